"""`add_attention_bias`: the values and gradients of a plain add, for shared and per-example
biases; a bias of another shape is named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.layers.attention import add_attention_bias


@pytest.mark.parametrize("bias_batch", [1, 3])
def test_values_and_gradients_equal_a_plain_add(bias_batch):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(3, 2, 4, 5)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(bias_batch, 2, 4, 5)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(3, 2, 4, 5)), jnp.float32)

    def loss(fn, x, b):
        return jnp.sum(jnp.tanh(fn(x, b)) * weights)

    plain = lambda x, b: x + b
    np.testing.assert_allclose(add_attention_bias(logits, bias), plain(logits, bias), atol=1e-6)
    ours = jax.grad(lambda x, b: loss(add_attention_bias, x, b), argnums=(0, 1))(logits, bias)
    want = jax.grad(lambda x, b: loss(plain, x, b), argnums=(0, 1))(logits, bias)
    for a, b in zip(ours, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_bias_of_another_shape_is_named():
    with pytest.raises(ValueError, match=r"attention bias of shape \(1, 2, 4\) must be"):
        add_attention_bias(jnp.zeros((3, 2, 4, 5)), jnp.zeros((1, 2, 4)))
    with pytest.raises(ValueError, match=r"\(2, 2, 4, 5\)"):
        add_attention_bias(jnp.zeros((3, 2, 4, 5)), jnp.zeros((2, 2, 4, 5)))
