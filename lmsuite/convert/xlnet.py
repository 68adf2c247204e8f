"""XLNet: `XLNetLMHeadModel`, the two-stream Transformer-XL with a tied LM head and its own bias.

HF keeps the projections q, k, v, r as (D, H, K) tensors (already lmsuite's layout) and o as
(D, H, K), which lmsuite's `out` holds as (H, K, D). HF's memories are time-major (C, B, D);
lmsuite's are (B, C, D), and `model_inputs` / `hf_mems` transpose them.

HF has no `untie_r`: every layer owns its r_w_bias, r_r_bias and r_s_bias. A config that says
untie_r=False (a tied TF checkpoint carried over) converts to lmsuite's shared
`relative_biases` only when every layer holds the same values; `to_hf` writes the shared set
into every layer and keeps untie_r=False in config.json.

HF options that change nothing lmsuite computes are not converted: summary_* / start_n_top /
end_n_top (heads of other XLNet classes), use_mems_eval / use_mems_train (whether HF returns
its memory; lmsuite always returns `new_mems`, and the caller decides whether to feed it).
"""

import numpy as np

from lmsuite.convert import common
from lmsuite.convert.common import linear_in, take
from lmsuite.models import ModelConfig
from lmsuite.models.option_groups import XLNET_ATTENTION_TYPES, XLNetOptions

CLASSES = ("XLNetLMHeadModel",)
_BIASES = (
    ("content_bias", "r_w_bias"),
    ("position_bias", "r_r_bias"),
    ("segment_bias", "r_s_bias"),
)
# (lmsuite kernel under layers_i/attention, HF tensor under rel_attn), both (D, H, K).
_PROJECTIONS = (("query", "q"), ("key", "k"), ("value", "v"), ("position", "r"))
_NORMS = (("post_attention_norm", "rel_attn.layer_norm"), ("post_mlp_norm", "ff.layer_norm"))
_FFN = (("wi", "layer_1"), ("wo", "layer_2"))


def config_from_hf(hf, hf_class: str) -> ModelConfig:
    if not isinstance(hf.ff_activation, str):
        raise ValueError(
            f"unsupported XLNet config option ff_activation={hf.ff_activation!r}; lmsuite "
            f"supports the names {sorted(common.HF_ACTIVATIONS)}"
        )
    common.require(hf, "attn_type", XLNET_ATTENTION_TYPES, "XLNet")
    if hf.d_head * hf.n_head != hf.d_model:
        raise ValueError(
            f"unsupported XLNet config: d_head={hf.d_head} * n_head={hf.n_head} != "
            f"d_model={hf.d_model}"
        )
    options = XLNetOptions(
        mem_len=hf.mem_len or None,  # HF keeps every state for mem_len None and 0 alike
        reuse_len=hf.reuse_len or None,
        clamp_len=hf.clamp_len if hf.clamp_len > 0 else -1,
        attn_type=hf.attn_type,
        bi_data=bool(hf.bi_data),
        untie_r=bool(getattr(hf, "untie_r", True)),
        same_length=bool(hf.same_length),
    )
    return ModelConfig(
        architecture="xlnet",
        vocab_size=hf.vocab_size,
        d_model=hf.d_model,
        num_heads=hf.n_head,
        d_ff=hf.d_inner,
        num_layers=hf.n_layer,
        type_vocab_size=0,
        position_type="none",
        activation=common.hf_activation(hf.ff_activation, "ff_activation"),
        norm_eps=hf.layer_norm_eps,
        embedding_norm=False,
        heads=("lm",),
        tie_embeddings=bool(hf.tie_word_embeddings),
        output_bias=True,
        dropout_rate=hf.dropout,
        attention_dropout_rate=hf.dropout,
        init_stddev=hf.initializer_range,
        pad_id=hf.pad_token_id if hf.pad_token_id is not None else 0,
        xlnet=options,
    )


def _check_exportable(config: ModelConfig):
    expected = dict(architecture="xlnet", heads=("lm",), output_bias=True)
    common.require_fields(config, expected, "XLNetLMHeadModel")
    if config.head_width * config.num_heads != config.d_model:
        raise ValueError(
            f"XLNetLMHeadModel needs head_dim * num_heads == d_model, got "
            f"{config.head_width} * {config.num_heads} != {config.d_model}"
        )
    if config.dropout_rate != config.attention_dropout_rate:
        raise ValueError(
            f"XLNetLMHeadModel has one dropout; dropout_rate={config.dropout_rate} differs from "
            f"attention_dropout_rate={config.attention_dropout_rate}"
        )


def config_to_hf(config: ModelConfig, hf_class: str):
    from transformers import XLNetConfig

    _check_exportable(config)
    opts = config.xlnet
    return XLNetConfig(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        n_layer=config.num_layers,
        n_head=config.num_heads,
        d_inner=config.d_ff,
        ff_activation=common.to_hf_activation(config.activation),
        attn_type=opts.attn_type,
        layer_norm_eps=config.norm_eps,
        dropout=config.dropout_rate,
        initializer_range=config.init_stddev,
        mem_len=opts.mem_len,
        reuse_len=opts.reuse_len,
        clamp_len=opts.clamp_len,
        bi_data=opts.bi_data,
        same_length=opts.same_length,
        untie_r=opts.untie_r,  # not read by HF; kept so that from_hf ties the biases again
        pad_token_id=config.pad_id,
        tie_word_embeddings=config.tie_embeddings,
    )


# ------------------------------------------------------------------------------ weights
def _hf_layer(i: int) -> str:
    return f"transformer.layer.{i}."


