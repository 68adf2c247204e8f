"""EncoderMlmFeatureConverter(pack=True): packed rows hold the examples exactly, re-indexed."""

import numpy as np
import pytest
import tensorflow as tf

from lmsuite.data import feature_converters, tasks
from lmsuite.data.preprocessors import spanbert

L, P = 32, 6
SPAN = ("span_left_positions", "span_right_positions", "span_offsets")
_SPEC = {
    "input_ids": tf.TensorSpec([None], tf.int32),
    "token_type_ids": tf.TensorSpec([None], tf.int32),
    "masked_positions": tf.TensorSpec([None], tf.int32),
    "masked_ids": tf.TensorSpec([None], tf.int32),
    "masked_weights": tf.TensorSpec([None], tf.float32),
    **{name: tf.TensorSpec([None], tf.int32) for name in SPAN},
}


def _examples(n=40, seed=0, min_tokens=3, max_tokens=20):
    """Random MLM examples padded to P predictions (weight 0), some with none at all.

    Token types, span offsets and ids include 0, weights include fractions: the packer must
    keep real zeros and exact weights.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        size = int(rng.integers(min_tokens, max_tokens + 1))
        count = int(rng.integers(0, min(P, size - 2) + 1))
        positions = np.sort(rng.choice(np.arange(1, size - 1), count, replace=False))
        pad = lambda x, dtype, count=count: np.pad(np.asarray(x, dtype), (0, P - count))
        out.append({
            "input_ids": rng.integers(0, 50, size).astype(np.int32),
            "token_type_ids": (np.arange(size) >= size // 2).astype(np.int32),
            "masked_positions": pad(positions, np.int32),
            "masked_ids": pad(rng.integers(0, 50, count), np.int32),
            "masked_weights": pad(rng.choice([1.0, 0.5, 0.25], count), np.float32),
            "span_left_positions": pad(positions - 1, np.int32),
            "span_right_positions": pad(positions + 1, np.int32),
            "span_offsets": pad(rng.integers(0, 3, count), np.int32),
        })  # fmt: skip
    return out


def _dataset(examples):
    return tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=_SPEC)


def _convert(examples, *, pack, length=L, predictions=P):
    converter = feature_converters.EncoderMlmFeatureConverter(span_features=SPAN, pack=pack)
    out = converter(_dataset(examples), {"input_ids": length, "masked_ids": predictions})
    return [{k: v.numpy() for k, v in row.items()} for row in out]


def _unpack(row):
    """The examples of one packed row, checking segment ids and positions on the way."""
    segments, positions = row["segment_ids"], row["position_ids"]
    count = segments.max()
    real = segments > 0
    assert (real == (row["input_mask"] == 1)).all()
    assert not real[real.argmin() :].any() or real.all()  # padding only at the end
    np.testing.assert_array_equal(np.unique(segments[real]), np.arange(1, count + 1))
    assert (row["input_ids"][~real] == 0).all() and (positions[~real] == 0).all()
    weighted = row["masked_weights"] != 0
    assert not weighted[weighted.argmin() :].any() or weighted.all()
    assert (row["masked_ids"][~weighted] == 0).all()
    examples = []
    for s in range(1, count + 1):
        (index,) = np.nonzero(segments == s)
        start = index[0]
        np.testing.assert_array_equal(index, np.arange(start, start + len(index)))  # contiguous
        np.testing.assert_array_equal(positions[index], np.arange(len(index)))  # restart at 0
        mine = weighted & (segments[row["masked_positions"]] == s)
        ex = {
            "input_ids": row["input_ids"][index],
            "token_type_ids": row["token_type_ids"][index],
            "masked_positions": row["masked_positions"][mine] - start,
            "masked_ids": row["masked_ids"][mine],
            "masked_weights": row["masked_weights"][mine],
            "span_offsets": row["span_offsets"][mine],
        }
        for name in ("span_left_positions", "span_right_positions"):
            ex[name] = row[name][mine] - start
        examples.append(ex)
    return examples


def _unpadded(ex):
    keep = ex["masked_weights"] != 0
    out = {k: np.asarray(ex[k]) for k in ("input_ids", "token_type_ids")}
    out.update({k: np.asarray(v)[keep] for k, v in ex.items() if k not in out})
    return out


def _assert_same_examples(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert sorted(g) == sorted(e)
        for k in e:
            np.testing.assert_array_equal(g[k], e[k], err_msg=k)


def test_packed_rows_reproduce_every_example_in_order():
    examples = _examples()
    rows = _convert(examples, pack=True)
    assert len(rows) < 0.7 * len(examples)  # 3..20 tokens in 32: rows really hold several
    assert all(row["input_ids"].shape == (L,) and row["masked_ids"].shape == (P,) for row in rows)
    unpacked = [ex for row in rows for ex in _unpack(row)]
    _assert_same_examples(unpacked, [_unpadded(ex) for ex in examples])
    # Nothing dropped at the P cap: every weighted prediction is in some row.
    total = sum(int((row["masked_weights"] != 0).sum()) for row in rows)
    assert total == sum(int((ex["masked_weights"] != 0).sum()) for ex in examples)


def test_predictions_cap_starts_a_new_row():
    # Two 4-token examples fit L=8 together, but their 2 + 2 predictions exceed P=3.
    example = {
        "input_ids": np.array([2, 7, 8, 3], np.int32),
        "token_type_ids": np.zeros(4, np.int32),
        "masked_positions": np.array([1, 2, 0], np.int32),
        "masked_ids": np.array([5, 6, 0], np.int32),
        "masked_weights": np.array([1.0, 1.0, 0.0], np.float32),
        **{name: np.array([0, 3, 0], np.int32) for name in SPAN},
    }
    rows = _convert([example, example], pack=True, length=8, predictions=3)
    assert [row["segment_ids"].max() for row in rows] == [1, 1]
    assert [row["masked_ids"].tolist() for row in rows] == [[5, 6, 0], [5, 6, 0]]
    # With room for both (P=4) they share one row.
    (row,) = _convert([example, example], pack=True, length=8, predictions=4)
    assert row["masked_positions"].tolist() == [1, 2, 5, 6]
    assert row["span_right_positions"].tolist() == [0, 3, 4, 7]


def test_one_example_per_row_equals_the_unpacked_output():
    # 17..20 tokens in 32: two never fit, so each packed row holds exactly one example.
    examples = _examples(n=8, seed=2, min_tokens=17)
    packed, padded = _convert(examples, pack=True), _convert(examples, pack=False)
    assert len(packed) == len(padded) == 8
    for p, u, ex in zip(packed, padded, examples, strict=True):
        assert sorted(p) == sorted([*u, "segment_ids", "position_ids"])
        np.testing.assert_array_equal(p["segment_ids"], u["input_mask"])
        np.testing.assert_array_equal(p["position_ids"], np.arange(L) * u["input_mask"])
        # The unpacked row keeps the padding predictions in their slots; both put the
        # weighted ones first, in order.
        weighted = u["masked_weights"] != 0
        n = int(weighted.sum())
        for k in u:
            if k in ("masked_positions", "masked_ids", "masked_weights", *SPAN):
                np.testing.assert_array_equal(p[k][:n], u[k][weighted], err_msg=k)
                assert not p[k][n:].any(), k
            else:
                np.testing.assert_array_equal(p[k], u[k], err_msg=k)
        assert n == int((ex["masked_weights"] != 0).sum())


def test_packing_is_deterministic():
    examples = _examples(n=30, seed=3)
    first, second = _convert(examples, pack=True), _convert(examples, pack=True)
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_refuses_labels_and_oversized_examples():
    with pytest.raises(ValueError, match="next_sentence_label"):
        feature_converters.EncoderMlmFeatureConverter(labels=("next_sentence_label",), pack=True)
    too_long = _examples(n=1, seed=4, min_tokens=L + 1, max_tokens=L + 1)
    message = rf"more than L={L} tokens \(input_ids"
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _convert(too_long, pack=True)
    # More weighted predictions than P (masked_ids padded to P, weights longer) is refused too.
    bad = _examples(n=1, seed=5, min_tokens=12, max_tokens=12)[0]
    bad["masked_weights"] = np.ones(P + 1, np.float32)
    bad["masked_positions"] = np.arange(1, P + 2, dtype=np.int32)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"more than P={P}"):
        _convert([bad], pack=True)


@pytest.mark.parametrize(
    "feature, length",
    [
        ("input_ids", L + 1),
        ("masked_ids", P + 1),
        ("masked_weights", P + 3),
        ("span_left_positions", P + 1),
    ],
)
def test_unpacked_refuses_a_feature_longer_than_its_limit(feature, length):
    # _pad would cut it silently; the converter's own check (SeqIO's is off) must name it.
    example = _examples(n=1, seed=6, min_tokens=12, max_tokens=12)[0]
    example[feature] = np.ones(length, example[feature].dtype)
    converter = feature_converters.EncoderMlmFeatureConverter(span_features=SPAN)
    out = converter(_dataset([example]), {"input_ids": L, "masked_ids": P})
    limit = L if feature == "input_ids" else P
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=rf"\({feature}, {limit},\] \[{length}\]"
    ):
        next(iter(out))
    # At the limit it converts, and every output has its static shape.
    example[feature] = np.ones(limit, example[feature].dtype)
    out = converter(_dataset([example]), {"input_ids": L, "masked_ids": P})
    assert all(spec.shape.is_fully_defined() for spec in out.element_spec.values())
    assert next(iter(out))[feature].shape == (limit,)


def test_packed_spanbert_task_matches_its_unpacked_examples(tiny_vocab):
    task = tasks.build_task("wiki_sample", "spanbert", vocab=tiny_vocab, register=False)
    lengths = {"input_ids": 64, "masked_ids": 10}
    dataset = task.get_dataset(lengths, split="validation", shuffle=False, seed=0)
    # Document tails: wiki_sample's other chunks fill all 64 tokens and would not pack.
    source = dataset.filter(lambda ex: tf.size(ex["input_ids"]) < 40).take(8)
    examples = [{k: v.numpy() for k, v in ex.items()} for ex in source]
    converter = feature_converters.EncoderMlmFeatureConverter(
        span_features=spanbert.SBO_KEYS, pack=True
    )
    rows = [{k: v.numpy() for k, v in r.items()} for r in converter(source, lengths)]
    assert len(rows) < len(examples)
    keys = ("input_ids", "token_type_ids", "masked_positions", "masked_ids", "masked_weights")
    expected = [_unpadded({k: ex[k] for k in (*keys, *spanbert.SBO_KEYS)}) for ex in examples]
    _assert_same_examples([ex for row in rows for ex in _unpack(row)], expected)


def test_packed_features_reach_the_model_through_the_mlm_objective():
    from lmsuite.objectives import mlm

    rows = _convert(_examples(n=10, seed=6), pack=True)
    batch = {k: np.stack([r[k] for r in rows[:2]]) for k in rows[0]}
    inputs = mlm().model_inputs(batch)
    np.testing.assert_array_equal(inputs["segment_ids"], batch["segment_ids"])
    np.testing.assert_array_equal(inputs["position_ids"], batch["position_ids"])
    np.testing.assert_array_equal(inputs["masked_positions"], batch["masked_positions"])


def test_packed_row_gives_each_example_its_unpacked_mlm_logits():
    import jax

    from lmsuite.models import ModelConfig, Transformer
    from lmsuite.objectives import mlm

    config = ModelConfig(
        architecture="encoder",
        vocab_size=64,
        d_model=16,
        num_heads=2,
        d_ff=32,
        num_layers=1,
        max_length=L,
        type_vocab_size=2,
        heads=("mlm",),
    )
    examples = _examples(n=3, seed=7, min_tokens=8, max_tokens=10)
    (packed,) = _convert(examples, pack=True, predictions=3 * P)
    assert packed["segment_ids"].max() == 3
    padded = _convert(examples, pack=False, predictions=3 * P)
    model, objective = Transformer(config), mlm()
    as_batch = lambda rows: {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    params = model.init(jax.random.PRNGKey(0), **objective.model_inputs(as_batch(padded)))
    logits = lambda rows: model.apply(params, **objective.model_inputs(as_batch(rows)))
    packed_logits, padded_logits = logits([packed])["mlm_logits"][0], logits(padded)["mlm_logits"]
    weighted = [row["masked_weights"] != 0 for row in padded]
    expected = np.concatenate([x[w] for x, w in zip(padded_logits, weighted, strict=True)])
    got = packed_logits[: len(expected)]
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


# MassFeatureConverter.

ML, MM = 24, 12
_MASS_KEYS = ("inputs", "targets", "decoder_input_tokens", "decoder_positions")
_MASS_SPEC = {key: tf.TensorSpec([None], tf.int32) for key in _MASS_KEYS}


def _mass_examples(n=60, seed=0, min_n=3, max_n=14):
    """Random MASS examples; ids include 0 and the fragment may start right after position 0,
    so real zeros appear in every feature (the packer must keep them)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        size = int(rng.integers(min_n, max_n + 1))
        source = rng.integers(0, 8, size).astype(np.int32)
        k = int(rng.integers(1, min(size - 1, MM) + 1))
        start = int(rng.integers(1, size - k + 1))
        inputs = source.copy()
        inputs[start : start + k] = 4
        out.append({
            "inputs": inputs,
            "targets": source[start : start + k],
            "decoder_input_tokens": source[start - 1 : start + k - 1],
            "decoder_positions": np.arange(start - 1, start + k - 1, dtype=np.int32),
        })  # fmt: skip
    return out


