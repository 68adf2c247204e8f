"""Masked language modelling (BERT, RoBERTa, ALBERT, SpanBERT inputs), optionally with a
sentence-level classification term (NSP, SOP, StructBERT's 3-way task)."""

import jax.numpy as jnp

from lmsuite.objectives.base import (
    Objective,
    optional,
    require,
    token_cross_entropy,
    total_weight,
)


def mlm(
    *,
    inputs: str = "input_ids",
    input_mask: str = "input_mask",
    masked_positions: str = "masked_positions",
    masked_targets: str = "masked_ids",
    masked_weights: str = "masked_weights",
    targets: str = "encoder_target_tokens",
    weights: str = "encoder_loss_weights",
    token_type_ids: str = "token_type_ids",
    segment_ids: str = "segment_ids",
    positions: str = "position_ids",
    sentence_label: str | None = None,
    pad_id: int = 0,
) -> Objective:
    """The MLM objective over `lmsuite.data.feature_converters.EncoderMlmFeatureConverter`
    features: (B, L) `input_ids`, `token_type_ids`, `input_mask` and BERT's gathered predictions,
    (B, P) `masked_positions`, `masked_ids`, `masked_weights`, so logits are computed at the P
    positions only; packed rows (`EncoderMlmFeatureConverter(pack=True)`) add (B, L)
    `segment_ids` and `position_ids`, forwarded to the model. Without `masked_positions` in the
    batch it reads SeqIO `EncoderFeatureConverter`'s dense (B, L) targets and loss weights
    instead (pass `segment_ids="encoder_segment_ids", positions="encoder_positions"` for its
    packed features).

    With `sentence_label` set (e.g. "next_sentence_label") a `sentence` term is added: the
    classifier head's cross-entropy against that (B,) or (B, 1) label, weight 1 per example.

    Its contract declares the gathered features (`masked_positions` ...); the dense targets are
    read only from batches without them.
    """

    def model_inputs(batch):
        require(batch, "mlm", inputs)
        kwargs = {"input_ids": batch[inputs]}
        kwargs |= optional(
            batch,
            token_type_ids=token_type_ids,
            segment_ids=segment_ids,
            position_ids=positions,
            masked_positions=masked_positions,
        )
        if input_mask in batch:
            kwargs["attention_mask"] = batch[input_mask]
        elif segment_ids not in batch:
            kwargs["attention_mask"] = (batch[inputs] != pad_id).astype(jnp.int32)
        return kwargs

    def mlm_weights(batch):
        return batch[masked_weights] if masked_positions in batch else batch[weights]

    def denominators(batch):
        out = {"mlm": total_weight(mlm_weights(batch))}
        if sentence_label is not None:
            require(batch, "mlm", sentence_label)
            out["sentence"] = jnp.asarray(batch[sentence_label].shape[0], jnp.float32)
        return out

    def terms(outputs, batch):
        if masked_positions in batch:
            require(batch, "mlm", masked_targets, masked_weights)
            target_ids = batch[masked_targets]
        else:
            require(batch, "mlm", targets, weights)
            target_ids = batch[targets]
        out = {"mlm": token_cross_entropy(outputs["mlm_logits"], target_ids, mlm_weights(batch))}
        if sentence_label is not None:
            labels = batch[sentence_label].reshape(batch[sentence_label].shape[0])
            out["sentence"] = token_cross_entropy(
                outputs["classifier_logits"], labels, jnp.ones(labels.shape, jnp.float32)
            )
        return out

    def num_tokens(batch):
        return total_weight(batch[inputs] != pad_id)

    labels = () if sentence_label is None else (sentence_label,)
    return Objective(
        name="mlm",
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=num_tokens,
        features=(inputs, input_mask, masked_positions, masked_targets, masked_weights) + labels,
        heads=("mlm",) + (("classifier",) if labels else ()),
        metrics=("mlm_loss", "mlm_accuracy")
        + (("sentence_loss", "sentence_accuracy") if labels else ()),
        prediction_features=(masked_targets, masked_weights),
        learning_metrics=("mlm_accuracy", "mlm_loss"),
        prediction_name="MLM",
        label_metrics=tuple(("sentence_accuracy", label) for label in labels),
    )
