"""DeBERTa: `DebertaForMaskedLM` (v1) and `DebertaV2ForMaskedLM` (v2/v3).

Both are post-norm BERT-like encoders with disentangled attention (`lmsuite.layers.disentangled`)
and DeBERTa's embedding order (embed_proj without bias before the LayerNorm, then the padded
rows zeroed). What differs between the two HF classes:
  - v1 packs query/key/value into one `in_proj` without bias, grouped per head as
    (head, [q, k, v], K), plus `q_bias` / `v_bias`: lmsuite's `key` has no bias
    (use_key_bias=False), and neither has v1's position key `pos_proj`; `pos_q_proj` has one.
  - v2 has `query_proj` / `key_proj` / `value_proj`, `pos_key_proj` / `pos_query_proj` (or none
    with share_att_key), log `position_buckets`, a LayerNorm on the relative table
    (norm_rel_ebd="layer_norm").
The MLM head is `cls.predictions` (BERT's, the default `legacy=True`) or, with legacy=False,
`lm_predictions.lm_head`, which computes the same thing with the tied embeddings; `to_hf`
always writes the legacy layout.

HF has no enhanced mask decoder, so `config_from_hf` sets DebertaOptions.emd_layers=0. To
continue pretraining a HF checkpoint with it, call `params_from_hf` with
`config.replace(deberta=config.deberta.replace(emd_layers=2))`: the decoder's absolute-position
table is the state's
`deberta.embeddings.position_embeddings.weight` when present (the released checkpoints keep it;
HF's loader drops it), else drawn as a fresh model's would be (truncated normal of
init_stddev, PRNGKey(0)).
`to_hf` refuses an EMD config: HF's MLM head would read the last layer instead.
"""

import jax
import jax.numpy as jnp
import numpy as np

from lmsuite.convert import common
from lmsuite.convert.common import heads_bias, heads_in, heads_out, linear_in, take
from lmsuite.layers.dense import default_kernel_init
from lmsuite.models import ModelConfig
from lmsuite.models.option_groups import DebertaOptions

V1 = "DebertaForMaskedLM"
V2 = "DebertaV2ForMaskedLM"
CLASSES = (V1, V2)
_POS_TYPES = ("c2p", "p2c")
_LEGACY = "cls.predictions."
_NON_LEGACY = "lm_predictions.lm_head."


def _unsupported(option: str, value, expected: str):
    raise ValueError(
        f"unsupported DeBERTa config option {option}={value!r}; lmsuite supports {expected}"
    )


def _pos_att_type(hf) -> tuple[str, ...]:
    raw = hf.pos_att_type
    types = raw.lower().split("|") if isinstance(raw, str) else list(raw or [])
    types = [t.strip() for t in types]
    if any(t not in _POS_TYPES for t in types) or len(set(types)) != len(types):
        _unsupported("pos_att_type", raw, f"distinct entries of {list(_POS_TYPES)}")
    return tuple(types)


def _embedding_size(hf) -> int:
    size = getattr(hf, "embedding_size", None)
    return hf.hidden_size if size is None else size


