"""Shared pieces of the HuggingFace <-> lmsuite converters: the family record, weight layouts,
activation names and the check that a converted tree is exactly the model's tree."""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from lmsuite.models import ModelConfig, families

StateDict = dict[str, np.ndarray]
Params = dict[str, Any]

# HF hidden_act -> lmsuite activation. Anything else is refused by name.
HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}
LMSUITE_TO_HF_ACTIVATION = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}


@dataclasses.dataclass(frozen=True)
class Family:
    """How one HF model family maps onto lmsuite.

    config_from_hf(hf_config, hf_class) -> ModelConfig     (raises on unsupported options)
    config_to_hf(config, hf_class) -> transformers config
    params_from_hf(state_dict, config, hf_class) -> params (flat "a/b/c" keys)
    params_to_hf(flat_params, config, hf_class) -> state_dict
    model_inputs(hf_config, input_ids, attention_mask, token_type_ids, decoder_input_ids,
                 **extra_inputs)
        -> kwargs for Transformer.apply, reproducing what HF derives itself (positions, shifts)
    hf_logits(outputs_dict, hf_class) -> the array HF's `.logits` holds
    extra_inputs: further HF keyword inputs the family takes (XLNet: perm_mask, mems, ...)
    hf_mems(outputs_dict, hf_class) -> what HF's `.mems` holds, for families with a memory
    config_json(config) -> config.json fields `to_hf` writes over what the HF config class
        saves, for a class that rewrites a value it was given (T5's tie_word_embeddings)
    """

    name: str
    hf_classes: tuple[str, ...]
    config_from_hf: Callable
    config_to_hf: Callable
    params_from_hf: Callable
    params_to_hf: Callable
    model_inputs: Callable
    hf_logits: Callable
    extra_inputs: tuple[str, ...] = ()
    hf_mems: Callable | None = None
    config_json: Callable | None = None


def mlm_logits(outputs, hf_class: str):
    """`Family.hf_logits` of the masked-LM classes: what HF's `.logits` holds."""
    return outputs["mlm_logits"]


def lm_logits(outputs, hf_class: str):
    """`Family.hf_logits` of the causal-LM and seq2seq classes."""
    return outputs["lm_logits"]


def encoder_model_inputs(family: str) -> Callable[..., dict]:
    """`Family.model_inputs` of a BERT-style encoder: ids, attention mask and token types."""

    def model_inputs(hf, input_ids, *, attention_mask, token_type_ids, decoder_input_ids):
        if decoder_input_ids is not None:
            raise ValueError(f"{family} is an encoder: decoder_input_ids must be None")
        return dict(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        )

    return model_inputs


def hf_activation(name: str, option: str = "hidden_act") -> str:
    if name not in HF_ACTIVATIONS:
        raise ValueError(
            f"unsupported HF config option {option}={name!r}; supported: {sorted(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[name]


def to_hf_activation(name: str) -> str:
    if name not in LMSUITE_TO_HF_ACTIVATION:
        raise ValueError(f"activation {name!r} has no HF equivalent in this family")
    return LMSUITE_TO_HF_ACTIVATION[name]


def require(hf_config, option: str, allowed, family: str):
    """Raises unless hf_config.<option> is one of `allowed` (a value or a tuple of values)."""
    value = getattr(hf_config, option, None)
    allowed = allowed if isinstance(allowed, tuple) else (allowed,)
    if value not in allowed:
        raise ValueError(
            f"unsupported {family} config option {option}={value!r}; lmsuite supports {allowed}"
        )


def require_fields(config, expected: dict, hf_class: str):
    """Raises unless each ModelConfig field has the value the HF class can express."""
    for field, value in expected.items():
        if getattr(config, field) != value:
            raise ValueError(
                f"{hf_class} needs ModelConfig.{field}={value!r}, got {getattr(config, field)!r}"
            )


# ---------------------------------------------------------------- torch Linear <-> kernels
def linear_in(weight_OI: np.ndarray) -> np.ndarray:
    """torch Linear weight (out, in) -> kernel (in, out)."""
    return np.ascontiguousarray(weight_OI.T)


def heads_in(weight_OI: np.ndarray, num_heads: int) -> np.ndarray:
    """torch (H*K, D) -> kernel (D, H, K)."""
    d = weight_OI.shape[1]
    return np.ascontiguousarray(weight_OI.T.reshape(d, num_heads, -1))


def heads_out(weight_OI: np.ndarray, num_heads: int) -> np.ndarray:
    """torch (D, H*K) -> kernel (H, K, D)."""
    d = weight_OI.shape[0]
    return np.ascontiguousarray(weight_OI.T.reshape(num_heads, -1, d))


def heads_bias(bias: np.ndarray, num_heads: int) -> np.ndarray:
    return bias.reshape(num_heads, -1)


def kernel_to_linear(kernel: np.ndarray, n_in: int = 1) -> np.ndarray:
    """kernel (in..., out...) -> torch (out, in) with the in/out groups flattened."""
    k = np.asarray(kernel)
    in_size = int(np.prod(k.shape[:n_in]))
    return np.ascontiguousarray(k.reshape(in_size, -1).T)


# ------------------------------------------------------------------------- tree handling
def abstract_params(config: ModelConfig, *, decoder_length: int | None = None) -> Params:
    """The model's parameter shapes (flat keys), from abstract evaluation: nothing allocated."""
    model = families.Transformer(config)
    inputs = families.example_inputs(config)
    shapes = jax.eval_shape(lambda rng: model.init(rng, **inputs), jax.random.PRNGKey(0))
    return traverse_util.flatten_dict(nn.unbox(shapes["params"]), sep="/")


def check_params(config: ModelConfig, flat: Mapping[str, np.ndarray]) -> Params:
    """Verifies `flat` has exactly the model's keys and shapes; returns the nested tree."""
    expected = abstract_params(config)
    missing = sorted(set(expected) - set(flat))
    extra = sorted(set(flat) - set(expected))
    wrong = [
        f"{k}: expected {tuple(expected[k].shape)}, got {tuple(np.shape(flat[k]))}"
        for k in sorted(set(expected) & set(flat))
        if tuple(expected[k].shape) != tuple(np.shape(flat[k]))
    ]
    if missing or extra or wrong:
        raise ValueError(
            f"converted parameters do not match the model: missing={missing} extra={extra} "
            f"wrong_shapes={wrong}"
        )
    return traverse_util.unflatten_dict(
        {k: np.asarray(v, np.float32) for k, v in flat.items()}, sep="/"
    )


def flatten(params: Params) -> dict[str, np.ndarray]:
    return {
        k: np.asarray(v) for k, v in traverse_util.flatten_dict(nn.unbox(params), sep="/").items()
    }


def take(state: StateDict, key: str) -> np.ndarray:
    """Pops `key` from the state dict, naming it if absent (used so leftovers can be reported)."""
    if key not in state:
        raise ValueError(f"HF checkpoint lacks expected weight {key!r}")
    return state.pop(key)


def check_consumed(state: StateDict, family: str, ignore: tuple[str, ...] = ()):
    """Raises if HF weights were left unconverted (an option lmsuite would silently drop)."""
    left = sorted(k for k in state if not any(k.endswith(s) for s in ignore))
    if left:
        raise ValueError(f"{family}: HF weights with no lmsuite counterpart: {left}")
