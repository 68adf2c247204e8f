"""T5: `T5ForConditionalGeneration`, both T5 1.0 (relu, tied and rescaled output) and T5 1.1
(gated-gelu, untied lm_head).

RMSNorm, no biases, no 1/sqrt(K) in attention, head width d_kv (need not be d_model/heads).
HF stores the relative-position table in the first block of each stack and reuses it in every
layer; lmsuite keeps it once per stack as `relative_bias`.

HF 5.24 decides the output scaling by `config.scale_decoder_outputs` (what `tie_word_embeddings`
meant in older configs) and unties `lm_head` from `shared` only when a checkpoint holds
different values for them. lmsuite maps scale_decoder_outputs=True to a tied, D**-0.5-scaled
head (T5 1.0) and False to an untied head (T5 1.1). T5Config sets tie_word_embeddings=True
whatever it is given (the tables of a model it builds stay shared), so `config_json` writes the
head's true tying into config.json afterwards: a reader that ties by that key (transformers
before 5) would otherwise replace an untied head with the embeddings. A tied but unscaled
lmsuite head has no T5 form; it is written as an untied head holding a copy of the table.
"""

import numpy as np

from lmsuite.convert import common
from lmsuite.convert.common import heads_in, heads_out, linear_in, take
from lmsuite.models import ModelConfig

CLASSES = ("T5ForConditionalGeneration",)

# feed_forward_proj -> lmsuite activation. "gated-gelu" is tanh-gelu for historical reasons.
_FEED_FORWARD = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "silu": "silu",
    "gated-gelu": "geglu_tanh",
    "gated-gelu_new": "geglu_tanh",
    "gated-silu": "swiglu",
}
_TO_FEED_FORWARD = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_tanh": "gelu_new",
    "silu": "silu",
    "geglu_tanh": "gated-gelu",
    "swiglu": "gated-silu",
}


def _scales_output(hf) -> bool:
    return bool(getattr(hf, "scale_decoder_outputs", hf.tie_word_embeddings))


def config_from_hf(hf, hf_class: str) -> ModelConfig:
    if hf.feed_forward_proj not in _FEED_FORWARD:
        raise ValueError(
            f"unsupported T5 config option feed_forward_proj={hf.feed_forward_proj!r}; "
            f"lmsuite supports {sorted(_FEED_FORWARD)}"
        )
    common.require(hf, "is_encoder_decoder", True, "T5")
    scaled = _scales_output(hf)
    pad = hf.pad_token_id if hf.pad_token_id is not None else 0
    start = getattr(hf, "decoder_start_token_id", None)
    return ModelConfig(
        architecture="encoder_decoder",
        vocab_size=hf.vocab_size,
        d_model=hf.d_model,
        num_heads=hf.num_heads,
        head_dim=hf.d_kv,
        d_ff=hf.d_ff,
        num_layers=hf.num_layers,
        num_decoder_layers=hf.num_decoder_layers,
        type_vocab_size=0,
        position_type="t5_relative",
        relative_buckets=hf.relative_attention_num_buckets,
        relative_max_distance=hf.relative_attention_max_distance,
        activation=_FEED_FORWARD[hf.feed_forward_proj],
        norm_type="rmsnorm",
        norm_eps=hf.layer_norm_epsilon,
        norm_position="pre",
        use_bias=False,
        scale_attention=False,
        embedding_norm=False,
        final_norm=True,
        heads=("lm",),
        tie_embeddings=scaled,
        scale_tied_output=scaled,
        output_bias=False,
        dropout_rate=hf.dropout_rate,
        attention_dropout_rate=hf.dropout_rate,
        mlp_inner_dropout=True,
        pad_id=pad,
        decoder_start_id=start if start is not None else pad,
    )


def _check_exportable(config: ModelConfig):
    expected = dict(
        architecture="encoder_decoder",
        position_type="t5_relative",
        norm_type="rmsnorm",
        norm_position="pre",
        use_bias=False,
        scale_attention=False,
        embedding_norm=False,
        scale_embeddings=False,
        final_norm=True,
        type_vocab_size=0,
        heads=("lm",),
        output_bias=False,
        embedding_dim=None,
    )
    common.require_fields(config, expected, "T5ForConditionalGeneration")
    if config.activation not in _TO_FEED_FORWARD:
        raise ValueError(
            f"activation {config.activation!r} has no T5 feed_forward_proj; "
            f"supported: {sorted(_TO_FEED_FORWARD)}"
        )


def config_to_hf(config: ModelConfig, hf_class: str):
    from transformers import T5Config

    _check_exportable(config)
    return T5Config(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        d_kv=config.head_width,
        d_ff=config.d_ff,
        num_layers=config.num_layers,
        num_decoder_layers=config.decoder_layers,
        num_heads=config.num_heads,
        relative_attention_num_buckets=config.relative_buckets,
        relative_attention_max_distance=config.relative_max_distance,
        dropout_rate=config.dropout_rate,
        layer_norm_epsilon=config.norm_eps,
        feed_forward_proj=_TO_FEED_FORWARD[config.activation],
        pad_token_id=config.pad_id,
        decoder_start_token_id=config.decoder_start_id,
        # HF 5.24 reads this as "scale the decoder output" and then sets the attribute True.
        tie_word_embeddings=_tied(config),
    )


def _tied(config: ModelConfig) -> bool:
    return config.tie_embeddings and config.scale_tied_output


def config_json(config: ModelConfig) -> dict:
    """`Family.config_json`: the head's tying, which T5Config rewrites to True."""
    return {"tie_word_embeddings": _tied(config)}


