"""ELECTRA's replaced-token detection term: per-token binary cross-entropy of `rtd_logits`
(the `electra` objective computes its labels inside the step, from the generator's samples)."""

import jax
import jax.numpy as jnp

from lmsuite.objectives.base import TermSums


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
