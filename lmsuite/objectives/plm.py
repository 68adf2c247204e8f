"""XLNet's permutation language modelling over `PermutationLmFeatureConverter` features, with
Transformer-XL memory carried between steps.

The loss is zihangdai/xlnet `modeling.py`'s `lm_loss` as `train_gpu.py` uses it: the query
stream at each of the P predicted positions (`target_mapping`) is scored against that position's
own token (`target`), weighted by `target_mask`, averaged over the predictions of the batch.
"""

import jax.numpy as jnp

from lmsuite.objectives.base import Carry, Objective, require, token_cross_entropy, total_weight

FEATURES = ("input_k", "seg_id", "perm_mask", "target_mapping", "target", "target_mask")


def reset_memory(mems, batch, *, stream_step: str = "stream_step"):
    """Zeroes the memory of rows whose stream starts with this batch (`stream_step == 0`): what
    they carry in belongs to other text. Zeros are the state the reference starts every run
    with (`train_gpu.py`'s `init_mems`); it never resets afterwards, because its rows never
    switch text inside a file.

    Example: stream_step [0, 3], memory rows [m0, m1] -> [0, m1].
    """
    require(batch, "plm", stream_step)
    keep_B = batch[stream_step] != 0
    for i, m_BCD in enumerate(mems):
        if m_BCD.ndim != 3 or m_BCD.shape[0] != keep_B.shape[0]:
            raise ValueError(
                f"memory of layer {i} has shape {tuple(m_BCD.shape)}, but the batch has "
                f"{keep_B.shape[0]} rows: the memory must be (B, C, D) with one row per batch "
                "row (the stream layout keeps row i of every batch on the same stream)"
            )
    return tuple(jnp.where(keep_B[:, None, None], m_BCD, jnp.zeros_like(m_BCD)) for m_BCD in mems)


def permutation_lm(*, memory: bool = True, name: str = "plm") -> Objective:
    """Cross-entropy of the `lm` head's query-stream logits (B, P, V) against `target` (B, P).

    `memory`: carry each layer's memory (the model's `new_mems`) into the next step's `mems`,
    reset per row where a stream starts; False trains every step without memory (the ablation).
    """

    def model_inputs(batch):
        require(batch, name, "input_k", "seg_id", "perm_mask", "target_mapping")
        return {
            "input_ids": batch["input_k"],
            "token_type_ids": batch["seg_id"],
            "perm_mask": batch["perm_mask"],
            "target_mapping": batch["target_mapping"],
        }

    def denominators(batch):
        require(batch, name, "target_mask")
        return {"plm": total_weight(batch["target_mask"])}

    def terms(outputs, batch):
        require(batch, name, "target", "target_mask")
        return {
            "plm": token_cross_entropy(outputs["lm_logits"], batch["target"], batch["target_mask"])
        }

    def num_tokens(batch):
        return jnp.asarray(batch["input_k"].size, jnp.float32)  # XLNet rows have no padding

    carry = Carry(model_input="mems", model_output="new_mems", reset=reset_memory)
    return Objective(
        name=name,
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=num_tokens,
        carry=carry if memory else None,
        # The memory's reset reads `stream_step`: which rows start a new stream.
        features=FEATURES + (("stream_step",) if memory else ()),
        heads=("lm",),
        metrics=("plm_loss", "plm_accuracy"),
        prediction_features=("target", "target_mask"),
        learning_metrics=("plm_accuracy", "plm_loss"),
        prediction_name="PLM",
    )
