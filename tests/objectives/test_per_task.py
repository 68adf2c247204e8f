"""Per-task metrics against numpy sums over each task's predictions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite import objectives
from lmsuite.objectives import per_task, seq2seq

TASKS = ("span", "iid", "prefix")


def _batch(rng, rows=4, length=12, vocab=7):
    ids = rng.integers(0, 3, size=(rows, length)) + 1
    weights = (rng.random((rows, length)) < 0.8).astype(np.int32)
    ids = np.where(weights > 0, ids, 0)  # padding carries task id 0
    return {
        seq2seq.INPUTS: rng.integers(1, vocab, size=(rows, 9)).astype(np.int32),
        seq2seq.DECODER_INPUTS: rng.integers(1, vocab, size=(rows, length)).astype(np.int32),
        seq2seq.TARGETS: rng.integers(1, vocab, size=(rows, length)).astype(np.int32),
        seq2seq.WEIGHTS: weights,
        per_task.TASK_IDS: ids.astype(np.int32),
    }


def test_per_task_seq2seq_metrics_are_the_sums_over_each_tasks_tokens():
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    logits = rng.normal(size=batch[seq2seq.TARGETS].shape + (7,)).astype(np.float32)
    objective = per_task.per_task(seq2seq.seq2seq(z_loss=1e-3, label_smoothing=0.1), TASKS)
    denominators = objective.denominators(batch)
    total, metrics = objective.loss_and_metrics({"lm_logits": jnp.asarray(logits)}, batch,
                                                denominators)  # fmt: skip

    # Independent restatement: T5X's smoothed loss + z-loss per token, then plain sums.
    log_z = np.log(np.exp(logits).sum(-1))
    target_logit = np.take_along_axis(logits, batch[seq2seq.TARGETS][..., None], -1)[..., 0]
    s, vocab = 0.1, 7
    q_low, q_high = s / (vocab - 1), 1 - s
    entropy = -(q_high * np.log(q_high) + (vocab - 1) * q_low * np.log(q_low))
    expected_logit = q_low * logits.sum(-1) + (q_high - q_low) * target_logit
    loss = log_z - expected_logit - entropy + 1e-3 * log_z**2
    correct = logits.argmax(-1) == batch[seq2seq.TARGETS]
    weights = batch[seq2seq.WEIGHTS].astype(np.float64)
    shares = []
    for k, task in enumerate(TASKS):
        mask = weights * (batch[per_task.TASK_IDS] == k + 1)
        assert mask.sum() > 0
        expected = (loss * mask).sum() / mask.sum()
        np.testing.assert_allclose(metrics[f"seq2seq_loss/{task}"], expected, rtol=1e-5)
        np.testing.assert_allclose(
            metrics[f"seq2seq_accuracy/{task}"], (correct * mask).sum() / mask.sum(), rtol=1e-6
        )
        shares.append(metrics[f"seq2seq_share/{task}"])
        np.testing.assert_allclose(shares[-1], mask.sum() / weights.sum(), rtol=1e-6)
    np.testing.assert_allclose(sum(shares), 1.0, rtol=1e-6)
    mixed = sum(metrics[f"seq2seq_loss/{t}"] * metrics[f"seq2seq_share/{t}"] for t in TASKS)
    np.testing.assert_allclose(mixed, metrics["seq2seq_loss"], rtol=1e-5)
    np.testing.assert_allclose(total, metrics["seq2seq_loss"], rtol=1e-6)


def test_per_task_mlm_metrics_under_jit():
    rng = np.random.default_rng(1)
    rows, predictions, vocab = 3, 5, 11
    batch = {
        "input_ids": rng.integers(1, vocab, size=(rows, 8)).astype(np.int32),
        "masked_positions": rng.integers(0, 8, size=(rows, predictions)).astype(np.int32),
        "masked_ids": rng.integers(1, vocab, size=(rows, predictions)).astype(np.int32),
        "masked_weights": np.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], np.float32),
        per_task.TASK_IDS: np.array([[1, 2, 2, 0, 0], [1, 1, 0, 0, 0], [2, 2, 1, 2, 2]], np.int32),
    }
    objective = per_task.per_task(objectives.mlm(), ("bert", "wwm"))
    logits = rng.normal(size=(rows, predictions, vocab)).astype(np.float32)

    @jax.jit
    def run(logits, batch):
        return objective.loss_and_metrics(
            {"mlm_logits": logits}, batch, objective.denominators(batch)
        )

    _, metrics = run(logits, batch)
    target_logit = np.take_along_axis(logits, batch["masked_ids"][..., None], -1)[..., 0]
    nll = np.log(np.exp(logits).sum(-1)) - target_logit
    for k, task in enumerate(("bert", "wwm")):
        mask = batch["masked_weights"] * (batch[per_task.TASK_IDS] == k + 1)
        np.testing.assert_allclose(metrics[f"mlm_loss/{task}"], (nll * mask).sum() / mask.sum(),
                                   rtol=1e-5)  # fmt: skip
    assert set(objective.metrics) == set(metrics)
    assert per_task.TASK_IDS in objective.features


def test_per_task_refuses_repeated_or_missing_tasks():
    with pytest.raises(ValueError, match="distinct task names"):
        per_task.per_task(objectives.mlm(), ("a", "a"))
    with pytest.raises(ValueError, match="need tasks"):
        per_task.per_task(objectives.mlm(), ())


def test_task_ids_of_another_shape_are_refused():
    objective = per_task.per_task(objectives.mlm(), ("a",))
    batch = {
        "masked_positions": np.zeros((2, 3), np.int32),
        "masked_ids": np.ones((2, 3), np.int32),
        "masked_weights": np.ones((2, 3), np.float32),
        per_task.TASK_IDS: np.ones((2,), np.int32),
    }
    with pytest.raises(ValueError, match="must run along masked_weights"):
        objective.denominators(batch)


def test_task_weights_make_the_loss_a_task_weighted_mean_and_leave_the_rest_unweighted():
    rng = np.random.default_rng(2)
    batch = _batch(rng)
    logits = rng.normal(size=batch[seq2seq.TARGETS].shape + (7,)).astype(np.float32)
    outputs = {"lm_logits": jnp.asarray(logits)}
    weights = {"span": 2.0, "prefix": 0.0}  # "iid" weighs 1
    plain = per_task.per_task(seq2seq.seq2seq(z_loss=0.0), TASKS)
    weighted = per_task.per_task(seq2seq.seq2seq(z_loss=0.0), TASKS, weights=weights)
    _, base = plain.loss_and_metrics(outputs, batch, plain.denominators(batch))
    total, metrics = weighted.loss_and_metrics(outputs, batch, weighted.denominators(batch))

    log_z = np.log(np.exp(logits).sum(-1))
    target_logit = np.take_along_axis(logits, batch[seq2seq.TARGETS][..., None], -1)[..., 0]
    factor = np.array([0.0, 2.0, 1.0, 0.0])[batch[per_task.TASK_IDS]] * batch[seq2seq.WEIGHTS]
    expected = ((log_z - target_logit) * factor).sum() / factor.sum()
    np.testing.assert_allclose(total, expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["seq2seq_loss"], expected, rtol=1e-5)
    for name in metrics:  # everything but the loss is what the unweighted objective reports
        if name not in ("seq2seq_loss",):
            np.testing.assert_allclose(metrics[name], base[name], rtol=1e-6, err_msg=name)


def test_task_weights_of_an_mlm_keep_its_accuracy_per_prediction():
    rng = np.random.default_rng(3)
    batch = {
        "input_ids": rng.integers(1, 11, size=(2, 8)).astype(np.int32),
        "masked_positions": rng.integers(0, 8, size=(2, 4)).astype(np.int32),
        "masked_ids": rng.integers(1, 11, size=(2, 4)).astype(np.int32),
        "masked_weights": np.ones((2, 4), np.float32),
        per_task.TASK_IDS: np.array([[1, 1, 2, 2], [2, 2, 2, 2]], np.int32),
    }
    logits = jnp.asarray(rng.normal(size=(2, 4, 11)).astype(np.float32))
    plain = per_task.per_task(objectives.mlm(), ("a", "b"))
    weighted = per_task.per_task(objectives.mlm(), ("a", "b"), weights={"a": 3.0})
    _, base = plain.loss_and_metrics({"mlm_logits": logits}, batch, plain.denominators(batch))
    _, metrics = weighted.loss_and_metrics(
        {"mlm_logits": logits}, batch, weighted.denominators(batch)
    )
    np.testing.assert_allclose(metrics["mlm_accuracy"], base["mlm_accuracy"], rtol=1e-6)
    expected = (3 * 2 * base["mlm_loss/a"] + 6 * base["mlm_loss/b"]) / (3 * 2 + 6)
    np.testing.assert_allclose(metrics["mlm_loss"], expected, rtol=1e-5)


@pytest.mark.parametrize(
    "weights, message",
    [
        ({"nope": 1.0}, r"\['nope'\], which are not tasks"),
        ({"a": -1.0}, "finite, >= 0"),
        ({"a": 0.0, "b": 0.0}, "not all 0"),
    ],  # fmt: skip
)
def test_bad_task_weights_are_refused_naming_them(weights, message):
    with pytest.raises(ValueError, match=message):
        per_task.per_task(objectives.mlm(), ("a", "b"), weights=weights)
