"""BART: `BartForConditionalGeneration`, a post-norm encoder-decoder with learned positions.

Each stack has its own position table (offset 2: rows 0 and 1 are never used by positions)
and its own `layernorm_embedding`; the token table is shared by both stacks and the tied head.
HF's `final_logits_bias` is a buffer, not a parameter: it is accepted when all zeros (as in
every BART checkpoint) and refused otherwise.
"""

import numpy as np

from lmsuite.convert import common
from lmsuite.convert.common import heads_bias, heads_in, heads_out, linear_in, take
from lmsuite.models import ModelConfig

CLASSES = ("BartForConditionalGeneration",)
OFFSET = 2

# Options of older BartConfigs (mBART-style pre-norm, a logits bias, no embedding norm) with the
# values lmsuite implements. HF 5.24 no longer reads them, but a config that sets them was
# written for a different computation.
_LEGACY = (
    ("add_bias_logits", (False, None)),
    ("normalize_before", (False, None)),
    ("add_final_layer_norm", (False, None)),
    ("normalize_embedding", (True, None)),
)


def _check_options(hf):
    for option, allowed in _LEGACY:
        common.require(hf, option, allowed, "BART")
    for ours, theirs in (
        ("encoder_ffn_dim", "decoder_ffn_dim"),
        ("encoder_attention_heads", "decoder_attention_heads"),
    ):
        if getattr(hf, ours) != getattr(hf, theirs):
            raise ValueError(
                f"unsupported BART config: {ours}={getattr(hf, ours)} != "
                f"{theirs}={getattr(hf, theirs)}; lmsuite stacks share one width"
            )
    for option in ("encoder_layerdrop", "decoder_layerdrop"):
        if getattr(hf, option):
            raise ValueError(f"unsupported BART config option {option}={getattr(hf, option)}")
    if hf.activation_dropout not in (0.0, hf.dropout):
        raise ValueError(
            f"unsupported BART config: activation_dropout={hf.activation_dropout} is neither 0 "
            f"nor dropout={hf.dropout}"
        )


def config_from_hf(hf, hf_class: str) -> ModelConfig:
    _check_options(hf)
    return ModelConfig(
        architecture="encoder_decoder",
        vocab_size=hf.vocab_size,
        d_model=hf.d_model,
        num_heads=hf.encoder_attention_heads,
        d_ff=hf.encoder_ffn_dim,
        num_layers=hf.encoder_layers,
        num_decoder_layers=hf.decoder_layers,
        type_vocab_size=0,
        max_length=hf.max_position_embeddings + OFFSET,
        position_type="learned",
        position_offset=OFFSET,
        activation=common.hf_activation(hf.activation_function, "activation_function"),
        norm_eps=1e-5,  # torch's LayerNorm default, which BART uses everywhere
        norm_position="post",
        embedding_norm=True,
        scale_embeddings=bool(hf.scale_embedding),
        final_norm=False,
        heads=("lm",),
        tie_embeddings=bool(hf.tie_word_embeddings),
        output_bias=False,
        dropout_rate=hf.dropout,
        attention_dropout_rate=hf.attention_dropout,
        mlp_inner_dropout=hf.activation_dropout > 0,
        init_stddev=hf.init_std,
        pad_id=hf.pad_token_id,
        decoder_start_id=hf.decoder_start_token_id,
    )


def _check_exportable(config: ModelConfig):
    expected = dict(
        architecture="encoder_decoder",
        type_vocab_size=0,
        position_type="learned",
        position_offset=OFFSET,
        norm_type="layernorm",
        norm_eps=1e-5,
        norm_position="post",
        use_bias=True,
        use_key_bias=True,
        embedding_norm=True,
        final_norm=False,
        heads=("lm",),
        output_bias=False,
        embedding_dim=None,
        head_dim=None,
    )
    common.require_fields(config, expected, "BartForConditionalGeneration")


