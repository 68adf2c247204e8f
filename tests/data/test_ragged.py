"""The test corpora's ragged builder gives what `tf.ragged.constant` gives."""

import numpy as np
import pytest
import tensorflow as tf

from tests.data.ragged import ragged


@pytest.mark.parametrize(
    "values, dtype, rank",
    [
        ([[[1, 2], [3]], [], [[], [4, 5, 6]]], np.int32, 2),
        ([["nr", "v"], [], ["ns"]], object, 1),
        ([[7], [8, 9]], np.int32, 1),
    ],
)
def test_equals_tf_ragged_constant(values, dtype, rank):
    tf_dtype = tf.string if dtype is object else tf.int32
    want = tf.ragged.constant(values, dtype=tf_dtype, ragged_rank=rank, inner_shape=())
    got = ragged(values, dtype, ragged_rank=rank)
    assert got.dtype == want.dtype and got.ragged_rank == want.ragged_rank == rank
    assert got.row_splits.dtype == want.row_splits.dtype
    assert got.to_list() == want.to_list()


def test_values_nested_deeper_than_the_rank_are_refused():
    with pytest.raises(ValueError, match="nested deeper than ragged_rank \\+ 1 = 2"):
        ragged([[[1, 2]], [[3, 4]]], np.int32, ragged_rank=1)
