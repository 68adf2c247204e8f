"""Oracle tests for XLNet's permutation-LM data (zihangdai/xlnet data_utils.py restated)."""

import itertools
import math

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data import corpora, feature_converters, tasks, tokenization
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import xlnet

CLS, SEP, EOD = 2, 3, 6
FUNCTIONAL = dict(cls_id=CLS, sep_id=SEP, eod_id=EOD)


def _corpus(seed, *, docs, max_sentences, max_sentence_len):
    """Documents of sentences of unique ids >= 10, the stream the reference would build from
    them (<eod> after each document) and its sentence starts (never on <eod>)."""
    rng = np.random.default_rng(seed)
    documents, stream, starts, next_id = [], [], [], 10
    for _ in range(docs):
        sentences = []
        for _ in range(rng.integers(1, max_sentences + 1)):
            length = int(rng.integers(1, max_sentence_len + 1))
            sentences.append(list(range(next_id, next_id + length)))
            stream += sentences[-1]
            starts += [True] + [False] * (length - 1)
            next_id += length
        documents.append(sentences)
        stream.append(EOD)
        starts.append(False)
    return documents, np.array(stream), np.array(starts)


def _examples(documents, seed=8, **options):
    ds = tf.data.Dataset.from_tensor_slices({"sentence_ids": tf.ragged.constant(documents)})
    with seqio.map_seed_manager(seed):
        out = xlnet.permutation_lm_streams(ds, **FUNCTIONAL, **options)
        return list(out.as_numpy_iterator())


def _reference_trim(a, b, total):
    while a + b > total:  # _split_a_and_b's loop, verbatim in behaviour
        if a > b:
            a -= 1
        else:
            b -= 1
    return a, b


def test_trimmed_lengths_match_the_reference_loop():
    grid = [(a, b, t) for a in range(1, 30) for b in range(1, 30) for t in range(2, 40)]
    a, b, t = (tf.constant(c) for c in zip(*grid, strict=True))
    got = np.stack([x.numpy() for x in xlnet.trimmed_lengths(a, b, total=t)], axis=1)
    want = np.array([_reference_trim(*g) for g in grid])
    np.testing.assert_array_equal(got, want)


