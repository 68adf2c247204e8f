"""`add_attention_bias`: the values and gradients of a plain add, for shared and per-example
biases; a bias of another shape is named. Under bfloat16 the scores stay float32."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jex_core

from lmsuite.layers.attention import MultiHeadAttention, add_attention_bias


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


def _dot_generals(jaxpr):
    """Every dot_general of `jaxpr` and of the jaxprs in its equations' parameters."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(sub, (jex_core.ClosedJaxpr, jex_core.Jaxpr)):
                    yield from _dot_generals(getattr(sub, "jaxpr", sub))


@pytest.mark.parametrize("float32_scores", [True, False])
def test_bfloat16_attention_keeps_its_scores_in_float32(float32_scores):
    """Near initialisation a query's scores are almost equal across keys, and the differences
    attention learns from are below bfloat16's resolution: rounded, they kept a bfloat16 BERT on
    the unigram plateau (benchmarks/RESULTS.md). The product q.k and the products of its
    gradient with k and q are float32; the projections and the probabilities stay bfloat16.
    `float32_scores=False` rounds the scores (and so their gradient) to bfloat16."""
    x = jnp.ones((2, 5, 32), jnp.bfloat16)
    module = MultiHeadAttention(
        num_heads=2, head_dim=16, dtype=jnp.bfloat16, float32_scores=float32_scores
    )
    params = module.init(jax.random.PRNGKey(0), x, x)["params"]
    loss = lambda p, x: module.apply({"params": p}, x, x).astype(jnp.float32).sum()
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(params, x).jaxpr
    scores_dtype = jnp.dtype(jnp.float32 if float32_scores else jnp.bfloat16)
    avals = lambda eqn: [v.aval for v in eqn.invars]
    heads = jax.core.ShapedArray((2, 5, 2, 16), jnp.bfloat16)  # q or k: (B, L, H, K)
    scores = [e for e in _dot_generals(jaxpr) if avals(e) == [heads, heads]]
    assert [e.outvars[0].aval.dtype for e in scores] == [scores_dtype]
    float32_grads = jax.core.ShapedArray((2, 2, 5, 5), jnp.float32)
    backward = [e for e in _dot_generals(jaxpr) if float32_grads in avals(e)]
    if float32_scores:
        assert len(backward) == 2  # dq and dk
        assert all(e.outvars[0].aval.dtype == jnp.float32 for e in backward)
    else:
        assert not backward
