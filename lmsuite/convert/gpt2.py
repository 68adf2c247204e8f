"""GPT-2: `GPT2LMHeadModel`, a pre-norm causal decoder with learned positions and a tied head.

HF keeps GPT-2's projections as `Conv1D`, whose weight is already (in, out); the fused
`c_attn` (D, 3D) splits into query, key and value in that order.
"""

import numpy as np

from lmsuite.convert import common
from lmsuite.convert.common import take
from lmsuite.models import ModelConfig

CLASSES = ("GPT2LMHeadModel",)

# HF GPT2Config options whose non-default values lmsuite does not implement.
_REFUSED = (
    ("scale_attn_by_inverse_layer_idx", (False, None)),
    ("reorder_and_upcast_attn", (False, None)),
    ("add_cross_attention", (False, None)),
)


def config_from_hf(hf, hf_class: str) -> ModelConfig:
    for option, allowed in _REFUSED:
        common.require(hf, option, allowed, "GPT-2")
    if hf.embd_pdrop != hf.resid_pdrop:
        raise ValueError(
            f"unsupported GPT-2 config: embd_pdrop={hf.embd_pdrop} differs from "
            f"resid_pdrop={hf.resid_pdrop}; lmsuite has one dropout_rate"
        )
    return ModelConfig(
        architecture="decoder",
        vocab_size=hf.vocab_size,
        d_model=hf.n_embd,
        num_heads=hf.n_head,
        d_ff=hf.n_inner if hf.n_inner is not None else 4 * hf.n_embd,
        num_layers=hf.n_layer,
        type_vocab_size=0,
        max_length=hf.n_positions,
        position_type="learned",
        activation=common.hf_activation(hf.activation_function, "activation_function"),
        norm_eps=hf.layer_norm_epsilon,
        norm_position="pre",
        scale_attention=bool(hf.scale_attn_weights),
        embedding_norm=False,
        final_norm=True,
        heads=("lm",),
        tie_embeddings=bool(hf.tie_word_embeddings),
        output_bias=False,
        dropout_rate=hf.resid_pdrop,
        attention_dropout_rate=hf.attn_pdrop,
        init_stddev=hf.initializer_range,
        pad_id=hf.pad_token_id if hf.pad_token_id is not None else 0,
    )


def _check_exportable(config: ModelConfig):
    expected = dict(
        architecture="decoder",
        type_vocab_size=0,
        position_type="learned",
        position_offset=0,
        norm_type="layernorm",
        norm_position="pre",
        use_bias=True,
        use_key_bias=True,
        embedding_norm=False,
        scale_embeddings=False,
        final_norm=True,
        share_layers="none",
        heads=("lm",),
        output_bias=False,
        embedding_dim=None,
        head_dim=None,
    )
    common.require_fields(config, expected, "GPT2LMHeadModel")


def config_to_hf(config: ModelConfig, hf_class: str):
    from transformers import GPT2Config

    _check_exportable(config)
    return GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.max_length,
        n_embd=config.d_model,
        n_layer=config.num_layers,
        n_head=config.num_heads,
        n_inner=config.d_ff,
        activation_function=common.to_hf_activation(config.activation),
        resid_pdrop=config.dropout_rate,
        embd_pdrop=config.dropout_rate,
        attn_pdrop=config.attention_dropout_rate,
        layer_norm_epsilon=config.norm_eps,
        initializer_range=config.init_stddev,
        scale_attn_weights=config.scale_attention,
        pad_token_id=config.pad_id,
        tie_word_embeddings=config.tie_embeddings,
    )


# ------------------------------------------------------------------------------ weights
_NORMS = (("pre_attention_norm", "ln_1"), ("pre_mlp_norm", "ln_2"))