def _mass_convert(examples, *, pack, length=ML, targets=MM):
    ds = tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=_MASS_SPEC)
    converter = feature_converters.MassFeatureConverter(pack=pack)
    out = converter(ds, {"inputs": length, "targets": targets})
    return [{k: v.numpy() for k, v in row.items()} for row in out]


def _unpack_mass(row):
    """The examples of one packed MASS row, checking segment ids, positions and padding."""
    encoder, decoder = row["encoder_segment_ids"], row["decoder_segment_ids"]
    count = encoder.max()
    assert decoder.max() == count
    for segments in (encoder, decoder):
        real = segments > 0
        assert not real[real.argmin() :].any() or real.all()  # padding only at the end
        np.testing.assert_array_equal(np.unique(segments[real]), np.arange(1, count + 1))
    np.testing.assert_array_equal(row["decoder_loss_weights"], (decoder > 0).astype(np.int32))
    assert not row["encoder_input_tokens"][encoder == 0].any()
    assert not row["encoder_positions"][encoder == 0].any()
    for key in ("decoder_target_tokens", "decoder_input_tokens", "decoder_positions"):
        assert not row[key][decoder == 0].any(), key
    examples = []
    for s in range(1, count + 1):
        (e,) = np.nonzero(encoder == s)
        (d,) = np.nonzero(decoder == s)
        np.testing.assert_array_equal(e, np.arange(e[0], e[0] + len(e)))  # contiguous
        np.testing.assert_array_equal(d, np.arange(d[0], d[0] + len(d)))
        np.testing.assert_array_equal(row["encoder_positions"][e], np.arange(len(e)))
        examples.append({
            "inputs": row["encoder_input_tokens"][e],
            "targets": row["decoder_target_tokens"][d],
            "decoder_input_tokens": row["decoder_input_tokens"][d],
            "decoder_positions": row["decoder_positions"][d],
        })  # fmt: skip
    return examples


