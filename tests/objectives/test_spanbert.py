"""SpanBERT's MLM + SBO loss (lmsuite.objectives.spanbert): which masked tokens get an SBO
target, on the real span masker's output, and the loss against a numpy computation."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from lmsuite import objectives
from lmsuite.data.preprocessors import mlm as mlm_data
from lmsuite.data.preprocessors import spanbert as spanbert_data
from lmsuite.models import ModelConfig, Transformer
from lmsuite.objectives import spanbert

CLS, SEP, MASK = 2, 3, 4
SPEC = mlm_data.MlmSpec(
    mask_id=MASK, vocab_size=500, special_ids=tuple(range(7)), max_predictions=40, mask_rate=0.4
)


def _masked(rows, seed=0):
    """`spanbert.mask_spans` on each (input_ids, word_starts) row, batched as numpy."""
    outs = []
    for i, (ids, starts) in enumerate(rows):
        features = {"input_ids": tf.constant(ids), "word_starts": tf.constant(starts)}
        out = spanbert_data.mask_spans(features, seed=tf.constant([seed, i], tf.int64), spec=SPEC)
        outs.append({k: v.numpy() for k, v in out.items()})
    return {k: np.stack([o[k] for o in outs]) for k in outs[0]}


def _expected(batch, *, max_span, excluded=()):
    """From the masked set alone: a run [s, e] of the row has SBO targets iff s - 1 and
    e + 1 are tokens of the row whose ids are not excluded; offsets below max_span."""
    out = np.zeros(batch["masked_weights"].shape, np.float32)
    for b in range(out.shape[0]):
        length = batch["input_ids"].shape[1]
        real = batch["masked_weights"][b] > 0
        chosen = np.zeros(length, bool)
        chosen[batch["masked_positions"][b][real]] = True
        for j in np.flatnonzero(real):
            i = batch["masked_positions"][b, j]
            s, e = i, i
            while s > 0 and chosen[s - 1]:
                s -= 1
            while e < length - 1 and chosen[e + 1]:
                e += 1
            ok = s > 0 and e < length - 1 and i - s < max_span
            ok = ok and batch["input_ids"][b, s - 1] not in excluded
            ok = ok and batch["input_ids"][b, min(e + 1, length - 1)] not in excluded
            out[b, j] = float(ok)
    return out


def _weights(batch, **kwargs):
    return np.asarray(
        spanbert.sbo_weights(
            batch["masked_positions"],
            batch["masked_weights"],
            batch["span_left_positions"],
            batch["span_right_positions"],
            batch["span_offsets"],
            input_ids_BL=batch["input_ids"],
            **kwargs,
        )
    )


def test_no_sbo_target_where_a_boundary_falls_outside_the_row():
    # Rows of bare words (no [CLS]/[SEP]), masked at 40%: runs often touch either end.
    rng = np.random.default_rng(0)
    rows = [(rng.integers(7, 500, 24).astype(np.int32), np.ones(24, np.int32)) for _ in range(40)]
    batch = _masked(rows)
    got = _weights(batch, max_span=15)
    np.testing.assert_array_equal(got, _expected(batch, max_span=15))
    positions, real = batch["masked_positions"], batch["masked_weights"] > 0
    at_edges = real & ((positions == 0) | (positions == 23))
    assert at_edges.sum() > 5 and not got[at_edges].any()  # the case is exercised
    assert got.sum() > 0.5 * real.sum()
    # Short tables cut long runs after their first max_span tokens.
    np.testing.assert_array_equal(_weights(batch, max_span=2), _expected(batch, max_span=2))
    assert _weights(batch, max_span=2).sum() < got.sum()


def test_excluded_boundary_ids_drop_runs_next_to_cls_and_sep():
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(40):
        words = rng.integers(7, 500, 20).astype(np.int32)
        ids = np.concatenate([[CLS], words[:9], [SEP], words[9:], [SEP]]).astype(np.int32)
        rows.append((ids, np.ones(len(ids), np.int32)))
    batch = _masked(rows)
    kept = _weights(batch, max_span=15)
    cut = _weights(batch, max_span=15, excluded_boundary_ids=(CLS, SEP))
    np.testing.assert_array_equal(kept, _expected(batch, max_span=15))
    np.testing.assert_array_equal(cut, _expected(batch, max_span=15, excluded=(CLS, SEP)))
    assert cut.sum() < kept.sum()


def test_packed_rows_keep_each_examples_boundaries():
    # Two examples of 4 tokens in one row of 8, the second masked from its first token: its
    # clipped left boundary is its own (masked) first token, not the first example's last.
    batch = {
        "input_ids": np.array([[10, 11, 12, 13, 20, 21, 22, 23]], np.int32),
        "masked_positions": np.array([[1, 2, 4, 5, 0]], np.int32),
        "masked_weights": np.array([[1, 1, 1, 1, 0]], np.float32),
        "span_left_positions": np.array([[0, 0, 4, 4, 0]], np.int32),
        "span_right_positions": np.array([[3, 3, 6, 6, 0]], np.int32),
        "span_offsets": np.array([[0, 1, 0, 1, 0]], np.int32),
    }
    np.testing.assert_array_equal(_weights(batch, max_span=15), [[1, 1, 0, 0, 0]])


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_loss_is_mean_mlm_plus_weighted_mean_sbo_as_numpy_computes_it():
    rng = np.random.default_rng(2)
    batch = {
        "input_ids": np.array([[2, 9, 4, 4, 8, 4, 3], [2, 4, 4, 9, 9, 9, 3]], np.int32),
        "input_mask": np.ones((2, 7), np.int32),
        "token_type_ids": np.zeros((2, 7), np.int32),
        "masked_positions": np.array([[2, 3, 5, 0], [1, 2, 0, 0]], np.int32),
        "masked_ids": rng.integers(0, 11, (2, 4)).astype(np.int32),
        "masked_weights": np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32),
        "span_left_positions": np.array([[1, 1, 4, 0], [0, 0, 0, 0]], np.int32),
        "span_right_positions": np.array([[4, 4, 6, 0], [3, 3, 0, 0]], np.int32),
        "span_offsets": np.array([[0, 1, 0, 0], [0, 1, 0, 0]], np.int32),
    }
    # Row 0's last run ends next to [SEP] (id 3), row 1's run starts next to [CLS] (id 2).
    sbo_w = np.array([[1, 1, 0, 0], [0, 0, 0, 0]], np.float32)
    outputs = {
        "mlm_logits": rng.normal(size=(2, 4, 11)).astype(np.float32),
        "sbo_logits": rng.normal(size=(2, 4, 11)).astype(np.float32),
    }
    objective = objectives.span_boundary(sbo_weight=0.5, excluded_boundary_ids=(CLS, SEP))
    denominators = objective.denominators(batch)
    total, metrics = objective.loss_and_metrics(outputs, batch, denominators)

    def mean_ce(logits, w):
        picked = np.take_along_axis(_log_softmax(logits), batch["masked_ids"][..., None], -1)
        hits = logits.argmax(-1) == batch["masked_ids"]
        return -(picked[..., 0] * w).sum() / w.sum(), (hits * w).sum() / w.sum()

    mlm_loss, mlm_acc = mean_ce(outputs["mlm_logits"], batch["masked_weights"])
    sbo_loss, sbo_acc = mean_ce(outputs["sbo_logits"], sbo_w)
    assert float(denominators["sbo"]) == 2.0
    np.testing.assert_allclose(float(total), mlm_loss + 0.5 * sbo_loss, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["mlm_loss"]), mlm_loss, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["sbo_loss"]), sbo_loss, rtol=1e-5)
    np.testing.assert_allclose(float(metrics["sbo_accuracy"]), sbo_acc, rtol=1e-6)
    np.testing.assert_allclose(float(metrics["mlm_accuracy"]), mlm_acc, rtol=1e-6)

    inputs = objective.model_inputs(batch)
    for name in spanbert.SPAN_FEATURES:
        np.testing.assert_array_equal(inputs[name], batch[name])
    missing = {k: v for k, v in batch.items() if k != "span_offsets"}
    with pytest.raises(ValueError, match=r"needs batch features \['span_offsets'\]"):
        objective.model_inputs(missing)


def test_the_sbo_gradient_reaches_the_head_and_the_tied_token_table_only_through_sbo():
    config = ModelConfig(
        vocab_size=30, d_model=16, num_heads=2, d_ff=24, num_layers=1, max_length=16,
        heads=("mlm", "sbo"), sbo_position_dim=8, dropout_rate=0.0, attention_dropout_rate=0.0,
    )  # fmt: skip
    batch = {
        "input_ids": np.array([[2, 9, 4, 4, 8, 3]], np.int32),
        "input_mask": np.ones((1, 6), np.int32),
        "masked_positions": np.array([[2, 3]], np.int32),
        "masked_ids": np.array([[11, 12]], np.int32),
        "masked_weights": np.ones((1, 2), np.float32),
        "span_left_positions": np.array([[1, 1]], np.int32),
        "span_right_positions": np.array([[4, 4]], np.int32),
        "span_offsets": np.array([[0, 1]], np.int32),
    }
    objective = spanbert.span_boundary(token_type_ids=None)
    model = Transformer(config)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), **objective.model_inputs(batch)))
    params = params["params"]

    def loss(params, sbo_weight):
        outputs = model.apply({"params": params}, **objective.model_inputs(batch))
        sums = objective.terms(outputs, batch)
        return sums["mlm"].loss + sbo_weight * sums["sbo"].loss

    grads = jax.jit(jax.grad(loss))(params, 1.0)
    mlm_only = jax.jit(jax.grad(loss))(params, 0.0)
    norm = lambda tree: float(sum(jnp.abs(x).sum() for x in jax.tree.leaves(tree)))
    assert norm(grads["sbo_head"]) > 0 and norm(mlm_only["sbo_head"]) == 0
    table = lambda g: np.asarray(g["token_embedder"]["embedding"])
    assert np.abs(table(grads) - table(mlm_only)).max() > 0
