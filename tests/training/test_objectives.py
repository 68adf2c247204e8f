"""Objective losses against hand computations; terms add up over microbatches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite import objectives
from lmsuite.objectives.base import token_cross_entropy
from lmsuite.objectives.rtd import binary_cross_entropy


def test_token_cross_entropy_matches_log_softmax():
    logits = jnp.asarray([[[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]]])
    targets = jnp.asarray([[0, 2]])
    sums = token_cross_entropy(logits, targets, jnp.asarray([[1.0, 0.5]]))
    logp = jax.nn.log_softmax(logits)
    np.testing.assert_allclose(sums.loss, -(logp[0, 0, 0] + 0.5 * logp[0, 1, 2]), rtol=1e-6)
    assert float(sums.correct) == 1.0
    with pytest.raises(ValueError, match=r"targets \(1, 3\)"):
        token_cross_entropy(logits, jnp.zeros((1, 3), jnp.int32), jnp.ones((1, 3)))


def test_binary_cross_entropy_docstring_example():
    sums = binary_cross_entropy(jnp.asarray([[2.0, -1.0]]), jnp.asarray([[1, 0]]), jnp.ones((1, 2)))
    np.testing.assert_allclose(sums.loss, jax.nn.softplus(-2.0) + jax.nn.softplus(-1.0), rtol=1e-6)
    assert float(sums.correct) == 2.0


def _mlm_nsp_case(rows):
    rs = np.random.RandomState(0)
    batch = {
        "input_ids": rs.randint(1, 9, (rows, 6)).astype(np.int32),
        "input_mask": np.ones((rows, 6), np.int32),
        "masked_positions": rs.randint(0, 6, (rows, 3)).astype(np.int32),
        "masked_ids": rs.randint(0, 9, (rows, 3)).astype(np.int32),
        "masked_weights": (rs.rand(rows, 3) < 0.7).astype(np.float32),
        "next_sentence_label": rs.randint(0, 2, (rows, 1)).astype(np.int32),
    }
    outputs = {
        "mlm_logits": jnp.asarray(rs.randn(rows, 3, 9), jnp.float32),
        "classifier_logits": jnp.asarray(rs.randn(rows, 2), jnp.float32),
    }
    return batch, outputs


def test_mlm_with_sentence_term_and_microbatch_additivity():
    objective = objectives.mlm(sentence_label="next_sentence_label")
    batch, outputs = _mlm_nsp_case(4)
    kwargs = objective.model_inputs(batch)
    assert set(kwargs) == {"input_ids", "attention_mask", "masked_positions"}
    denominators = objective.denominators(batch)
    loss, metrics = objective.loss_and_metrics(outputs, batch, denominators)
    logp = jax.nn.log_softmax(outputs["mlm_logits"])
    picked = np.take_along_axis(np.asarray(logp), batch["masked_ids"][..., None], axis=-1)[..., 0]
    mlm = -(picked * batch["masked_weights"]).sum() / batch["masked_weights"].sum()
    nsp_logp = jax.nn.log_softmax(outputs["classifier_logits"])
    nsp = -np.take_along_axis(np.asarray(nsp_logp), batch["next_sentence_label"], axis=1).mean()
    np.testing.assert_allclose(metrics["mlm_loss"], mlm, rtol=1e-5)
    np.testing.assert_allclose(metrics["sentence_loss"], nsp, rtol=1e-5)
    np.testing.assert_allclose(loss, mlm + nsp, rtol=1e-5)
    halves = [
        objective.loss_and_metrics(
            jax.tree.map(lambda x, s=s: x[s], outputs),
            {k: v[s] for k, v in batch.items()},
            denominators,
        )[0]
        for s in (slice(0, 2), slice(2, 4))
    ]
    np.testing.assert_allclose(sum(halves), loss, rtol=1e-6)


def test_held_out_metrics_pool_the_batches_sums():
    """Evaluation over uneven batches (1 row, then 3) reports what the objective computes on
    all 4 rows at once, where the mean of the batches' means does not."""
    from lmsuite.training import step

    objective = objectives.mlm(sentence_label="next_sentence_label")
    batch, outputs = _mlm_nsp_case(4)
    batch["masked_weights"][0] = [1.0, 0.0, 0.0]  # 1 prediction, against the others' ~6
    whole_loss, whole = objective.loss_and_metrics(outputs, batch, objective.denominators(batch))
    pieces = [
        (jax.tree.map(lambda x, s=s: x[s], outputs), {k: v[s] for k, v in batch.items()})
        for s in (slice(0, 1), slice(1, 4))
    ]
    parts = [objective.metric_parts(o, b, objective.denominators(b)) for o, b in pieces]
    pooled = step.held_out_metrics(objective, iter(parts))
    assert set(pooled) == {*objective.metrics, "loss"}
    for name, value in whole.items():
        np.testing.assert_allclose(pooled[name], value, rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(pooled["loss"], whole_loss, rtol=1e-6)
    means = [objective.loss_and_metrics(o, b, objective.denominators(b))[1] for o, b in pieces]
    mean_of_means = (means[0]["mlm_loss"] + means[1]["mlm_loss"]) / 2
    assert abs(float(mean_of_means) - pooled["mlm_loss"]) > 0.05
    assert step.held_out_metrics(objective, iter([])) == {}


def test_causal_lm_reads_seqio_lm_features_and_names_missing_ones():
    objective = objectives.causal_lm()
    batch = {
        "decoder_input_tokens": np.asarray([[0, 5, 6, 7]], np.int32),
        "decoder_target_tokens": np.asarray([[5, 6, 7, 1]], np.int32),
        "decoder_loss_weights": np.asarray([[1, 1, 1, 1]], np.float32),
    }
    assert objective.model_inputs(batch) == {"input_ids": batch["decoder_input_tokens"]}
    logits = jax.nn.one_hot(batch["decoder_target_tokens"], 9) * 20.0
    loss, metrics = objective.loss_and_metrics(
        {"lm_logits": logits}, batch, objective.denominators(batch)
    )
    assert float(loss) < 1e-6 and float(metrics["lm_accuracy"]) == 1.0
    assert float(objective.num_tokens(batch)) == 4.0
    with pytest.raises(ValueError, match=r"needs batch features \['decoder_input_tokens'\]"):
        objective.model_inputs({"input_ids": batch["decoder_input_tokens"]})
