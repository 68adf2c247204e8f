"""Oracle tests for UniLM mode sampling, masking and attention masks."""

import collections
import itertools
import math

import numpy as np
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import unilm

CLS, SEP, MASK, VOCAB = 2, 3, 4, 1000


def test_seq2seq_mask_small_case_exactly():
    got = unilm.unilm_attention_mask(mode=unilm.SEQ2SEQ, length=5, source_length=2).numpy()
    want = np.array(
        [
            [1, 1, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1],
        ],
        bool,
    )
    np.testing.assert_array_equal(got, want)
    lower = np.tril(np.ones((4, 4), bool))
    np.testing.assert_array_equal(unilm.unilm_attention_mask(mode=1, length=4).numpy(), lower)
    np.testing.assert_array_equal(unilm.unilm_attention_mask(mode=2, length=4).numpy(), lower.T)
    assert unilm.unilm_attention_mask(mode=0, length=4).numpy().all()


def test_modes_layout_and_masking():
    num, n = 1800, 20  # chunks of targets - 3 = 20 tokens; budget round(0.15 * 20) = 3
    stream = np.arange(num * n, dtype=np.int32) % 900 + 50
    ds = tf.data.Dataset.from_tensor_slices({"targets": stream.reshape(-1, 100)})
    with seqio.map_seed_manager(6):
        out = list(
            unilm.unilm(
                ds,
                sequence_length={"targets": 23},
                cls_id=CLS,
                sep_id=SEP,
                mask_id=MASK,
                vocab_size=VOCAB,
                special_ids=range(7),
            ).as_numpy_iterator()
        )
    assert len(out) == num
    modes = np.bincount([x["unilm_mode"] for x in out], minlength=4)
    for count, p in zip(modes, unilm.MODE_PROBABILITIES, strict=True):
        assert abs(count - num * p) < 5 * math.sqrt(num * p * (1 - p))
    replaced = 0
    for i, x in enumerate(out):
        chunk, ids, mode = stream[i * n : (i + 1) * n], x["input_ids"], x["unilm_mode"]
        pair = mode in (unilm.BIDIRECTIONAL, unilm.SEQ2SEQ)
        assert ids[0] == CLS and ids[-1] == SEP and len(ids) == n + 2 + pair
        if pair:
            split = x["source_length"] - 2
            assert ids[split + 1] == SEP and 1 <= split < n
            original = np.concatenate([[CLS], chunk[:split], [SEP], chunk[split:], [SEP]])
            # unilm-v1 seq2seq_loader.py (new_segment_ids): bidirectional 0/1, seq2seq 4/5.
            first, second = (0, 1) if mode == unilm.BIDIRECTIONAL else (4, 5)
            want = [first] * (split + 2) + [second] * (n - split + 1)
            assert x["token_type_ids"].tolist() == want
        else:
            # Left-to-right 2 throughout, right-to-left 3 (modeling.py's type-embedding init).
            kind = 2 if mode == unilm.LEFT_TO_RIGHT else 3
            assert x["source_length"] == 0 and (x["token_type_ids"] == kind).all()
            original = np.concatenate([[CLS], chunk, [SEP]])
        # The types alone name the mode.
        assert {0: 0, 2: 1, 3: 2, 4: 3}[int(x["token_type_ids"][0])] == mode
        assert x["masked_weights"].tolist() == [1.0, 1.0, 1.0]
        positions = x["masked_positions"]
        assert len(set(positions.tolist())) == 3
        assert (x["masked_ids"] == original[positions]).all()
        assert not np.isin(original[positions], [CLS, SEP]).any()
        unmasked = np.ones(len(ids), bool)
        unmasked[positions] = False
        np.testing.assert_array_equal(ids[unmasked], original[unmasked])
        replaced += (ids[positions] == MASK).sum()
    total = 3 * num
    assert abs(replaced / total - 0.8) < 5 * math.sqrt(0.16 / total)


def test_units_are_80_percent_unigrams_10_bigrams_10_trigrams():
    drawn = unilm.sample_units(rows=300, budget=40, seed=tf.constant([0, 2])).numpy()
    units = []
    for row in drawn:
        kept = row[row > 0]
        assert kept.sum() == 40 and (row[len(kept) :] == 0).all()
        units.extend(kept[:-1].tolist())  # the last unit is trimmed to the budget
    counts = np.bincount(units, minlength=4)[1:]
    total = counts.sum()
    for count, p in zip(counts, unilm.NGRAM_PROBABILITIES, strict=True):
        assert abs(count - total * p) < 5 * math.sqrt(total * p * (1 - p))


def _layouts(n, units):
    """Every placement of `units` (in order, without overlap) in n positions, as bool tuples."""
    slots = n - sum(units) + len(units)
    layouts = []
    for chosen in itertools.combinations(range(slots), len(units)):
        mask, unit = [], iter(units)
        for slot in range(slots):
            width = next(unit) if slot in chosen else 1
            mask += [slot in chosen] * width
        layouts.append(tuple(mask))
    return layouts


def test_place_units_gives_every_layout_equal_chance_in_each_row():
    # Rows of one call hold different units: [2, 1] has C(5, 2) = 10 layouts in 6 positions,
    # [1, 1, 1] C(6, 3) = 20, and [3, 0, 0] (zeros after the last unit) 4.
    shapes = {0: [2, 1, 0], 1: [1, 1, 1], 2: [3, 0, 0]}
    rows = 9000
    units = np.array([shapes[i % 3] for i in range(rows)], np.int32)
    got = unilm.place_units(n=6, units=tf.constant(units), seed=tf.constant([3, 4])).numpy()
    # Chi-square critical values at p = 0.001 for 9, 19 and 3 degrees of freedom.
    for kind, critical in ((0, 27.88), (1, 43.82), (2, 16.27)):
        want = _layouts(6, [u for u in shapes[kind] if u])
        counts = collections.Counter(tuple(row) for row in got[kind::3])
        assert set(counts) <= set(want), set(counts) - set(want)
        expected = (rows // 3) / len(want)
        chi = sum((counts[layout] - expected) ** 2 / expected for layout in want)
        assert chi < critical, (kind, chi, counts)


def test_shuffled_units_take_every_layout_of_either_order():
    # Units [3, 1] in 6 positions: 6 placements with the trigram first and 6 with it second,
    # each 1/12 once the order is shuffled (in draw order the trigram would always come first).
    rows = 6000
    units = tf.constant([[3, 1, 0]] * rows, tf.int32)
    shuffled = unilm.shuffle_units(units=units, seed=tf.constant([5, 6]))
    pairs = shuffled.numpy()
    assert (np.sort(pairs[:, :2], axis=1) == [1, 3]).all() and (pairs[:, 2] == 0).all()
    got = unilm.place_units(n=6, units=shuffled, seed=tf.constant([7, 8])).numpy()
    # 12 placements, 9 masks: a trigram next to the unigram looks the same either way round.
    want = collections.Counter(_layouts(6, [3, 1]) + _layouts(6, [1, 3]))
    counts = collections.Counter(tuple(row) for row in got)
    assert sum(want.values()) == 12 and set(counts) == set(want), set(counts) ^ set(want)
    chi = sum((counts[mask] - rows * k / 12) ** 2 / (rows * k / 12) for mask, k in want.items())
    assert chi < 26.12, (chi, counts)  # 8 degrees of freedom, p = 0.001
