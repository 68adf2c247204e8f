"""The eval_step path of `lmsuite eval`: rows scored as the run's own evaluation scores them.

Every row whose examples have no "targets" for the Evaluator's score path
(`evaluate.uses_evaluator`) comes here: MLM rows gather their targets (`masked_ids` at
`masked_positions`), XLNet's and Transformer-XL's carry memory, the multi-task rows add label
heads. They go through the recipe's feature converter, the batches the run's own evaluation
reads (`input_pipeline.eval_dataset`) and `step.eval_step`, and each label head's held-out labels
are counted, so a reader can set its accuracy against the majority class.
"""

import math
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.models import Transformer, memory_shapes
from lmsuite.training import input_pipeline, recipes, step

if TYPE_CHECKING:
    from lmsuite.evaluation.evaluate import EvalRequest


class LabelCount(NamedTuple):
    """A classification head's held-out labels: its accuracy metric, the labelled entries (rows,
    or tokens for a per-token head) and the share of the most frequent label among them."""

    metric: str
    labelled: int
    majority: float
    per_token: bool


class _Params(NamedTuple):
    params: Any  # what `step.eval_step` reads of a TrainState


def with_eval_step(
    req: "EvalRequest", built: recipes.Built
) -> tuple[dict[str, float], int, dict[str, LabelCount]]:
    """(metrics, examples, label feature -> its `LabelCount`).

    A multi-task row's examples carry every label head's feature, -1 where their task has no
    such label (`label_fill`, as in training): a head's loss and accuracy are averaged over its
    labelled entries, and a head no example labels is left out, so one task of an ERNIE 2.0 run
    reports its own head only. A mixture reports per-task metrics, as its run does."""
    label_heads = dict(built.objective.label_heads)
    data = input_pipeline.eval_dataset(
        task=req.task,
        sequence_length=req.sequence_length,
        feature_converter=built.feature_converter,
        global_batch_size=req.batch_size,
        split=req.split,
        batches=-1 if req.max_batches is None else req.max_batches,  # -1: tf.data's "all"
        rows_task=req.recipe.rows_task,
        task_ids_along=built.task_ids_along,
        label_fill=label_heads or None,
    )
    model = Transformer(req.model_config)
    objective = built.objective
    targets, weights = objective.prediction_features
    accuracy, cross_entropy = objective.learning_metrics

    @jax.jit
    def run(params, batch, carry):
        return step.eval_step(
            _Params(params), batch, carry, apply_fn=model.apply, objective=objective
        )

    carry = None
    if objective.carry is not None:
        shapes = memory_shapes(req.model_config, req.batch_size)
        carry = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    heads = {f"{name}_{m}": name for name in label_heads for m in ("loss", "accuracy")}
    tallies = {
        label: _LabelTally(metric, label, label_heads.get(label, False))
        for metric, label in objective.label_metrics
    }
    tokens = batches = 0

    def parts():
        nonlocal carry, tokens, batches
        for batch in data.as_numpy_iterator():
            batch_parts, carry = run(req.params, batch, carry)
            tokens += int((np.asarray(batch[weights]) > 0).sum())
            batches += 1
            for tally in tallies.values():
                tally.add(batch)
            yield batch_parts

    held_out = step.held_out_metrics(objective, parts())
    if not tokens:
        raise ValueError(
            f"task {req.task!r} split {req.split!r} gave no batch of {req.batch_size} examples "
            f"with {targets!r} to evaluate"
        )
    loss = held_out[cross_entropy]  # per target token, as every metric: over all the batches
    out = {"loss": loss, "token_accuracy": held_out[accuracy], "perplexity": math.exp(loss)}
    out |= {
        f"eval/{k}": v
        for k, v in held_out.items()
        if k not in heads or tallies[heads[k]].labelled  # a head no example labels: left out
    }
    labels = {label: t.count() for label, t in tallies.items() if t.labelled}
    return out, batches * req.batch_size, labels


class _LabelTally:
    """Counts one label feature's labelled entries and classes over the batches (-1: none; a
    per-token label counts the real tokens only, as the head's loss does)."""

    def __init__(self, metric: str, label: str, per_token: bool):
        self.metric, self.label, self.per_token = metric, label, per_token
        self.classes = np.zeros(0, np.int64)

    @property
    def labelled(self) -> int:
        return int(self.classes.sum())

    def add(self, batch) -> int:
        values = np.asarray(batch[self.label]).reshape(len(batch["input_mask"]), -1)
        present = values >= 0
        if self.per_token:
            present &= np.asarray(batch["input_mask"]) > 0
        found = np.bincount(values[present])
        size = max(len(found), len(self.classes))
        self.classes = np.pad(self.classes, (0, size - len(self.classes)))
        self.classes += np.pad(found, (0, size - len(found)))
        return int(present.sum())

    def count(self) -> LabelCount:
        share = float(self.classes.max() / self.labelled)
        return LabelCount(self.metric, self.labelled, share, self.per_token)
