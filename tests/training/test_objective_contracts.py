"""Each objective's declared contract (`Objective.features`, `.heads`, `.metrics`) against what
its recipe row pairs it with: the converter emits the features, the model has the heads, a step
reports the metrics (`Objective.loss_and_metrics` refuses any other set, and the recipe matrix
in `test_recipes.py` finds each declared metric in the log of a real two-step run)."""

import dataclasses

import jax.numpy as jnp
import pytest

from lmsuite import cli
from lmsuite import objectives as losses
from lmsuite.models.config import HEADS
from lmsuite.training import preflight, recipes

ROWS = list(recipes.RECIPES)


def _example_config(recipe):
    bindings = list(recipe.example_bindings)
    return cli.model_config_from_gin([f"models/{recipe.example_model}.gin"], bindings)


@pytest.mark.parametrize("name", ROWS)
def test_the_rows_converter_emits_every_declared_feature(name):
    recipe = recipes.RECIPES[name]
    objective = recipe.objective
    assert objective.features, name
    for pack in (False, True) if recipe.can_pack() else (False,):
        emitted = recipe.model_features(pack=pack)
        missing = set(objective.features) - emitted
        assert not missing, f"{name} pack={pack}: {objective.name} reads {missing}, not emitted"
        assert set(objective.prediction_features) <= emitted
        assert {label for _, label in objective.label_metrics} <= emitted


@pytest.mark.parametrize("name", ROWS)
def test_the_declared_heads_are_what_the_model_must_have(name):
    recipe = recipes.RECIPES[name]
    heads = recipe.objective.heads
    assert heads and set(heads) <= set(HEADS), heads
    config = _example_config(recipe)
    assert set(heads) <= set(config.heads), (heads, config.heads)
    for head in heads:  # without any one of them the run is refused, naming it
        fewer = tuple(h for h in config.heads if h != head)
        try:
            lacking = dataclasses.replace(config, heads=fewer)
        except ValueError as refused:  # the model config itself needs it (XLNet, ELECTRA)
            assert "heads" in str(refused), refused
            continue
        problems = preflight.recipe_run_problems(recipe, sequence_length=None, model_config=lacking)
        assert any(f"needs model heads {list(heads)}" in p and repr(head) in p for p in problems)


@pytest.mark.parametrize("name", ROWS)
def test_learning_and_label_metrics_are_among_the_declared_ones(name):
    objective = recipes.RECIPES[name].objective
    assert len(set(objective.metrics)) == len(objective.metrics)
    assert set(objective.learning_metrics) <= set(objective.metrics)
    assert {metric for metric, _ in objective.label_metrics} <= set(objective.metrics)


def test_the_losss_options_drive_its_declaration():
    plain, nsp = losses.mlm(), losses.mlm(sentence_label="next_sentence_label")
    assert plain.heads == ("mlm",) and nsp.heads == ("mlm", "classifier")
    assert set(nsp.metrics) - set(plain.metrics) == {"sentence_loss", "sentence_accuracy"}
    assert set(nsp.features) - set(plain.features) == {"next_sentence_label"}
    assert nsp.label_metrics == (("sentence_accuracy", "next_sentence_label"),)
    assert "stream_step" in losses.permutation_lm().features
    assert "stream_step" not in losses.permutation_lm(memory=False).features
    assert "decoder_positions" not in losses.seq2seq.seq2seq().features
    assert "decoder_positions" in losses.seq2seq.seq2seq(given_decoder_positions=True).features
    named = losses.seq2seq.seq2seq(name="t5")
    assert named.learning_metrics == ("t5_accuracy", "t5_cross_entropy")
    assert losses.prefix_lm().features[-1] == "decoder_causal_attention"


def test_a_step_reporting_other_metrics_than_declared_is_refused():
    objective = dataclasses.replace(losses.causal_lm(), metrics=("lm_loss", "lm_accuracy", "x"))
    batch = {
        "decoder_target_tokens": jnp.array([[1, 2]]),
        "decoder_loss_weights": jnp.array([[1, 1]]),
    }
    outputs = {"lm_logits": jnp.zeros((1, 2, 4))}
    with pytest.raises(ValueError, match=r"declares metrics .*'x'.* but reports"):
        objective.loss_and_metrics(outputs, batch, objective.denominators(batch))
    _, metrics = losses.causal_lm().loss_and_metrics(
        outputs, batch, losses.causal_lm().denominators(batch)
    )
    assert set(metrics) == {"lm_loss", "lm_accuracy"}


def test_a_declaration_naming_an_undeclared_metric_or_feature_is_refused():
    with pytest.raises(ValueError, match="learning and label metrics"):
        dataclasses.replace(losses.causal_lm(), learning_metrics=("lm_accuracy", "lm_nll"))
    with pytest.raises(ValueError, match="prediction and label features"):
        dataclasses.replace(losses.causal_lm(), prediction_features=("targets", "weights"))
