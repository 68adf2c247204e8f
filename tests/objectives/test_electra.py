"""ELECTRA's loss on hand-made model outputs: labels from the corrupted ids against the original
text (a sample equal to the original is real), MLM + 50 x RTD with the reference's means, the
metrics and the model inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.objectives.electra import METRICS, electra, original_ids

MASK = 4


def _batch():
    # Row 0: [CLS] a [MASK] b [MASK] [SEP] pad pad; targets 8 (pos 2) and 9 (pos 4); slot 2 pads.
    ids = jnp.array([[2, 5, MASK, 6, MASK, 3, 0, 0]], jnp.int32)
    return {
        "input_ids": ids,
        "input_mask": (ids != 0).astype(jnp.int32),
        "token_type_ids": jnp.zeros_like(ids),
        "masked_positions": jnp.array([[2, 4, 0]], jnp.int32),
        "masked_ids": jnp.array([[8, 9, 0]], jnp.int32),
        "masked_weights": jnp.array([[1.0, 1.0, 0.0]]),
    }


def _outputs(rs, sampled):
    batch = _batch()
    corrupted = np.asarray(batch["input_ids"]).copy()
    corrupted[0, [2, 4]] = sampled
    return {
        "mlm_logits": jnp.asarray(rs.randn(1, 3, 16), jnp.float32),
        "sampled_ids": jnp.array([list(sampled) + [7]], jnp.int32),
        "corrupted_ids": jnp.asarray(corrupted),
        "rtd_logits": jnp.asarray(rs.randn(1, 8), jnp.float32),
    }


def test_original_ids_write_back_the_real_predictions_only():
    batch = _batch()
    got = original_ids(
        batch["input_ids"], batch["masked_positions"], batch["masked_ids"], batch["masked_weights"]
    )
    np.testing.assert_array_equal(got, [[2, 5, 8, 6, 9, 3, 0, 0]])  # [CLS] at 0 untouched


def test_a_sample_equal_to_the_original_is_real_and_the_loss_is_mlm_plus_50_rtd():
    rs = np.random.RandomState(0)
    batch = _batch()
    # Position 2 samples its original (8): label 0; position 4 samples 11 != 9: label 1.
    outputs = _outputs(rs, sampled=(8, 11))
    objective = electra()
    loss, metrics = objective.loss_and_metrics(outputs, batch, objective.denominators(batch))

    labels = np.array([0, 0, 0, 0, 1, 0, 0, 0], np.float32)
    real = np.array([1, 1, 1, 1, 1, 1, 0, 0], np.float32)
    z = np.asarray(outputs["rtd_logits"][0], np.float64)
    bce = np.log1p(np.exp(z)) - labels * z  # sigmoid cross-entropy, closed form
    rtd = np.sum(bce * real) / real.sum()
    logp = jax.nn.log_softmax(np.asarray(outputs["mlm_logits"][0], np.float64))
    mlm = -(logp[0, 8] + logp[1, 9]) / 2

    np.testing.assert_allclose(metrics["rtd_loss"], rtd, rtol=1e-5)
    np.testing.assert_allclose(metrics["mlm_loss"], mlm, rtol=1e-5)
    np.testing.assert_allclose(loss, mlm + 50.0 * rtd, rtol=1e-5)
    hits = ((z > 0) == labels) * real
    np.testing.assert_allclose(metrics["rtd_accuracy"], hits.sum() / real.sum(), rtol=1e-6)
    np.testing.assert_allclose(metrics["replaced_fraction"], 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(metrics["sampled_accuracy"], 1 / 2, rtol=1e-6)
    assert set(METRICS) <= set(metrics)


def test_padding_is_no_token_of_the_discriminator():
    rs = np.random.RandomState(1)
    batch = _batch()
    outputs = _outputs(rs, sampled=(8, 11))
    objective = electra()
    _, base = objective.loss_and_metrics(outputs, batch, objective.denominators(batch))
    outputs["rtd_logits"] = outputs["rtd_logits"].at[0, 6:].set(30.0)  # confident, on padding
    _, padded = objective.loss_and_metrics(outputs, batch, objective.denominators(batch))
    np.testing.assert_allclose(padded["rtd_loss"], base["rtd_loss"], rtol=1e-6)
    np.testing.assert_allclose(objective.num_tokens(batch), 6)


def test_weights_scale_the_terms():
    rs = np.random.RandomState(2)
    batch, outputs = _batch(), _outputs(rs, sampled=(3, 11))
    plain, doubled = electra(), electra(generator_weight=2.0, discriminator_weight=1.0)
    loss, m = plain.loss_and_metrics(outputs, batch, plain.denominators(batch))
    loss2, _ = doubled.loss_and_metrics(outputs, batch, doubled.denominators(batch))
    np.testing.assert_allclose(loss, m["mlm_loss"] + 50 * m["rtd_loss"], rtol=1e-6)
    np.testing.assert_allclose(loss2, 2 * m["mlm_loss"] + m["rtd_loss"], rtol=1e-6)


def test_model_inputs_carry_the_prediction_slots_and_missing_features_are_named():
    batch = _batch()
    inputs = electra().model_inputs(batch)
    assert sorted(inputs) == [
        "attention_mask",
        "input_ids",
        "masked_positions",
        "masked_weights",
        "token_type_ids",
    ]
    assert "token_type_ids" not in electra(token_type_ids=None).model_inputs(batch)
    del batch["masked_weights"]
    with pytest.raises(ValueError, match=r"'electra' needs batch features \['masked_weights'\]"):
        electra().model_inputs(batch)
