"""RoBERTa: `RobertaForMaskedLM`.

A BERT encoder with three differences that matter for conversion:
  - positions are counted from the input ids, skipping padding, and start at padding_idx + 1
    (fairseq's `make_positions`); padding tokens take the padding_idx row of the table;
  - one segment type (type_vocab_size 1) and no pooler;
  - the MLM head (`lm_head`) hardcodes exact gelu whatever `hidden_act` says.
"""

import numpy as np

from lmsuite.convert import bert, common
from lmsuite.models import ModelConfig

CLASSES = ("RobertaForMaskedLM",)

# RobertaLMHead: dense -> gelu -> layer_norm -> decoder (+ bias).
_MLM_NAMES = dict(dense="dense", norm="layer_norm", decoder="decoder", bias="bias")


def config_from_hf(hf, hf_class: str) -> ModelConfig:
    bert.check_bert_options(hf, "RoBERTa")
    if hf.pad_token_id is None or not 0 <= hf.pad_token_id < hf.max_position_embeddings - 1:
        raise ValueError(
            f"unsupported RoBERTa config option pad_token_id={hf.pad_token_id!r}: positions start "
            f"at pad_token_id + 1, which must lie inside max_position_embeddings="
            f"{hf.max_position_embeddings}"
        )
    return bert.base_config(
        hf,
        heads=("mlm",),
        head_activation="gelu",  # RobertaLMHead calls gelu() directly
        position_offset=hf.pad_token_id + 1,
    )


def config_to_hf(config: ModelConfig, hf_class: str):
    from transformers import RobertaConfig

    if config.mlm_activation != "gelu":
        raise ValueError(
            f"RoBERTa's MLM head applies exact gelu; head activation {config.mlm_activation!r} "
            "has no HF equivalent"
        )
    if config.position_offset != config.pad_id + 1:
        raise ValueError(
            f"RoBERTa needs position_offset == pad_id + 1, got position_offset="
            f"{config.position_offset} and pad_id={config.pad_id}"
        )
    if set(config.heads) != {"mlm"} or not config.mlm_transform:
        raise ValueError(
            f"RobertaForMaskedLM has one MLM head with a transform, got {config.heads}"
        )
    return RobertaConfig(**bert.base_hf_kwargs(config))


def params_from_hf(state, config: ModelConfig, hf_class: str) -> dict:
    out = {}
    bert.embeddings_from_hf(state, "roberta.", config, out)
    bert.encoder_from_hf(state, "roberta.", config, out)
    bert.mlm_head_from_hf(state, "lm_head.", config, out, names=_MLM_NAMES)
    common.check_consumed(state, "RoBERTa")
    return out


def params_to_hf(flat, config: ModelConfig, hf_class: str) -> dict:
    out = {}
    bert.embeddings_to_hf(flat, "roberta.", config, out)
    bert.encoder_to_hf(flat, "roberta.", config, out)
    bert.mlm_head_to_hf(flat, "lm_head.", config, out, names=_MLM_NAMES)
    return out


def position_ids(input_ids, *, pad_id: int) -> np.ndarray:
    """0-based positions counted over the non-pad tokens; padding gets -1.

    The model adds position_offset = pad_id + 1, so real tokens read rows pad_id + 1, pad_id + 2,
    ... and padding reads row pad_id, exactly as HF's `create_position_ids_from_input_ids`.
    A pad id in the middle of a sequence does not advance the count.

    >>> position_ids(np.array([[0, 5, 1, 6, 1]]), pad_id=1)
    array([[ 0,  1, -1,  2, -1]])
    """
    input_ids = np.asarray(input_ids)
    if input_ids.ndim != 2:
        raise ValueError(f"input_ids must be (batch, length), got shape {input_ids.shape}")
    real = (input_ids != pad_id).astype(np.int64)
    return np.cumsum(real, axis=1) * real - 1


def model_inputs(hf, input_ids, *, attention_mask, token_type_ids, decoder_input_ids):
    if decoder_input_ids is not None:
        raise ValueError("RoBERTa is an encoder: decoder_input_ids must be None")
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        token_type_ids=token_type_ids,
        position_ids=position_ids(input_ids, pad_id=hf.pad_token_id),
    )


FAMILY = common.Family(
    name="roberta",
    hf_classes=CLASSES,
    config_from_hf=config_from_hf,
    config_to_hf=config_to_hf,
    params_from_hf=params_from_hf,
    params_to_hf=params_to_hf,
    model_inputs=model_inputs,
    hf_logits=common.mlm_logits,
)
