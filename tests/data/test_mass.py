"""Oracle tests for MASS fragment masking."""

import math

import numpy as np
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import mass

MASK, BOS, VOCAB = 4, 5, 1000


def test_fragment_is_half_the_sentence_with_shifted_decoder_inputs():
    num, n = 1500, 10  # chunks of inputs_length - 1 = 10 tokens; fragment k = 5
    docs = (np.arange(num * n, dtype=np.int32) % 900 + 50).reshape(num, n)
    ds = tf.data.Dataset.from_tensor_slices({"targets": docs})
    with seqio.map_seed_manager(4):
        out = list(
            mass.mass(
                ds, sequence_length={"inputs": 11}, mask_id=MASK, bos_id=BOS, vocab_size=VOCAB
            ).as_numpy_iterator()
        )
    starts, masked, kept = [], 0, 0
    for doc, x in zip(docs, out, strict=True):
        start = int(x["decoder_positions"][0])
        starts.append(start)
        np.testing.assert_array_equal(x["decoder_positions"], np.arange(start, start + 5))
        np.testing.assert_array_equal(x["targets"], doc[start : start + 5])
        previous = doc[start - 1] if start else BOS
        np.testing.assert_array_equal(
            x["decoder_input_tokens"], [previous, *doc[start : start + 4]]
        )
        outside = np.ones(n, bool)
        outside[start : start + 5] = False
        np.testing.assert_array_equal(x["inputs"][outside], doc[outside])
        masked += (x["inputs"][~outside] == MASK).sum()
        kept += (x["inputs"][~outside] == doc[~outside]).sum()
    total = 5 * num
    assert abs(masked / total - 0.8) < 5 * math.sqrt(0.8 * 0.2 / total)
    # kept: the 10% left alone plus random draws that hit the original id (rare)
    assert abs(kept / total - 0.1) < 5 * math.sqrt(0.1 * 0.9 / total) + 0.002
    counts = np.bincount(starts, minlength=6)
    assert len(counts) == 6  # start in [0, n - k]
    sigma = math.sqrt(num * (1 / 6) * (5 / 6))
    assert np.abs(counts - num / 6).max() < 5 * sigma


def test_short_sentences_mask_at_least_one_token():
    ds = tf.data.Dataset.from_tensors({"targets": tf.constant([70], tf.int32)})
    with seqio.map_seed_manager(1):
        (x,) = mass.mass(
            ds, sequence_length={"inputs": 11}, mask_id=MASK, bos_id=BOS, vocab_size=VOCAB
        ).as_numpy_iterator()
    assert x["targets"].tolist() == [70] and x["decoder_input_tokens"].tolist() == [BOS]
