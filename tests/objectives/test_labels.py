"""A multi-task encoder: label heads of their own arity, and each example's labels routed to their
own terms (-1: the example's task does not label it)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from lmsuite import objectives
from lmsuite.data import feature_converters as fc
from lmsuite.models import LabelHead, ModelConfig, Transformer
from lmsuite.objectives.labels import Label, with_labels
from lmsuite.training import preflight, recipes

B, L, P, V = 4, 8, 3, 30
HEADS = (LabelHead(name="distance", num_labels=3), LabelHead(name="capital", num_labels=2,
         per_token=True))  # fmt: skip
CONFIG = ModelConfig(vocab_size=V, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_length=L,
                     label_heads=HEADS, dropout_rate=0.0, attention_dropout_rate=0.0)  # fmt: skip
LABELS = (Label("distance"), Label("capital", per_token=True))


def _batch(rng):
    input_mask = np.ones((B, L), np.int32)
    input_mask[:, 6:] = 0
    capital = rng.integers(0, 2, size=(B, L)).astype(np.int32)
    capital[2:] = -1  # rows 2 and 3 come from a task without capitalization labels
    return {
        "input_ids": rng.integers(5, V, size=(B, L)).astype(np.int32),
        "input_mask": input_mask,
        "token_type_ids": np.zeros((B, L), np.int32),
        "masked_positions": rng.integers(0, 6, size=(B, P)).astype(np.int32),
        "masked_ids": rng.integers(5, V, size=(B, P)).astype(np.int32),
        "masked_weights": np.ones((B, P), np.float32),
        "distance": np.array([2, -1, 0, 1], np.int32),
        "capital": capital,
    }


def _log_softmax(x):
    return (
        x
        - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - x.max(-1, keepdims=True)
    )


def test_label_terms_are_means_over_the_labelled_entries_only():
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    objective = with_labels(objectives.mlm(), LABELS, weights={"capital": 0.5})
    outputs = {
        "mlm_logits": jnp.asarray(rng.normal(size=(B, P, V)), jnp.float32),
        "distance_logits": jnp.asarray(rng.normal(size=(B, 3)), jnp.float32),
        "capital_logits": jnp.asarray(rng.normal(size=(B, L, 2)), jnp.float32),
    }
    total, metrics = objective.loss_and_metrics(outputs, batch, objective.denominators(batch))
    rows = batch["distance"] >= 0
    lp = _log_softmax(np.asarray(outputs["distance_logits"], np.float64))
    distance = -lp[rows, batch["distance"][rows]].mean()
    np.testing.assert_allclose(metrics["distance_loss"], distance, rtol=1e-5)
    tokens = (batch["capital"] >= 0) & (batch["input_mask"] > 0)
    lp = _log_softmax(np.asarray(outputs["capital_logits"], np.float64))
    capital = -lp[tokens, batch["capital"][tokens]].mean()
    np.testing.assert_allclose(metrics["capital_loss"], capital, rtol=1e-5)
    expected = metrics["mlm_loss"] + distance + 0.5 * capital
    np.testing.assert_allclose(total, expected, rtol=1e-5)
    assert objective.label_heads == (("distance", False), ("capital", True))


def test_each_example_trains_only_the_heads_its_task_labels():
    """Gradients reach a label head only through labelled entries: with every distance label
    -1, the distance head gets no gradient; with one labelled row, it does."""
    rng = np.random.default_rng(1)
    batch = _batch(rng)
    model = Transformer(CONFIG)
    objective = with_labels(objectives.mlm(), LABELS)
    params = model.init(jax.random.PRNGKey(0), **objective.model_inputs(batch))["params"]

    def grads(batch):
        def loss(params):
            outputs = model.apply({"params": params}, **objective.model_inputs(batch))
            return objective.loss_and_metrics(outputs, batch, objective.denominators(batch))[0]

        return jax.grad(loss)(params)

    unlabelled = dict(batch, distance=np.full((B,), -1, np.int32))
    head = grads(unlabelled)["label_distance"]
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(head))
    head = grads(batch)["label_distance"]
    assert any(float(jnp.abs(g).max()) > 0.0 for g in jax.tree_util.tree_leaves(head))


def test_label_heads_have_their_own_arity_and_parameters():
    model = Transformer(CONFIG)
    ids = jnp.ones((2, L), jnp.int32)
    variables = model.init(jax.random.PRNGKey(0), input_ids=ids)
    outputs = model.apply(variables, input_ids=ids)
    assert outputs["distance_logits"].shape == (2, 3)
    assert outputs["capital_logits"].shape == (2, L, 2)
    params = variables["params"]
    assert set(params["label_distance"]) == {"pooler", "output"}
    assert set(params["label_capital"]) == {"output"}
    assert ModelConfig.from_json(CONFIG.to_json()) == CONFIG


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(label_heads=(HEADS[0], HEADS[0])), "distinct names"),
        (
            dict(architecture="decoder", heads=("lm",), type_vocab_size=0),
            "heads of a plain encoder",
        ),
    ],
)
def test_label_heads_are_refused_where_they_cannot_be(change, message):
    with pytest.raises(ValueError, match=message):
        CONFIG.replace(**change)
    with pytest.raises(ValueError, match="num_labels must be an int >= 2"):
        LabelHead(name="x", num_labels=1)
    with pytest.raises(ValueError, match="an identifier other than the heads"):
        LabelHead(name="mlm", num_labels=2)


def test_a_recipe_reading_a_label_head_the_model_lacks_is_refused_by_name():
    row = dataclasses.replace(
        recipes.get("bert_mlm"), loss=lambda **options: with_labels(objectives.mlm(), LABELS)
    )
    problems = preflight.recipe_run_problems(
        row, sequence_length=None, model_config=CONFIG.replace(label_heads=HEADS[:1])
    )
    assert len(problems) == 1 and "needs a per-token label head 'capital'" in problems[0]
    assert not preflight.recipe_run_problems(row, sequence_length=None, model_config=CONFIG)


def test_the_mlm_converter_pads_token_labels_with_minus_one_and_refuses_to_pack_them():
    example = {"input_ids": [2, 7, 8, 3], "masked_positions": [1], "masked_ids": [7],
               "masked_weights": [1.0], "capital": [-1, 1, 0, -1]}  # fmt: skip
    dataset = tf.data.Dataset.from_tensors({k: tf.constant(v) for k, v in example.items()})
    converter = fc.EncoderMlmFeatureConverter(token_labels=("capital",))
    row = next(converter(dataset, {"input_ids": 6, "masked_ids": 2}).as_numpy_iterator())
    assert row["capital"].tolist() == [-1, 1, 0, -1, -1, -1]
    with pytest.raises(ValueError, match="cannot pack"):
        fc.EncoderMlmFeatureConverter(token_labels=("capital",), pack=True)