def test_mass_converter_matches_the_docstring_examples():
    first = {"inputs": [6, 9, 4, 4, 6], "targets": [10, 11], "decoder_input_tokens": [9, 10],
             "decoder_positions": [1, 2]}  # fmt: skip
    second = {"inputs": [6, 4, 4], "targets": [12, 6], "decoder_input_tokens": [6, 12],
              "decoder_positions": [0, 1]}  # fmt: skip
    examples = [{k: np.array(v, np.int32) for k, v in ex.items()} for ex in (first, second)]
    unpacked = _mass_convert(examples, pack=False, length=8, targets=4)
    assert {k: v.tolist() for k, v in unpacked[0].items()} == {
        "encoder_input_tokens": [6, 9, 4, 4, 6, 0, 0, 0],
        "decoder_target_tokens": [10, 11, 0, 0],
        "decoder_input_tokens": [9, 10, 0, 0],
        "decoder_positions": [1, 2, 0, 0],
        "decoder_loss_weights": [1, 1, 0, 0],
    }
    (row,) = _mass_convert(examples, pack=True, length=8, targets=4)
    assert {k: v.tolist() for k, v in row.items()} == {
        "encoder_input_tokens": [6, 9, 4, 4, 6, 6, 4, 4],
        "encoder_segment_ids": [1, 1, 1, 1, 1, 2, 2, 2],
        "encoder_positions": [0, 1, 2, 3, 4, 0, 1, 2],
        "decoder_target_tokens": [10, 11, 12, 6],
        "decoder_input_tokens": [9, 10, 6, 12],
        "decoder_positions": [1, 2, 0, 1],
        "decoder_segment_ids": [1, 1, 2, 2],
        "decoder_loss_weights": [1, 1, 1, 1],
    }


