"""Oracle tests for whole-word masking (lmsuite.data.preprocessors.whole_word)."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import mlm, ngram, spanbert, whole_word

CLS, SEP, MASK = 2, 3, 4
SPECIALS = (0, 1, 2, 3, 4, 5, 6)
SPEC = mlm.MlmSpec(mask_id=MASK, vocab_size=1000, special_ids=SPECIALS, max_predictions=30)


def worded_rows(num, *, seed, min_words=2, max_words=60, max_pieces=4):
    """(input_ids, word_starts): [CLS] words [SEP] words [SEP], words of 1..max_pieces pieces."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num):
        ids, starts = [CLS], [1]
        num_words = int(rng.integers(min_words, max_words + 1))
        cut = int(rng.integers(1, num_words + 1))
        for w in range(num_words):
            if w == cut:
                ids.append(SEP)
                starts.append(1)
            pieces = int(rng.integers(1, max_pieces + 1))
            ids.extend(rng.integers(7, 1000, size=pieces).tolist())
            starts.extend([1] + [0] * (pieces - 1))
        ids.append(SEP)
        starts.append(1)
        rows.append((np.array(ids, np.int32), np.array(starts, np.int32)))
    return rows


def words_of(ids, starts):
    """Lists of token positions, one per word of maskable tokens."""
    words, current = [], []
    for i, (t, s) in enumerate(zip(ids, starts, strict=True)):
        if t in SPECIALS:
            current = []
            continue
        if s or not current:
            current = []
            words.append(current)
        current.append(i)
    return words


def run_masker(fn, rows, *, seed=0, spec=SPEC, **kw):
    def gen():
        for ids, starts in rows:
            yield {"input_ids": ids, "word_starts": starts}

    sig = {k: tf.TensorSpec([None], tf.int32) for k in ("input_ids", "word_starts")}
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig).enumerate()
    ds = ds.map(
        lambda i, f: fn(f, seed=tf.stack([tf.constant(seed, tf.int64), i]), spec=spec, **kw)
    )
    return list(ds.as_numpy_iterator())


def selected_positions(out):
    k = int(out["masked_weights"].sum())
    return set(out["masked_positions"][:k].tolist())


def test_unit_index_example():
    index, num = whole_word.unit_index(
        tf.constant([False, True, True, True, False, True]), tf.constant([1, 1, 0, 1, 1, 0])
    )
    np.testing.assert_array_equal(index, [-1, 0, 0, 1, -1, 2])
    assert int(num) == 3


def test_unit_index_of_a_group_numbers_each_row_alone():
    rng = np.random.default_rng(4)
    maskable = rng.random((6, 25)) < 0.8
    starts = (rng.random((6, 25)) < 0.4).astype(np.int32)
    index, num = whole_word.unit_index(tf.constant(maskable), tf.constant(starts))
    for row in range(6):
        alone, count = whole_word.unit_index(tf.constant(maskable[row]), tf.constant(starts[row]))
        np.testing.assert_array_equal(index[row], alone)
        assert int(num[row]) == int(count) and int(count) > 3


def _fit_or_skip(lengths, budget):
    expected, remaining = [], budget
    for n in lengths:  # BERT: skip a word that does not fit, keep trying the rest
        take = n <= remaining
        remaining -= n if take else 0
        expected.append(take)
    return expected


@pytest.mark.parametrize("seed", range(40))
def test_greedy_fit_matches_bert_fit_or_skip_loop(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0 if seed % 4 == 0 else 1, 6, size=int(rng.integers(1, 60)))
    if seed % 3 == 0:  # units never taken, as ERNIE's independent selection marks them
        lengths[rng.random(lengths.size) < 0.7] = np.iinfo(np.int32).max
    budget = int(rng.integers(-2, 40))
    got = whole_word.greedy_fit(tf.constant(lengths, tf.int32), tf.constant(budget))
    np.testing.assert_array_equal(got, _fit_or_skip(lengths, budget))


@pytest.mark.parametrize(
    ("lengths", "budget"),
    [([], 5), ([7], 6), ([6], 6), ([3, 2, 4, 1], 6), ([5, 1, 1, 1, 9, 1], 4), ([2, 2], -3)],
)
def test_greedy_fit_edge_cases(lengths, budget):
    got = whole_word.greedy_fit(tf.constant(lengths, tf.int32), tf.constant(budget))
    np.testing.assert_array_equal(got, np.array(_fit_or_skip(lengths, budget), bool))
    fit = tf.function(whole_word.greedy_fit)  # as tf.data traces it: the lengths' size unknown
    traced = fit.get_concrete_function(tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32))
    np.testing.assert_array_equal(
        traced(tf.constant(lengths, tf.int32), tf.constant(budget)),
        np.array(_fit_or_skip(lengths, budget), bool),
    )


