"""Oracle tests for StructBERT's word- and sentence-structure objectives."""

import numpy as np
import tensorflow as tf

from lmsuite.data.preprocessors import mlm, structbert
from lmsuite.data.preprocessors import sentence_pairs as sp
from tests.data.ragged import ragged

CLS, SEP, MASK = 2, 3, 4
SPECIALS = (0, 1, 2, 3, 4, 5, 6)
SPEC = mlm.MlmSpec(mask_id=MASK, vocab_size=100_000, special_ids=SPECIALS, max_predictions=40)
BASE = 10_000


def test_word_structure_shuffles_unmasked_trigrams_and_targets_original_order():
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(80):
        n = int(rng.integers(20, 200))
        body = BASE + np.arange(n)  # distinct ids: any reordering is visible
        cut = int(rng.integers(1, n))
        rows.append(np.concatenate([[CLS], body[:cut], [SEP], body[cut:], [SEP]]).astype(np.int32))
    ds = tf.data.Dataset.from_generator(
        lambda: ({"input_ids": r} for r in rows),
        output_signature={"input_ids": tf.TensorSpec([None], tf.int32)},
    ).enumerate()
    ds = ds.map(
        lambda i, f: structbert.mask_and_shuffle(
            f, seed=tf.stack([tf.constant(1, tf.int64), i]), spec=SPEC, max_trigrams=20
        )
    )
    total_trigrams = 0
    for row, out in zip(rows, ds.as_numpy_iterator(), strict=True):
        k = int(out["masked_weights"].sum())
        masked = set(out["masked_positions"][:k].tolist())
        free = np.array([t not in SPECIALS and i not in masked for i, t in enumerate(row)])
        num_trigram_positions = int(np.sum(free[:-2] & free[1:-1] & free[2:]))
        expected = min(20, round(0.05 * num_trigram_positions))
        m = int(out["shuffled_weights"].sum())
        assert m % 3 == 0
        positions = out["shuffled_positions"][:m]
        np.testing.assert_array_equal(out["shuffled_ids"][:m], row[positions])
        assert not set(positions.tolist()) & masked
        assert not np.isin(row[positions], SPECIALS).any()
        # aligned blocks can run out before the 5% target only in tiny rows
        assert m // 3 <= expected and (m // 3 == expected or len(row) < 40)
        for t in range(0, m, 3):
            block = positions[t : t + 3]
            np.testing.assert_array_equal(block, block[0] + np.arange(3))
            shuffled, original = out["input_ids"][block], row[block]
            assert sorted(shuffled.tolist()) == sorted(original.tolist())
            assert not np.array_equal(shuffled, original)  # never the identity permutation
        untouched = np.ones(len(row), bool)
        untouched[positions] = False
        untouched[list(masked)] = False
        np.testing.assert_array_equal(out["input_ids"][untouched], row[untouched])
        total_trigrams += m // 3
    assert total_trigrams > 100


def _where(t):
    return (t - BASE) // 1000, ((t - BASE) % 1000) // 20


def test_sentence_structure_three_way_labels_are_balanced():
    # Two short sentences per document -> one chunk of two sentences per document.
    num_docs = 450
    docs = [
        [[BASE + d * 1000 + s * 20 + j for j in range(3)] for s in range(2)]
        for d in range(num_docs)
    ]
    ids = ragged(docs, np.int32, ragged_rank=2)
    ds = structbert.structbert_sentence_pairs(
        tf.data.Dataset.from_tensor_slices({sp.IDS_KEY: ids}),
        seed=3,
        max_seq_length=32,
        cls_id=CLS,
        sep_id=SEP,
        short_seq_prob=0.0,
        buffer_size=64,
    )
    primary = {}
    forced = 0
    for ex in ds.as_numpy_iterator():
        ids = ex["input_ids"]
        sep = int(np.where(ids == SEP)[0][0])
        a, b = ids[1:sep], ids[sep + 1 : -1]
        (da, sa), (db, sb) = _where(a[0]), _where(b[0])
        label = int(ex["sentence_relation_label"])
        if label == 0:
            assert da == db and (sa, sb) == (0, 1)  # next
        elif label == 1:
            assert da == db and (sa, sb) == (1, 0)  # previous
        else:
            assert da != db  # another document
        if sa == 0 or label == 1:
            assert da not in primary
            primary[da] = label
        else:
            forced += 1  # sentence 1 put back after a random draw: a one-sentence chunk
    assert len(primary) == num_docs
    labels = np.array(list(primary.values()))
    for value in range(3):
        p = 1 / 3
        observed = np.mean(labels == value)
        assert abs(observed - p) < 5 * np.sqrt(p * (1 - p) / num_docs), (value, observed)
    assert forced == np.sum(labels == 2)
