"""Transformer-XL's language modelling over `StreamLmFeatureConverter` features: next-token
cross-entropy of every position, with each layer's memory carried from step to step.

The loss is kimiyoung/transformer-xl `pytorch/mem_transformer.py` `MemTransformerLM.forward`
as `train.py` runs it: the mean negative log-likelihood of the `tgt_len` targets of every row
(`loss.float().mean()`), the memory returned by one step fed to the next.
"""

import jax.numpy as jnp

from lmsuite.objectives.base import Carry, Objective, require, token_cross_entropy, total_weight
from lmsuite.objectives.plm import reset_memory

FEATURES = ("inputs", "targets", "target_weights")


def stream_lm(*, memory: bool = True, name: str = "lm") -> Objective:
    """Cross-entropy of the `lm` head's logits (B, L, V) against `targets` (B, L).

    `memory`: carry each layer's memory (the model's `new_mems`) into the next step's `mems`,
    reset per row where a stream starts (`plm.reset_memory`); False trains without memory.
    """

    def model_inputs(batch):
        require(batch, name, "inputs")
        return {"input_ids": batch["inputs"]}

    def denominators(batch):
        require(batch, name, "target_weights")
        return {"lm": total_weight(batch["target_weights"])}

    def terms(outputs, batch):
        require(batch, name, "targets", "target_weights")
        return {
            "lm": token_cross_entropy(
                outputs["lm_logits"], batch["targets"], batch["target_weights"]
            )
        }

    def num_tokens(batch):
        return jnp.asarray(batch["inputs"].size, jnp.float32)  # stream rows have no padding

    carry = Carry(model_input="mems", model_output="new_mems", reset=reset_memory)
    return Objective(
        name=name,
        model_inputs=model_inputs,
        denominators=denominators,
        terms=terms,
        num_tokens=num_tokens,
        carry=carry if memory else None,
        features=FEATURES + (("stream_step",) if memory else ()),
        heads=("lm",),
        metrics=("lm_loss", "lm_accuracy"),
        prediction_features=("targets", "target_weights"),
        learning_metrics=("lm_accuracy", "lm_loss"),
        prediction_name="LM",
    )
