"""SpanBERT's loss: masked LM plus the span boundary objective (SBO) on the same masked tokens.

As facebookresearch/SpanBERT `pretraining/fairseq/criterions/spanbert_loss.py`: each term is
a mean over its own targets and the two are added, the SBO term times `--pair-loss-weight` (1.0
in the published command): loss = mlm_sum / num_mlm + sbo_weight * sbo_sum / num_sbo. The
reference divides the SBO sum by num_sbo + 1 (to survive a batch without pairs); here, as for
every term, by max(num_sbo, 1e-8).

A masked token has an SBO target only where both boundaries of its masked run are real tokens
of its row and its offset has a row in the head's offset table. The data
(`lmsuite.data.preprocessors.spanbert`) clips boundaries into the row and gives no weight, so
the weight is derived here: the left boundary must be exactly (position - offset - 1), the
right one must lie after the token, and neither may itself be a masked position (a clipped
boundary lands on a masked token, a real one never does: runs are maximal). The reference makes
the same cut when it builds its pairs (`span_masking`: a run touching the block's first or last
token gets none) and keeps the first `--max-pair-targets` tokens of each run. It masks the block
before adding [CLS] and [SEP], so these are never boundaries there; `excluded_boundary_ids`
(the `spanbert` recipe passes both ids) makes the same cut on rows that already hold them.
"""

import jax
import jax.numpy as jnp

from lmsuite.objectives.base import Objective, require, token_cross_entropy, total_weight
from lmsuite.objectives.mlm import mlm

SPAN_FEATURES = ("span_left_positions", "span_right_positions", "span_offsets")


def sbo_weights(
    masked_positions_BP,
    masked_weights_BP,
    left_BP,
    right_BP,
    offsets_BP,
    *,
    input_ids_BL,
    max_span,
    excluded_boundary_ids=(),
) -> jax.Array:
    """float32 (B, P): the MLM weight where the SBO has a target, 0 elsewhere.

    Example (L=6, max_span=15): masked_positions [[1, 2, 4, 0]], weights [[1, 1, 1, 0]],
    left [[0, 0, 3, 0]], right [[3, 3, 5, 0]], offsets [[0, 1, 0, 0]] -> [[1, 1, 1, 0]];
    a token masked at position 0 (offset 0, left clipped to 0) or at L - 1 (right clipped to
    L - 1, the token itself) would get 0, and so would the first two with
    excluded_boundary_ids=(input_ids[0, 0],): their left boundary holds that id.
    """
    length = input_ids_BL.shape[1]
    real_BP = masked_weights_BP > 0

    def is_masked(x_BP):
        hit_BPP = x_BP[:, :, None] == masked_positions_BP[:, None, :]
        return jnp.any(hit_BPP & real_BP[:, None, :], axis=-1)

    start_BP = masked_positions_BP - offsets_BP
    left_ok = (left_BP == start_BP - 1) & (left_BP >= 0) & ~is_masked(left_BP)
    right_ok = (right_BP > masked_positions_BP) & (right_BP < length) & ~is_masked(right_BP)
    in_table = (offsets_BP >= 0) & (offsets_BP < max_span)
    keep = real_BP & left_ok & right_ok & in_table
    for side_BP in (left_BP, right_BP):
        ids_BP = jnp.take_along_axis(input_ids_BL, jnp.clip(side_BP, 0, length - 1), axis=1)
        for excluded in excluded_boundary_ids:
            keep &= ids_BP != excluded
    return jnp.where(keep, masked_weights_BP.astype(jnp.float32), 0.0)


def span_boundary(
    *,
    inputs: str = "input_ids",
    input_mask: str = "input_mask",
    masked_positions: str = "masked_positions",
    masked_targets: str = "masked_ids",
    masked_weights: str = "masked_weights",
    token_type_ids: str | None = "token_type_ids",
    segment_ids: str = "segment_ids",
    positions: str = "position_ids",
    span_left: str = "span_left_positions",
    span_right: str = "span_right_positions",
    span_offsets: str = "span_offsets",
    sbo_weight: float = 1.0,
    max_span: int = 15,
    excluded_boundary_ids: tuple[int, ...] = (),
    pad_id: int = 0,
) -> Objective:
    """MLM + SBO over `EncoderMlmFeatureConverter(span_features=SPAN_FEATURES)` batches: the
    MLM objective's features (`objectives.mlm`, gathered predictions only) plus (B, P)
    `span_left_positions`, `span_right_positions`, `span_offsets`, which are fed to the model
    under those names; it reads `mlm_logits` and `sbo_logits` (B, P, V).

    `max_span` must equal the model's `ModelConfig.sbo_max_span` (both default to the
    reference's 15): tokens further into their run than that have no SBO target. Runs with a
    boundary token in `excluded_boundary_ids` ([CLS], [SEP]) have none either.
    """
    if max_span < 1:
        raise ValueError(f"max_span must be >= 1, got {max_span}")
    base = mlm(
        inputs=inputs,
        input_mask=input_mask,
        masked_positions=masked_positions,
        masked_targets=masked_targets,
        masked_weights=masked_weights,
        token_type_ids=token_type_ids,
        segment_ids=segment_ids,
        positions=positions,
        pad_id=pad_id,
    )
    features = dict(zip(SPAN_FEATURES, (span_left, span_right, span_offsets), strict=True))

    def weights(batch):
        require(batch, "span_boundary", masked_positions, masked_weights, *features.values())
        return sbo_weights(
            batch[masked_positions],
            batch[masked_weights],
            batch[span_left],
            batch[span_right],
            batch[span_offsets],
            input_ids_BL=batch[inputs],
            max_span=max_span,
            excluded_boundary_ids=tuple(excluded_boundary_ids),
        )

    def model_inputs(batch):
        require(batch, "span_boundary", masked_positions, *features.values())
        return base.model_inputs(batch) | {kw: batch[name] for kw, name in features.items()}

    def denominators(batch):
        return base.denominators(batch) | {"sbo": total_weight(weights(batch))}

    def terms(outputs, batch):
        sbo = token_cross_entropy(outputs["sbo_logits"], batch[masked_targets], weights(batch))
        return base.terms(outputs, batch) | {"sbo": sbo}

    return Objective(
        name="span_boundary",
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=base.num_tokens,
        term_weights={"sbo": sbo_weight},
        features=base.features + tuple(features.values()),
        heads=base.heads + ("sbo",),
        metrics=base.metrics + ("sbo_loss", "sbo_accuracy"),
        prediction_features=base.prediction_features,
        learning_metrics=base.learning_metrics,
        prediction_name=base.prediction_name,
    )