def test_mass_packed_rows_hold_every_example_as_unpacked():
    examples = _mass_examples()
    rows = _mass_convert(examples, pack=True)
    assert len(rows) < 0.7 * len(examples)  # 3..14 tokens in 24: rows really hold several
    assert all(r["encoder_input_tokens"].shape == (ML,) for r in rows)
    assert all(r["decoder_positions"].shape == (MM,) for r in rows)
    unpacked = [ex for row in rows for ex in _unpack_mass(row)]
    assert len(unpacked) == len(examples)  # none dropped, in order
    for got, ex in zip(unpacked, examples, strict=True):
        for key in _MASS_KEYS:
            np.testing.assert_array_equal(got[key], ex[key], err_msg=key)
    # Unpacked: the same values, padded, with decoder_positions kept.
    padded = _mass_convert(examples, pack=False)
    assert len(padded) == len(examples)
    names = {"inputs": "encoder_input_tokens", "targets": "decoder_target_tokens"}
    for row, ex in zip(padded, examples, strict=True):
        assert sorted(row) == sorted(feature_converters.MassFeatureConverter.MODEL_FEATURES)
        for key in _MASS_KEYS:
            value, limit = row[names.get(key, key)], ML if key == "inputs" else MM
            np.testing.assert_array_equal(value, np.pad(ex[key], (0, limit - len(ex[key]))))
        k = len(ex["targets"])
        assert row["decoder_loss_weights"].tolist() == [1] * k + [0] * (MM - k)


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("feature", ["inputs", "targets"])
def test_mass_converter_refuses_a_feature_longer_than_its_limit(feature, pack):
    example = _mass_examples(n=1, seed=2, min_n=14, max_n=14)[0]
    if feature == "inputs":
        example["inputs"] = np.ones(ML + 1, np.int32)
        names, limit = ["inputs"], ML
    else:  # The three decoder-side features grow together (one per target token).
        for key in _MASS_KEYS[1:]:
            example[key] = np.ones(MM + 1, np.int32)
        names, limit = list(_MASS_KEYS[1:]), MM
    for name in names:
        with pytest.raises(
            tf.errors.InvalidArgumentError, match=rf"\({name}, {limit},\] \[{limit + 1}\]"
        ):
            _mass_convert([example], pack=pack)


