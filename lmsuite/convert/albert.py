"""ALBERT: `AlbertForPreTraining` (MLM + sentence-order prediction).

ALBERT is a post-norm BERT encoder with
  - factorised embeddings: tables of width E, LayerNorm at width E, then the E -> D Linear
    `encoder.embedding_hidden_mapping_in` (present even when E == D), which is lmsuite's
    Embedder order (norm, dropout, projection) with `project_embeddings=True`;
  - one layer shared by all `num_hidden_layers` (share_layers="all", `layers_shared`). HF's
    general grouping (num_hidden_groups > 1 or inner_group_num > 1) is refused by name;
  - an MLM head of width E whose activation is `hidden_act`, and the SOP classifier on the
    tanh pooler.
"""

from lmsuite.convert import bert, common
from lmsuite.convert.common import linear_in, take
from lmsuite.models import ModelConfig

CLASSES = ("AlbertForPreTraining",)
_LAYER_PREFIX = "albert.encoder.albert_layer_groups.0.albert_layers.0."
_PROJECTION = "albert.encoder.embedding_hidden_mapping_in"
_MLM_NAMES = dict(dense="dense", norm="LayerNorm", decoder="decoder", bias="bias")

# (lmsuite name under the shared layer, HF name under the layer, kind) for AlbertLayer.
_LAYER = (
    ("attention/query", "attention.query", "heads_in"),
    ("attention/key", "attention.key", "heads_in"),
    ("attention/value", "attention.value", "heads_in"),
    ("attention/out", "attention.dense", "heads_out"),
    ("post_attention_norm", "attention.LayerNorm", "norm"),
    ("mlp/wi", "ffn", "linear"),
    ("mlp/wo", "ffn_output", "linear"),
    ("post_mlp_norm", "full_layer_layer_norm", "norm"),
)


def config_from_hf(hf, hf_class: str) -> ModelConfig:
    common.require(hf, "num_hidden_groups", 1, "ALBERT")
    common.require(hf, "inner_group_num", 1, "ALBERT")
    common.require(hf, "position_embedding_type", ("absolute", None), "ALBERT")
    return bert.base_config(
        hf,
        embedding_dim=hf.embedding_size,
        project_embeddings=True,
        share_layers="all",
        heads=("mlm", "classifier"),
        num_labels=hf.num_labels,
    )


def config_to_hf(config: ModelConfig, hf_class: str):
    from transformers import AlbertConfig

    if config.share_layers != "all":
        raise ValueError(
            f"ALBERT shares every layer: share_layers must be 'all', got {config.share_layers!r}"
        )
    if not bert.has_projection(config):
        raise ValueError("ALBERT always projects E -> D: set project_embeddings=True")
    if set(config.heads) != {"mlm", "classifier"} or not config.mlm_transform:
        raise ValueError(
            "AlbertForPreTraining has heads mlm (with transform) and classifier, got "
            f"{config.heads}"
        )
    if config.mlm_activation != config.activation:
        raise ValueError(
            f"ALBERT's MLM head uses hidden_act; head_activation={config.head_activation!r} "
            f"differs from activation={config.activation!r}"
        )
    return AlbertConfig(
        **bert.base_hf_kwargs(config),
        embedding_size=config.embed_width,
        num_hidden_groups=1,
        inner_group_num=1,
        num_labels=config.num_labels,
    )


def params_from_hf(state, config: ModelConfig, hf_class: str) -> dict:
    out = {}
    bert.embeddings_from_hf(state, "albert.", config, out, projection=_PROJECTION)
    bert.layer_from_hf(state, _LAYER_PREFIX, "encoder/layers_shared", config, out, table=_LAYER)
    bert.mlm_head_from_hf(state, "predictions.", config, out, names=_MLM_NAMES)
    out["classifier/pooler/kernel"] = linear_in(take(state, "albert.pooler.weight"))
    out["classifier/pooler/bias"] = take(state, "albert.pooler.bias")
    out["classifier/output/kernel"] = linear_in(take(state, "sop_classifier.classifier.weight"))
    out["classifier/output/bias"] = take(state, "sop_classifier.classifier.bias")
    common.check_consumed(state, "ALBERT")
    return out


def params_to_hf(flat, config: ModelConfig, hf_class: str) -> dict:
    out = {}
    bert.embeddings_to_hf(flat, "albert.", config, out, projection=_PROJECTION)
    bert.layer_to_hf(flat, _LAYER_PREFIX, "encoder/layers_shared", config, out, table=_LAYER)
    bert.mlm_head_to_hf(flat, "predictions.", config, out, names=_MLM_NAMES)
    out["albert.pooler.weight"] = common.kernel_to_linear(flat["classifier/pooler/kernel"])
    out["albert.pooler.bias"] = flat["classifier/pooler/bias"]
    out["sop_classifier.classifier.weight"] = common.kernel_to_linear(
        flat["classifier/output/kernel"]
    )
    out["sop_classifier.classifier.bias"] = flat["classifier/output/bias"]
    return out


FAMILY = common.Family(
    name="albert",
    hf_classes=CLASSES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    params_from_hf=params_from_hf,
    params_to_hf=params_to_hf,
    model_inputs=common.encoder_model_inputs("ALBERT"),
    hf_logits=common.mlm_logits,  # SOP logits: outputs["classifier_logits"]
)
