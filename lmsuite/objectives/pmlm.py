"""UniLMv2's pseudo-masked LM loss: L = L_AE + L_PAR over one forward pass of one encoder.

The data (`lmsuite.data.preprocessors.pmlm`) appends, per factorization step, pseudo tokens [P]
and copies of the original tokens of the step's block to `[CLS] x-with-[M] [SEP]`, and marks
each token with `pmlm_step` (0 on the main sequence, k on the tokens appended for step k) and
`pmlm_pseudo` (1 on [P]). This module builds the (B, L, L) attention mask from those two
features (here, not in `lmsuite.layers.masks`, because objectives import no layers; the model
receives it as an ordinary full `attention_mask`) and scores the model's MLM head at the [M]
positions (term `ae`) and at the [P] positions (term `par`) in one gathered call.
"""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.objectives.base import (
    Objective,
    optional,
    require,
    token_cross_entropy,
    total_weight,
)

STEP, PSEUDO = "pmlm_step", "pmlm_pseudo"
PSEUDO_POSITIONS = "pseudo_positions"
# What the `unilm2` recipe row does otherwise than the paper (the README's objectives table).
DIFFERENCES = (
    "blocks are placed without overlap uniformly at random (the paper's Algorithm 1 redraws a "
    "start until the block lands on unmasked tokens) and a block that would run past the chunk "
    "is trimmed; every masked token is [M] in the main sequence, never kept or random (a kept "
    "one would show earlier steps' [P] queries a later block's original), while its [P] follows "
    "BERT's 80/10/10 as the released s2s-ft code's pseudo tokens do (the paper does not say); "
    "[P] is the sentinel <extra_id_0>; "
    "the row length counts the appended tokens (chunks of L - 2 - 2P tokens); padding queries "
    "see the main sequence"
)


def _check_values(step_BL, pseudo_BL) -> None:
    """Where the values are known (outside jit): a negative step or a [P] on the main sequence
    would give a mask that is no PMLM mask."""
    if isinstance(step_BL, jax.core.Tracer) or isinstance(pseudo_BL, jax.core.Tracer):
        return
    steps, pseudo = np.asarray(step_BL), np.asarray(pseudo_BL)
    if steps.size and steps.min() < 0:
        raise ValueError(f"{STEP} holds {int(steps.min())}; expected 0 (main sequence) or k >= 1")
    bad = (pseudo != 0) & (steps == 0)
    if bad.any():
        raise ValueError(f"{PSEUDO} marks a main-sequence token (step 0) at {np.argwhere(bad)[0]}")


def pmlm_attention_mask(step_BL, pseudo_BL, input_mask_BL) -> jax.Array:
    """bool (B, L, L): entry (b, i, j) is True when query i of row b may attend to key j.

    Main-sequence queries (step 0, padding too) see the main sequence; a [P] query of step k
    sees the main sequence, the copied originals of steps < k and the [P] tokens of step k; a
    copied original of step k sees the main sequence and the copied originals of steps <= k.
    Padding keys (input_mask 0) are never seen.

    Example (`[CLS] a M c M M f SEP | P P d e | P b`, steps 0 x 8, 1 1 1 1, 2 2; the rows of the
    appended tokens, columns 8..13; every row also sees columns 0..7):
      P(d) [1 1 0 0 0 0]
      P(e) [1 1 0 0 0 0]
      d    [0 0 1 1 0 0]
      e    [0 0 1 1 0 0]
      P(b) [0 0 1 1 1 0]
      b    [0 0 1 1 0 1]
    """
    if input_mask_BL.ndim != 2:
        raise ValueError(f"input_mask must be (B, L), got shape {tuple(input_mask_BL.shape)}")
    for name, x in ((STEP, step_BL), (PSEUDO, pseudo_BL)):
        if tuple(x.shape) != tuple(input_mask_BL.shape):
            raise ValueError(
                f"{name} must have input_mask's shape {tuple(input_mask_BL.shape)}, "
                f"got {tuple(x.shape)}"
            )
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"{name} must hold integers, got dtype {x.dtype}")
    _check_values(step_BL, pseudo_BL)
    step_q, step_k = step_BL[:, :, None], step_BL[:, None, :]
    pseudo_q, pseudo_k = (pseudo_BL != 0)[:, :, None], (pseudo_BL != 0)[:, None, :]
    main_k = step_k == 0
    appended_q = step_q > 0
    copy_k = (step_k > 0) & ~pseudo_k
    earlier_copy = appended_q & copy_k & (step_k < step_q)
    own_copies = appended_q & ~pseudo_q & copy_k & (step_k == step_q)
    own_pseudo = pseudo_q & pseudo_k & (step_k == step_q)
    allowed_BLL = main_k | earlier_copy | own_copies | own_pseudo
    return allowed_BLL & input_mask_BL.astype(bool)[:, None, :]


