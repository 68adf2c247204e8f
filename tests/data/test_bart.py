"""Oracle tests for BART text infilling, sentence permutation and sentence packing."""

import math

import numpy as np
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import bart

MASK = 4


def run(ds, fn, seed=3, **kwargs):
    with seqio.map_seed_manager(seed):
        return list(fn(ds, **kwargs).as_numpy_iterator())


def test_span_lengths_are_poisson_and_sum_to_the_budget():
    lengths = tf.function(bart.sample_span_lengths)
    full = []
    for i in range(400):
        seed = tf.constant([i, 1])
        spans = lengths(budget=tf.constant(60), poisson_lambda=3.0, seed=seed).numpy()
        assert spans.sum() == 60 and (spans >= 0).all() and spans[-1] >= 1
        full.extend(spans[:-1].tolist())  # the last span is trimmed to the budget
    full = np.array(full)
    n = len(full)  # about 400 * 19.5 draws
    assert abs(full.mean() - 3.0) < 5 * math.sqrt(3.0 / n)
    p0 = math.exp(-3.0)  # zero-length spans: inserted masks
    assert abs((full == 0).mean() - p0) < 5 * math.sqrt(p0 * (1 - p0) / n)


def test_text_infilling_masks_exactly_the_budget_and_keeps_order():
    n, num = 50, 300
    docs = np.arange(num * n, dtype=np.int32).reshape(num, n) + 10
    ds = tf.data.Dataset.from_tensor_slices({"targets": docs})
    out = run(ds, bart.text_infilling, mask_id=MASK)
    budget = math.ceil(0.3 * n)  # 15 tokens masked per example
    masks = 0
    for doc, x in zip(docs, out, strict=True):
        np.testing.assert_array_equal(x["targets"], doc)
        kept = x["inputs"][x["inputs"] != MASK]
        assert len(kept) == n - budget
        assert np.isin(kept, doc).all() and (np.diff(kept) > 0).all()
        masks += (x["inputs"] == MASK).sum()
    # One [MASK] per span; spans average about 3 tokens (fewer than budget / 3 + 1 each).
    assert num * budget / 3.0 < masks < num * (budget / 3.0 + 1.5)


def test_text_infilling_on_words_masks_whole_words():
    tokens = np.arange(10, 40, dtype=np.int32)
    word_starts = np.array([1, 0, 0, 1, 1, 0] * 5, np.int32)  # words of 3, 1 and 2 tokens
    ds = tf.data.Dataset.from_tensors({"targets": tokens, "word_starts": word_starts}).repeat(50)
    out = run(ds, bart.text_infilling, mask_id=MASK, use_word_starts=True)
    word_of = np.cumsum(word_starts) - 1
    for x in out:
        kept = x["inputs"][x["inputs"] != MASK] - 10
        kept_words = np.unique(word_of[kept])
        assert len(kept_words) == 15 - math.ceil(0.3 * 15)  # 15 words, 5 masked
        assert len(kept) == np.isin(word_of, kept_words).sum()  # no partial word survives


def test_sentence_permutation_is_uniform_over_orders():
    sentences = tf.ragged.constant([[10, 11], [12], [13, 14, 15]])
    ds = tf.data.Dataset.from_tensors({"sentence_ids": sentences}).repeat(1200)
    out = run(ds, bart.sentence_permutation)
    orders = {}
    for x in out:
        assert x["targets"].tolist() == list(range(10, 16))
        assert sorted(x["inputs"].tolist()) == list(range(10, 16))
        key = tuple(x["inputs"].tolist())
        orders[key] = orders.get(key, 0) + 1
    assert len(orders) == 6
    sigma = math.sqrt(1200 * (1 / 6) * (5 / 6))
    assert max(abs(c - 200) for c in orders.values()) < 5 * sigma


def test_pack_sentences_matches_docstring_example():
    sentences = tf.ragged.constant([[1, 2], [3], [], [4, 5, 6], [7, 8, 9, 10, 11]])
    ds = tf.data.Dataset.from_tensors({"sentence_ids": sentences})
    out = [x["sentence_ids"].to_list() for x in bart.pack_sentences(ds, max_tokens=4)]
    assert out == [[[1, 2], [3]], [[4, 5, 6]], [[7, 8, 9, 10]], [[11]]]


def test_bart_denoising_end_to_end_is_deterministic():
    doc = {
        "sentence_ids": tf.ragged.constant([list(range(10 + 7 * i, 17 + 7 * i)) for i in range(9)])
    }
    ds = tf.data.Dataset.from_tensors(doc)
    kw = dict(sequence_length={"targets": 31}, mask_id=MASK)
    a, b, c = (run(ds, bart.bart_denoising, seed=s, **kw) for s in (1, 1, 2))
    assert [len(x["targets"]) for x in a] == [28, 28, 7]  # blocks of 4, 4 and 1 sentences
    assert all((x["inputs"] == y["inputs"]).all() for x, y in zip(a, b, strict=True))
    assert any(not np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, c, strict=True))