def config_from_hf(hf, hf_class: str) -> ModelConfig:
    v1 = hf_class == V1
    types = _pos_att_type(hf)
    activation = common.hf_activation(hf.hidden_act)
    if v1 and getattr(hf, "talking_head", False):
        _unsupported("talking_head", hf.talking_head, "False")
    buckets, share, norm_rel = -1, False, False
    if not v1:
        if getattr(hf, "conv_kernel_size", 0) > 0:
            _unsupported("conv_kernel_size", hf.conv_kernel_size, "0 (no convolution layer)")
        norm = [x.strip() for x in str(getattr(hf, "norm_rel_ebd", "none")).lower().split("|")]
        if any(x not in ("none", "layer_norm") for x in norm):
            _unsupported("norm_rel_ebd", hf.norm_rel_ebd, "'none' or 'layer_norm'")
        norm_rel = "layer_norm" in norm
        buckets = getattr(hf, "position_buckets", -1)
        buckets = buckets if buckets > 0 else -1
        share = bool(getattr(hf, "share_att_key", False))
        size = getattr(hf, "attention_head_size", None)
        if size is not None and size != hf.hidden_size // hf.num_attention_heads:
            # HF's attention.output.dense is hidden_size wide, so its forward fails here anyway.
            _unsupported(
                "attention_head_size", size, "hidden_size // num_attention_heads (or unset)"
            )
    legacy = getattr(hf, "legacy", True)
    embedding_size = _embedding_size(hf)
    if not legacy and embedding_size != hf.hidden_size:
        _unsupported(
            "legacy",
            legacy,
            f"True when embedding_size={embedding_size} != hidden_size={hf.hidden_size}",
        )
    max_rel = getattr(hf, "max_relative_positions", -1)
    return ModelConfig(
        architecture="encoder",
        vocab_size=hf.vocab_size,
        d_model=hf.hidden_size,
        num_heads=hf.num_attention_heads,
        d_ff=hf.intermediate_size,
        num_layers=hf.num_hidden_layers,
        embedding_dim=embedding_size if embedding_size != hf.hidden_size else None,
        type_vocab_size=hf.type_vocab_size,
        max_length=hf.max_position_embeddings,
        position_type="deberta",
        deberta=DebertaOptions(
            relative_attention=bool(getattr(hf, "relative_attention", False)),
            max_relative_positions=max_rel if max_rel >= 1 else -1,
            position_buckets=buckets,
            share_att_key=share,
            pos_att_type=types,
            norm_rel_embeddings=norm_rel,
            position_biased_input=bool(getattr(hf, "position_biased_input", True)),
        ),
        activation=activation,
        norm_eps=hf.layer_norm_eps,
        norm_position="post",
        use_key_bias=not v1,
        mask_padded_queries=True,
        mask_padded_embeddings=True,
        embedding_projection_first=True,
        embedding_projection_bias=False,
        heads=("mlm",),
        tie_embeddings=bool(hf.tie_word_embeddings) if legacy else True,
        dropout_rate=hf.hidden_dropout_prob,
        attention_dropout_rate=hf.attention_probs_dropout_prob,
        init_stddev=hf.initializer_range,
        pad_id=hf.pad_token_id if hf.pad_token_id is not None else 0,
    )


def _check_exportable(config: ModelConfig, hf_class: str):
    """Raises, naming the field, when an lmsuite config has no twin in `hf_class`."""
    v1 = hf_class == V1
    needed = dict(
        position_type="deberta",
        heads=("mlm",),
        mlm_transform=True,
        output_bias=True,
        head_activation=None,
        norm_type="layernorm",
        norm_position="post",
        use_bias=True,
        use_key_bias=not v1,
        scale_attention=True,
        embedding_norm=True,
        scale_embeddings=False,
        final_norm=False,
        project_embeddings=False,
        mask_padded_queries=True,
        mask_padded_embeddings=True,
        share_layers="none",
        position_offset=0,
        scale_tied_output=False,
    )
    needed_options = dict(emd_layers=0)
    if config.embed_width != config.d_model:
        needed.update(embedding_projection_first=True, embedding_projection_bias=False)
    if config.head_width * config.num_heads != config.d_model:
        needed.update(head_dim=config.d_model // config.num_heads)
    if v1:
        needed_options.update(position_buckets=-1, share_att_key=False, norm_rel_embeddings=False)
    for field, value in needed.items():
        if getattr(config, field) != value:
            raise ValueError(
                f"{hf_class} cannot express ModelConfig.{field}={getattr(config, field)!r} "
                f"(needs {value!r})"
            )
    for field, value in needed_options.items():
        if getattr(config.deberta, field) != value:
            raise ValueError(
                f"{hf_class} cannot express DebertaOptions.{field}="
                f"{getattr(config.deberta, field)!r} (needs {value!r})"
            )


def config_to_hf(config: ModelConfig, hf_class: str):
    import transformers

    _check_exportable(config, hf_class)
    kwargs = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.d_ff,
        hidden_act=common.to_hf_activation(config.activation),
        hidden_dropout_prob=config.dropout_rate,
        attention_probs_dropout_prob=config.attention_dropout_rate,
        max_position_embeddings=config.max_length,
        type_vocab_size=config.type_vocab_size,
        initializer_range=config.init_stddev,
        layer_norm_eps=config.norm_eps,
        relative_attention=config.deberta.relative_attention,
        max_relative_positions=config.deberta.max_relative_positions,
        pad_token_id=config.pad_id,
        position_biased_input=config.deberta.position_biased_input,
        pos_att_type=list(config.deberta.pos_att_type),
        legacy=True,
        tie_word_embeddings=config.tie_embeddings,
        embedding_size=config.embed_width,
    )
    if hf_class == V1:
        return transformers.DebertaConfig(**kwargs)
    kwargs.update(
        position_buckets=config.deberta.position_buckets,
        share_att_key=config.deberta.share_att_key,
        norm_rel_ebd="layer_norm" if config.deberta.norm_rel_embeddings else "none",
        conv_kernel_size=0,
    )
    return transformers.DebertaV2Config(**kwargs)


