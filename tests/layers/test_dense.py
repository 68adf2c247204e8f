"""add_bias's custom gradient and gelu_exact against their plain jax definitions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.layers.dense import add_bias
from lmsuite.layers.mlp import gelu_exact


@pytest.mark.parametrize(
    "y_shape,bias_shape", [((5, 7), (7,)), ((2, 3, 4, 6), (4, 6)), ((3,), (3,))]
)
def test_add_bias_gradients_match_plain_add(y_shape, bias_shape):
    rng = np.random.default_rng(0)
    y = jnp.asarray(rng.standard_normal(y_shape), jnp.float32)
    bias = jnp.asarray(rng.standard_normal(bias_shape), jnp.float32)
    plain = lambda y, b: y + b.reshape((1,) * (y.ndim - b.ndim) + b.shape)
    loss = lambda f: lambda y, b: jnp.sum(jnp.sin(f(y, b)) * jnp.arange(y.size).reshape(y.shape))
    want = jax.grad(loss(plain), argnums=(0, 1))(y, bias)
    got = jax.jit(jax.grad(loss(add_bias), argnums=(0, 1)))(y, bias)
    np.testing.assert_allclose(add_bias(y, bias), plain(y, bias), rtol=0, atol=0)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_add_bias_rejects_a_bias_that_is_not_the_trailing_shape():
    with pytest.raises(ValueError, match=r"\(3,\).*\(2, 4\)"):
        add_bias(jnp.zeros((2, 4)), jnp.zeros((3,)))


def test_gelu_exact_matches_jax_erfc_gelu_and_its_gradient():
    x = jnp.linspace(-10.0, 10.0, 4001)
    want = jax.nn.gelu(x, approximate=False)
    np.testing.assert_allclose(gelu_exact(x), want, rtol=0, atol=2e-6)
    dgelu = lambda f: jax.vmap(jax.grad(f))(x)
    np.testing.assert_allclose(
        dgelu(gelu_exact), dgelu(lambda v: jax.nn.gelu(v, approximate=False)), rtol=0, atol=2e-6
    )