@pytest.mark.parametrize("pack", [False, True])
def test_mass_converter_refuses_decoder_features_of_another_length(pack):
    example = _mass_examples(n=1, seed=3, min_n=10, max_n=10)[0]
    example["decoder_positions"] = example["decoder_positions"][:-1]
    with pytest.raises(
        tf.errors.InvalidArgumentError, match="decoder_positions and targets differ"
    ):
        _mass_convert([example], pack=pack)
    ds = tf.data.Dataset.from_tensors({"inputs": [6, 4, 6], "targets": [7]})
    with pytest.raises(ValueError, match="needs the task feature 'decoder_input_tokens'"):
        feature_converters.MassFeatureConverter(pack=pack)(ds, {"inputs": 8, "targets": 4})


def test_mass_task_converts_packed_and_unpacked(tiny_vocab):
    task = tasks.build_task("wiki_sample", "mass", vocab=tiny_vocab, register=False)
    lengths = {"inputs": 64, "targets": 32}
    source = task.get_dataset(lengths, split="validation", shuffle=False, seed=0).take(30)
    examples = [{k: v.numpy() for k, v in ex.items()} for ex in source]
    converter = feature_converters.MassFeatureConverter(pack=True)
    rows = [{k: v.numpy() for k, v in r.items()} for r in converter(source, lengths)]
    unpacked = [ex for row in rows for ex in _unpack_mass(row)]
    assert len(unpacked) == len(examples) == 30
    for got, ex in zip(unpacked, examples, strict=True):
        for key in _MASS_KEYS:
            np.testing.assert_array_equal(got[key], ex[key], err_msg=key)
    padded = feature_converters.MassFeatureConverter(pack=False)(source, lengths)
    first = next(iter(padded))
    k = len(examples[0]["targets"])
    np.testing.assert_array_equal(first["decoder_positions"][:k], examples[0]["decoder_positions"])
