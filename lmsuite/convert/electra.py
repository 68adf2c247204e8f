"""ELECTRA: the discriminator `ElectraForPreTraining` and the generator `ElectraForMaskedLM`.

Both are BERT encoders whose embedding tables have width E; when E != D the Linear
`electra.embeddings_project` maps the normed embeddings to D (lmsuite's `embedding_projection`).
  - discriminator head `discriminator_predictions` -> `rtd_head`: dense D -> D, `hidden_act`,
    dense D -> 1 (`dense_prediction`);
  - generator head `generator_predictions` + `generator_lm_head` -> `mlm_head`: dense D -> E,
    exact gelu whatever `hidden_act` says, LayerNorm(E), vocabulary Linear (E -> V, tied) + bias.
"""

from lmsuite.convert import bert, common
from lmsuite.convert.common import linear_in, take
from lmsuite.models import ModelConfig

CLASSES = ("ElectraForPreTraining", "ElectraForMaskedLM")
_PROJECTION = "electra.embeddings_project"
_MLM_NAMES = dict(
    dense="generator_predictions.dense",
    norm="generator_predictions.LayerNorm",
    decoder="generator_lm_head",
    bias="generator_lm_head.bias",
)


def config_from_hf(hf, hf_class: str) -> ModelConfig:
    bert.check_bert_options(hf, "ELECTRA")
    if hf_class == "ElectraForPreTraining":
        # The discriminator head applies hidden_act: the default head activation is right.
        return bert.base_config(hf, embedding_dim=hf.embedding_size, heads=("rtd",))
    return bert.base_config(
        hf, embedding_dim=hf.embedding_size, heads=("mlm",), head_activation="gelu"
    )


def config_to_hf(config: ModelConfig, hf_class: str):
    from transformers import ElectraConfig

    if config.project_embeddings and config.embed_width == config.d_model:
        raise ValueError("ELECTRA projects embeddings only when E != D: project_embeddings=True")
    if hf_class == "ElectraForPreTraining":
        if set(config.heads) != {"rtd"}:
            raise ValueError(f"ElectraForPreTraining has only the rtd head, got {config.heads}")
        if config.mlm_activation != config.activation:
            raise ValueError(
                f"ELECTRA's discriminator head uses hidden_act; head_activation="
                f"{config.head_activation!r} differs from activation={config.activation!r}"
            )
    else:
        if set(config.heads) != {"mlm"} or not config.mlm_transform:
            raise ValueError(
                f"ElectraForMaskedLM has one MLM head with a transform, got {config.heads}"
            )
        if config.mlm_activation != "gelu":
            raise ValueError(
                f"ELECTRA's generator head applies exact gelu; head activation "
                f"{config.mlm_activation!r} has no HF equivalent"
            )
    return ElectraConfig(**bert.base_hf_kwargs(config), embedding_size=config.embed_width)


def params_from_hf(state, config: ModelConfig, hf_class: str) -> dict:
    out = {}
    bert.embeddings_from_hf(state, "electra.", config, out, projection=_PROJECTION)
    bert.encoder_from_hf(state, "electra.", config, out)
    if hf_class == "ElectraForPreTraining":
        p = "discriminator_predictions."
        out["rtd_head/dense/kernel"] = linear_in(take(state, p + "dense.weight"))
        out["rtd_head/dense/bias"] = take(state, p + "dense.bias")
        out["rtd_head/output/kernel"] = linear_in(take(state, p + "dense_prediction.weight"))
        out["rtd_head/output/bias"] = take(state, p + "dense_prediction.bias")
    else:
        bert.mlm_head_from_hf(state, "", config, out, names=_MLM_NAMES)
    common.check_consumed(state, "ELECTRA")
    return out


def params_to_hf(flat, config: ModelConfig, hf_class: str) -> dict:
    out = {}
    bert.embeddings_to_hf(flat, "electra.", config, out, projection=_PROJECTION)
    bert.encoder_to_hf(flat, "electra.", config, out)
    if hf_class == "ElectraForPreTraining":
        p = "discriminator_predictions."
        out[p + "dense.weight"] = common.kernel_to_linear(flat["rtd_head/dense/kernel"])
        out[p + "dense.bias"] = flat["rtd_head/dense/bias"]
        out[p + "dense_prediction.weight"] = common.kernel_to_linear(flat["rtd_head/output/kernel"])
        out[p + "dense_prediction.bias"] = flat["rtd_head/output/bias"]
    else:
        bert.mlm_head_to_hf(flat, "", config, out, names=_MLM_NAMES)
    return out


def hf_logits(outputs, hf_class: str):
    """`logits`: (B, L) replaced-token scores for the discriminator, (B, L, V) for the generator."""
    if hf_class == "ElectraForPreTraining":
        return outputs["rtd_logits"]
    return outputs["mlm_logits"]


FAMILY = common.Family(
    name="electra",
    hf_classes=CLASSES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    params_from_hf=params_from_hf,
    params_to_hf=params_to_hf,
    model_inputs=common.encoder_model_inputs("ELECTRA"),
    hf_logits=hf_logits,
)
