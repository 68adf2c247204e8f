"""Sequence classification (NSP, SOP and fine-tuning probes) with the classifier head."""

import jax.numpy as jnp

from lmsuite.objectives.base import Objective, optional, require, token_cross_entropy


def classification(
    *,
    inputs: str = "input_ids",
    label: str = "label",
    token_type_ids: str = "token_type_ids",
    attention_mask: str = "input_mask",
    pad_id: int = 0,
) -> Objective:
    """Cross-entropy of `classifier_logits` (B, num_labels) against the (B,) `label` feature."""

    def model_inputs(batch):
        require(batch, "classification", inputs)
        kwargs = {"input_ids": batch[inputs]}
        kwargs |= optional(batch, token_type_ids=token_type_ids, attention_mask=attention_mask)
        if attention_mask not in batch:
            kwargs["attention_mask"] = (batch[inputs] != pad_id).astype(jnp.int32)
        return kwargs

    def denominators(batch):
        require(batch, "classification", label)
        return {"classification": jnp.asarray(batch[label].shape[0], jnp.float32)}

    def terms(outputs, batch):
        labels = batch[label].reshape(batch[label].shape[0])  # (B,) or (B, 1)
        return {
            "classification": token_cross_entropy(
                outputs["classifier_logits"], labels, jnp.ones(labels.shape, jnp.float32)
            )
        }

    def num_tokens(batch):
        return jnp.sum((batch[inputs] != pad_id).astype(jnp.float32))

    return Objective(
        name="classification",
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=num_tokens,
    )
