"""ELECTRA's joint loss: the generator's masked LM plus 50 x the discriminator's replaced-token
detection, as google-research/electra run_pretraining.py's `total_loss`."""

import jax.numpy as jnp

from lmsuite.objectives.base import MetricSum, Objective, require, total_weight
from lmsuite.objectives.mlm import mlm
from lmsuite.objectives.rtd import binary_cross_entropy

# Outputs of `lmsuite.models.electra.ElectraPretrainer` the loss reads.
OUTPUTS = ("mlm_logits", "sampled_ids", "corrupted_ids", "rtd_logits")
METRICS = (
    "mlm_loss",
    "mlm_accuracy",
    "rtd_loss",
    "rtd_accuracy",
    "replaced_fraction",
    "sampled_accuracy",
)
# What the `electra` recipe row (lmsuite/training/encoder_recipes.py) does otherwise than the
# reference.
DIFFERENCES = (
    "masking (85% [MASK], 15% kept) happens in the SeqIO pipeline, not in the graph; the "
    "generator's heads and FFN scale with its width (the reference sets heads = D/64, F = 4D: "
    "the same for the paper's sizes); padded prediction slots are skipped by weight (the "
    "reference: updates to position 0 are ignored); exact Gumbel noise (the reference adds 1e-9 "
    "inside its logs); held-out batches sample with one fixed key; means divide by "
    "max(count, 1e-8), not count + 1e-6"
)


def original_ids(input_ids_BL, positions_BP, targets_BP, weights_BP):
    """The unmasked text: the masked inputs with each real prediction's target written back.

    Example: input_ids [[2, 4, 7, 4]] ([MASK] = 4), positions [[1, 3, 0]], targets [[8, 9, 0]],
    weights [[1, 1, 0]] -> [[2, 8, 7, 9]] (the padded slot at position 0 writes nothing).
    """
    rows_BP = jnp.broadcast_to(jnp.arange(input_ids_BL.shape[0])[:, None], positions_BP.shape)
    target_BP = jnp.where(weights_BP > 0, positions_BP.astype(jnp.int32), input_ids_BL.shape[1])
    return (
        jnp.asarray(input_ids_BL)
        .at[rows_BP, target_BP]
        .set(targets_BP.astype(input_ids_BL.dtype), mode="drop")
    )


def electra(
    *,
    inputs: str = "input_ids",
    input_mask: str = "input_mask",
    masked_positions: str = "masked_positions",
    masked_targets: str = "masked_ids",
    masked_weights: str = "masked_weights",
    token_type_ids: str | None = "token_type_ids",
    pad_id: int = 0,
    generator_weight: float = 1.0,
    discriminator_weight: float = 50.0,
) -> Objective:
    """Generator MLM (mean over the real predictions) + `discriminator_weight` x discriminator
    sigmoid cross-entropy (mean over the real input tokens, `input_mask`).

    The batch is `EncoderMlmFeatureConverter`'s (the MLM recipe's); the model
    (`ModelConfig.electra`) samples the replacements itself and returns `corrupted_ids`. A token
    is "replaced" (label 1) where `corrupted_ids` differs from the original text, so a sample
    equal to the original counts as real, as in the reference.

    Metrics: `mlm_loss`, `mlm_accuracy` (the generator's argmax), `rtd_loss`, `rtd_accuracy`,
    `replaced_fraction` (replaced among real tokens) and `sampled_accuracy` (samples equal to
    the target among the predictions: the reference's sampled_masked_lm_accuracy).
    """
    masked_lm = mlm(
        inputs=inputs,
        input_mask=input_mask,
        masked_positions=masked_positions,
        masked_targets=masked_targets,
        masked_weights=masked_weights,
        token_type_ids=token_type_ids,
        pad_id=pad_id,
    )
    features = (inputs, masked_positions, masked_targets, masked_weights)

    def real_tokens(batch):
        if input_mask in batch:
            return batch[input_mask].astype(jnp.float32)
        return (batch[inputs] != pad_id).astype(jnp.float32)

    def model_inputs(batch):
        require(batch, "electra", *features)
        return masked_lm.model_inputs(batch) | {"masked_weights": batch[masked_weights]}

    def denominators(batch):
        return masked_lm.denominators(batch) | {"rtd": total_weight(real_tokens(batch))}

    def replaced(outputs, batch):
        originals = original_ids(
            batch[inputs], batch[masked_positions], batch[masked_targets], batch[masked_weights]
        )
        return (outputs["corrupted_ids"] != originals).astype(jnp.float32)

    def terms(outputs, batch):
        require(batch, "electra", *features)
        out = masked_lm.terms(outputs, batch)
        out["rtd"] = binary_cross_entropy(
            outputs["rtd_logits"], replaced(outputs, batch), real_tokens(batch)
        )
        return out

    def metric_sums(outputs, batch):
        weights = batch[masked_weights].astype(jnp.float32)
        hits = (outputs["sampled_ids"] == batch[masked_targets]).astype(jnp.float32)
        return {
            "replaced_fraction": MetricSum(
                jnp.sum(replaced(outputs, batch) * real_tokens(batch)), "rtd"
            ),
            "sampled_accuracy": MetricSum(jnp.sum(hits * weights), "mlm"),
        }

    return Objective(
        name="electra",
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=lambda batch: total_weight(real_tokens(batch)),
        term_weights={"mlm": generator_weight, "rtd": discriminator_weight},
        metric_sums=metric_sums,
        features=masked_lm.features,
        heads=("mlm", "rtd"),
        metrics=METRICS,
        prediction_features=masked_lm.prediction_features,
        learning_metrics=masked_lm.learning_metrics,
        prediction_name=masked_lm.prediction_name,
    )
