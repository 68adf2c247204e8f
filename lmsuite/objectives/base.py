"""`Objective`, the token cross-entropy every objective shares, and loss assembly.

An `Objective` carries its contract with the rest of the suite, as SeqIO's feature converters
carry TASK_FEATURES / MODEL_FEATURES: the batch features it reads, the model heads it reads the
outputs of, the metrics each step reports and what its predictions are compared with. Each
factory sets them from its own options (`mlm(sentence_label=...)` adds a feature, the classifier
head and the sentence metrics), so a recipe row only pairs the objective with its data and its
model; `tests/training/test_objective_contracts.py` holds every row's converter and model to
them.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

Batch = Mapping[str, jax.Array]


class TermSums(NamedTuple):
    """Sums over the examples of one loss term: weighted loss and weighted correct predictions."""

    loss: jax.Array
    correct: jax.Array


class MetricSum(NamedTuple):
    """A metric that is not a loss term: a sum over the examples and the name of the denominator
    (a key of `Objective.denominators(batch)`) it is divided by."""

    value: jax.Array
    denominator: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Carry:
    """A state the model returns with one batch and takes back with the next (XLNet's memory).

    Attributes:
      model_input: the model's keyword argument that receives it (e.g. "mems").
      model_output: the model output that holds the next step's value (e.g. "new_mems").
      reset: (carried, batch) -> what this batch's rows see: rows that start a new stream get
        the initial (zero) state.
    """

    model_input: str
    model_output: str
    reset: Callable[[Any, Batch], Any]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Objective:
    """What the training step needs to know about an objective.

    Attributes:
      name: for metrics and error messages.
      model_inputs: batch -> keyword arguments of the model's `__call__` (ids, masks, ...).
      denominators: batch -> {name: total weight}, one per term (keyed by the term) and any
        more that accuracies and metric sums name; depends on the batch only.
      terms: (model outputs, batch) -> {term: TermSums}; each term has a denominator.
      num_tokens: batch -> number of real (non-padding) input tokens, for tokens/s.
      term_weights: optional multiplier per term (ELECTRA's discriminator weight, for example).
      accuracy_denominators: term -> the denominator its accuracy is divided by, where that is
        not the loss's own (seq2seq with a constant loss normalizing factor still reports
        accuracy per real target token).
      metric_sums: optional (model outputs, batch) -> {metric: MetricSum}, metrics beyond each
        term's loss and accuracy (sequence accuracy, z-loss), reported under their own names.
      carry: a state carried from step to step through the model (None: each step stands
        alone); the train state holds it, so checkpoints keep it.

    The contract (what the row's converter and model must provide, what a step reports):
      features: batch features the loss always reads (the feature converter must emit them);
        features it reads only where present (packing's segment ids, token types) are not listed.
      heads: model heads whose outputs it reads (`ModelConfig.heads` must include them).
      metrics: what `loss_and_metrics` reports, besides the total loss: `{term}_loss` and
        `{term}_accuracy` per term, then the metric sums; it raises when they differ.
      prediction_features: (targets, weights) of the batch: the predictions the baselines
        (most frequent target, unigram cross-entropy) count.
      learning_metrics: (accuracy, cross-entropy) metric names compared with those baselines.
      prediction_name: how summaries name the predictions ("MLM", "LM", "PLM", "target").
      label_metrics: (accuracy metric, label feature) of each per-row classification term (NSP,
        SOP, sentence structure), compared with the held-out majority label.
      label_heads: (name, per_token) of each `ModelConfig.label_heads` entry the loss reads
        (`lmsuite.objectives.labels`): the model must have a LabelHead of that name and kind.
    """

    name: str
    model_inputs: Callable[[Batch], dict]
    denominators: Callable[[Batch], dict[str, jax.Array]]
    terms: Callable[[Mapping[str, jax.Array], Batch], dict[str, TermSums]]
    num_tokens: Callable[[Batch], jax.Array]
    term_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)
    accuracy_denominators: Mapping[str, str] = dataclasses.field(default_factory=dict)
    metric_sums: Callable[[Mapping[str, jax.Array], Batch], dict[str, MetricSum]] | None = None
    carry: Carry | None = None
    features: tuple[str, ...]
    heads: tuple[str, ...]
    metrics: tuple[str, ...]
    prediction_features: tuple[str, str]
    learning_metrics: tuple[str, str]
    prediction_name: str
    label_metrics: tuple[tuple[str, str], ...] = ()
    label_heads: tuple[tuple[str, bool], ...] = ()

    def __post_init__(self):
        declared = set(self.metrics)
        named = set(self.learning_metrics) | {metric for metric, _ in self.label_metrics}
        if not named <= declared:
            raise ValueError(
                f"objective {self.name!r}: learning and label metrics {sorted(named - declared)} "
                f"are not among its metrics {list(self.metrics)}"
            )
        read = set(self.prediction_features) | {label for _, label in self.label_metrics}
        if not read <= set(self.features):
            raise ValueError(
                f"objective {self.name!r}: prediction and label features "
                f"{sorted(read - set(self.features))} are not among its features "
                f"{list(self.features)}"
            )

    def loss_and_metrics(
        self, outputs: Mapping[str, jax.Array], batch: Batch, denominators: Mapping[str, jax.Array]
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Total loss and per-term `{term}_loss` / `{term}_accuracy` for the given denominators.

        With the denominators of the whole global batch, the values of microbatches add up to
        the values of the whole batch.
        """
        return self.combine(self.metric_parts(outputs, batch, denominators))

    def metric_parts(
        self, outputs: Mapping[str, jax.Array], batch: Batch, denominators: Mapping[str, jax.Array]
    ) -> "MetricParts":
        """The sums behind `loss_and_metrics` and the denominator value of each.

        Summed leaf by leaf over batches, they give the metrics of the batches taken together
        (`combine`): what held-out evaluation reports, where a mean of per-batch means would
        weigh a batch of few predictions like a full one and count a mixture's task that is
        absent from a batch as 0.
        """
        sums = self.terms(outputs, batch)
        missing = sorted(set(sums) - set(denominators))
        if missing:
            raise ValueError(
                f"objective {self.name!r}: terms {missing} have no denominator; the "
                f"denominators are {sorted(denominators)}"
            )
        terms = {
            term: (
                term_sums.loss,
                term_sums.correct,
                denominators[term],
                denominators[self.accuracy_denominators.get(term, term)],
            )
            for term, term_sums in sums.items()
        }
        reported = {f"{term}_{m}" for term in terms for m in ("loss", "accuracy")}
        extra = {} if self.metric_sums is None else self.metric_sums(outputs, batch)
        metrics = {}
        for name, metric in extra.items():
            if name in reported or metric.denominator not in denominators:
                raise ValueError(
                    f"objective {self.name!r}: metric {name!r} clashes with a term's metric or "
                    f"names an unknown denominator {metric.denominator!r} (have "
                    f"{sorted(denominators)})"
                )
            metrics[name] = (metric.value, denominators[metric.denominator])
        if reported | set(metrics) != set(self.metrics):
            raise ValueError(
                f"objective {self.name!r} declares metrics {list(self.metrics)} but reports "
                f"{[*reported, *metrics]}"
            )
        return MetricParts(terms=terms, metrics=metrics)

    def combine(self, parts: "MetricParts", *, xp: Any = jnp) -> tuple[Any, dict[str, Any]]:
        """(total loss, metrics) of `metric_parts`, one batch's or several batches' summed: each
        metric is its sum over its denominator (at least 1e-8: an empty one gives 0), the loss
        the `term_weights`-weighted sum of the terms' losses. `xp=numpy` divides host sums in
        float64 (jax.numpy: float32, traceable)."""
        safe = lambda denominator: xp.maximum(denominator, 1e-8)
        total = xp.zeros(())
        metrics = {}
        for term, (loss, correct, loss_denominator, accuracy_denominator) in parts.terms.items():
            term_loss = loss / safe(loss_denominator)
            total = total + self.term_weights.get(term, 1.0) * term_loss
            metrics[f"{term}_loss"] = term_loss
            metrics[f"{term}_accuracy"] = correct / safe(accuracy_denominator)
        for name, (value, denominator) in parts.metrics.items():
            metrics[name] = value / safe(denominator)
        return total, metrics


class MetricParts(NamedTuple):
    """One batch's sums behind an objective's loss and metrics, each with its denominator's
    value (`Objective.metric_parts`); a pytree, so batches' parts add leaf by leaf.

    Attributes:
      terms: term -> (loss sum, correct sum, the loss's denominator, the accuracy's).
      metrics: metric sum name -> (sum, denominator).
    """

    terms: dict[str, tuple[jax.Array, jax.Array, jax.Array, jax.Array]]
    metrics: dict[str, tuple[jax.Array, jax.Array]]


def token_cross_entropy(logits, targets, weights) -> TermSums:
    """Weighted sums of softmax cross-entropy and of argmax hits, computed in float32.

    Example: logits (2, 3, V), targets (2, 3) ids, weights (2, 3) in {0, 1} -> two scalars,
    the sum of -log p(target) and the number of correct argmaxes over weighted positions.
    """
    if logits.shape[:-1] != targets.shape or targets.shape != weights.shape:
        raise ValueError(
            f"logits {logits.shape} need targets and weights of shape {logits.shape[:-1]}, got "
            f"targets {targets.shape} and weights {weights.shape}"
        )
    logits = logits.astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[
        ..., 0
    ]
    loss = jnp.sum((log_z - target_logit) * weights)
    correct = jnp.sum((jnp.argmax(logits, axis=-1) == targets) * weights)
    return TermSums(loss=loss, correct=correct)


def total_weight(weights) -> jax.Array:
    """The float32 sum of a weight array."""
    return jnp.sum(weights.astype(jnp.float32))


def optional(batch: Batch, **names: str) -> dict:
    """Model keyword arguments for the batch features that are present.

    Example: optional({"a": x}, attention_mask="a", segment_ids="s") -> {"attention_mask": x}
    """
    return {kwarg: batch[feature] for kwarg, feature in names.items() if feature in batch}


def require(batch: Batch, objective: str, *features: str) -> None:
    """Raises a ValueError naming the missing features and the ones the batch has."""
    missing = [f for f in features if f not in batch]
    if missing:
        raise ValueError(
            f"objective {objective!r} needs batch features {missing}; the batch has {sorted(batch)}"
        )