def params_from_hf(state, config: ModelConfig, hf_class: str) -> dict:
    table = take(state, "transformer.word_embedding.weight")
    out = {
        "token_embedder/embedding": table,
        "mask_emb": take(state, "transformer.mask_emb").reshape(-1),
    }
    for i in range(config.num_layers):
        hf, ours = _hf_layer(i), f"layers_{i}/"
        for name, hf_name in _PROJECTIONS:
            out[f"{ours}attention/{name}/kernel"] = take(state, f"{hf}rel_attn.{hf_name}")
        out[f"{ours}attention/out/kernel"] = take(state, f"{hf}rel_attn.o").transpose(1, 2, 0)
        out[f"{ours}attention/segment_embedding"] = take(state, f"{hf}rel_attn.seg_embed")
        for name, hf_name in _BIASES:
            bias = take(state, f"{hf}rel_attn.{hf_name}")
            if config.xlnet.untie_r:
                out[f"{ours}attention/{name}"] = bias
            elif i == 0:
                out[f"relative_biases/{name}"] = bias
            elif not np.array_equal(bias, out[f"relative_biases/{name}"]):
                raise ValueError(
                    f"untie_r=False, but {hf}rel_attn.{hf_name} differs from layer 0's; "
                    "lmsuite shares one set of biases (set untie_r=True to keep them per layer)"
                )
        for name, hf_name in _NORMS:
            out[f"{ours}{name}/scale"] = take(state, f"{hf}{hf_name}.weight")
            out[f"{ours}{name}/bias"] = take(state, f"{hf}{hf_name}.bias")
        for name, hf_name in _FFN:
            out[f"{ours}mlp/{name}/kernel"] = linear_in(take(state, f"{hf}ff.{hf_name}.weight"))
            out[f"{ours}mlp/{name}/bias"] = take(state, f"{hf}ff.{hf_name}.bias")
    head = state.pop("lm_loss.weight", table)
    if config.tie_embeddings:
        if not np.array_equal(head, table):
            raise ValueError(
                "lm_loss.weight differs from transformer.word_embedding.weight, but "
                "tie_word_embeddings=True"
            )
    else:
        out["lm_head/output_projection/kernel"] = linear_in(head)
    out["lm_head/output_bias"] = take(state, "lm_loss.bias")
    common.check_consumed(state, "XLNet")
    return out


def params_to_hf(flat, config: ModelConfig, hf_class: str) -> dict:
    table = flat["token_embedder/embedding"]
    out = {
        "transformer.word_embedding.weight": table,
        "transformer.mask_emb": flat["mask_emb"].reshape(1, 1, -1),
    }
    for i in range(config.num_layers):
        hf, ours = _hf_layer(i), f"layers_{i}/"
        for name, hf_name in _PROJECTIONS:
            out[f"{hf}rel_attn.{hf_name}"] = flat[f"{ours}attention/{name}/kernel"]
        out[f"{hf}rel_attn.o"] = np.asarray(flat[f"{ours}attention/out/kernel"]).transpose(2, 0, 1)
        out[f"{hf}rel_attn.seg_embed"] = flat[f"{ours}attention/segment_embedding"]
        for name, hf_name in _BIASES:
            where = f"{ours}attention/" if config.xlnet.untie_r else "relative_biases/"
            out[f"{hf}rel_attn.{hf_name}"] = flat[where + name]
        for name, hf_name in _NORMS:
            out[f"{hf}{hf_name}.weight"] = flat[f"{ours}{name}/scale"]
            out[f"{hf}{hf_name}.bias"] = flat[f"{ours}{name}/bias"]
        for name, hf_name in _FFN:
            kernel = flat[f"{ours}mlp/{name}/kernel"]
            out[f"{hf}ff.{hf_name}.weight"] = common.kernel_to_linear(kernel)
            out[f"{hf}ff.{hf_name}.bias"] = flat[f"{ours}mlp/{name}/bias"]
    if config.tie_embeddings:
        out["lm_loss.weight"] = table
    else:
        kernel = flat["lm_head/output_projection/kernel"]
        out["lm_loss.weight"] = common.kernel_to_linear(kernel)
    out["lm_loss.bias"] = flat["lm_head/output_bias"]
    return out


# ------------------------------------------------------------------------------- inputs
def model_inputs(
    hf,
    input_ids,
    *,
    attention_mask,
    token_type_ids,
    decoder_input_ids,
    perm_mask=None,
    target_mapping=None,
    mems=None,
    input_mask=None,
):
    """HF's XLNet inputs -> lmsuite kwargs: input_mask (1 = padding) becomes attention_mask,
    and HF's time-major (C, B, D) memories become (B, C, D)."""
    if decoder_input_ids is not None:
        raise ValueError("XLNet has no decoder: decoder_input_ids must be None")
    if input_mask is not None:
        if attention_mask is not None:
            raise ValueError("pass one of input_mask (1 = padding) and attention_mask, not both")
        attention_mask = 1 - np.asarray(input_mask)
    if mems is not None:
        mems = tuple(np.swapaxes(np.asarray(m), 0, 1) for m in mems)
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        perm_mask=perm_mask,
        target_mapping=target_mapping,
        mems=mems,
    )


def hf_mems(outputs, hf_class: str) -> list:
    """The `mems` HF returns with use_mems=True: one time-major (C, B, D) array per layer."""
    return [np.swapaxes(m, 0, 1) for m in outputs["new_mems"]]


FAMILY = common.Family(
    name="xlnet",
    hf_classes=CLASSES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    params_from_hf=params_from_hf,
    params_to_hf=params_to_hf,
    model_inputs=model_inputs,
    hf_logits=common.lm_logits,
    extra_inputs=("perm_mask", "target_mapping", "mems", "input_mask"),
    hf_mems=hf_mems,
)
