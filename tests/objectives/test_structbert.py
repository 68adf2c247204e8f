"""StructBERT's loss (lmsuite.objectives.structbert): the three terms against a numpy
log-softmax computation, padding slots ignored, one MLM head for both token terms, bad inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite import cli
from lmsuite.models import Transformer
from lmsuite.objectives import structbert
from lmsuite.training import structure_checks

B, L, P, S, V = 3, 10, 4, 6, 11


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "input_ids": jnp.asarray(rng.integers(5, V, size=(B, L)), jnp.int32),
        "input_mask": jnp.ones((B, L), jnp.int32),
        "token_type_ids": jnp.zeros((B, L), jnp.int32),
        "masked_positions": jnp.asarray(rng.integers(1, L, size=(B, P)), jnp.int32),
        "masked_ids": jnp.asarray(rng.integers(0, V, size=(B, P)), jnp.int32),
        "masked_weights": jnp.asarray([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], jnp.float32),
        "shuffled_positions": jnp.asarray(rng.integers(1, L, size=(B, S)), jnp.int32),
        "shuffled_ids": jnp.asarray(rng.integers(0, V, size=(B, S)), jnp.int32),
        # int32, as the converter's span features hand them over.
        "shuffled_weights": jnp.asarray([[1] * 3 + [0] * 3, [1] * 6, [0] * 6], jnp.int32),
        "sentence_relation_label": jnp.asarray([[0], [2], [1]], jnp.int32),
    }


def _outputs(seed=1):
    rng = np.random.default_rng(seed)
    return {
        "mlm_logits": jnp.asarray(rng.normal(size=(B, P + S, V)), jnp.float32),
        "classifier_logits": jnp.asarray(rng.normal(size=(B, 3)), jnp.float32),
    }


def _numpy_mean_ce(logits, targets, weights):
    logits = np.asarray(logits, np.float64)
    log_p = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
    log_p -= logits.max(-1, keepdims=True)
    nll = -np.take_along_axis(log_p, np.asarray(targets)[..., None], -1)[..., 0]
    hits = logits.argmax(-1) == np.asarray(targets)
    w = np.asarray(weights, np.float64)
    return (nll * w).sum() / w.sum(), (hits * w).sum() / w.sum()


def _loss(batch, outputs, objective=None):
    objective = objective or structbert.structbert()
    return objective.loss_and_metrics(outputs, batch, objective.denominators(batch))


def test_loss_is_the_sum_of_three_numpy_cross_entropies():
    batch, outputs = _batch(), _outputs()
    total, metrics = _loss(batch, outputs)
    logits = np.asarray(outputs["mlm_logits"])
    mlm, mlm_acc = _numpy_mean_ce(logits[:, :P], batch["masked_ids"], batch["masked_weights"])
    word, word_acc = _numpy_mean_ce(logits[:, P:], batch["shuffled_ids"], batch["shuffled_weights"])
    labels = np.asarray(batch["sentence_relation_label"])[:, 0]
    sentence, sentence_acc = _numpy_mean_ce(outputs["classifier_logits"], labels, np.ones(B))
    want = {
        "mlm_loss": mlm,
        "mlm_accuracy": mlm_acc,
        "word_structure_loss": word,
        "word_structure_accuracy": word_acc,
        "sentence_loss": sentence,
        "sentence_accuracy": sentence_acc,
    }
    assert set(metrics) == set(want)
    for name, value in want.items():
        np.testing.assert_allclose(float(metrics[name]), value, rtol=1e-5, err_msg=name)
    assert min(mlm, word, sentence) > 0.1  # each term contributes
    np.testing.assert_allclose(float(total), mlm + word + sentence, rtol=1e-5)
    weighted, _ = _loss(batch, outputs, structbert.structbert(word_structure_weight=0.5))
    np.testing.assert_allclose(float(weighted), mlm + 0.5 * word + sentence, rtol=1e-5)


def test_weight_zero_slots_are_ignored():
    batch, outputs = _batch(), _outputs()
    total, metrics = _loss(batch, outputs)
    logits = np.asarray(outputs["mlm_logits"]).copy()
    ids = np.asarray(batch["shuffled_ids"]).copy()
    dead_mlm = np.asarray(batch["masked_weights"]) == 0
    dead_word = np.asarray(batch["shuffled_weights"]) == 0
    logits[:, :P][dead_mlm] = 50.0 * np.random.default_rng(5).normal(size=(dead_mlm.sum(), V))
    logits[:, P:][dead_word] = -30.0
    ids[dead_word] = 0
    changed_batch = batch | {"shuffled_ids": jnp.asarray(ids)}
    changed = outputs | {"mlm_logits": jnp.asarray(logits)}
    total2, metrics2 = _loss(changed_batch, changed)
    np.testing.assert_allclose(float(total2), float(total), rtol=1e-6)
    for name in metrics:
        np.testing.assert_allclose(float(metrics2[name]), float(metrics[name]), rtol=1e-6)
    # A live word-structure slot does move it (the test above can fail).
    logits[1, P, 0] += 5.0  # one class: shifting a whole row changes no softmax
    _, moved = _loss(changed_batch, outputs | {"mlm_logits": jnp.asarray(logits)})
    assert float(moved["word_structure_loss"]) != pytest.approx(
        float(metrics["word_structure_loss"])
    )
    assert float(moved["mlm_loss"]) == pytest.approx(float(metrics["mlm_loss"]))


def test_both_token_terms_read_the_one_mlm_head():
    config = cli.model_config_from_gin(
        ["models/structbert_tiny.gin"], ["ModelConfig.vocab_size=64"]
    )
    model = Transformer(config)
    batch = _batch() | {
        "input_ids": jnp.asarray(np.random.default_rng(2).integers(5, 64, size=(B, L)), jnp.int32)
    }
    objective = structbert.structbert()
    inputs = objective.model_inputs(batch)
    np.testing.assert_array_equal(
        inputs["masked_positions"],
        np.concatenate([batch["masked_positions"], batch["shuffled_positions"]], axis=1),
    )
    params = jax.jit(lambda rng: model.init(rng, **inputs))(jax.random.PRNGKey(0))["params"]
    apply = jax.jit(lambda kwargs: model.apply({"params": params}, **kwargs))
    out = apply(inputs)
    assert out["mlm_logits"].shape == (B, P + S, 64) and out["classifier_logits"].shape == (B, 3)
    alone = apply(inputs | {"masked_positions": batch["shuffled_positions"]})
    np.testing.assert_allclose(out["mlm_logits"][:, P:], alone["mlm_logits"], rtol=1e-5, atol=1e-5)
    total, _ = _loss(batch, out, objective)
    assert np.isfinite(float(total))


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda b: {k: v for k, v in b.items() if k != "shuffled_ids"}, r"\['shuffled_ids'\]"),
        (lambda b: b | {"sentence_relation_label": jnp.asarray([0, 3, 1])}, "holds 3; expected 0"),
        (lambda b: b | {"shuffled_weights": jnp.ones((B, S - 1))}, "shuffled_weights must have"),
        (lambda b: b | {"segment_ids": b["input_mask"]}, "packed batch"),
        (lambda b: b | {"sentence_relation_label": jnp.zeros((B, 2), jnp.int32)}, r"\(3,\) or"),
    ],
)
def test_bad_batches_are_named(change, match):
    with pytest.raises(ValueError, match=match):
        structbert.structbert().model_inputs(change(_batch()))


def test_bad_model_outputs_and_configs_are_named():
    batch, outputs = _batch(), _outputs()
    with pytest.raises(ValueError, match="num_labels = 3"):
        _loss(batch, outputs | {"classifier_logits": jnp.zeros((B, 2))})
    with pytest.raises(ValueError, match=r"P \+ S = 10"):
        _loss(batch, outputs | {"mlm_logits": outputs["mlm_logits"][:, :P]})
    bert = cli.model_config_from_gin(["models/bert_tiny.gin"], [])
    (problem,) = structure_checks.structbert_model_problems(bert, None)
    assert "num_labels = 3, got 2" in problem
    tiny = cli.model_config_from_gin(["models/structbert_tiny.gin"], [])
    assert structure_checks.structbert_model_problems(tiny, None) == []
    assert structure_checks.structbert_lengths_fit({"input_ids": 512, "masked_ids": 79}) == []
    (short,) = structure_checks.structbert_lengths_fit({"input_ids": 16, "masked_ids": 2})
    assert "3 shuffled word-structure slots, more than masked_ids = 2" in short
