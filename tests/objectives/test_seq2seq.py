"""The encoder-decoder loss: T5X's cross-entropy with z-loss and label smoothing against a direct
reimplementation, the normalizing factor, sequence accuracy on packed rows, and the whole loss of
a converted T5 1.1 against HuggingFace torch's own loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import lmsuite.convert as convert
from lmsuite.models import Transformer
from lmsuite.objectives import seq2seq as s2s
from lmsuite.training import step

V = 11


def _soft_target_loss(logits, targets, smoothing, z_loss):
    """T5X's formula written out with the (.., V) soft targets: log Z - sum q logit + z (log Z)^2
    - entropy(q)."""
    logits = np.asarray(logits, np.float64)
    log_z = np.log(np.exp(logits).sum(-1))
    confidence, low = 1.0 - smoothing, smoothing / (V - 1)
    q = np.full(logits.shape, low)
    np.put_along_axis(q, targets[..., None], confidence, axis=-1)
    entropy = -(confidence * np.log(confidence) + (V - 1) * low * np.log(low + 1e-20))
    return log_z - (q * logits).sum(-1) + z_loss * log_z**2 - entropy


@pytest.mark.parametrize("smoothing, z_loss", [(0.0, 0.0), (0.0, 1e-4), (0.1, 1e-4), (0.3, 0.0)])
def test_per_token_loss_is_t5xs_formula(smoothing, z_loss):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 5, V)).astype(np.float32) * 3
    targets = rng.integers(0, V, size=(3, 5))
    loss, z_part, cross_entropy = s2s.smoothed_cross_entropy(
        jnp.asarray(logits), jnp.asarray(targets), label_smoothing=smoothing, z_loss=z_loss
    )
    np.testing.assert_allclose(
        loss, _soft_target_loss(logits, targets, smoothing, z_loss), atol=1e-5
    )
    log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    plain = log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(cross_entropy, plain, atol=1e-5)
    np.testing.assert_allclose(z_part, z_loss * log_z**2, atol=1e-6)


def test_smoothing_entropy_makes_the_matching_distribution_score_zero():
    smoothing = 0.1
    q = np.full((1, V), smoothing / (V - 1))
    q[0, 3] = 1 - smoothing
    loss, _, _ = s2s.smoothed_cross_entropy(
        jnp.log(jnp.asarray(q)), jnp.array([3]), label_smoothing=smoothing, z_loss=0.0
    )
    assert abs(float(loss[0])) < 1e-5


def _batch(packed=False):
    targets = np.array([[5, 6, 7, 1, 0, 0], [8, 1, 9, 9, 1, 0]], np.int32)
    batch = {
        "encoder_input_tokens": np.array([[5, 5, 1, 0], [7, 1, 8, 1]], np.int32),
        "decoder_input_tokens": np.roll(targets, 1, axis=1) * (targets > 0),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (targets > 0).astype(np.int32),
    }
    if packed:
        batch["decoder_segment_ids"] = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 2, 2, 2, 0]], np.int32)
        batch["encoder_segment_ids"] = np.array([[1, 1, 1, 0], [1, 1, 2, 2]], np.int32)
    return {k: jnp.asarray(v) for k, v in batch.items()}


def _perfect_logits(targets, wrong=()):
    """Logits whose argmax is the target, except at the (row, position) pairs in `wrong`."""
    logits = np.full(targets.shape + (V,), -5.0, np.float32)
    np.put_along_axis(logits, np.asarray(targets)[..., None], 5.0, axis=-1)
    for row, position in wrong:
        logits[row, position] = -5.0
        logits[row, position, (int(targets[row, position]) + 1) % V] = 5.0
    return jnp.asarray(logits)


def test_accuracy_sequence_accuracy_and_normalizers():
    batch = _batch(packed=True)
    # Row 1 holds two packed examples; only the second has a wrong token.
    outputs = {"lm_logits": _perfect_logits(batch["decoder_target_tokens"], wrong=[(1, 3)])}
    per_token = s2s.seq2seq(z_loss=0.0)
    loss, metrics = per_token.loss_and_metrics(outputs, batch, per_token.denominators(batch))
    tokens = 9.0  # real target tokens
    assert float(metrics["seq2seq_accuracy"]) == pytest.approx(8 / tokens)
    assert float(metrics["seq2seq_sequence_accuracy"]) == pytest.approx(2 / 3)
    constant = s2s.seq2seq(z_loss=0.0, loss_normalizing_factor=100.0)
    loss_c, metrics_c = constant.loss_and_metrics(outputs, batch, constant.denominators(batch))
    assert float(loss_c) == pytest.approx(float(loss) * tokens / 100.0, rel=1e-6)
    # Accuracy and cross-entropy stay per real target token whatever the normalizer.
    for name in ("seq2seq_accuracy", "seq2seq_cross_entropy", "seq2seq_sequence_accuracy"):
        assert float(metrics_c[name]) == pytest.approx(float(metrics[name]), rel=1e-6)
    unpacked = {k: v for k, v in batch.items() if "segment" not in k}
    _, metrics_u = per_token.loss_and_metrics(outputs, unpacked, per_token.denominators(unpacked))
    assert float(metrics_u["seq2seq_sequence_accuracy"]) == pytest.approx(1 / 2)


def test_model_inputs_route_packing_and_masks():
    packed = s2s.seq2seq(cross_attention_ignores=4).model_inputs(_batch(packed=True))
    assert set(packed) == {
        "input_ids", "decoder_input_ids", "segment_ids", "decoder_segment_ids",
        "cross_attention_mask",
    }  # fmt: skip
    unpacked = s2s.seq2seq().model_inputs(_batch())
    np.testing.assert_array_equal(unpacked["attention_mask"], [[1, 1, 1, 0], [1, 1, 1, 1]])


@pytest.mark.parametrize(
    "options, match",
    [
        ({"label_smoothing": 1.0}, r"label_smoothing must lie in \[0, 1\), got 1.0"),
        ({"z_loss": -1.0}, "z_loss must be >= 0, got -1.0"),
        ({"loss_normalizing_factor": "NUM_TOKENS"}, "loss_normalizing_factor must be None"),
    ],
)
def test_bad_options_are_named(options, match):
    with pytest.raises(ValueError, match=match):
        s2s.seq2seq(**options)


def test_microbatches_add_up_to_the_whole_batch():
    """Every denominator comes from the whole batch, so accumulated gradients equal the big
    batch's for a per-token and a constant normalizer alike."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(4, V)).astype(np.float32))
    batch = {k: jnp.concatenate([v, v[::-1]]) for k, v in _batch(packed=True).items()}

    def apply_fn(variables, input_ids, decoder_input_ids, **_):
        one_hot = jax.nn.one_hot(decoder_input_ids % 4, 4)
        return {"lm_logits": jnp.einsum("BMF,FV->BMV", one_hot, variables["params"])}

    for objective in (s2s.seq2seq(), s2s.seq2seq(loss_normalizing_factor=12.0)):
        whole = step.loss_and_grads(
            w, batch, jax.random.PRNGKey(0), apply_fn=apply_fn, objective=objective
        )
        parts = step.loss_and_grads(
            w, batch, jax.random.PRNGKey(0), apply_fn=apply_fn, objective=objective,
            num_microbatches=2,
        )  # fmt: skip
        np.testing.assert_allclose(parts[0], whole[0], rtol=1e-6)
        np.testing.assert_allclose(parts[2], whole[2], rtol=1e-5, atol=1e-7)
        for name in whole[1]:
            np.testing.assert_allclose(parts[1][name], whole[1][name], rtol=1e-6, atol=1e-7)


