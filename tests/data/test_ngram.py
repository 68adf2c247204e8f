"""Oracle tests for ALBERT n-gram masking (lmsuite.data.preprocessors.ngram)."""

import numpy as np
import tensorflow as tf

from lmsuite.data.preprocessors import mlm, ngram

CLS, SEP, MASK = 2, 3, 4
SPECIALS = (0, 1, 2, 3, 4, 5, 6)
SPEC = mlm.MlmSpec(mask_id=MASK, vocab_size=1000, special_ids=SPECIALS, max_predictions=40)


def _row(rng, num_words, max_pieces):
    ids, starts = [CLS], [1]
    for _ in range(num_words):
        pieces = int(rng.integers(1, max_pieces + 1))
        ids += rng.integers(7, 1000, size=pieces).tolist()
        starts += [1] + [0] * (pieces - 1)
    return np.array(ids + [SEP], np.int32), np.array(starts + [1], np.int32)


def _mask_all(rows, seed=0):
    sig = {k: tf.TensorSpec([None], tf.int32) for k in ("input_ids", "word_starts")}
    gen = lambda: ({"input_ids": i, "word_starts": s} for i, s in rows)
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig).enumerate()
    ds = ds.map(
        lambda i, f: ngram.mask_ngrams(
            f, seed=tf.stack([tf.constant(seed, tf.int64), i]), spec=SPEC
        )
    )
    return list(ds.as_numpy_iterator())


def test_probabilities_are_6_3_2_elevenths():
    np.testing.assert_allclose(ngram.ngram_probabilities(3), [6 / 11, 3 / 11, 2 / 11])


def test_sampler_frequencies_before_budget_cuts():
    n = 60_000
    draws = ngram.sample_ngram_lengths(
        seed=tf.constant([5, 6]), available=tf.fill([n], 3), max_ngram=3
    ).numpy()
    for length, p in zip([1, 2, 3], [6 / 11, 3 / 11, 2 / 11], strict=True):
        observed = np.mean(draws == length)
        assert abs(observed - p) < 5 * np.sqrt(p * (1 - p) / n), (length, observed, p)


def test_sampler_respects_words_left():
    n = 30_000
    draws = ngram.sample_ngram_lengths(
        seed=tf.constant([1, 2]), available=tf.constant([1, 2] * (n // 2)), max_ngram=3
    ).numpy()
    assert (draws[0::2] == 1).all()
    tail = draws[1::2]
    assert set(np.unique(tail).tolist()) == {1, 2}
    p = 2 / 3  # 1/1 : 1/2 renormalised
    assert abs(np.mean(tail == 1) - p) < 5 * np.sqrt(p * (1 - p) / len(tail))


def test_one_piece_words_meet_the_budget_and_stay_special_free():
    rng = np.random.default_rng(0)
    rows = [_row(rng, int(rng.integers(3, 120)), 1) for _ in range(60)]
    for (ids, _), out in zip(rows, _mask_all(rows), strict=True):
        n = len(ids) - 2
        k = int(out["masked_weights"].sum())
        assert k == min(40, max(1, round(0.15 * n)), n)
        assert not np.isin(ids[out["masked_positions"][:k]], SPECIALS).any()


def test_ngrams_cover_whole_words_within_budget():
    rng = np.random.default_rng(1)
    rows = [_row(rng, int(rng.integers(5, 80)), 3) for _ in range(60)]
    run_lengths = []
    for (ids, starts), out in zip(rows, _mask_all(rows, seed=1), strict=True):
        n = len(ids) - 2
        k = int(out["masked_weights"].sum())
        assert 1 <= k <= min(40, max(1, round(0.15 * n)))
        chosen = np.zeros(len(ids), bool)
        chosen[out["masked_positions"][:k]] = True
        word = np.cumsum(starts) - 1
        for w in np.unique(word[1:-1]):
            inside = chosen[word == w]
            assert inside.all() or not inside.any()
        # maximal runs of covered words: n-grams (and adjacent n-grams) of whole words
        covered_words = [bool(chosen[word == w].all()) for w in range(1, word[-2] + 1)]
        run = 0
        for c in covered_words + [False]:
            if c:
                run += 1
            elif run:
                run_lengths.append(run)
                run = 0
    assert max(run_lengths) >= 2  # n-grams longer than one word do occur
