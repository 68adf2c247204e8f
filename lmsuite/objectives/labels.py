"""A multi-task encoder's objective: a base objective (MLM) plus one cross-entropy term per
label head, each over the examples that carry that label.

In a mixture of tasks with different auxiliary labels (ERNIE 2.0: capitalization and
token-document relation per token, sentence reordering over k! classes and a 3-way sentence
distance per row), every example carries every label feature, set to -1 where its task does not
label it; so each example is routed to the terms of its own task:

  row label feature    int32 (B,)    its class, or -1          -> {name}_logits (B, C)
  token label feature  int32 (B, L)  a class per token, or -1  -> {name}_logits (B, L, C)

Term `name` is the mean cross-entropy over the labelled entries of the batch (a batch without
any gives 0), and adds `{name}_loss` and `{name}_accuracy` to the base's metrics; `weights`
scale each term in the total loss.

Example: labels [2, -1, 0] for logits (3, 3) -> the mean of -log p(2) of row 0 and -log p(0) of
row 2; `{name}_accuracy` counts those two rows.
"""

import dataclasses
import math
from collections.abc import Mapping, Sequence

import jax.numpy as jnp

from lmsuite.objectives.base import Objective, TermSums, token_cross_entropy, total_weight
from lmsuite.objectives.mlm import mlm as objectives_mlm


@dataclasses.dataclass(frozen=True)
class Label:
    """A label feature and its head: `per_token` labels run along the input tokens."""

    name: str
    per_token: bool = False


def with_labels(
    base: Objective,
    labels: Sequence[Label],
    *,
    weights: Mapping[str, float] | None = None,
    input_mask: str = "input_mask",
) -> Objective:
    """`base` plus a term per label (see the module docstring).

    Raises:
      ValueError: repeated or clashing label names, weights for unknown labels or not finite
        and >= 0.
    """
    labels = tuple(labels)
    names = [label.name for label in labels]
    clash = sorted(set(names) & {m.rsplit("_", 1)[0] for m in base.metrics})
    if len(set(names)) != len(names) or clash:
        raise ValueError(
            f"label names must be distinct and not the base objective's terms; got {names} "
            f"(clashing: {clash})"
        )
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(names))
    if unknown or not all(math.isfinite(w) and w >= 0 for w in weights.values()):
        raise ValueError(
            f"label weights must name labels of {names} with finite weights >= 0, got {weights}"
        )

    def labelled(batch, label: Label):
        values = batch[label.name]
        if label.per_token:
            if values.shape != batch[input_mask].shape:
                raise ValueError(
                    f"token label {label.name!r} {values.shape} must run along "
                    f"{input_mask} {batch[input_mask].shape}"
                )
            return values, (values >= 0) & (batch[input_mask] > 0)
        values = values.reshape(values.shape[0])
        return values, values >= 0

    def denominators(batch):
        out = dict(base.denominators(batch))
        for label in labels:
            out[label.name] = total_weight(labelled(batch, label)[1])
        return out

    def terms(outputs, batch) -> dict[str, TermSums]:
        out = dict(base.terms(outputs, batch))
        for label in labels:
            values, present = labelled(batch, label)
            out[label.name] = token_cross_entropy(
                outputs[f"{label.name}_logits"], jnp.maximum(values, 0), present
            )
        return out

    added = tuple(f"{label.name}_{m}" for label in labels for m in ("loss", "accuracy"))
    return dataclasses.replace(
        base,
        denominators=denominators,
        terms=terms,
        term_weights={**base.term_weights, **weights},
        features=(*base.features, *names),
        metrics=(*base.metrics, *added),
        label_metrics=(*base.label_metrics, *((f"{n}_accuracy", n) for n in names)),
        label_heads=(*base.label_heads, *((label.name, label.per_token) for label in labels)),
    )


def mlm_with_labels(
    *,
    labels: Sequence[str] = (),
    token_labels: Sequence[str] = (),
    label_weights: Mapping[str, float] | None = None,
    token_type_ids: str | None = "token_type_ids",
) -> Objective:
    """Masked LM plus a term per row label (`labels`) and per token label (`token_labels`):
    the loss of a multi-task encoder row (`recipes.RECIPES["mlm_multitask"]`)."""
    heads = [Label(n) for n in labels] + [Label(n, per_token=True) for n in token_labels]
    base = objectives_mlm(token_type_ids=token_type_ids)
    return with_labels(base, heads, weights=label_weights)