def pmlm(
    *,
    inputs: str = "input_ids",
    input_mask: str = "input_mask",
    masked_positions: str = "masked_positions",
    masked_targets: str = "masked_ids",
    masked_weights: str = "masked_weights",
    pseudo_positions: str = PSEUDO_POSITIONS,
    positions: str = "position_ids",
    step: str = STEP,
    pseudo: str = PSEUDO,
    token_type_ids: str | None = "token_type_ids",
) -> Objective:
    """AE + PAR over `EncoderMlmFeatureConverter(span_features=(pseudo_positions,),
    sequence_features=(positions, step, pseudo))` batches.

    The model's MLM head runs once at the (B, 2P) positions `[masked_positions,
    pseudo_positions]`; the first P logits are the AE predictions, the last P the PAR ones, both
    against `masked_ids` with `masked_weights` (the data lists the AE targets in the
    factorization order, aligned with `pseudo_positions`). Terms `ae` and `par`, each a mean over
    its targets, summed with weight 1 (the paper's L_AE + L_PAR).
    """

    def model_inputs(batch):
        require(batch, "pmlm", inputs, input_mask, masked_positions, pseudo_positions)
        require(batch, "pmlm", positions, step, pseudo)
        if "segment_ids" in batch:
            raise ValueError(
                "pmlm reads one example per row (its mask indexes the row); got a packed batch "
                "with segment_ids: set make_recipe.pack = False"
            )
        if batch[pseudo_positions].shape != batch[masked_positions].shape:
            raise ValueError(
                f"{pseudo_positions} must have {masked_positions}'s shape "
                f"{tuple(batch[masked_positions].shape)}, got "
                f"{tuple(batch[pseudo_positions].shape)}"
            )
        kwargs = {"input_ids": batch[inputs], "position_ids": batch[positions]}
        if token_type_ids is not None:
            kwargs |= optional(batch, token_type_ids=token_type_ids)
        kwargs["attention_mask"] = pmlm_attention_mask(
            batch[step], batch[pseudo], batch[input_mask]
        )
        kwargs["masked_positions"] = jnp.concatenate(
            [batch[masked_positions], batch[pseudo_positions]], axis=1
        )
        return kwargs

    def denominators(batch):
        weight = total_weight(batch[masked_weights])
        return {"ae": weight, "par": weight}

    def terms(outputs, batch):
        require(batch, "pmlm", masked_targets, masked_weights)
        logits_BPV = outputs["mlm_logits"]
        width = batch[masked_targets].shape[1]
        if logits_BPV.shape[1] != 2 * width:
            raise ValueError(
                f"pmlm needs MLM logits at 2 x {width} positions (AE then PAR), got "
                f"{tuple(logits_BPV.shape)}"
            )
        targets, weights = batch[masked_targets], batch[masked_weights]
        return {
            "ae": token_cross_entropy(logits_BPV[:, :width], targets, weights),
            "par": token_cross_entropy(logits_BPV[:, width:], targets, weights),
        }

    def num_tokens(batch):
        return total_weight(batch[input_mask])

    return Objective(
        name="pmlm",
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=num_tokens,
        features=(
            inputs,
            input_mask,
            masked_positions,
            masked_targets,
            masked_weights,
            pseudo_positions,
            positions,
            step,
            pseudo,
        ),
        heads=("mlm",),
        metrics=("ae_loss", "ae_accuracy", "par_loss", "par_accuracy"),
        prediction_features=(masked_targets, masked_weights),
        learning_metrics=("ae_accuracy", "ae_loss"),
        prediction_name="MLM",
    )
