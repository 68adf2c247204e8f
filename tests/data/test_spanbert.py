"""Oracle tests for SpanBERT span masking and SBO targets (lmsuite.data.preprocessors.spanbert)."""

import numpy as np
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import mlm, spanbert

CLS, SEP, MASK = 2, 3, 4
SPECIALS = (0, 1, 2, 3, 4, 5, 6)
SPEC = mlm.MlmSpec(mask_id=MASK, vocab_size=5000, special_ids=SPECIALS, max_predictions=80)


def _rows(num, *, seed, min_words=10, max_words=200, max_pieces=3):
    """[CLS] words [SEP] words [SEP]; words of 1..max_pieces pieces."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num):
        ids, starts = [CLS], [1]
        num_words = int(rng.integers(min_words, max_words + 1))
        cut = int(rng.integers(1, num_words))
        for w in range(num_words):
            if w == cut:
                ids.append(SEP)
                starts.append(1)
            pieces = int(rng.integers(1, max_pieces + 1))
            ids += rng.integers(7, 5000, size=pieces).tolist()
            starts += [1] + [0] * (pieces - 1)
        rows.append((np.array(ids + [SEP], np.int32), np.array(starts + [1], np.int32)))
    return rows


def _mask_all(rows, seed=0):
    def gen():
        for ids, starts in rows:
            yield {"input_ids": ids, "word_starts": starts}

    sig = {k: tf.TensorSpec([None], tf.int32) for k in ("input_ids", "word_starts")}
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig).enumerate()
    ds = ds.map(
        lambda i, f: spanbert.mask_spans(
            f, seed=tf.stack([tf.constant(seed, tf.int64), i]), spec=SPEC
        )
    )
    return list(ds.as_numpy_iterator())


def _runs(chosen):
    runs, start = [], None
    for i, c in enumerate(list(chosen) + [False]):
        if c and start is None:
            start = i
        if not c and start is not None:
            runs.append((start, i - 1))
            start = None
    return runs


def test_closed_form_mean_is_3_797_words():
    mean = spanbert.expected_span_length(p=0.2, max_length=10)
    assert round(mean, 3) == 3.797
    pmf = spanbert.span_length_probabilities(p=0.2, max_length=10)
    np.testing.assert_allclose(pmf.sum(), 1.0)
    np.testing.assert_allclose(np.sum(np.arange(1, 11) * pmf), mean, rtol=1e-12)
    # Rejection of draws above 10 gives the same law as renormalising: check by simulation.
    rng = np.random.default_rng(0)
    raw = rng.geometric(0.2, size=400_000)
    kept = raw[raw <= 10]
    assert abs(kept.mean() - mean) < 5 * kept.std() / np.sqrt(len(kept))


def test_sampler_histogram_and_mean_match_clipped_geometric():
    n = 60_000
    lengths = spanbert.sample_span_lengths([n], seed=tf.constant([3, 4])).numpy()
    assert lengths.min() >= 1 and lengths.max() <= 10
    pmf = spanbert.span_length_probabilities()
    observed = np.bincount(lengths, minlength=11)[1:] / n
    np.testing.assert_array_less(np.abs(observed - pmf), 5 * np.sqrt(pmf * (1 - pmf) / n))
    mean, var = spanbert.expected_span_length(), np.sum((np.arange(1, 11) ** 2) * pmf)
    std = np.sqrt(var - mean**2)
    assert abs(lengths.mean() - mean) < 5 * std / np.sqrt(n), lengths.mean()


def test_budget_exact_spans_start_at_word_starts_and_sbo_targets():
    rows = _rows(150, seed=1)
    outs = _mask_all(rows)
    all_masked_runs = masked_fraction = 0
    for (ids, starts), out in zip(rows, outs, strict=True):
        n = int(np.sum(~np.isin(ids, SPECIALS)))
        budget = min(SPEC.max_predictions, max(1, round(0.15 * n)), n)
        k = int(out["masked_weights"].sum())
        assert k == budget  # exactly the budget
        positions = out["masked_positions"][:k]
        assert not np.isin(ids[positions], SPECIALS).any()
        chosen = np.zeros(len(ids), bool)
        chosen[positions] = True
        runs = _runs(chosen)
        mid_word_ends = 0
        for s, e in runs:
            assert starts[s] == 1, (s, e)  # spans start at word starts
            nxt = e + 1
            mid_word_ends += nxt < len(ids) and starts[nxt] == 0 and ids[nxt] not in SPECIALS
            is_mask = out["input_ids"][s : e + 1] == MASK
            assert is_mask.all() or not is_mask.any()  # one decision per span
            all_masked_runs += is_mask.all()
        assert mid_word_ends <= 1  # only the last span may be cut by the budget
        # SBO: boundaries just outside the run, offsets inside it
        run_of = {p: (s, e) for s, e in runs for p in range(s, e + 1)}
        for j, p in enumerate(positions):
            s, e = run_of[int(p)]
            assert out["span_left_positions"][j] == s - 1
            assert out["span_right_positions"][j] == e + 1
            assert out["span_offsets"][j] == p - s
            assert not chosen[s - 1] and not chosen[e + 1]
        assert (out["span_offsets"][k:] == 0).all()
        masked_fraction += len(runs)
    p = 0.8
    assert abs(all_masked_runs / masked_fraction - p) < 5 * np.sqrt(p * (1 - p) / masked_fraction)


def test_span_lengths_in_words_follow_the_sampler_when_budget_is_loose():
    # One-piece words, a long sequence and a big budget: most runs are single spans.
    rows = _rows(40, seed=2, min_words=400, max_words=400, max_pieces=1)
    lengths = []
    for (ids, _), out in zip(rows, _mask_all(rows, seed=9), strict=True):
        k = int(out["masked_weights"].sum())
        chosen = np.zeros(len(ids), bool)
        chosen[out["masked_positions"][:k]] = True
        lengths += [e - s + 1 for s, e in _runs(chosen)]
    # Merged neighbours and the budget cut bias this a little; it must stay near 3.8 words.
    assert 3.0 < np.mean(lengths) < 4.6, np.mean(lengths)
    assert max(lengths) >= 8


def test_determinism():
    ids, starts = _rows(1, seed=3, min_words=100)[0]
    f = {"input_ids": tf.constant(ids), "word_starts": tf.constant(starts)}
    a = spanbert.mask_spans(f, seed=tf.constant([1, 1]), spec=SPEC)
    b = spanbert.mask_spans(f, seed=tf.constant([1, 1]), spec=SPEC)
    c = spanbert.mask_spans(f, seed=tf.constant([1, 2]), spec=SPEC)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["masked_positions"], c["masked_positions"])


def _unit_index(maskable, starts):
    """Word number of each maskable token (-1 elsewhere): a word starts at a flagged token or
    after a token that cannot be masked."""
    index, word = np.full(len(maskable), -1), -1
    for i, m in enumerate(maskable):
        if m and (starts[i] or i == 0 or not maskable[i - 1]):
            word += 1
        if m:
            index[i] = word
    return index


def _spanbert_rule(maskable, starts, budget, draws):
    """SpanBERT's sampling loop on one row, restated in plain Python, fed the row's draws of
    each turn (`draws(t)` -> the length's and the anchor's uniform)."""
    index = _unit_index(maskable, starts)
    candidates = np.flatnonzero(maskable)
    cumulative = np.cumsum(spanbert.span_length_probabilities()).astype(np.float32)[:-1]
    chosen, count, turn = np.zeros(len(maskable), bool), 0, 0
    while count < budget:
        u_length, u_anchor = draws(turn)
        turn += 1
        words = 1 + int(np.sum(u_length >= cumulative))
        pick = min(int(u_anchor * np.float32(len(candidates))), len(candidates) - 1)
        word = index[candidates[pick]]
        if chosen[np.flatnonzero(index == word)[0]]:  # the word's first piece is taken
            continue
        for i in range(len(maskable)):
            if word <= index[i] < word + words and not chosen[i] and count < budget:
                chosen[i], count = True, count + 1
    return chosen


def test_group_sampler_is_spanbert_loop_on_each_row():
    # A group of rows of different lengths (the rest padding), words of 1-3 pieces, some rows
    # with a budget far above 15% so that rejections and cut spans are common.
    rng = np.random.default_rng(4)
    width, num = 90, 24
    maskable, starts, budgets = np.zeros((num, width), bool), np.zeros((num, width), int), []
    for g in range(num):
        length = int(rng.integers(3, width + 1))
        maskable[g, 1 : length - 1] = rng.random(length - 2) > 0.05  # a few specials inside
        starts[g, :length] = rng.random(length) < 0.6
        budgets.append(min(int(maskable[g].sum()), int(rng.integers(0, 30))))
    seed = tf.constant([7, 11], tf.int64)
    got = spanbert.choose_spans(
        tf.constant(maskable),
        tf.constant(starts, tf.int32),
        tf.constant(budgets, tf.int32),
        seed=seed,
        p=0.2,
        max_length=10,
    ).numpy()
    turns = {}

    def draws_of(g):
        def draws(t):
            if t not in turns:
                turns[t] = spanbert.turn_draws(seed, tf.constant(t), num).numpy()
            return turns[t][g]

        return draws

    for g in range(num):
        want = _spanbert_rule(maskable[g], starts[g], budgets[g], draws_of(g))
        np.testing.assert_array_equal(got[g], want, err_msg=f"row {g}")
    assert sum(budgets) > 200 and len(turns) > 10


def test_group_masking_gives_each_row_its_spans_and_sbo_targets():
    # Rows masked in groups (as the task does), some without [SEP] so a run can end at the
    # row's last token: its right boundary is clipped to the row, not to the group's width.
    rows = _rows(40, seed=5, min_words=3, max_words=60)
    rows += [(ids[:-1], starts[:-1]) for ids, starts in _rows(8, seed=6, max_words=12)]
    sig = {k: tf.TensorSpec([None], tf.int32) for k in ("input_ids", "word_starts")}
    gen = lambda: ({"input_ids": i, "word_starts": s} for i, s in rows)
    ds = tf.data.Dataset.from_generator(gen, output_signature=sig)
    spec = mlm.MlmSpec(
        mask_id=MASK, vocab_size=5000, special_ids=SPECIALS, max_predictions=80, mask_rate=0.5
    )
    with seqio.map_seed_manager(3):
        outs = list(spanbert.spanbert_dynamic_mlm(ds, spec=spec).as_numpy_iterator())
    clipped = 0
    for (ids, _), out in zip(rows, outs, strict=True):
        assert len(out["input_ids"]) == len(ids)
        n = int(np.sum(~np.isin(ids, SPECIALS)))
        k = int(out["masked_weights"].sum())
        assert k == min(80, max(1, round(0.5 * n)), n)
        chosen = np.zeros(len(ids), bool)
        chosen[out["masked_positions"][:k]] = True
        run_of = {p: (s, e) for s, e in _runs(chosen) for p in range(s, e + 1)}
        for j, p in enumerate(out["masked_positions"][:k]):
            s, e = run_of[int(p)]
            assert out["span_left_positions"][j] == max(s - 1, 0)
            assert out["span_right_positions"][j] == min(e + 1, len(ids) - 1)
            assert out["span_offsets"][j] == p - s
            clipped += e == len(ids) - 1
        for key in spanbert.SBO_KEYS:
            assert (out[key][k:] == 0).all()
    assert clipped > 0


def test_run_boundaries_example():
    starts, ends = spanbert.run_boundaries(tf.constant([False, True, True, False, True]))
    np.testing.assert_array_equal(np.asarray(starts)[[1, 2, 4]], [1, 1, 4])
    np.testing.assert_array_equal(np.asarray(ends)[[1, 2, 4]], [2, 2, 4])
    # A group: each row's runs on their own.
    group = tf.constant([[False, True, True, False, True], [True, True, False, False, True]])
    starts, ends = spanbert.run_boundaries(group)
    np.testing.assert_array_equal(np.asarray(starts)[group.numpy()], [1, 1, 4, 0, 0, 4])
    np.testing.assert_array_equal(np.asarray(ends)[group.numpy()], [2, 2, 4, 1, 1, 4])


def test_span_lengths_invert_the_cumulative_p():
    # Cumulative p of Geo(0.2) clipped at 10: 0.2241, 0.4034, 0.5468, ...
    got = spanbert.span_lengths(tf.constant([0.0, 0.1, 0.2240, 0.2242, 0.5, 0.9999]))
    np.testing.assert_array_equal(got, [1, 1, 1, 2, 3, 10])