def test_local_perm_reproduces_the_reference_by_hand():
    # reuse [r0 r1 r2 r3] + rest [a1 a2 <sep> b1 <sep> <cls>], perm_size 2; r1, r2, a2, b1 are
    # masked and so is the second <sep> (the reference's sampler may pick one; it is dropped).
    # Both parts shuffle the two rows of their [2, blocks] index with order [1, 0], so the ranks
    # are [1 0 3 2] and [1 0 3 2 5 4]. Derived by hand from _local_perm and the parser's concat:
    input_k = tf.constant([11, 12, 13, 14, 21, 22, SEP, 31, SEP, CLS])
    masked = tf.constant([0, 1, 1, 0, 0, 1, 0, 1, 1, 0]) > 0
    functional = tf.constant([0, 0, 0, 0, 0, 0, 1, 0, 1, 1]) > 0
    out = xlnet.permutation_features(
        input_k,
        masked,
        functional,
        reuse_len=4,
        num_predict=5,
        reuse_order=tf.constant([1, 0]),
        rest_order=tf.constant([1, 0]),
    )
    expected_perm_mask = [
        [0, 1, 1, 0, 1, 1, 1, 1, 1, 1],
        [0, 1, 1, 0, 1, 1, 1, 1, 1, 1],
        [0, 0, 1, 0, 1, 1, 1, 1, 1, 1],
        [0, 1, 1, 0, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 1],
        [0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 1, 0],
    ]
    np.testing.assert_array_equal(out["perm_mask"].numpy(), expected_perm_mask)
    np.testing.assert_array_equal(out["input_q"].numpy(), [0, 1, 1, 0, 0, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(out["target"].numpy(), [12, 13, 22, 31, 0])
    np.testing.assert_array_equal(out["target_mask"].numpy(), [1, 1, 1, 1, 0])
    expected_mapping = np.zeros([5, 10])
    expected_mapping[[0, 1, 2, 3], [1, 2, 5, 7]] = 1
    np.testing.assert_array_equal(out["target_mapping"].numpy(), expected_mapping)
    np.testing.assert_array_equal(xlnet.block_ranks(6, tf.constant([1, 0])), [1, 0, 3, 2, 5, 4])


def test_span_begins_follow_the_sequential_cursor():
    rng = np.random.default_rng(0)
    for n, count in [(40, 7), (200, 33), (12, 1)]:
        rows = []
        for _ in range(4):
            allowed = np.flatnonzero(rng.random(n) < 0.6).tolist() + [n]
            next_start = [min(a for a in allowed if a >= p) for p in range(n + 1)]
            left = rng.integers(0, 6, count)
            advance = rng.integers(0, 9, count)
            cursor, want = 0, []
            for k in range(count):  # the reference's while loop, one span at a time
                want.append(next_start[min(cursor + left[k], n)])
                cursor = want[-1] + advance[k]
            rows.append((next_start, left, advance, want))
            one = xlnet.span_begins(*(tf.constant(v, tf.int32) for v in rows[-1][:3]))
            np.testing.assert_array_equal(np.minimum(one, n), np.minimum(want, n))
        group = xlnet.span_begins(
            *(tf.constant(v, tf.int32) for v in list(zip(*rows, strict=True))[:3])
        )
        np.testing.assert_array_equal(np.minimum(group, n), np.minimum([r[3] for r in rows], n))


def _reference_sample(can_start, grams, offsets, scores, *, goal, mask_alpha, mask_beta):
    """`_sample_mask`'s loop, fed the draws `sampler_draws` made (float32 offsets and scores)."""
    n = len(scores)
    mask, num, cursor = np.zeros(n, bool), 0, 0
    for gram, offset in zip(grams, offsets, strict=True):
        if num >= goal:
            break
        gram = min(int(gram), goal - num)
        context = gram * mask_alpha // mask_beta
        left = int(np.float32(offset) * np.float32(context))
        begin = cursor + left
        while begin < n and not can_start[begin]:
            begin += 1
        if begin >= n or begin + gram >= n:
            break
        mask[begin : begin + gram] = True
        num += gram
        cursor = begin + gram + context - left
    free = np.flatnonzero(~mask)  # the rest uniformly: here the highest scores
    mask[free[np.argsort(-scores[free], kind="stable")[: goal - num]]] = True
    return mask


@pytest.mark.parametrize(
    "n, goal, max_gram, alpha, beta, start_rate",
    [
        (256, 43, 5, 6, 1, 0.7),
        (61, 10, 5, 6, 1, 1.0),
        (30, 12, 3, 4, 2, 0.3),
        (20, 19, 2, 1, 1, 0.5),
    ],
)
def test_group_sampler_follows_the_reference_loop(n, goal, max_gram, alpha, beta, start_rate):
    # Covers spans cut by the segment's end, spans that never start (no start piece left), and
    # the uniform top-up; each row of the group has its own seed and start pieces.
    rng = np.random.default_rng(n)
    group = 24
    draws = [
        xlnet.sampler_draws(tf.constant([s, 7]), n=n, goal=goal, max_gram=max_gram)
        for s in range(group)
    ]
    stacked = {k: tf.stack([d[k] for d in draws]) for k in draws[0]}
    can_start = rng.random((group, n)) < start_rate
    got = xlnet.predicted_from_draws(
        **stacked, can_start=tf.constant(can_start), mask_alpha=alpha, mask_beta=beta
    ).numpy()
    for row, d in enumerate(draws):
        args = (can_start[row], *(d[k].numpy() for k in ("grams", "offsets", "scores")))
        want = _reference_sample(*args, goal=goal, mask_alpha=alpha, mask_beta=beta)
        np.testing.assert_array_equal(got[row], want)
        assert want.sum() == goal


def test_sampler_spans_start_at_start_pieces_and_hit_the_goal():
    n, goal = 600, 40  # spans need at most 7 * 40 + 2 * 40 tokens: no uniform top-up
    can_start = tf.range(n) % 3 == 0
    for seed in range(5):
        chosen = xlnet.sample_predicted(n=n, goal=goal, seed=[seed, 1], can_start=can_start)
        chosen = chosen.numpy().astype(int)
        run_starts = np.flatnonzero(np.diff(np.r_[0, chosen]) == 1)
        assert chosen.sum() == goal and (run_starts % 3 == 0).all()
    free = xlnet.sample_predicted(n=n, goal=goal, seed=[0, 1]).numpy().astype(int)
    assert free.sum() == goal and (np.flatnonzero(np.diff(np.r_[0, free]) == 1) % 3).any()


def _reference_local_perm(is_masked, is_functional, rank):
    """`_local_perm` as released, with its shuffled index given as each position's rank."""
    non_functional = ~is_functional
    non_masked = ~is_masked & non_functional
    rev_index = np.where(non_masked, -1, rank)
    target = ~non_masked & non_functional
    self_rev_index = np.where(target, rev_index, rev_index + 1)
    perm_mask = (self_rev_index[:, None] <= rev_index[None, :]) & ~non_masked[None, :]
    return perm_mask, target


def test_group_features_equal_the_reference_per_example():
    rng = np.random.default_rng(3)
    group, reuse, length, perm, predict = 12, 8, 24, 4, 12
    input_k = rng.integers(10, 99, (group, length))
    masked = rng.random((group, length)) < 0.3
    first_sep = reuse + rng.integers(1, length - reuse - 3, group)
    positions = np.arange(length)
    functional = (positions == first_sep[:, None]) | (positions >= length - 2)
    orders = [np.stack([rng.permutation(perm) for _ in range(group)]) for _ in range(2)]
    out = xlnet.permutation_features(
        tf.constant(input_k, tf.int32),
        tf.constant(masked),
        tf.constant(functional),
        reuse_len=reuse,
        num_predict=predict,
        reuse_order=tf.constant(orders[0], tf.int32),
        rest_order=tf.constant(orders[1], tf.int32),
    )
    out = {k: v.numpy() for k, v in out.items()}
    for g in range(group):
        parts = []
        for order, span in zip(orders, (np.arange(reuse), np.arange(reuse, length)), strict=True):
            local = span - span[0]
            rank = local - local % perm + order[g][local % perm]
            parts.append(_reference_local_perm(masked[g, span], functional[g, span], rank))
        (pm0, t0), (pm1, t1) = parts
        rest = length - reuse
        want = np.block([[pm0, np.ones((reuse, rest), bool)], [np.zeros((rest, reuse), bool), pm1]])
        np.testing.assert_array_equal(out["perm_mask"][g], want)
        target = np.r_[t0, t1]
        np.testing.assert_array_equal(out["input_q"][g], target)
        predicted = np.flatnonzero(target)
        assert len(predicted) < predict  # padded slots follow the targets
        mapping = np.zeros((predict, length))
        mapping[np.arange(len(predicted)), predicted] = 1
        np.testing.assert_array_equal(out["target_mapping"][g], mapping)
        want_target = np.r_[input_k[g, predicted], np.zeros(predict - len(predicted))]
        np.testing.assert_array_equal(out["target"][g], want_target)
        np.testing.assert_array_equal(out["target_mask"][g], mapping.sum(axis=1))


def _reference_split(starts, *, begin, tot_len, coin, pick, place):
    """`_split_a_and_b` on one row (sentence starts instead of sentence ids), its random
    choices given: coin (random.random()), pick (its cut's index), place (B's begin)."""
    n = len(starts)
    end, cuts = begin + 1, []
    while end < n:
        if starts[end]:
            if end - begin >= tot_len:
                break
            cuts.append(end)
        end += 1
    a_end = cuts[pick % len(cuts)] if cuts else end
    is_random = not cuts or coin < 0.5
    if is_random:
        b_len = max(1, tot_len - (a_end - begin))
        b_begin = place % (n - b_len)
        b_end = b_begin + b_len
        while b_begin > 0 and not starts[b_begin]:
            b_begin -= 1
        while b_end < n - 1 and not starts[b_end]:
            b_end += 1
    else:
        b_begin, b_end = a_end, end
    a_len, b_len = _reference_trim(a_end - begin, b_end - b_begin, tot_len)
    return a_len, b_begin, b_len, is_random


def test_group_split_follows_the_reference_loop():
    rng = np.random.default_rng(4)
    size, group, tot_len = 300, 200, 13
    starts = rng.random((4, size)) < np.array([[0.02], [0.1], [0.4], [0.0]])
    # Row 3: a window before 150 has no cut, so B is random and one token long; placed at
    # 297 or 298, it widens to [297, 299): the reference stops B's end at n - 1.
    starts[3, [0, 150, size - 3]] = True
    row = np.r_[rng.integers(0, 3, group), np.full(20, 3)]
    begin = np.r_[rng.integers(1, size - tot_len - 3, group), rng.integers(1, 150 - tot_len, 20)]
    coin = rng.random(group + 20).astype(np.float32)
    bits = rng.integers(-(2**31), 2**31 - 1, (2, group + 20))
    bits[1, group:] = size - 3 + np.arange(20) % 2
    got = xlnet.split_a_and_b(
        xlnet.sentence_tables(tf.constant(starts)),
        row=tf.constant(row, tf.int32),
        begin=tf.constant(begin, tf.int32),
        tot_len=tot_len,
        coin=tf.constant(coin),
        cut_bits=tf.constant(bits[0], tf.int32),
        place_bits=tf.constant(bits[1], tf.int32),
    )
    got = np.stack([x.numpy().astype(int) for x in got], axis=1)
    unsigned = bits.astype(np.int64) % 2**32
    want = [
        _reference_split(starts[r], begin=b, tot_len=tot_len, coin=c, pick=int(p), place=int(q))
        for r, b, c, p, q in zip(row, begin, coin, *unsigned, strict=True)
    ]
    np.testing.assert_array_equal(got, np.array(want, dtype=int))
    assert 0 < got[:group, 3].sum() < group  # both kinds of B
    assert (got[group:, 1:3] == [size - 3, 2]).all()


def test_uniform_below_is_tf_stateless_uniform_int():
    # The split draws 32 bits per choice and reduces them later, when the range is known.
    rng = np.random.default_rng(5)
    for seed, high in zip(
        rng.integers(-(2**31), 2**31 - 1, (300, 2)),
        rng.choice([1, 2, 3, 7, 100, 4095, 16641, 2**20 + 3, 2**31 - 2], 300),
        strict=True,
    ):
        seed = tf.constant(seed, tf.int32)
        want = tf.random.stateless_uniform([], seed, minval=0, maxval=high, dtype=tf.int32)
        bits = tf.random.stateless_uniform([], seed, minval=None, maxval=None, dtype=tf.int32)
        assert xlnet.uniform_below(bits, high) == want
    assert xlnet.uniform_below(tf.constant(-1), 10) == 5


def test_start_piece_table_follows_is_start_piece(tiny_vocab):
    table = xlnet.start_piece_table(tiny_vocab)
    piece = tiny_vocab.tokenizer.id_to_piece
    for i in range(tiny_vocab.tokenizer.get_piece_size()):
        p = piece(i)
        if p.startswith("\u2581") or p in (".", ",", "(", "</s>", "[SEP]"):
            assert table[i], p
        elif len(p) > 1 and p[0].isalnum():
            assert not table[i], p
    assert table[tiny_vocab.vocab_size - 1]  # <extra_id_0>


def test_rows_interleave_and_windows_follow_the_stream():
    seq_len, reuse, rows, steps, tot = 32, 16, 3, 4, 13
    documents, stream, starts = _corpus(1, docs=40, max_sentences=10, max_sentence_len=20)
    out = _examples(
        documents,
        seq_len=seq_len,
        reuse_len=reuse,
        batch_size=rows,
        num_predict=5,
        perm_size=8,
        steps_per_block=steps,
    )
    row_len = steps * reuse + seq_len - reuse
    full, tail = divmod(len(stream), rows * row_len)
    tail_row = tail // rows
    tail_steps = (tail_row - seq_len) // reuse + 1 if tail_row >= seq_len else 0
    assert len(out) == rows * (full * steps + tail_steps) > rows * steps * 3
    where = {int(t): p for p, t in enumerate(stream) if t != EOD}
    seen_eod = 0
    for k, x in enumerate(out):
        block, within = divmod(k, rows * steps)
        step, row = divmod(within, rows)
        assert (x["stream_row"], x["stream_step"]) == (row, step)
        n = row_len if block < full else tail_row
        row_begin = block * rows * row_len + row * n
        begin = row_begin + (step + 1) * reuse  # A starts right after the reuse part
        ids = x["input_k"]
        np.testing.assert_array_equal(ids[:reuse], stream[begin - reuse : begin])
        if step > 0:  # row i of this step continues row i of the step before: its A
            before = out[k - rows]["input_k"]
            a_before = int(np.flatnonzero(before == SEP)[0]) - reuse
            np.testing.assert_array_equal(ids[:a_before], before[reuse : reuse + a_before])
        seps = np.flatnonzero(ids == SEP)
        assert len(seps) == 2 and seps[1] == seq_len - 2 and ids[-1] == CLS
        a_len, b = seps[0] - reuse, ids[seps[0] + 1 : -2]
        assert a_len >= 1 and len(b) >= 1 and a_len + len(b) == tot
        np.testing.assert_array_equal(ids[reuse : seps[0]], stream[begin : begin + a_len])
        b_begin = where[int(b[0])]
        np.testing.assert_array_equal(b, stream[b_begin : b_begin + len(b)])
        if not x["is_random"]:
            assert starts[b_begin]
            assert begin + a_len <= b_begin < begin + tot  # at a cut, continuing A
        else:  # whole sentences from anywhere in the same row (widened to at most its start)
            assert starts[b_begin] or b_begin == row_begin
            assert row_begin <= b_begin < row_begin + n
        assert x["seg_id"].tolist() == [0] * (seps[0] + 1) + [1] * (len(b) + 1) + [2]
        seen_eod += int((ids == EOD).sum())
    assert seen_eod > 0


def test_predictions_split_functional_tokens_and_perm_mask():
    seq_len, reuse = 32, 16
    documents, _, _ = _corpus(2, docs=20, max_sentences=8, max_sentence_len=12)
    out = _examples(
        documents, seq_len=seq_len, reuse_len=reuse, batch_size=2, num_predict=7, perm_size=8
    )
    for x in out:
        q = x["input_q"].astype(bool)
        assert q[:reuse].sum() == 4 and q[reuse:].sum() == 3  # 7 - 7 // 2 and 7 // 2
        functional = np.flatnonzero(np.isin(x["input_k"], [SEP, CLS]))
        assert not q[functional].any()
        predicted = np.flatnonzero(q)
        np.testing.assert_array_equal(x["target_mapping"].argmax(axis=1), predicted)
        np.testing.assert_array_equal(x["target"], x["input_k"][predicted])
        assert x["target_mask"].tolist() == [1.0] * 7
        pm = x["perm_mask"].astype(bool)
        assert pm[:reuse, reuse:].all() and not pm[reuse:, :reuse].any()
        assert pm[predicted, predicted].all()  # a predicted token never sees itself
        for part in (np.arange(reuse), np.arange(reuse, seq_len)):
            seen = part[~q[part] & ~np.isin(part, functional)]
            assert not pm[np.ix_(part, seen)].any()  # the part sees its unpredicted tokens
            assert pm[np.ix_(seen, part[~np.isin(part, seen)])].all()  # which see no other
            mine = part[q[part]]
            sub = pm[np.ix_(mine, mine)]
            assert (sub ^ sub.T)[~np.eye(len(mine), dtype=bool)].all()  # one order


def test_reuse_part_and_rest_draw_their_own_orders():
    # One block per part (perm_size 16): u precedes v in the order iff v may attend u. Where
    # both parts predict the offsets u < v, one shared order would always agree.
    documents, _, _ = _corpus(5, docs=20, max_sentences=8, max_sentence_len=12)
    out = _examples(documents, seq_len=32, reuse_len=16, batch_size=1, num_predict=16, perm_size=16)
    agree = 0
    for x in out:
        pm, q = x["perm_mask"].astype(bool), x["input_q"] > 0
        common = np.flatnonzero(q[:16] & q[16:])
        for u, v in itertools.combinations(common, 2):
            agree += (not pm[v, u]) == (not pm[16 + v, 16 + u])
    pairs = sum(math.comb(int((x["input_q"][:16] * x["input_q"][16:]).sum()), 2) for x in out)
    assert pairs > 50 and 0 < agree < pairs


def test_is_random_is_a_fair_coin_when_every_window_has_a_cut():
    # Sentences of at most tot_len - 1 = 4 tokens put a cut in every window.
    documents, _, _ = _corpus(3, docs=800, max_sentences=12, max_sentence_len=4)
    out = _examples(documents, seq_len=16, reuse_len=8, batch_size=4, num_predict=2, perm_size=4)
    n = len(out)
    assert n >= 1500
    # Hoeffding: P(|mean - 1/2| >= t) <= 2 exp(-2 n t^2) = 1e-6.
    t = math.sqrt(math.log(2 / 1e-6) / (2 * n))
    assert abs(np.mean([x["is_random"] for x in out]) - 0.5) < t
    # One endless sentence: no cut anywhere, so B is always random (the reference's label 0).
    one_sentence = [[list(range(10, 410))]]
    out = _examples(one_sentence, seq_len=16, reuse_len=8, batch_size=1, num_predict=2, perm_size=4)
    assert len(out) > 40 and all(x["is_random"] == 1 for x in out)


def test_same_seed_same_examples():
    documents, _, _ = _corpus(4, docs=10, max_sentences=8, max_sentence_len=12)
    options = dict(seq_len=32, reuse_len=16, batch_size=2, num_predict=5, perm_size=16)
    a, b, c = _examples(documents, **options), _examples(documents, **options), _examples(
        documents, seed=9, **options)  # fmt: skip
    assert all((x[k] == y[k]).all() for x, y in zip(a, b, strict=True) for k in x)
    assert any((x["perm_mask"] != y["perm_mask"]).any() for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(reuse_len=64), "reuse_len=64 must"),
        (dict(reuse_len=60, perm_size=4), "reuse_len=60 must"),
        (dict(reuse_len=8, perm_size=8, num_predict=20), "num_predict=20 splits into 10"),
        (dict(reuse_len=32, perm_size=5), "perm_size=5 must divide"),
        (dict(reuse_len=32, perm_size=32, batch_size=0), "batch_size=0"),
        (dict(reuse_len=32, perm_size=32, mask_beta=0), "mask_beta=0"),
    ],
)
def test_bad_options_name_the_value(options, message):
    full = {**dict(seq_len=64, num_predict=10, batch_size=1, perm_size=8), **options}
    with pytest.raises(ValueError, match=message):
        xlnet.permutation_lm_streams(tf.data.Dataset.range(0), **FUNCTIONAL, **full)