# ------------------------------------------------------------------------------ weights
def _attention_names(config: ModelConfig, hf_class: str) -> list[tuple[str, str, bool]]:
    """(lmsuite submodule, HF Linear under `attention.self.`, has bias) besides query/key/value."""
    cfg = config
    names = []
    if cfg.deberta.relative_attention and not cfg.deberta.share_att_key:
        v1 = hf_class == V1
        if "c2p" in cfg.deberta.pos_att_type:
            names.append(("pos_key", "pos_proj" if v1 else "pos_key_proj", not v1))
        if "p2c" in cfg.deberta.pos_att_type:
            names.append(("pos_query", "pos_q_proj" if v1 else "pos_query_proj", True))
    if hf_class == V2:
        names += [("query", "query_proj", True), ("key", "key_proj", True)]
        names.append(("value", "value_proj", True))
    return names


# (lmsuite path under a layer, HF module under the layer) of the post-norm layer's other parts.
_LINEAR = (("mlp/wi", "intermediate.dense"), ("mlp/wo", "output.dense"))
_NORMS = (
    ("post_attention_norm", "attention.output.LayerNorm"),
    ("post_mlp_norm", "output.LayerNorm"),
)


def _layer_from_hf(state, hp: str, ours: str, config: ModelConfig, hf_class: str, out: dict):
    h = config.num_heads
    a = hp + "attention.self."
    if hf_class == V1:
        w_H3KD = take(state, a + "in_proj.weight").reshape(h, 3, -1, config.d_model)
        for j, name in enumerate(("query", "key", "value")):
            out[f"{ours}/attention/{name}/kernel"] = np.transpose(w_H3KD[:, j], (2, 0, 1))
        out[f"{ours}/attention/query/bias"] = heads_bias(take(state, a + "q_bias"), h)
        out[f"{ours}/attention/value/bias"] = heads_bias(take(state, a + "v_bias"), h)
    for name, hf_name, bias in _attention_names(config, hf_class):
        out[f"{ours}/attention/{name}/kernel"] = heads_in(take(state, f"{a}{hf_name}.weight"), h)
        if bias:
            out[f"{ours}/attention/{name}/bias"] = heads_bias(take(state, f"{a}{hf_name}.bias"), h)
    out[f"{ours}/attention/out/kernel"] = heads_out(
        take(state, hp + "attention.output.dense.weight"), h
    )
    out[f"{ours}/attention/out/bias"] = take(state, hp + "attention.output.dense.bias")
    for name, hf_name in _LINEAR:
        out[f"{ours}/{name}/kernel"] = linear_in(take(state, f"{hp}{hf_name}.weight"))
        out[f"{ours}/{name}/bias"] = take(state, f"{hp}{hf_name}.bias")
    for name, hf_name in _NORMS:
        out[f"{ours}/{name}/scale"] = take(state, f"{hp}{hf_name}.weight")
        out[f"{ours}/{name}/bias"] = take(state, f"{hp}{hf_name}.bias")


