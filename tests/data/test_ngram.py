"""Oracle tests for ALBERT n-gram masking (lmsuite.data.preprocessors.ngram)."""

import collections
import itertools
import math

import numpy as np
import pytest
import seqio
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
    draws = ngram.sample_ngram_lengths([n], seed=tf.constant([5, 6]), max_ngram=3).numpy()
    for length, p in zip([1, 2, 3], [6 / 11, 3 / 11, 2 / 11], strict=True):
        observed = np.mean(draws == length)
        assert abs(observed - p) < 5 * np.sqrt(p * (1 - p) / n), (length, observed, p)


def _albert_visit(word_lengths, start, n, covered, count, budget, events=None):
    """One visit of ALBERT's rule, in plain Python: the words the n-gram drawn at `start`
    covers (none when the visit is skipped). The n-gram is the slice cand_indexes[idx:idx + n],
    cut at the row's end; n is shortened while its tokens overflow the budget; the visit is
    skipped if even a unigram overflows or a word is already covered."""
    events = collections.Counter() if events is None else events
    while n > 0 and count + sum(word_lengths[start : start + n]) > budget:
        n -= 1  # shorten the n-gram while it overflows
        events["shortened"] += 1
    words = set(range(start, min(start + n, len(word_lengths))))
    events["cut at the end"] += len(words) < n
    if n == 0 or words & covered:
        events["skipped" if n == 0 else "overlapped"] += 1
        return set()
    return words


def _albert_outcomes(word_lengths, budget, max_ngram=3):
    """Exact P(covered words) under ALBERT's create_masked_lm_predictions, restated in Python.

    Enumerates every visiting order (ALBERT's shuffle of ngram_indexes) and every n drawn at a
    visit (np.random.choice over all of ngrams, p = 1/n normalised), each visit by
    `_albert_visit`.
    """
    pvals = ngram.ngram_probabilities(max_ngram)
    outcomes = {}

    def visit(order, covered, count, prob):
        if not order or count >= budget:
            key = frozenset(covered)
            outcomes[key] = outcomes.get(key, 0.0) + prob
            return
        idx, rest = order[0], order[1:]
        for n, p_n in zip(range(1, max_ngram + 1), pvals, strict=True):
            words = _albert_visit(word_lengths, idx, n, covered, count, budget)
            tokens = sum(word_lengths[w] for w in words)
            visit(rest, covered | words, count + tokens, prob * p_n)

    for order in itertools.permutations(range(len(word_lengths))):
        visit(order, frozenset(), 0, 1.0 / math.factorial(len(word_lengths)))
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


def _albert_rule(word_lengths, order, ngrams, budget):
    """ALBERT's selection as the module docstring states it, in plain Python, fed a row's
    draws: the set of words covered."""
    covered, count = set(), 0
    for start, n in zip(order, ngrams, strict=True):
        if count >= budget:
            break
        words = _albert_visit(word_lengths, start, n, covered, count, budget, EVENTS)
        covered |= words
        count += sum(word_lengths[w] for w in words)
    return covered


EVENTS = collections.Counter()


def _padded(rows):
    """Rows of different lengths as one zero-padded group, and their lengths."""
    width = max(len(ids) for ids, _ in rows)
    pad = lambda x: np.pad(x, [0, width - len(x)])  # noqa: E731
    group = {
        "input_ids": tf.constant(np.stack([pad(ids) for ids, _ in rows])),
        "word_starts": tf.constant(np.stack([pad(starts) for _, starts in rows])),
    }
    return group, tf.constant([len(ids) for ids, _ in rows])


