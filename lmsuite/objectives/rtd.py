"""ELECTRA's replaced-token detection: per-token binary cross-entropy of `rtd_logits`."""

import jax
import jax.numpy as jnp

from lmsuite.objectives.base import Objective, TermSums, optional, require, total_weight


def binary_cross_entropy(logits, labels, weights) -> TermSums:
    """Weighted sums of sigmoid cross-entropy and of correct (logit > 0) == label decisions.

    Example: logits [[2., -1.]], labels [[1, 0]], weights [[1, 1]] ->
      loss = softplus(-2) + softplus(-1) = 0.127 + 0.313, correct = 2.
    """
    if not logits.shape == labels.shape == weights.shape:
        raise ValueError(
            f"rtd logits {logits.shape}, labels {labels.shape} and weights {weights.shape} "
            "must have one shape"
        )
    logits = logits.astype(jnp.float32)
    labels = labels.astype(jnp.float32)
    weights = weights.astype(jnp.float32)
    per_token = jax.nn.softplus(logits) - labels * logits
    correct = ((logits > 0).astype(jnp.float32) == labels).astype(jnp.float32)
    return TermSums(loss=jnp.sum(per_token * weights), correct=jnp.sum(correct * weights))


def rtd(
    *,
    inputs: str = "replaced_ids",
    originals: str = "original_ids",
    weights: str | None = None,
    token_type_ids: str = "token_type_ids",
    pad_id: int = 0,
    discriminator_weight: float = 50.0,
) -> Objective:
    """The discriminator's loss over the corrupted `inputs` against the `originals` they came from.

    A token is "replaced" (label 1) where the two differ, so a generator sample equal to the
    original counts as real, as in ELECTRA. No SeqIO task emits these two features: ELECTRA's
    joint model makes them from the MLM features and its generator's samples inside the step
    (the `electra` recipe trains it with `lmsuite.objectives.electra`). The loss covers every
    non-padding token (or `weights` when given) and is scaled by `discriminator_weight`
    (ELECTRA's lambda = 50).

    Example: replaced_ids [[2, 9, 7, 3]], original_ids [[2, 8, 7, 3]] -> labels [[0, 1, 0, 0]].
    """

    def token_weights(batch):
        if weights is not None:
            return batch[weights]
        return (batch[inputs] != pad_id).astype(jnp.float32)

    def model_inputs(batch):
        require(batch, "rtd", inputs)
        kwargs = {"input_ids": batch[inputs]}
        kwargs |= optional(batch, token_type_ids=token_type_ids)
        kwargs["attention_mask"] = (batch[inputs] != pad_id).astype(jnp.int32)
        return kwargs

    def denominators(batch):
        return {"rtd": total_weight(token_weights(batch))}

    def terms(outputs, batch):
        require(batch, "rtd", inputs, originals)
        labels = (batch[inputs] != batch[originals]).astype(jnp.float32)
        return {"rtd": binary_cross_entropy(outputs["rtd_logits"], labels, token_weights(batch))}

    def num_tokens(batch):
        return total_weight(batch[inputs] != pad_id)

    return Objective(
        name="rtd",
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=num_tokens,
        term_weights={"rtd": discriminator_weight},
    )