def config_to_hf(config: ModelConfig, hf_class: str):
    from transformers import BartConfig

    _check_exportable(config)
    return BartConfig(
        vocab_size=config.vocab_size,
        max_position_embeddings=config.max_length - OFFSET,
        encoder_layers=config.num_layers,
        decoder_layers=config.decoder_layers,
        encoder_ffn_dim=config.d_ff,
        decoder_ffn_dim=config.d_ff,
        encoder_attention_heads=config.num_heads,
        decoder_attention_heads=config.num_heads,
        d_model=config.d_model,
        activation_function=common.to_hf_activation(config.activation),
        dropout=config.dropout_rate,
        attention_dropout=config.attention_dropout_rate,
        activation_dropout=config.dropout_rate if config.mlp_inner_dropout else 0.0,
        init_std=config.init_stddev,
        scale_embedding=config.scale_embeddings,
        pad_token_id=config.pad_id,
        decoder_start_token_id=config.decoder_start_id,
        tie_word_embeddings=config.tie_embeddings,
    )


# ------------------------------------------------------------------------------ weights
# (lmsuite module under a layer, HF module under the layer, kind); cross-attention: decoder only.
_LAYER = (
    ("attention/query", "self_attn.q_proj", "heads_in"),
    ("attention/key", "self_attn.k_proj", "heads_in"),
    ("attention/value", "self_attn.v_proj", "heads_in"),
    ("attention/out", "self_attn.out_proj", "heads_out"),
    ("post_attention_norm", "self_attn_layer_norm", "norm"),
    ("mlp/wi", "fc1", "linear"),
    ("mlp/wo", "fc2", "linear"),
    ("post_mlp_norm", "final_layer_norm", "norm"),
)
_CROSS = (
    ("cross_attention/query", "encoder_attn.q_proj", "heads_in"),
    ("cross_attention/key", "encoder_attn.k_proj", "heads_in"),
    ("cross_attention/value", "encoder_attn.v_proj", "heads_in"),
    ("cross_attention/out", "encoder_attn.out_proj", "heads_out"),
    ("post_cross_attention_norm", "encoder_attn_layer_norm", "norm"),
)


def _table(stack: str):
    return _LAYER + _CROSS if stack == "decoder" else _LAYER


def _stack_from_hf(state, stack: str, n_layers: int, config: ModelConfig, out: dict):
    h, hf_stack = config.num_heads, f"model.{stack}."
    emb = f"{stack}_embedder/"
    out[emb + "position_embedder/embedding"] = take(state, hf_stack + "embed_positions.weight")
    out[emb + "embedding_norm/scale"] = take(state, hf_stack + "layernorm_embedding.weight")
    out[emb + "embedding_norm/bias"] = take(state, hf_stack + "layernorm_embedding.bias")
    for i in range(n_layers):
        hf, mine = f"{hf_stack}layers.{i}.", f"{stack}/layers_{i}/"
        for name, hf_name, kind in _table(stack):
            w = take(state, f"{hf}{hf_name}.weight")
            b = take(state, f"{hf}{hf_name}.bias")
            if kind == "norm":
                out[f"{mine}{name}/scale"], out[f"{mine}{name}/bias"] = w, b
            elif kind == "heads_in":
                out[f"{mine}{name}/kernel"] = heads_in(w, h)
                out[f"{mine}{name}/bias"] = heads_bias(b, h)
            elif kind == "heads_out":
                out[f"{mine}{name}/kernel"], out[f"{mine}{name}/bias"] = heads_out(w, h), b
            else:
                out[f"{mine}{name}/kernel"], out[f"{mine}{name}/bias"] = linear_in(w), b