def params_from_hf(state, config: ModelConfig, hf_class: str) -> dict:
    d, h = config.d_model, config.num_heads
    out = {
        "token_embedder/embedding": take(state, "transformer.wte.weight"),
        "embedder/position_embedder/embedding": take(state, "transformer.wpe.weight"),
        "decoder/final_norm/scale": take(state, "transformer.ln_f.weight"),
        "decoder/final_norm/bias": take(state, "transformer.ln_f.bias"),
    }
    for i in range(config.num_layers):
        hf, ours = f"transformer.h.{i}.", f"decoder/layers_{i}/"
        for name, hf_name in _NORMS:
            out[f"{ours}{name}/scale"] = take(state, f"{hf}{hf_name}.weight")
            out[f"{ours}{name}/bias"] = take(state, f"{hf}{hf_name}.bias")
        qkv_w = take(state, f"{hf}attn.c_attn.weight")  # (D, 3D): Conv1D is (in, out)
        qkv_b = take(state, f"{hf}attn.c_attn.bias")
        for j, name in enumerate(("query", "key", "value")):
            cols = slice(j * d, (j + 1) * d)
            out[f"{ours}attention/{name}/kernel"] = qkv_w[:, cols].reshape(d, h, -1)
            out[f"{ours}attention/{name}/bias"] = qkv_b[cols].reshape(h, -1)
        out[f"{ours}attention/out/kernel"] = take(state, f"{hf}attn.c_proj.weight").reshape(
            h, -1, d
        )
        out[f"{ours}attention/out/bias"] = take(state, f"{hf}attn.c_proj.bias")
        out[f"{ours}mlp/wi/kernel"] = take(state, f"{hf}mlp.c_fc.weight")
        out[f"{ours}mlp/wi/bias"] = take(state, f"{hf}mlp.c_fc.bias")
        out[f"{ours}mlp/wo/kernel"] = take(state, f"{hf}mlp.c_proj.weight")
        out[f"{ours}mlp/wo/bias"] = take(state, f"{hf}mlp.c_proj.bias")
        # Causal-mask buffers of older checkpoints: HF builds its masks itself now.
        state.pop(f"{hf}attn.bias", None)
        state.pop(f"{hf}attn.masked_bias", None)
    head = take(state, "lm_head.weight")
    if config.tie_embeddings:
        if not np.array_equal(head, out["token_embedder/embedding"]):
            raise ValueError("tie_word_embeddings=True but lm_head.weight differs from wte.weight")
    else:
        out["lm_head/output_projection/kernel"] = common.linear_in(head)
    common.check_consumed(state, "GPT-2")
    return out


def params_to_hf(flat, config: ModelConfig, hf_class: str) -> dict:
    out = {
        "transformer.wte.weight": flat["token_embedder/embedding"],
        "transformer.wpe.weight": flat["embedder/position_embedder/embedding"],
        "transformer.ln_f.weight": flat["decoder/final_norm/scale"],
        "transformer.ln_f.bias": flat["decoder/final_norm/bias"],
    }
    for i in range(config.num_layers):
        hf, ours = f"transformer.h.{i}.", f"decoder/layers_{i}/"
        for name, hf_name in _NORMS:
            out[f"{hf}{hf_name}.weight"] = flat[f"{ours}{name}/scale"]
            out[f"{hf}{hf_name}.bias"] = flat[f"{ours}{name}/bias"]
        qkv = ("query", "key", "value")
        out[f"{hf}attn.c_attn.weight"] = np.concatenate(
            [flat[f"{ours}attention/{n}/kernel"].reshape(config.d_model, -1) for n in qkv], axis=1
        )
        out[f"{hf}attn.c_attn.bias"] = np.concatenate(
            [flat[f"{ours}attention/{n}/bias"].reshape(-1) for n in qkv]
        )
        out[f"{hf}attn.c_proj.weight"] = flat[f"{ours}attention/out/kernel"].reshape(
            -1, config.d_model
        )
        out[f"{hf}attn.c_proj.bias"] = flat[f"{ours}attention/out/bias"]
        out[f"{hf}mlp.c_fc.weight"] = flat[f"{ours}mlp/wi/kernel"]
        out[f"{hf}mlp.c_fc.bias"] = flat[f"{ours}mlp/wi/bias"]
        out[f"{hf}mlp.c_proj.weight"] = flat[f"{ours}mlp/wo/kernel"]
        out[f"{hf}mlp.c_proj.bias"] = flat[f"{ours}mlp/wo/bias"]
    if config.tie_embeddings:
        out["lm_head.weight"] = flat["token_embedder/embedding"]
    else:
        out["lm_head.weight"] = common.kernel_to_linear(flat["lm_head/output_projection/kernel"])
    return out


def model_inputs(hf, input_ids, *, attention_mask, token_type_ids, decoder_input_ids):
    """HF's GPT-2 inputs -> lmsuite kwargs.

    HF 5.24 numbers positions 0..L-1 whatever the padding (no cumsum over attention_mask), and
    the mask only hides padded keys, so right padding leaves real positions untouched:
    input_ids (2, 3), attention_mask [[1, 1, 1], [1, 1, 0]] -> position_ids [[0, 1, 2], [0, 1, 2]].
    """
    if decoder_input_ids is not None:
        raise ValueError("GPT-2 is a decoder-only model: decoder_input_ids must be None")
    if token_type_ids is not None:
        raise ValueError(
            "GPT-2 token_type_ids (added through the token table) are not supported; pass None"
        )
    batch, length = input_ids.shape
    position_ids = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length))
    return dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


FAMILY = common.Family(
    name="gpt2",
    hf_classes=CLASSES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    params_from_hf=params_from_hf,
    params_to_hf=params_to_hf,
    model_inputs=model_inputs,
    hf_logits=common.lm_logits,
)