# ------------------------------------------------------------------------------ weights
def _mlp_names(config: ModelConfig) -> tuple[str, ...]:
    return ("wi_0", "wi_1", "wo") if config.activation in ("geglu_tanh", "swiglu") else ("wi", "wo")


def _sublayers(stack: str, config: ModelConfig):
    """(HF sub-layer index, lmsuite module, HF module) of one block of `stack`."""
    if stack == "encoder":
        return ((0, "attention", "SelfAttention"), (1, "mlp", "DenseReluDense"))
    return (
        (0, "attention", "SelfAttention"),
        (1, "cross_attention", "EncDecAttention"),
        (2, "mlp", "DenseReluDense"),
    )


def _stack_from_hf(state, stack: str, n_layers: int, config: ModelConfig, out: dict):
    h = config.num_heads
    out[f"{stack}/relative_bias/rel_embedding"] = take(
        state, f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    )
    for i in range(n_layers):
        for j, ours, theirs in _sublayers(stack, config):
            hf, mine = f"{stack}.block.{i}.layer.{j}.", f"{stack}/layers_{i}/"
            out[f"{mine}pre_{ours}_norm/scale"] = take(state, f"{hf}layer_norm.weight")
            if ours == "mlp":
                for name in _mlp_names(config):
                    out[f"{mine}mlp/{name}/kernel"] = linear_in(
                        take(state, f"{hf}{theirs}.{name}.weight")
                    )
                continue
            for name, hf_name in (("query", "q"), ("key", "k"), ("value", "v")):
                w = take(state, f"{hf}{theirs}.{hf_name}.weight")
                out[f"{mine}{ours}/{name}/kernel"] = heads_in(w, h)
            out[f"{mine}{ours}/out/kernel"] = heads_out(take(state, f"{hf}{theirs}.o.weight"), h)
    out[f"{stack}/final_norm/scale"] = take(state, f"{stack}.final_layer_norm.weight")


def _stack_to_hf(flat, stack: str, n_layers: int, config: ModelConfig, out: dict):
    out[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = flat[
        f"{stack}/relative_bias/rel_embedding"
    ]
    for i in range(n_layers):
        for j, ours, theirs in _sublayers(stack, config):
            hf, mine = f"{stack}.block.{i}.layer.{j}.", f"{stack}/layers_{i}/"
            out[f"{hf}layer_norm.weight"] = flat[f"{mine}pre_{ours}_norm/scale"]
            if ours == "mlp":
                for name in _mlp_names(config):
                    out[f"{hf}{theirs}.{name}.weight"] = common.kernel_to_linear(
                        flat[f"{mine}mlp/{name}/kernel"]
                    )
                continue
            for name, hf_name in (("query", "q"), ("key", "k"), ("value", "v")):
                out[f"{hf}{theirs}.{hf_name}.weight"] = common.kernel_to_linear(
                    flat[f"{mine}{ours}/{name}/kernel"]
                )
            out[f"{hf}{theirs}.o.weight"] = common.kernel_to_linear(
                flat[f"{mine}{ours}/out/kernel"], 2
            )
    out[f"{stack}.final_layer_norm.weight"] = flat[f"{stack}/final_norm/scale"]


def params_from_hf(state, config: ModelConfig, hf_class: str) -> dict:
    shared = take(state, "shared.weight")
    out = {"token_embedder/embedding": shared}
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        table = state.pop(key, shared)
        if not np.array_equal(table, shared):
            raise ValueError(f"{key} differs from shared.weight; lmsuite has one token table")
    _stack_from_hf(state, "encoder", config.num_layers, config, out)
    _stack_from_hf(state, "decoder", config.decoder_layers, config, out)
    # Old checkpoints carry an unused cross-attention position table.
    state.pop("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight", None)
    head = state.pop("lm_head.weight", shared)
    if config.tie_embeddings:
        if not np.array_equal(head, shared):
            raise ValueError(
                "lm_head.weight differs from shared.weight, but scale_decoder_outputs=True; "
                "lmsuite rescales only a tied head"
            )
    else:
        out["lm_head/output_projection/kernel"] = linear_in(head)
    common.check_consumed(state, "T5")
    return out


def params_to_hf(flat, config: ModelConfig, hf_class: str) -> dict:
    table = flat["token_embedder/embedding"]
    out = {
        "shared.weight": table,
        "encoder.embed_tokens.weight": table,
        "decoder.embed_tokens.weight": table,
    }
    _stack_to_hf(flat, "encoder", config.num_layers, config, out)
    _stack_to_hf(flat, "decoder", config.decoder_layers, config, out)
    if config.tie_embeddings:
        out["lm_head.weight"] = table
    else:
        out["lm_head.weight"] = common.kernel_to_linear(flat["lm_head/output_projection/kernel"])
    return out


def model_inputs(hf, input_ids, *, attention_mask, token_type_ids, decoder_input_ids):
    """HF's T5 inputs -> lmsuite kwargs. HF builds no decoder inputs from `input_ids` (it shifts
    only `labels`), so decoder_input_ids are required; the decoder mask is causal only."""
    if token_type_ids is not None:
        raise ValueError("T5 has no token_type_ids; pass None")
    if decoder_input_ids is None:
        raise ValueError(
            "T5ForConditionalGeneration needs decoder_input_ids (B, L_dec): HF does not derive "
            "them from input_ids"
        )
    return dict(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
    )


FAMILY = common.Family(
    name="t5",
    hf_classes=CLASSES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    params_from_hf=params_from_hf,
    params_to_hf=params_to_hf,
    model_inputs=model_inputs,
    hf_logits=common.lm_logits,
    config_json=config_json,
)
