"""Oracle tests for ALBERT n-gram masking (lmsuite.data.preprocessors.ngram)."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

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
    draws = ngram.sample_ngram_lengths(seed=tf.constant([5, 6]), num=n, max_ngram=3).numpy()
    for length, p in zip([1, 2, 3], [6 / 11, 3 / 11, 2 / 11], strict=True):
        observed = np.mean(draws == length)
        assert abs(observed - p) < 5 * np.sqrt(p * (1 - p) / n), (length, observed, p)


def _albert_outcomes(word_lengths, budget, max_ngram=3):
    """Exact P(covered words) under ALBERT's create_masked_lm_predictions, restated in Python.

    Enumerates every visiting order (ALBERT's shuffle of ngram_indexes) and every n drawn at a
    visit (np.random.choice over all of ngrams, p = 1/n normalised). The n-gram is the slice
    cand_indexes[idx:idx + n], cut at the row's end; n is shortened while the n-gram's tokens
    overflow the budget; the visit is skipped if even a unigram overflows or a word is covered.
    """
    pvals = ngram.ngram_probabilities(max_ngram)
    num_words = len(word_lengths)
    outcomes = {}

    def visit(order, covered, count, prob):
        if not order or count >= budget:
            key = frozenset(covered)
            outcomes[key] = outcomes.get(key, 0.0) + prob
            return
        idx, rest = order[0], order[1:]
        for n, p_n in zip(range(1, max_ngram + 1), pvals, strict=True):
            gram = list(range(idx, min(idx + n, num_words)))
            while count + sum(word_lengths[w] for w in gram) > budget and n > 1:
                n -= 1
                gram = list(range(idx, min(idx + n, num_words)))
            tokens = sum(word_lengths[w] for w in gram)
            if count + tokens > budget or covered & set(gram):
                visit(rest, covered, count, prob * p_n)
            else:
                visit(rest, covered | set(gram), count + tokens, prob * p_n)

    for order in itertools.permutations(range(num_words)):
        visit(order, frozenset(), 0, 1.0 / math.factorial(num_words))
    return outcomes


def test_albert_restatement_by_hand():
    # three one-piece words, budget 2: the last two are covered 9/22 of the time (a draw among
    # the n-grams that fit would give 7/18); worked in docs/objectives.md
    outcomes = _albert_outcomes([1, 1, 1], budget=2)
    assert math.isclose(outcomes[frozenset({1, 2})], 9 / 22)
    assert math.isclose(outcomes[frozenset({0, 2})], 17 / 66)
    assert math.isclose(outcomes[frozenset({0, 1})], 1 / 3)


@pytest.mark.parametrize(
    ("word_lengths", "budget"), [([1, 1, 1], 2), ([1, 2, 1, 1], 3), ([2, 1, 1, 2, 1], 4)]
)
def test_covered_words_follow_albert_rule(word_lengths, budget):
    """choose_ngrams' covered words over 30,000 seeds against the exact reference outcomes."""
    starts = np.concatenate([[1] + [0] * (k - 1) for k in word_lengths]).astype(np.int32)
    word_of_token = np.cumsum(starts) - 1
    maskable = tf.ones(len(starts), tf.bool)
    n = 30_000
    ds = tf.data.Dataset.range(n).map(
        lambda i: ngram.choose_ngrams(
            maskable, tf.constant(starts), tf.constant(budget), seed=tf.stack([i, 7]), max_ngram=3
        )
    )
    counts = {}
    for chosen in ds.batch(1000).as_numpy_iterator():
        for row in chosen:
            key = frozenset(word_of_token[row].tolist())
            counts[key] = counts.get(key, 0) + 1
    expected = _albert_outcomes(word_lengths, budget)
    assert set(counts) <= set(expected), set(counts) - set(expected)
    keys = sorted(expected, key=sorted)
    observed = np.array([counts.get(k, 0) for k in keys])
    statistic, p_value = stats.chisquare(observed, n * np.array([expected[k] for k in keys]))
    assert p_value > 1e-4, (statistic, dict(zip(map(sorted, keys), observed, strict=True)))


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
