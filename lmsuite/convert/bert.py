"""BERT: `BertForPreTraining` (MLM + NSP) and `BertForMaskedLM`.

The layer layout here (`encoder.layer.N.attention.self.query`, ...) is shared by RoBERTa and
ELECTRA, whose converters reuse `encoder_from_hf` / `encoder_to_hf` and the embedding helpers.
"""

import numpy as np

from lmsuite.convert import common
from lmsuite.convert.common import heads_bias, heads_in, heads_out, linear_in, take
from lmsuite.models import ModelConfig

CLASSES = ("BertForPreTraining", "BertForMaskedLM")


def check_bert_options(hf, family: str):
    """Options of BertConfig-like configs that lmsuite does not implement."""
    common.require(hf, "is_decoder", (False, None), family)
    common.require(hf, "add_cross_attention", (False, None), family)
    common.require(hf, "position_embedding_type", ("absolute", None), family)


def base_config(hf, **overrides) -> ModelConfig:
    """The ModelConfig fields every BERT-like HF config shares."""
    fields = dict(
        architecture="encoder",
        vocab_size=hf.vocab_size,
        d_model=hf.hidden_size,
        num_heads=hf.num_attention_heads,
        d_ff=hf.intermediate_size,
        num_layers=hf.num_hidden_layers,
        type_vocab_size=hf.type_vocab_size,
        max_length=hf.max_position_embeddings,
        position_type="learned",
        activation=common.hf_activation(hf.hidden_act),
        norm_eps=hf.layer_norm_eps,
        norm_position="post",
        dropout_rate=hf.hidden_dropout_prob,
        attention_dropout_rate=hf.attention_probs_dropout_prob,
        init_stddev=hf.initializer_range,
        pad_id=hf.pad_token_id if hf.pad_token_id is not None else 0,
        tie_embeddings=bool(getattr(hf, "tie_word_embeddings", True)),
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def config_from_hf(hf, hf_class: str) -> ModelConfig:
    check_bert_options(hf, "BERT")
    heads = ("mlm", "classifier") if hf_class == "BertForPreTraining" else ("mlm",)
    return base_config(hf, heads=heads)


def base_hf_kwargs(config: ModelConfig) -> dict:
    return dict(
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        num_attention_heads=config.num_heads,
        intermediate_size=config.d_ff,
        num_hidden_layers=config.num_layers,
        type_vocab_size=config.type_vocab_size,
        max_position_embeddings=config.max_length,
        hidden_act=common.to_hf_activation(config.activation),
        layer_norm_eps=config.norm_eps,
        hidden_dropout_prob=config.dropout_rate,
        attention_probs_dropout_prob=config.attention_dropout_rate,
        initializer_range=config.init_stddev,
        pad_token_id=config.pad_id,
        tie_word_embeddings=config.tie_embeddings,
    )


def config_to_hf(config: ModelConfig, hf_class: str):
    from transformers import BertConfig

    return BertConfig(**base_hf_kwargs(config))


# ------------------------------------------------------------------------------ weights
def has_projection(config: ModelConfig) -> bool:
    """Whether the model has `embedder/embedding_projection` (E -> D)."""
    return config.embed_width != config.d_model or config.project_embeddings


def embeddings_from_hf(
    state, prefix: str, config: ModelConfig, out: dict, *, types=True, projection=None
):
    """`{prefix}embeddings.*` -> token_embedder, embedder/{position,type}_embedder, norm.

    `projection` is the HF name of the E -> D Linear (ELECTRA `electra.embeddings_project`,
    ALBERT `albert.encoder.embedding_hidden_mapping_in`), read when the model has one.
    """
    e = f"{prefix}embeddings."
    out["token_embedder/embedding"] = take(state, e + "word_embeddings.weight")
    out["embedder/position_embedder/embedding"] = take(state, e + "position_embeddings.weight")
    if types and config.type_vocab_size > 0:
        out["embedder/type_embedder/embedding"] = take(state, e + "token_type_embeddings.weight")
    out["embedder/embedding_norm/scale"] = take(state, e + "LayerNorm.weight")
    out["embedder/embedding_norm/bias"] = take(state, e + "LayerNorm.bias")
    state.pop(e + "position_ids", None)
    state.pop(e + "token_type_ids", None)
    if projection is not None and has_projection(config):
        out["embedder/embedding_projection/kernel"] = linear_in(take(state, projection + ".weight"))
        out["embedder/embedding_projection/bias"] = take(state, projection + ".bias")


def embeddings_to_hf(flat, prefix: str, config: ModelConfig, out: dict, *, projection=None):
    e = f"{prefix}embeddings."
    out[e + "word_embeddings.weight"] = flat["token_embedder/embedding"]
    out[e + "position_embeddings.weight"] = flat["embedder/position_embedder/embedding"]
    if config.type_vocab_size > 0:
        out[e + "token_type_embeddings.weight"] = flat["embedder/type_embedder/embedding"]
    out[e + "LayerNorm.weight"] = flat["embedder/embedding_norm/scale"]
    out[e + "LayerNorm.bias"] = flat["embedder/embedding_norm/bias"]
    if projection is not None and has_projection(config):
        kernel = flat["embedder/embedding_projection/kernel"]
        out[projection + ".weight"] = common.kernel_to_linear(kernel)
        out[projection + ".bias"] = flat["embedder/embedding_projection/bias"]


# (lmsuite name under a layer, HF name under the layer, kind) for BERT's post-norm layer.
_LAYER = (
    ("attention/query", "attention.self.query", "heads_in"),
    ("attention/key", "attention.self.key", "heads_in"),
    ("attention/value", "attention.self.value", "heads_in"),
    ("attention/out", "attention.output.dense", "heads_out"),
    ("post_attention_norm", "attention.output.LayerNorm", "norm"),
    ("mlp/wi", "intermediate.dense", "linear"),
    ("mlp/wo", "output.dense", "linear"),
    ("post_mlp_norm", "output.LayerNorm", "norm"),
)


def layer_from_hf(state, hf_prefix: str, ours: str, config: ModelConfig, out: dict, table=_LAYER):
    """One HF layer at `hf_prefix` -> lmsuite params under `ours` (e.g. "encoder/layers_0")."""
    h = config.num_heads
    for name, hf_name, kind in table:
        w = take(state, f"{hf_prefix}{hf_name}.weight")
        b = take(state, f"{hf_prefix}{hf_name}.bias")
        if kind == "norm":
            out[f"{ours}/{name}/scale"], out[f"{ours}/{name}/bias"] = w, b
        elif kind == "heads_in":
            out[f"{ours}/{name}/kernel"] = heads_in(w, h)
            out[f"{ours}/{name}/bias"] = heads_bias(b, h)
        elif kind == "heads_out":
            out[f"{ours}/{name}/kernel"] = heads_out(w, h)
            out[f"{ours}/{name}/bias"] = b
        else:
            out[f"{ours}/{name}/kernel"] = linear_in(w)
            out[f"{ours}/{name}/bias"] = b


def layer_to_hf(flat, hf_prefix: str, ours: str, config: ModelConfig, out: dict, table=_LAYER):
    for name, hf_name, kind in table:
        if kind == "norm":
            out[f"{hf_prefix}{hf_name}.weight"] = flat[f"{ours}/{name}/scale"]
            out[f"{hf_prefix}{hf_name}.bias"] = flat[f"{ours}/{name}/bias"]
            continue
        n_in = 2 if kind == "heads_out" else 1
        out[f"{hf_prefix}{hf_name}.weight"] = common.kernel_to_linear(
            flat[f"{ours}/{name}/kernel"], n_in
        )
        out[f"{hf_prefix}{hf_name}.bias"] = np.reshape(flat[f"{ours}/{name}/bias"], -1)


def encoder_from_hf(state, prefix: str, config: ModelConfig, out: dict):
    for i in range(config.num_layers):
        layer_from_hf(state, f"{prefix}encoder.layer.{i}.", f"encoder/layers_{i}", config, out)


def encoder_to_hf(flat, prefix: str, config: ModelConfig, out: dict):
    for i in range(config.num_layers):
        layer_to_hf(flat, f"{prefix}encoder.layer.{i}.", f"encoder/layers_{i}", config, out)


# HF names (under the head's prefix) of an MLM head's parts: the transform's Linear and
# LayerNorm, the vocabulary Linear, and the output bias (a tensor of its own, or the decoder's).
BERT_MLM_NAMES = dict(
    dense="transform.dense", norm="transform.LayerNorm", decoder="decoder", bias="bias"
)


def mlm_head_from_hf(state, p: str, config: ModelConfig, out: dict, *, names=BERT_MLM_NAMES):
    """BERT's `cls.predictions` (transform + tied decoder + bias) at prefix `p`.

    `names` renames the parts for the other families (RoBERTa `lm_head.layer_norm`, ...).
    """
    n = names
    out["mlm_head/transform/kernel"] = linear_in(take(state, f"{p}{n['dense']}.weight"))
    out["mlm_head/transform/bias"] = take(state, f"{p}{n['dense']}.bias")
    out["mlm_head/transform_norm/scale"] = take(state, f"{p}{n['norm']}.weight")
    out["mlm_head/transform_norm/bias"] = take(state, f"{p}{n['norm']}.bias")
    decoder = take(state, f"{p}{n['decoder']}.weight")
    if config.tie_embeddings:
        if not np.array_equal(decoder, out["token_embedder/embedding"]):
            raise ValueError("tie_word_embeddings=True but the decoder differs from the embeddings")
    else:
        out["mlm_head/output_projection/kernel"] = linear_in(decoder)
    # HF's forward adds the decoder's bias. `bias` is the same tensor when the embeddings are
    # tied, and a parameter the forward never reads when tie_word_embeddings=False.
    decoder_bias = f"{p}{n['decoder']}.bias"
    if decoder_bias in state:
        out["mlm_head/output_bias"] = take(state, decoder_bias)
        state.pop(f"{p}{n['bias']}", None)
    else:
        out["mlm_head/output_bias"] = take(state, f"{p}{n['bias']}")


def mlm_head_to_hf(flat, p: str, config: ModelConfig, out: dict, *, names=BERT_MLM_NAMES):
    n = names
    out[f"{p}{n['dense']}.weight"] = common.kernel_to_linear(flat["mlm_head/transform/kernel"])
    out[f"{p}{n['dense']}.bias"] = flat["mlm_head/transform/bias"]
    out[f"{p}{n['norm']}.weight"] = flat["mlm_head/transform_norm/scale"]
    out[f"{p}{n['norm']}.bias"] = flat["mlm_head/transform_norm/bias"]
    if config.tie_embeddings:
        out[f"{p}{n['decoder']}.weight"] = flat["token_embedder/embedding"]
    else:
        out[f"{p}{n['decoder']}.weight"] = common.kernel_to_linear(
            flat["mlm_head/output_projection/kernel"]
        )
    out[f"{p}{n['bias']}"] = flat["mlm_head/output_bias"]
    out[f"{p}{n['decoder']}.bias"] = flat["mlm_head/output_bias"]


def params_from_hf(state, config: ModelConfig, hf_class: str) -> dict:
    out = {}
    embeddings_from_hf(state, "bert.", config, out)
    encoder_from_hf(state, "bert.", config, out)
    mlm_head_from_hf(state, "cls.predictions.", config, out)
    if hf_class == "BertForPreTraining":
        out["classifier/pooler/kernel"] = linear_in(take(state, "bert.pooler.dense.weight"))
        out["classifier/pooler/bias"] = take(state, "bert.pooler.dense.bias")
        out["classifier/output/kernel"] = linear_in(take(state, "cls.seq_relationship.weight"))
        out["classifier/output/bias"] = take(state, "cls.seq_relationship.bias")
    common.check_consumed(state, "BERT")
    return out


def params_to_hf(flat, config: ModelConfig, hf_class: str) -> dict:
    out = {}
    embeddings_to_hf(flat, "bert.", config, out)
    encoder_to_hf(flat, "bert.", config, out)
    mlm_head_to_hf(flat, "cls.predictions.", config, out)
    if hf_class == "BertForPreTraining":
        out["bert.pooler.dense.weight"] = common.kernel_to_linear(flat["classifier/pooler/kernel"])
        out["bert.pooler.dense.bias"] = flat["classifier/pooler/bias"]
        out["cls.seq_relationship.weight"] = common.kernel_to_linear(
            flat["classifier/output/kernel"]
        )
        out["cls.seq_relationship.bias"] = flat["classifier/output/bias"]
    return out


FAMILY = common.Family(
    name="bert",
    hf_classes=CLASSES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    params_from_hf=params_from_hf,
    params_to_hf=params_to_hf,
    model_inputs=common.encoder_model_inputs("BERT"),
    hf_logits=common.mlm_logits,
)