def _layer_to_hf(flat, hp: str, ours: str, config: ModelConfig, hf_class: str, out: dict):
    a = hp + "attention.self."
    if hf_class == V1:
        kernels = [flat[f"{ours}/attention/{n}/kernel"] for n in ("query", "key", "value")]
        w_H3KD = np.stack([np.transpose(k, (1, 2, 0)) for k in kernels], axis=1)
        out[a + "in_proj.weight"] = w_H3KD.reshape(-1, config.d_model)
        out[a + "q_bias"] = np.reshape(flat[f"{ours}/attention/query/bias"], -1)
        out[a + "v_bias"] = np.reshape(flat[f"{ours}/attention/value/bias"], -1)
    for name, hf_name, bias in _attention_names(config, hf_class):
        kernel = flat[f"{ours}/attention/{name}/kernel"]
        out[f"{a}{hf_name}.weight"] = common.kernel_to_linear(kernel)
        if bias:
            out[f"{a}{hf_name}.bias"] = np.reshape(flat[f"{ours}/attention/{name}/bias"], -1)
    kernel = flat[f"{ours}/attention/out/kernel"]
    out[hp + "attention.output.dense.weight"] = common.kernel_to_linear(kernel, 2)
    out[hp + "attention.output.dense.bias"] = flat[f"{ours}/attention/out/bias"]
    for name, hf_name in _LINEAR:
        out[f"{hp}{hf_name}.weight"] = common.kernel_to_linear(flat[f"{ours}/{name}/kernel"])
        out[f"{hp}{hf_name}.bias"] = flat[f"{ours}/{name}/bias"]
    for name, hf_name in _NORMS:
        out[f"{hp}{hf_name}.weight"] = flat[f"{ours}/{name}/scale"]
        out[f"{hp}{hf_name}.bias"] = flat[f"{ours}/{name}/bias"]


# lmsuite path <- HF name, for the pieces that exist under a config condition.
def _optional_names(config: ModelConfig) -> list[tuple[str, str]]:
    cfg = config
    e = "deberta.embeddings."
    names = [("token_embedder/embedding", e + "word_embeddings.weight")]
    if cfg.deberta.position_biased_input:
        names.append(("embedder/position_embedder/embedding", e + "position_embeddings.weight"))
    if cfg.type_vocab_size > 0:
        names.append(("embedder/type_embedder/embedding", e + "token_type_embeddings.weight"))
    names += [
        ("embedder/embedding_norm/scale", e + "LayerNorm.weight"),
        ("embedder/embedding_norm/bias", e + "LayerNorm.bias"),
    ]
    if cfg.deberta.relative_attention:
        rel = "encoder/relative_embeddings/"
        names.append((rel + "embedding", "deberta.encoder.rel_embeddings.weight"))
        if cfg.deberta.norm_rel_embeddings:
            names.append((rel + "norm/scale", "deberta.encoder.LayerNorm.weight"))
            names.append((rel + "norm/bias", "deberta.encoder.LayerNorm.bias"))
    return names


def _head_from_hf(state, config: ModelConfig, out: dict):
    legacy = _LEGACY + "transform.dense.weight" in state
    dense, norm = ("transform.dense", "transform.LayerNorm") if legacy else ("dense", "LayerNorm")
    p = _LEGACY if legacy else _NON_LEGACY
    out["mlm_head/transform/kernel"] = linear_in(take(state, f"{p}{dense}.weight"))
    out["mlm_head/transform/bias"] = take(state, f"{p}{dense}.bias")
    out["mlm_head/transform_norm/scale"] = take(state, f"{p}{norm}.weight")
    out["mlm_head/transform_norm/bias"] = take(state, f"{p}{norm}.bias")
    bias = take(state, p + "bias")
    out["mlm_head/output_bias"] = bias
    if not legacy:
        return
    decoder = take(state, p + "decoder.weight")
    decoder_bias = take(state, p + "decoder.bias")
    if config.tie_embeddings:
        if not np.array_equal(decoder, out["token_embedder/embedding"]):
            raise ValueError("tie_word_embeddings=True but the decoder differs from the embeddings")
    else:
        # Untied, HF's forward adds decoder.bias; its `bias` is a separate, unused tensor.
        out["mlm_head/output_projection/kernel"] = linear_in(decoder)
        out["mlm_head/output_bias"] = decoder_bias