@pytest.mark.parametrize(
    "rate, cap, max_words",
    [(0.15, 6, 70), (0.6, None, 12)],  # budgets cut by ALBERT-like caps; crowded short rows
)
def test_a_group_covers_in_each_row_what_albert_s_rule_covers(rate, cap, max_words):
    """48 rows (1-4 pieces per word, so that n-grams overflow the budget and shorten, or
    overlap words already covered; one row with nothing maskable, one of a single word) as one
    padded group: each row covers exactly the words the plain-Python rule covers with the row's
    own draws."""
    spec = mlm.MlmSpec(
        mask_id=MASK, vocab_size=1000, special_ids=SPECIALS, max_predictions=12,
        mask_rate=rate, prediction_cap=cap,
    )  # fmt: skip
    rng = np.random.default_rng(3)
    rows = [_row(rng, int(rng.integers(2, max_words)), 4) for _ in range(46)]
    rows += [_row(rng, 0, 1), _row(rng, 1, 3)]
    group, lengths = _padded(rows)
    keys, ngrams = ngram.ngram_draws(tf.shape(group["input_ids"]), seed=tf.constant([11, 0]),
                                     max_ngram=3)  # fmt: skip
    maskable = mlm.maskable_tokens(group, spec=spec, lengths=lengths)
    budgets = mlm.prediction_budget(tf.reduce_sum(tf.cast(maskable, tf.int32), axis=-1), spec=spec)
    covered_tokens = ngram.choose_drawn_ngrams(
        maskable, group["word_starts"], budgets, order=keys, drawn=ngrams, max_ngram=3
    ).numpy()
    EVENTS.clear()
    for r, (_, starts) in enumerate(rows):
        word = np.cumsum(starts)[1:-1] - 2  # the word of each maskable token (CLS is 1)
        word_lengths = np.bincount(word, minlength=word.max(initial=-1) + 1).tolist()
        budget = min(cap or 12, max(1, round(rate * len(word))), len(word))
        assert budgets[r] == budget, r
        order = np.argsort(keys[r, : len(word_lengths)], kind="stable").tolist()
        covered = _albert_rule(
            word_lengths, order, ngrams[r, : len(order)].numpy().tolist(), budget
        )
        expected = [1 + p for p, w in enumerate(word) if w in covered]
        assert np.flatnonzero(covered_tokens[r]).tolist() == expected, r
    # the rule's paths ran: n-grams shortened and words skipped (capped), n-grams cut at the
    # row's end and overlaps refused (crowded)
    wanted = ("shortened", "skipped") if cap else ("cut at the end", "overlapped")
    assert min(EVENTS[k] for k in wanted) >= 5, EVENTS


def test_dynamic_masking_masks_groups_of_rows_each_within_its_own_length():
    """The tasks' path: 70 rows of one-piece words (two groups of 32 and a rest of 6) each get
    exactly their budget of predictions, inside their own row, of their own tokens; nothing
    else of a row changes; two epochs draw other masks."""
    rng = np.random.default_rng(4)
    rows = [_row(rng, int(rng.integers(1, 90)), 1) for _ in range(70)]
    sig = {k: tf.TensorSpec([None], tf.int32) for k in ("input_ids", "word_starts")}
    gen = lambda: ({"input_ids": i, "word_starts": s} for i, s in rows)  # noqa: E731
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig).repeat(2)
    with seqio.utils.map_seed_manager(5):
        out = list(ngram.ngram_dynamic_mlm(ds, spec=SPEC).as_numpy_iterator())
    assert len(out) == 140
    for (ids, starts), got in zip(rows + rows, out, strict=True):
        n = len(ids) - 2
        k = int(got["masked_weights"].sum())
        assert k == min(40, max(1, round(0.15 * n)), n)
        positions = got["masked_positions"][:k]
        assert ((positions >= 1) & (positions <= n)).all()
        np.testing.assert_array_equal(got["masked_ids"][:k], ids[positions])
        kept = np.ones(len(ids), bool)
        kept[positions] = False
        np.testing.assert_array_equal(got["input_ids"][kept], ids[kept])
        np.testing.assert_array_equal(got["word_starts"], starts)
    first, second = out[:70], out[70:]
    assert any(
        not np.array_equal(a["masked_positions"], b["masked_positions"])
        for a, b in zip(first, second, strict=True)
    )