def _stack_to_hf(flat, stack: str, n_layers: int, config: ModelConfig, out: dict):
    hf_stack, emb = f"model.{stack}.", f"{stack}_embedder/"
    out[hf_stack + "embed_positions.weight"] = flat[emb + "position_embedder/embedding"]
    out[hf_stack + "layernorm_embedding.weight"] = flat[emb + "embedding_norm/scale"]
    out[hf_stack + "layernorm_embedding.bias"] = flat[emb + "embedding_norm/bias"]
    for i in range(n_layers):
        hf, mine = f"{hf_stack}layers.{i}.", f"{stack}/layers_{i}/"
        for name, hf_name, kind in _table(stack):
            if kind == "norm":
                out[f"{hf}{hf_name}.weight"] = flat[f"{mine}{name}/scale"]
            else:
                out[f"{hf}{hf_name}.weight"] = common.kernel_to_linear(
                    flat[f"{mine}{name}/kernel"], 2 if kind == "heads_out" else 1
                )
            out[f"{hf}{hf_name}.bias"] = np.reshape(flat[f"{mine}{name}/bias"], -1)


def params_from_hf(state, config: ModelConfig, hf_class: str) -> dict:
    shared = take(state, "model.shared.weight")
    out = {"token_embedder/embedding": shared}
    for key in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        if not np.array_equal(state.pop(key, shared), shared):
            raise ValueError(f"{key} differs from model.shared.weight; lmsuite has one token table")
    _stack_from_hf(state, "encoder", config.num_layers, config, out)
    _stack_from_hf(state, "decoder", config.decoder_layers, config, out)
    head = take(state, "lm_head.weight")
    if config.tie_embeddings:
        if not np.array_equal(head, shared):
            raise ValueError("tie_word_embeddings=True but lm_head.weight differs from shared")
    else:
        out["lm_head/output_projection/kernel"] = linear_in(head)
    bias = state.pop("final_logits_bias", None)
    if bias is not None and np.any(bias != 0):
        raise ValueError(
            f"final_logits_bias is non-zero (max |bias| = {np.max(np.abs(bias)):.3g}); lmsuite "
            "supports only the all-zeros buffer BART checkpoints carry"
        )
    common.check_consumed(state, "BART")
    return out


def params_to_hf(flat, config: ModelConfig, hf_class: str) -> dict:
    table = flat["token_embedder/embedding"]
    out = {
        "model.shared.weight": table,
        "model.encoder.embed_tokens.weight": table,
        "model.decoder.embed_tokens.weight": table,
        "final_logits_bias": np.zeros((1, config.vocab_size), np.float32),
    }
    _stack_to_hf(flat, "encoder", config.num_layers, config, out)
    _stack_to_hf(flat, "decoder", config.decoder_layers, config, out)
    if config.tie_embeddings:
        out["lm_head.weight"] = table
    else:
        out["lm_head.weight"] = common.kernel_to_linear(flat["lm_head/output_projection/kernel"])
    return out


def shift_right(ids_BL: np.ndarray, *, start_id: int, pad_id: int) -> np.ndarray:
    """HF's `shift_tokens_right`: prepend the start token, drop the last, -100 -> pad.

    >>> shift_right(np.array([[5, 6, -100]]), start_id=2, pad_id=1)
    array([[2, 5, 6]])
    """
    ids = np.asarray(ids_BL)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {ids.shape}")
    shifted = np.concatenate([np.full_like(ids[:, :1], start_id), ids[:, :-1]], axis=1)
    return np.where(shifted == -100, pad_id, shifted)


def model_inputs(hf, input_ids, *, attention_mask, token_type_ids, decoder_input_ids):
    """HF's BART inputs -> lmsuite kwargs; without decoder_input_ids the decoder reads
    `input_ids` shifted right with decoder_start_token_id, as HF's BartModel does."""
    if token_type_ids is not None:
        raise ValueError("BART has no token_type_ids; pass None")
    if decoder_input_ids is None:
        decoder_input_ids = shift_right(
            input_ids, start_id=hf.decoder_start_token_id, pad_id=hf.pad_token_id
        )
    return dict(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids
    )


FAMILY = common.Family(
    name="bart",
    hf_classes=CLASSES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    params_from_hf=params_from_hf,
    params_to_hf=params_to_hf,
    model_inputs=model_inputs,
    hf_logits=common.lm_logits,
)