def params_from_hf(state, config: ModelConfig, hf_class: str) -> dict:
    out = {}
    for ours, hf_name in _optional_names(config):
        out[ours] = take(state, hf_name)
    if config.embed_width != config.d_model:
        proj = take(state, "deberta.embeddings.embed_proj.weight")
        out["embedder/embedding_projection/kernel"] = linear_in(proj)
    state.pop("deberta.embeddings.position_ids", None)
    for i in range(config.num_layers):
        hp, ours = f"deberta.encoder.layer.{i}.", f"encoder/layers_{i}"
        _layer_from_hf(state, hp, ours, config, hf_class, out)
    _head_from_hf(state, config, out)
    if config.emd_layers:
        out[_EMD_TABLE] = _emd_table(state, config)
    common.check_consumed(state, "DeBERTa")
    return out


_EMD_TABLE = "encoder/enhanced_mask_decoder/position_embedder/embedding"
_HF_POSITIONS = "deberta.embeddings.position_embeddings.weight"


def _emd_table(state, config: ModelConfig) -> np.ndarray:
    """The EMD's (max_length, D) absolute positions: the checkpoint's, or a fresh draw."""
    shape = (config.max_length, config.d_model)
    if _HF_POSITIONS in state:
        table = take(state, _HF_POSITIONS)
        if table.shape != shape:
            raise ValueError(
                f"{_HF_POSITIONS} is {table.shape}; the enhanced mask decoder needs {shape}"
            )
        return table
    init = default_kernel_init(config.init_stddev)
    return np.asarray(init(jax.random.PRNGKey(0), shape, jnp.float32))


def params_to_hf(flat, config: ModelConfig, hf_class: str) -> dict:
    out = {hf_name: flat[ours] for ours, hf_name in _optional_names(config)}
    if config.embed_width != config.d_model:
        kernel = flat["embedder/embedding_projection/kernel"]
        out["deberta.embeddings.embed_proj.weight"] = common.kernel_to_linear(kernel)
    for i in range(config.num_layers):
        hp, ours = f"deberta.encoder.layer.{i}.", f"encoder/layers_{i}"
        _layer_to_hf(flat, hp, ours, config, hf_class, out)
    p = _LEGACY
    out[p + "transform.dense.weight"] = common.kernel_to_linear(flat["mlm_head/transform/kernel"])
    out[p + "transform.dense.bias"] = flat["mlm_head/transform/bias"]
    out[p + "transform.LayerNorm.weight"] = flat["mlm_head/transform_norm/scale"]
    out[p + "transform.LayerNorm.bias"] = flat["mlm_head/transform_norm/bias"]
    if config.tie_embeddings:
        out[p + "decoder.weight"] = flat["token_embedder/embedding"]
    else:
        kernel = flat["mlm_head/output_projection/kernel"]
        out[p + "decoder.weight"] = common.kernel_to_linear(kernel)
    out[p + "bias"] = flat["mlm_head/output_bias"]
    out[p + "decoder.bias"] = flat["mlm_head/output_bias"]
    return out


def model_inputs(hf, input_ids, *, attention_mask, token_type_ids, decoder_input_ids):
    """HF's inputs as they are, except that segment types are dropped when the model has none.

    HF ignores token_type_ids when type_vocab_size=0; all-zero ones are dropped likewise, other
    values raise rather than vanish.
    """
    if decoder_input_ids is not None:
        raise ValueError("DeBERTa is an encoder: decoder_input_ids must be None")
    if token_type_ids is not None and hf.type_vocab_size == 0:
        if np.any(token_type_ids != 0):
            raise ValueError(
                "token_type_ids hold non-zero ids, but the DeBERTa config has type_vocab_size=0"
            )
        token_type_ids = None
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)


FAMILY = common.Family(
    name="deberta",
    hf_classes=CLASSES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    params_from_hf=params_from_hf,
    params_to_hf=params_to_hf,
    model_inputs=model_inputs,
    hf_logits=common.mlm_logits,
)