def test_seqio_entry_defaults_and_odd_lengths():
    ds = tf.data.Dataset.range(0)
    with pytest.raises(ValueError, match="perm_size=32 must divide .* = 33"):
        xlnet.permutation_lm(ds, sequence_length={"input_k": 65}, **FUNCTIONAL)
    with pytest.raises(ValueError, match="need sequence_length"):
        xlnet.permutation_lm(ds, sequence_length={"targets": 64}, **FUNCTIONAL)
    assert xlnet.prediction_split(85) == (43, 42)


def test_wiki_sample_task_at_512_matches_the_reference_figures():
    seq_len, reuse, num_predict, rows = 512, 256, 85, 2
    # create_tfrecords: num_predict_1 = num_predict // 2 for the rest, the remainder for reuse.
    rest_goal = num_predict // 2
    reuse_goal = num_predict - rest_goal
    plain = tasks.build_task("wiki_sample", "xlnet_plm", register=False)
    task = xlnet.stream_task(plain, batch_size=rows, register=False)
    assert task.name == "wiki_sample_xlnet_plm_rows2"
    lengths = {"input_k": seq_len, "target": num_predict}
    with pytest.raises(ValueError, match="Shuffling is disallowed"):
        task.get_dataset(lengths, split="validation", shuffle=True)
    dataset = task.get_dataset(lengths, split="validation", shuffle=False, seed=0)
    out = list(dataset.take(8).as_numpy_iterator())
    vocab = task.output_features["input_k"].vocabulary
    docs = tokenization.tokenize_sentences(
        corpora.get_corpus("wiki_sample").dataset("validation"), vocab=vocab
    )
    eod = vocab_lib.EOS_ID
    stream = np.concatenate(
        [np.r_[np.concatenate(d["sentence_ids"]), eod] for d in docs.as_numpy_iterator()]
    )
    row_len = xlnet.STEPS_PER_BLOCK * reuse + seq_len - reuse
    assert len(stream) >= rows * row_len  # the first block is a full one
    for k, x in enumerate(out):
        step, row = divmod(k, rows)
        assert (x["stream_step"], x["stream_row"]) == (step, row)
        begin = row * row_len + step * reuse
        np.testing.assert_array_equal(x["input_k"][:reuse], stream[begin : begin + reuse])
        q = x["input_q"].astype(bool)
        assert q[:reuse].sum() == reuse_goal == 43 and q[reuse:].sum() == rest_goal == 42
        assert x["target_mapping"].shape == (num_predict, seq_len)
        assert x["perm_mask"].shape == (seq_len, seq_len) and x["target_mask"].sum() == 85
        assert x["input_k"][-1] == vocab_lib.CLS_ID and x["seg_id"][-1] == 2
        assert (x["input_k"] == vocab_lib.SEP_ID).sum() == 2
        assert not q[np.isin(x["input_k"], [vocab_lib.SEP_ID, vocab_lib.CLS_ID])].any()
        assert x["perm_mask"][:reuse, reuse:].all()
    converted = feature_converters.PermutationLmFeatureConverter()(dataset.take(1), lengths)
    assert next(iter(converted))["target"].shape == (num_predict,)
    # The registered task is one stream: consecutive elements continue each other.
    first, second = plain.get_dataset(lengths, split="validation", shuffle=False).take(2)
    a_len = int(np.flatnonzero(first["input_k"].numpy() == vocab_lib.SEP_ID)[0]) - reuse
    np.testing.assert_array_equal(second["input_k"][:a_len], first["input_k"][reuse:][:a_len])


def test_stream_task_needs_exactly_one_xlnet_step():
    with pytest.raises(ValueError, match="has 0 preprocessors taking `stream`"):
        xlnet.stream_task(
            tasks.build_task("wiki_sample", "causal_lm", register=False), batch_size=2
        )
