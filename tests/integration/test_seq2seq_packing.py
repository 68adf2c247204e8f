"""Packing changes nothing an example sees: the per-example losses of a packed seq2seq batch equal
those of the same examples unpacked, with segment ids and positions reaching encoder
self-attention, decoder self-attention, cross-attention and the position embeddings."""

import jax
import numpy as np
import pytest
import seqio
import tensorflow as tf

import lmsuite.data.tasks  # noqa: F401  (registers the tasks)
from lmsuite import cli
from lmsuite.models import Transformer
from lmsuite.objectives import seq2seq as s2s
from lmsuite.training import recipes

EXAMPLES = 10


def _examples(recipe: recipes.Recipe, lengths) -> list[dict]:
    task = seqio.get_mixture_or_task(f"wiki_sample_{recipe.task_objectives[0]}")
    dataset = task.get_dataset(lengths, split="validation", shuffle=False, seed=0)
    return list(dataset.take(EXAMPLES).as_numpy_iterator())


def _converted(examples, converter, lengths) -> list[dict]:
    spec = {k: tf.TensorSpec([None], tf.int32) for k in examples[0]}
    dataset = tf.data.Dataset.from_generator(
        lambda: ({k: v.astype(np.int32) for k, v in x.items()} for x in examples),
        output_signature=spec,
    )
    return list(converter(dataset, lengths).as_numpy_iterator())


def _per_example_losses(model, params, objective, rows) -> list[float]:
    """Mean target cross-entropy of every example, in the order the rows hold them."""
    batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    outputs = model.apply({"params": params}, **objective.model_inputs(batch))
    _, _, cross_entropy = s2s.smoothed_cross_entropy(
        outputs["lm_logits"], batch["decoder_target_tokens"], label_smoothing=0.0, z_loss=0.0
    )
    cross_entropy = np.asarray(cross_entropy)
    weights = batch["decoder_loss_weights"] > 0
    segments = batch.get("decoder_segment_ids", weights.astype(np.int32))
    losses = []
    for row in range(len(rows)):
        for segment in sorted(set(segments[row][weights[row]].tolist())):
            picked = weights[row] & (segments[row] == segment)
            losses.append(float(cross_entropy[row][picked].mean()))
    return losses


@pytest.mark.parametrize(
    "recipe_name, model_name",
    [("t5_span_corruption", "t5_1_1_tiny"), ("bart_denoising", "bart_tiny"), ("mass", "bart_tiny")],
)
def test_packed_per_example_losses_equal_unpacked(recipe_name, model_name):
    recipe = recipes.RECIPES[recipe_name]
    lengths = recipe.lengths_for(64)
    config = cli.model_config_from_gin([f"models/{model_name}.gin"])
    config = config.replace(vocab_size=8100, max_length=256)
    examples = _examples(recipe, lengths)
    # Rows three times as long as one example: the packer puts several in each.
    packed_lengths = {k: 3 * v for k, v in lengths.items()}
    packed = _converted(examples, recipe.converter(pack=True), packed_lengths)
    unpacked = _converted(examples, recipe.converter(pack=False), lengths)
    assert len(unpacked) == EXAMPLES and len(packed) < EXAMPLES  # several examples per row
    assert max(r["decoder_segment_ids"].max() for r in packed) >= 2
    objective = recipes.build(recipes.make_recipe(name=recipe_name), model_config=config).objective
    model = Transformer(config)
    first = {k: v[None] for k, v in unpacked[0].items()}
    params = model.init(jax.random.PRNGKey(0), **objective.model_inputs(first))
    params = jax.tree.map(np.asarray, params["params"])
    want = _per_example_losses(model, params, objective, unpacked)
    got = _per_example_losses(model, params, objective, packed)
    assert len(got) == len(want) == EXAMPLES
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert np.std(want) > 1e-3  # the examples differ, so a misrouted segment would show
