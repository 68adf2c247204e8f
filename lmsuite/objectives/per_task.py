"""An objective's metrics split by the task of each prediction (SeqIO mixtures).

A mixture's batches carry `task_ids` (`lmsuite.data.mixtures`): the 1-based task index on each
prediction of the objective's weights feature (`Objective.prediction_features[1]`), 0 on
padding. `per_task(objective, tasks)` reports, besides the objective's own metrics, for each
task k of `tasks` its main term's loss and accuracy over that task's predictions and the
task's share of the predictions:

  {term}_loss/{task}, {term}_accuracy/{task}, {term}_share/{task}

The main term is the one of `learning_metrics[0]` (`mlm` for MLM rows, `seq2seq`, `lm`). Its
sums come from the objective's own `terms` with the weights outside task k set to 0, so they
are exactly what the objective computes on that task's predictions alone; the shares sum to 1
and share-weighted accuracies to the main term's accuracy.

Example: task_ids [[1, 1, 2, 0]], weights [[1, 1, 1, 0]], per-token loss [[1., 3., 2., 9.]]
  -> seq2seq_loss/a = 2.0, seq2seq_loss/b = 2.0, seq2seq_share/a = 2/3, seq2seq_share/b = 1/3.
"""

import dataclasses
from collections.abc import Sequence

import jax.numpy as jnp

from lmsuite.objectives.base import MetricSum, Objective, total_weight

TASK_IDS = "task_ids"  # lmsuite.data.mixtures.TASK_IDS (objectives import no data module)


def main_term(objective: Objective) -> str:
    """The term whose accuracy is the objective's first learning metric."""
    accuracy = objective.learning_metrics[0]
    if not accuracy.endswith("_accuracy"):
        raise ValueError(
            f"objective {objective.name!r}: its first learning metric {accuracy!r} is not a "
            "term's accuracy; per-task metrics need one"
        )
    return accuracy.removesuffix("_accuracy")


def per_task(objective: Objective, tasks: Sequence[str]) -> Objective:
    """`objective` with per-task metrics for a batch of a mixture of `tasks` (in task-id order)."""
    tasks = tuple(tasks)
    if not tasks:
        raise ValueError(f"objective {objective.name!r}: per-task metrics need tasks, got none")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"per-task metrics need distinct task names, got {list(tasks)}")
    term = main_term(objective)
    weights_feature = objective.prediction_features[1]
    count = objective.accuracy_denominators.get(term, term)
    base_denominators, base_sums = objective.denominators, objective.metric_sums

    def weights_of(batch, k):
        in_task = batch[TASK_IDS] == k + 1
        weights = batch[weights_feature]
        if in_task.shape != weights.shape:
            raise ValueError(
                f"objective {objective.name!r}: {TASK_IDS} {in_task.shape} must run along "
                f"{weights_feature} {weights.shape}"
            )
        return jnp.where(in_task, weights, jnp.zeros_like(weights))

    def denominators(batch):
        out = dict(base_denominators(batch))
        for k, task in enumerate(tasks):
            out[f"{term}_tokens/{task}"] = total_weight(weights_of(batch, k))
        return out

    def metric_sums(outputs, batch):
        out = {} if base_sums is None else dict(base_sums(outputs, batch))
        for k, task in enumerate(tasks):
            only = {**batch, weights_feature: weights_of(batch, k)}
            sums = objective.terms(outputs, only)[term]
            tokens = f"{term}_tokens/{task}"
            out[f"{term}_loss/{task}"] = MetricSum(sums.loss, tokens)
            out[f"{term}_accuracy/{task}"] = MetricSum(sums.correct, tokens)
            out[f"{term}_share/{task}"] = MetricSum(total_weight(only[weights_feature]), count)
        return out

    added = tuple(
        f"{term}_{metric}/{task}" for task in tasks for metric in ("loss", "accuracy", "share")
    )
    return dataclasses.replace(
        objective,
        denominators=denominators,
        metric_sums=metric_sums,
        features=(*objective.features, TASK_IDS),
        metrics=(*objective.metrics, *added),
    )
