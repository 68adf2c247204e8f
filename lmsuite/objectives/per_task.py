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

With task `weights`, the main term's loss is the task-weighted mean of its predictions' losses.

Example: task_ids [[1, 1, 2, 0]], weights [[1, 1, 1, 0]], per-token loss [[1., 3., 2., 9.]]
  -> seq2seq_loss/a = 2.0, seq2seq_loss/b = 2.0, seq2seq_share/a = 2/3, seq2seq_share/b = 1/3.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence

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


def _check_weights(weights: Mapping[str, float], tasks: tuple[str, ...]) -> None:
    unknown = sorted(set(weights) - set(tasks))
    if unknown:
        raise ValueError(
            f"task weights name {unknown}, which are not tasks of the mixture; its tasks are "
            f"{list(tasks)}"
        )
    bad = {t: w for t, w in weights.items() if not (math.isfinite(w) and w >= 0)}
    if bad or not any(weights.get(t, 1.0) > 0 for t in tasks):
        raise ValueError(
            f"task weights must be finite, >= 0 and not all 0, got {dict(weights)} (a task not "
            "named weighs 1)"
        )


def per_task(
    objective: Objective, tasks: Sequence[str], *, weights: Mapping[str, float] | None = None
) -> Objective:
    """`objective` with per-task metrics for a batch of a mixture of `tasks` (in task-id order).

    `weights` (task -> weight, 1 for a task not named) turn the main term's loss into the
    weighted mean sum_i w_task(i) l_i / sum_i w_task(i) over its predictions (a term normalized
    by a constant divides by that constant); accuracies and the per-task metrics stay unweighted.
    """
    tasks = tuple(tasks)
    if not tasks:
        raise ValueError(f"objective {objective.name!r}: per-task metrics need tasks, got none")
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"per-task metrics need distinct task names, got {list(tasks)}")
    _check_weights(weights or {}, tasks)
    term = main_term(objective)
    weights_feature = objective.prediction_features[1]
    count = objective.accuracy_denominators.get(term, term)
    predictions = f"{term}_predictions"
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
        out[predictions] = out[count]  # unweighted, whatever task weights do to the term's
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
            out[f"{term}_share/{task}"] = MetricSum(
                total_weight(only[weights_feature]), predictions
            )
        return out

    added = tuple(
        f"{term}_{metric}/{task}" for task in tasks for metric in ("loss", "accuracy", "share")
    )
    out = dataclasses.replace(
        objective,
        denominators=denominators,
        metric_sums=metric_sums,
        features=(*objective.features, TASK_IDS),
        metrics=(*objective.metrics, *added),
    )
    if not weights or all(w == 1.0 for w in weights.values()):
        return out
    return _weighted(out, objective, term, weights_feature, predictions, tasks, weights)


def _weighted(out, objective, term, weights_feature, predictions, tasks, weights) -> Objective:
    """`out` whose main term's loss weighs each prediction by its task's weight; its accuracy
    is divided by the unweighted count of predictions."""
    factor_K = jnp.asarray([0.0] + [float(weights.get(t, 1.0)) for t in tasks], jnp.float32)

    def scaled(batch):
        factor = factor_K[batch[TASK_IDS]]
        return {**batch, weights_feature: batch[weights_feature].astype(jnp.float32) * factor}

    def denominators(batch):
        den = dict(out.denominators(batch))
        den[term] = objective.denominators(scaled(batch))[term]
        return den

    def terms(outputs, batch):
        sums = dict(objective.terms(outputs, batch))
        sums[term] = sums[term]._replace(loss=objective.terms(outputs, scaled(batch))[term].loss)
        return sums

    return dataclasses.replace(
        out,
        denominators=denominators,
        terms=terms,
        accuracy_denominators={**out.accuracy_denominators, term: predictions},
    )