def test_loss_of_a_converted_t5_1_1_equals_huggingface_torch():
    """HF's T5ForConditionalGeneration(labels=...) averages the cross-entropy over labels != -100
    and shifts the labels right itself: the independent reference for the model and the loss."""
    torch.manual_seed(0)
    config = transformers.T5Config(
        vocab_size=61, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2,
        num_heads=4, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        decoder_start_token_id=0, dropout_rate=0.0,
    )  # fmt: skip
    hf = transformers.T5ForConditionalGeneration(config).eval()
    hf.lm_head.weight = torch.nn.Parameter(torch.randn(61, 32))
    rng = np.random.default_rng(3)
    inputs = rng.integers(2, 61, size=(3, 9))
    inputs[1, 6:] = 0
    targets = rng.integers(2, 61, size=(3, 5))
    targets[2, 3:] = 0
    labels = np.where(targets > 0, targets, -100)
    with torch.no_grad():
        reference = hf(
            input_ids=torch.from_numpy(inputs),
            attention_mask=torch.from_numpy((inputs > 0).astype(np.int64)),
            labels=torch.from_numpy(labels),
        ).loss.item()
    ours = convert.from_hf(hf)
    batch = {
        "encoder_input_tokens": inputs,
        "decoder_input_tokens": np.pad(targets, ((0, 0), (1, 0)))[:, :-1],
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (targets > 0).astype(np.int32),
    }
    batch = {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}
    objective = s2s.seq2seq(z_loss=0.0)
    model = Transformer(ours.config)
    outputs = model.apply({"params": ours.params}, **objective.model_inputs(batch))
    loss, _ = objective.loss_and_metrics(outputs, batch, objective.denominators(batch))
    assert abs(float(loss) - reference) < 1e-5, (float(loss), reference)
