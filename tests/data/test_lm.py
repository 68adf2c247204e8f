"""Tests for the stream chunkers and the LM objectives (full, causal, prefix)."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import lm


def as_dataset(docs):
    return tf.data.Dataset.from_generator(
        lambda: ({"targets": np.asarray(d, np.int32)} for d in docs),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )


def rows(ds):
    def plain(x):
        return {k: v.tolist() for k, v in x.items()} if isinstance(x, dict) else x.tolist()

    return [plain(x) for x in ds.as_numpy_iterator()]


def test_chunk_stream_batches_is_continuous_and_keeps_the_tail():
    docs = [[1, 2, 3], [4, 5, 6, 7, 8], [], [9, 10, 11], [12]]
    batches = lm.chunk_stream_batches(as_dataset(docs), chunk_length=4, docs_per_group=2)
    # Groups of 2 documents: the carry crosses groups; only the stream's tail is short.
    assert rows(batches) == [[[1, 2, 3, 4], [5, 6, 7, 8]], [[9, 10, 11, 12]]]
    docs[-1] = [12, 13]
    batches = lm.chunk_stream_batches(as_dataset(docs), chunk_length=4, docs_per_group=2)
    assert rows(batches) == [[[1, 2, 3, 4], [5, 6, 7, 8]], [[9, 10, 11, 12]], [[13]]]
    dropped = lm.chunk_stream_batches(as_dataset(docs), chunk_length=4, min_chunk_length=2)
    assert rows(dropped) == [[[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]]


def test_full_lm_puts_eos_between_documents_only():
    docs = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    out = rows(lm.full_lm(as_dataset(docs), sequence_length={"targets": 4}, eos_id=1))
    targets = [x["targets"] for x in out]
    assert targets == [[5, 6, 7, 1], [8, 9, 1, 10], [11, 12, 13, 1]]


def test_causal_lm_keeps_documents_apart_with_room_for_eos():
    docs = [[5, 6, 7, 8, 9], [3]]
    out = rows(lm.causal_lm(as_dataset(docs), sequence_length={"targets": 4}))
    assert [x["targets"] for x in out] == [[5, 6, 7], [8, 9], [3]]


def test_prefix_lm_split_point_is_uniform_and_lossless():
    num_docs, n = 2000, 9  # chunks of inputs_length - 1 = 9 tokens, split point k in [1, 8]
    docs = np.arange(num_docs * n, dtype=np.int32).reshape(num_docs, n) + 10
    ds = tf.data.Dataset.from_tensor_slices({"targets": docs})
    with seqio.map_seed_manager(11):
        out = list(lm.prefix_lm(ds, sequence_length={"inputs": 10}).as_numpy_iterator())
    assert len(out) == num_docs
    ks = []
    for doc, x in zip(docs, out, strict=True):
        np.testing.assert_array_equal(np.concatenate([x["inputs"], x["targets"]]), doc)
        ks.append(len(x["inputs"]))
    counts = np.bincount(ks, minlength=n)
    assert counts[0] == 0 and counts[1:].sum() == num_docs
    sigma = np.sqrt(num_docs * (1 / 8) * (7 / 8))
    assert np.abs(counts[1:] - num_docs / 8).max() < 5 * sigma


def test_prefix_lm_is_deterministic_per_seed_and_drops_one_token_chunks():
    docs = [list(range(10, 30)), [7]]
    kw = dict(sequence_length={"inputs": 6})

    def run(seed):
        with seqio.map_seed_manager(seed):
            return rows(lm.prefix_lm(as_dataset(docs), **kw))

    a, b, c = run(1), run(1), run(2)
    assert a == b and a != c
    assert len(a) == 4  # [7] is a one-token chunk: nothing to predict after a prefix


def test_missing_lengths_fail_loudly():
    with pytest.raises(ValueError, match="lacks lengths for \\['targets'\\]"):
        lm.full_lm(as_dataset([]), sequence_length={"inputs": 4}, eos_id=1)
    with pytest.raises(ValueError, match="sequence_length is None"):
        lm.causal_lm(as_dataset([]), sequence_length=None)
