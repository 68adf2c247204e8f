"""Mask builders: exact small cases and shape validation."""

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