@pytest.mark.parametrize("per_row_budget", [False, True])
def test_greedy_fit_on_a_group_fits_each_row_as_alone(per_row_budget):
    """Rows of a group finish at different loop turns (one fits at once, one loops longest)."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 6, size=(12, 30))
    lengths[rng.random(lengths.shape) < 0.4] = np.iinfo(np.int32).max
    lengths[0] = 1  # every unit fits: no loop turn
    lengths[1] = np.tile([5, 1], 15)  # the 5s overflow late: the most turns
    budgets = rng.integers(-1, 25, size=12) if per_row_budget else np.full(12, 9)
    fit = tf.function(whole_word.greedy_fit)  # traced, as tf.data runs it
    got = fit(
        tf.constant(lengths, tf.int32),
        tf.constant(budgets if per_row_budget else 9, tf.int32),
    )
    expected = [_fit_or_skip(row, budget) for row, budget in zip(lengths, budgets, strict=True)]
    np.testing.assert_array_equal(got, np.array(expected, bool))


def test_whole_words_within_budget_and_fit_or_skip_is_tight():
    rows = worded_rows(200, seed=1)
    short = 0
    for (ids, starts), out in zip(rows, run_masker(whole_word.mask_whole_words, rows), strict=True):
        chosen = selected_positions(out)
        words = words_of(ids, starts)
        n = sum(len(w) for w in words)
        budget = min(SPEC.max_predictions, max(1, round(0.15 * n)), n)
        assert len(chosen) <= budget
        remaining = budget - len(chosen)
        for word in words:
            inside = [p in chosen for p in word]
            assert all(inside) or not any(inside), word  # whole words only
            if not any(inside):
                assert len(word) > remaining  # a skipped word really did not fit
        short += remaining > 0
        assert not np.isin(ids[sorted(chosen)], SPECIALS).any()
    assert short < len(rows)  # the budget is usually met exactly


def test_one_piece_words_meet_the_budget_exactly():
    rows = worded_rows(100, seed=2, max_pieces=1)
    for (ids, _), out in zip(rows, run_masker(whole_word.mask_whole_words, rows), strict=True):
        n = int(np.sum(~np.isin(ids, SPECIALS)))
        assert out["masked_weights"].sum() == min(30, max(1, round(0.15 * n)), n)


def test_each_piece_draws_its_own_replacement():
    # BERT's whole-word masking decides [MASK]/random/keep per piece, not per word.
    rows = worded_rows(200, seed=3, min_words=40, max_pieces=4)
    mixed = 0
    for (ids, starts), out in zip(rows, run_masker(whole_word.mask_whole_words, rows), strict=True):
        chosen = selected_positions(out)
        for word in words_of(ids, starts):
            if word[0] in chosen and len(word) > 1:
                is_mask = out["input_ids"][word] == MASK
                mixed += is_mask.any() and not is_mask.all()
    assert mixed > 0


def test_whole_word_static_and_dynamic_modes():
    rows = worded_rows(4, seed=4, min_words=30)

    def ds():
        sig = {k: tf.TensorSpec([None], tf.int32) for k in ("input_ids", "word_starts")}
        gen = lambda: ({"input_ids": i, "word_starts": s} for i, s in rows)
        return tf.data.Dataset.from_generator(gen, output_signature=sig)

    with seqio.map_seed_manager(3):
        static = whole_word.whole_word_static_mlm(ds(), spec=SPEC, dupe_factor=2)
        dynamic = whole_word.whole_word_dynamic_mlm(ds().repeat(2), spec=SPEC)
    static_pos = [tuple(e["masked_positions"]) for e in static.as_numpy_iterator()]
    assert len(static_pos) == 8
    assert static_pos == [tuple(e["masked_positions"]) for e in static.as_numpy_iterator()]
    dynamic_pos = [tuple(e["masked_positions"]) for e in dynamic.as_numpy_iterator()]
    assert all(dynamic_pos[d] != dynamic_pos[d + 4] for d in range(4))


def test_missing_word_starts_fails_loudly():
    with pytest.raises(ValueError, match="word_starts"):
        whole_word.mask_whole_words(
            {"input_ids": tf.constant([2, 10, 3])}, seed=tf.constant([0, 0]), spec=SPEC
        )


@pytest.mark.parametrize("masker", ["tokens", "whole_words", "ngrams", "spans"])
def test_rows_without_maskable_tokens_get_no_predictions(masker):
    fn = {
        "tokens": mlm.mask_tokens,
        "whole_words": whole_word.mask_whole_words,
        "ngrams": ngram.mask_ngrams,
        "spans": spanbert.mask_spans,
    }[masker]
    for ids in ([CLS, SEP], [CLS, SEP, SEP]):
        features = {"input_ids": tf.constant(ids), "word_starts": tf.ones([len(ids)], tf.int32)}
        out = fn(features, seed=tf.constant([0, 0]), spec=SPEC)
        np.testing.assert_array_equal(out["input_ids"], ids)
        assert float(tf.reduce_sum(out["masked_weights"])) == 0.0
