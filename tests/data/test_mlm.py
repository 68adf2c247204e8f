"""Oracle tests for token-level BERT / ELECTRA masking (lmsuite.data.preprocessors.mlm)."""

import functools

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import mlm

PAD, CLS, SEP, MASK = 0, 2, 3, 4
SPECIALS = (0, 1, 2, 3, 4, 5, 6)
VOCAB = 1000


def _spec(**kw):
    base = dict(mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS, max_predictions=20)
    return mlm.MlmSpec(**{**base, **kw})


def _documents(num, *, seed=0, min_len=1, max_len=160):
    """Token rows [CLS] a.. [SEP] b.. [SEP] with a special token sprinkled inside."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(num):
        n = int(rng.integers(min_len, max_len + 1))
        body = rng.integers(7, VOCAB, size=n)
        cut = int(rng.integers(0, n + 1))
        rows.append(np.concatenate([[CLS], body[:cut], [SEP], body[cut:], [SEP]]).astype(np.int32))
    return rows


def _dataset(rows):
    return tf.data.Dataset.from_generator(
        lambda: ({"input_ids": r} for r in rows),
        output_signature={"input_ids": tf.TensorSpec([None], tf.int32)},
    )


def _run(rows, spec, seed=7, *, grouped=False):
    """Masks `rows` one example per call (`mask_tokens`), or `grouped` as the dynamic
    pipeline does (`bert_dynamic_mlm`: GROUP_SIZE rows per call, padded to the longest)."""
    if grouped:
        with seqio.map_seed_manager(seed):
            return list(mlm.bert_dynamic_mlm(_dataset(rows), spec=spec).as_numpy_iterator())
    ds = (
        _dataset(rows)
        .enumerate()
        .map(
            lambda i, f: mlm.mask_tokens(
                f, seed=tf.stack([tf.constant(seed, tf.int64), i]), spec=spec
            )
        )
    )
    return list(ds.as_numpy_iterator())


@pytest.mark.parametrize("grouped", [False, True], ids=["per_example", "grouped"])
def test_budget_is_exact_and_specials_are_never_masked(grouped):
    rows = _documents(300, seed=1)
    spec = _spec()
    for row, out in zip(rows, _run(rows, spec, grouped=grouped), strict=True):
        assert out["input_ids"].shape == row.shape  # a grouped row is cut back to its length
        n = int(np.sum(~np.isin(row, SPECIALS)))
        expected = min(spec.max_predictions, max(1, round(0.15 * n)), n)
        weights = out["masked_weights"]
        assert weights.sum() == expected, (n, weights.sum())
        positions = out["masked_positions"][:expected]
        assert len(set(positions.tolist())) == expected
        assert not np.isin(row[positions], SPECIALS).any()
        np.testing.assert_array_equal(out["masked_ids"][:expected], row[positions])
        special = np.isin(row, SPECIALS)
        np.testing.assert_array_equal(out["input_ids"][special], row[special])
        untouched = np.ones(len(row), bool)
        untouched[positions] = False
        np.testing.assert_array_equal(out["input_ids"][untouched], row[untouched])
        assert (out["masked_positions"][expected:] == 0).all()


def test_budget_rounds_half_to_even_like_python():
    spec = _spec(max_predictions=100)
    for n in [0, 1, 3, 10, 30, 50, 70, 90, 203]:
        got = int(mlm.prediction_budget(tf.constant(n), spec=spec))
        assert got == min(100, max(1, round(0.15 * n)), n), n


@pytest.mark.parametrize("grouped", [False, True], ids=["per_example", "grouped"])
def test_replacement_fractions_are_80_10_10(grouped):
    rows = _documents(600, seed=2, min_len=100, max_len=160)
    spec = _spec()
    outs = _run(rows, spec, seed=3, grouped=grouped)
    counts = np.zeros(3)
    pool = set(spec.replacement_ids.tolist())
    for row, out in zip(rows, outs, strict=True):
        k = int(out["masked_weights"].sum())
        pos = out["masked_positions"][:k]
        new, old = out["input_ids"][pos], row[pos]
        is_random = (new != MASK) & (new != old)
        counts += [(new == MASK).sum(), ((new != MASK) & (new == old)).sum(), is_random.sum()]
        random_ids = new[is_random]
        assert set(random_ids.tolist()) <= pool
    total = counts.sum()
    keep_p = 0.1 + 0.1 / len(pool)  # a random draw may equal the original
    for observed, p in zip(counts / total, [0.8, keep_p, 0.1 - 0.1 / len(pool)], strict=True):
        sigma = np.sqrt(p * (1 - p) / total)
        assert abs(observed - p) < 5 * sigma, (observed, p, total)


def test_random_replacements_are_uniform_over_non_special_ids():
    spec = _spec(vocab_size=12, mask_fraction=0.0, random_fraction=1.0, max_predictions=40)
    row = np.array([CLS] + [7] * 200 + [SEP], np.int32)
    draws = []
    for s in range(30):
        out = mlm.mask_tokens({"input_ids": tf.constant(row)}, seed=tf.constant([s, 1]), spec=spec)
        k = int(out["masked_weights"].numpy().sum())
        draws.extend(out["input_ids"].numpy()[out["masked_positions"].numpy()[:k]].tolist())
    values, counts = np.unique(draws, return_counts=True)
    assert values.tolist() == [7, 8, 9, 10, 11]
    p, n = 0.2, len(draws)
    assert np.all(np.abs(counts / n - p) < 5 * np.sqrt(p * (1 - p) / n)), counts


def test_same_seed_same_mask_different_seed_different_mask():
    row = {"input_ids": tf.constant(_documents(1, seed=4, min_len=120)[0])}
    spec = _spec()
    a = mlm.mask_tokens(row, seed=tf.constant([1, 2]), spec=spec)
    b = mlm.mask_tokens(row, seed=tf.constant([1, 2]), spec=spec)
    c = mlm.mask_tokens(row, seed=tf.constant([1, 3]), spec=spec)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["masked_positions"], c["masked_positions"])


def _positions(ds):
    return [tuple(e["masked_positions"].tolist()) for e in ds.as_numpy_iterator()]


def test_grouped_masking_keeps_other_features_and_draws_per_row():
    # 40 copies of one row: two groups (32 + 8, the last one short). Each row must get its own
    # draws, and the other features must come back unchanged, cut to their own lengths.
    row = _documents(1, seed=12, min_len=120)[0]
    n = len(row)
    examples = [
        {"input_ids": row, "token_type_ids": np.arange(n, dtype=np.int32) % 2, "label": i}
        for i in range(40)
    ]
    signature = {
        "input_ids": tf.TensorSpec([None], tf.int32),
        "token_type_ids": tf.TensorSpec([None], tf.int32),
        "label": tf.TensorSpec([], tf.int32),
    }
    dataset = tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=signature)
    with seqio.map_seed_manager(5):
        outs = list(mlm.bert_dynamic_mlm(dataset, spec=_spec()).as_numpy_iterator())
    assert [int(o["label"]) for o in outs] == list(range(40))
    for out in outs:
        np.testing.assert_array_equal(out["token_type_ids"], np.arange(n) % 2)
        assert out["input_ids"].shape == (n,)
    positions = {tuple(o["masked_positions"].tolist()) for o in outs}
    assert len(positions) == 40  # no two rows share a mask (P(collision) is negligible)


def test_grouped_masking_handles_short_rows_and_rejects_2d_features():
    rows = [np.array(r, np.int32) for r in ([CLS, SEP], [CLS, 9, SEP], [CLS], [CLS, 8, 9, SEP])]
    outs = _run(rows, _spec(), grouped=True)
    assert [int(o["masked_weights"].sum()) for o in outs] == [0, 1, 0, 1]
    assert [o["input_ids"].shape[0] for o in outs] == [2, 3, 1, 4]
    assert outs[1]["masked_positions"][0] == 1 and outs[3]["masked_positions"][0] in (1, 2)
    matrix = tf.data.Dataset.from_tensors({"input_ids": tf.zeros([2, 3], tf.int32)})
    with pytest.raises(ValueError, match="scalar or 1-D features; got shapes .*input_ids"):
        mlm.grouped_dynamic_masking(matrix, mask_fn=mlm.mask_tokens, spec=_spec())


def test_grouped_masking_takes_features_of_one_static_length():
    """A 1-D feature with a static length is batched dense, the others ragged: the rows are
    those of the same data with no static length, each feature at its own length."""
    rows = [np.array(r, np.int32) for r in _documents(20, seed=3, min_len=30)]
    examples = [
        {"input_ids": np.resize(r, 30), "extra": r[: 5 + i % 7], "label": i}
        for i, r in enumerate(rows)
    ]

    def run(input_length):
        signature = {
            "input_ids": tf.TensorSpec([input_length], tf.int32),
            "extra": tf.TensorSpec([None], tf.int32),
            "label": tf.TensorSpec([], tf.int32),
        }
        dataset = tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=signature)
        with seqio.map_seed_manager(9):
            masked = mlm.grouped_dynamic_masking(
                dataset, mask_fn=mlm.mask_tokens, spec=_spec(), group_size=8
            )
            return list(masked.as_numpy_iterator())

    fixed, unknown = run(30), run(None)
    assert len(fixed) == len(unknown) == 20
    for i, (a, b) in enumerate(zip(fixed, unknown, strict=True)):
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], key)
        np.testing.assert_array_equal(a["extra"], examples[i]["extra"])
        assert a["masked_weights"].sum() > 0


def test_static_masking_materialises_dupe_factor_fixed_copies():
    rows = _documents(5, seed=5, min_len=60)
    with seqio.map_seed_manager(11):
        static = mlm.bert_static_mlm(_dataset(rows), spec=_spec(), dupe_factor=3)
    first, second = _positions(static), _positions(static)
    assert len(first) == 15
    assert first == second  # materialised: every pass sees the same masks
    for d in range(5):
        copies = first[3 * d : 3 * d + 3]
        assert len(set(copies)) == 3  # the copies of one document differ
    with seqio.map_seed_manager(11):
        again = mlm.bert_static_mlm(_dataset(rows), spec=_spec(), dupe_factor=3)
    assert _positions(again) == first
    with pytest.raises(ValueError, match="dupe_factor=0"):
        mlm.bert_static_mlm(_dataset(rows), spec=_spec(), dupe_factor=0)


def test_dynamic_masking_draws_a_new_mask_each_time_seen():
    rows = _documents(5, seed=6, min_len=60)
    with seqio.map_seed_manager(21):
        dynamic = mlm.bert_dynamic_mlm(_dataset(rows).repeat(2), spec=_spec())
    seen = _positions(dynamic)
    assert len(seen) == 10
    assert all(seen[d] != seen[d + 5] for d in range(5))  # epoch 2 differs from epoch 1
    with seqio.map_seed_manager(21):
        replay = mlm.bert_dynamic_mlm(_dataset(rows).repeat(2), spec=_spec())
    assert _positions(replay) == seen  # deterministic under a fixed SeqIO seed
    with seqio.map_seed_manager(22):
        other = mlm.bert_dynamic_mlm(_dataset(rows).repeat(2), spec=_spec())
    assert _positions(other) != seen


def test_no_mask_feature_protects_tokens():
    row = np.array([CLS] + list(range(10, 50)) + [SEP], np.int32)
    protect = np.zeros(len(row), np.int32)
    protect[1:30] = 1
    out = mlm.mask_tokens(
        {"input_ids": tf.constant(row), mlm.NO_MASK_KEY: tf.constant(protect)},
        seed=tf.constant([0, 0]),
        spec=_spec(),
    )
    k = int(out["masked_weights"].numpy().sum())
    assert k == 2  # round(0.15 * 11)
    assert (out["masked_positions"].numpy()[:k] >= 30).all()
    assert mlm.NO_MASK_KEY not in out


@pytest.mark.parametrize("grouped", [False, True])
def test_electra_count_and_replacements_match_electra_mask(grouped):
    # Reference: google-research/electra pretrain/pretrain_helpers.py mask(): the count per row
    # is max(1, min(N, round(0.15 * sum(input_mask)))), sum(input_mask) counting [CLS]/[SEP],
    # N = int(0.155 * L); a predicted position becomes [MASK] when uniform < 0.85, else it keeps
    # its token (never a random id). So [MASK] ~ Binomial(total, 0.85), random exactly 0.
    assert mlm.electra_max_predictions(128) == 19
    assert mlm.electra_max_predictions(512) == 79
    spec = mlm.MlmSpec.electra(
        max_seq_length=128, mask_id=MASK, vocab_size=VOCAB, special_ids=SPECIALS
    )
    assert (spec.max_predictions, spec.mask_fraction, spec.random_fraction) == (19, 0.85, 0.0)
    # Rows of 3..129 tokens: the count is round(0.15 * len) below 127 tokens, capped at 19 above.
    rows = _documents(2000, seed=8, min_len=1, max_len=126)
    masked = kept = total = 0
    for row, out in zip(rows, _run(rows, spec, grouped=grouped), strict=True):
        k = int(out["masked_weights"].sum())
        assert k == max(1, min(19, round(0.15 * len(row))))
        positions = out["masked_positions"][:k]
        assert len(set(positions.tolist())) == k and not np.isin(row[positions], SPECIALS).any()
        new = out["input_ids"][positions]
        masked += int((new == MASK).sum())
        kept += int((new == row[positions]).sum())
        total += k
        unchanged = np.ones(len(row), bool)
        unchanged[positions] = False
        np.testing.assert_array_equal(out["input_ids"][unchanged], row[unchanged])
    assert total >= 20_000
    assert masked + kept == total  # no random replacement at all
    sigma = np.sqrt(0.85 * 0.15 / total)
    assert abs(masked / total - 0.85) < 5 * sigma, (masked / total, sigma)


def test_electra_width_can_exceed_its_count():
    spec = mlm.MlmSpec.electra(
        max_seq_length=128, max_predictions=30, mask_id=MASK, vocab_size=VOCAB,
        special_ids=SPECIALS,
    )  # fmt: skip
    rows = _documents(50, seed=3, min_len=126, max_len=126)
    for out in _run(rows, spec):
        assert out["masked_weights"].shape == (30,) and out["masked_weights"].sum() == 19


def test_prediction_cap_bounds_the_budget_below_the_width():
    spec = _spec(max_predictions=79, prediction_cap=20)
    rows = _documents(40, seed=5, min_len=400, max_len=510)
    for out in _run(rows, spec):
        assert out["masked_weights"].shape == (79,) and out["masked_weights"].sum() == 20


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(mask_id=VOCAB), "mask_id"),
        (dict(special_ids=(0, VOCAB + 1)), "special_ids"),
        (dict(max_predictions=0), "max_predictions"),
        (dict(mask_fraction=0.95, random_fraction=0.1), "exceeds 1"),
        (dict(mask_rate=0.0), "mask_rate"),
        (dict(prediction_cap=0), "prediction_cap"),
    ],
)
def test_spec_rejects_bad_values(kw, message):
    with pytest.raises(ValueError, match=message):
        _spec(**kw)


def test_dynamic_masking_inside_a_seqio_task_is_seeded_and_fresh_per_epoch():
    def source(split, shuffle_files, seed=None):
        del split, shuffle_files, seed
        return _dataset(_documents(3, seed=9, min_len=40))

    task = seqio.Task(
        "lmsuite_test_dynamic_mlm",
        source=seqio.FunctionDataSource(source, splits=["train"]),
        preprocessors=[functools.partial(mlm.bert_dynamic_mlm, spec=_spec())],
        output_features={"input_ids": seqio.Feature(seqio.PassThroughVocabulary(VOCAB))},
    )

    def run(seed):
        ds = task.get_dataset(
            sequence_length=None, split="train", shuffle=False, num_epochs=2, seed=seed
        )
        return _positions(ds)

    first = run(1)
    assert first == run(1)
    assert first != run(2)
    assert all(first[d] != first[d + 3] for d in range(3))
