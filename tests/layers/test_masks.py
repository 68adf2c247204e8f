"""Mask builders: exact small cases and shape validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.layers import masks
from lmsuite.layers.attention import masked_softmax


def test_prefix_lm_mask_exact():
    m = masks.prefix_lm_mask(jnp.array([[1, 1, 0, 0]]))[0, 0].astype(int)
    np.testing.assert_array_equal(m, [[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]])


def test_segment_mask_isolates_and_drops_padding():
    seg = jnp.array([[1, 1, 2, 0]])
    m = masks.segment_mask(seg, seg)[0, 0].astype(int)
    np.testing.assert_array_equal(m, [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])


def test_combine_ands_and_skips_none():
    a = masks.causal_mask(3)
    b = masks.padding_mask(jnp.array([[1, 1, 0]]))
    m = masks.combine(None, a, b)[0, 0].astype(int)
    np.testing.assert_array_equal(m, [[1, 0, 0], [1, 1, 0], [1, 1, 0]])
    assert masks.combine(None, None) is None


@pytest.mark.parametrize(
    "fn,arg", [(masks.padding_mask, jnp.ones((2, 3, 3))), (masks.full_mask, jnp.ones((2, 3)))]
)
def test_wrong_rank_is_named(fn, arg):
    with pytest.raises(ValueError, match="must have rank"):
        fn(arg)


def test_fully_masked_row_gives_zero_probabilities():
    logits = jnp.zeros((1, 1, 2, 3))
    mask = jnp.array([[[[True, False, True], [False, False, False]]]])
    p = masked_softmax(logits, mask)
    np.testing.assert_allclose(p[0, 0, 0], [0.5, 0.0, 0.5])
    np.testing.assert_array_equal(p[0, 0, 1], [0.0, 0.0, 0.0])


@pytest.mark.parametrize("masked", [False, True])
def test_low_precision_probabilities_match_autodiff_within_bf16(masked):
    """`probabilities` in bfloat16 keeps only bf16 probabilities for the backward pass; its
    values and gradients equal autodiff's through the float32 softmax to bf16's precision
    (8 mantissa bits: a relative error of 2^-8 per rounding), and float32 is autodiff itself."""
    from lmsuite.layers.attention import probabilities

    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 3, 5, 7)) * 3, jnp.float32)
    mask = jnp.asarray(rng.random((2, 1, 5, 7)) > 0.3) if masked else None
    weights = jnp.asarray(rng.normal(size=logits.shape), jnp.float32)

    def loss(x, fn):
        return jnp.sum(fn(x).astype(jnp.float32) * weights)

    reference = lambda x: masked_softmax(x, mask).astype(jnp.bfloat16)
    ours = lambda x: probabilities(x, mask, jnp.bfloat16)
    low = logits.astype(jnp.bfloat16)
    np.testing.assert_array_equal(ours(low), reference(low))
    g_ours = jax.grad(loss)(low, ours).astype(jnp.float32)
    g_ref = jax.grad(loss)(low, reference).astype(jnp.float32)
    scale = float(jnp.max(jnp.abs(g_ref)))
    # bf16 probabilities (rounded once more than autodiff's float32 residual) feed
    # p * (g - sum(g p)), and the gradient is rounded to bf16 again: a few roundings of 2^-8
    error = float(jnp.max(jnp.abs(g_ours - g_ref)))
    assert 0 < error <= 4 * 2**-8 * scale  # not autodiff itself, and within bf16's precision
    if masked:
        assert (
            float(jnp.max(jnp.abs(jnp.where(jnp.broadcast_to(mask, g_ours.shape), 0, g_ours)))) == 0
        )
    f32 = lambda x: probabilities(x, mask, jnp.float32)
    np.testing.assert_array_equal(
        jax.grad(loss)(logits, f32), jax.grad(loss)(logits, lambda x: masked_softmax(x, mask))
    )
