"""Which converter handles which HF class, and the reverse guess from an lmsuite config."""

from lmsuite.convert.common import Family
from lmsuite.models import ModelConfig
from lmsuite.models import families as model_families

# Family modules, each defining FAMILY. A module that is not written yet is simply absent.
_MODULES = ("bert", "roberta", "albert", "electra", "gpt2", "t5", "bart", "deberta", "xlnet")


def families() -> list[Family]:
    import importlib

    out = []
    for name in _MODULES:
        try:
            module = importlib.import_module(f"lmsuite.convert.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"lmsuite.convert.{name}":
                raise
            continue
        out.append(module.FAMILY)
    return out


def families_by_class() -> dict[str, Family]:
    return {cls: fam for fam in families() for cls in fam.hf_classes}


def refuse_without_hf_class(config: ModelConfig):
    """Raises for a config that no HF model class can hold, whatever hf_class is asked for."""
    if config.position_type == "learned_relative":
        raise ValueError(
            "position_type='learned_relative': HuggingFace transformers has no class for BERT's "
            "learned positions plus a bucketed relative bias (UniLMv2's released checkpoints "
            "load through microsoft/unilm's s2s-ft code, not transformers), so this model cannot "
            "be exported to HF. Use it through lmsuite (`lmsuite eval`, `lmsuite finetune`, "
            "lmsuite.evaluation) from its checkpoint."
        )
    if config.position_type == "tupe":
        raise ValueError(
            "position_type='tupe': HuggingFace transformers has no TUPE model class (TUPE's "
            "untied positional attention and [CLS] have no counterpart in BertModel or any "
            "other class), so a TUPE model cannot be exported to HF. Use it through lmsuite "
            "(`lmsuite eval`, `lmsuite finetune`, lmsuite.evaluation) from its checkpoint."
        )


def infer_hf_class(config: ModelConfig) -> str:
    """Guesses the HF class from config features; raises when the config has no HF twin."""
    refuse_without_hf_class(config)
    heads = set(config.heads)
    family = model_families.family(config)
    if family is model_families.XLNET:
        return "XLNetLMHeadModel"
    if family is model_families.DECODER and heads == {"lm"}:
        return "GPT2LMHeadModel"
    if family is model_families.ENCODER_DECODER:
        return (
            "T5ForConditionalGeneration"
            if config.position_type == "t5_relative"
            else ("BartForConditionalGeneration")
        )
    if family is model_families.ENCODER:
        if config.position_type == "deberta":
            # v1's in_proj has no key bias; v2/v3 (with or without log buckets) have one.
            return "DebertaV2ForMaskedLM" if config.use_key_bias else "DebertaForMaskedLM"
        if config.share_layers == "all":
            return "AlbertForPreTraining"
        if heads == {"rtd"}:
            return "ElectraForPreTraining"
        if config.position_offset == 2 and heads == {"mlm"}:
            return "RobertaForMaskedLM"
        if config.embed_width != config.d_model and heads == {"mlm"}:
            return "ElectraForMaskedLM"
        if heads == {"mlm", "classifier"}:
            return "BertForPreTraining"
        if heads == {"mlm"}:
            return "BertForMaskedLM"
    raise ValueError(
        f"no HF class matches {model_families.describe(config)}, heads={sorted(heads)}, "
        f"position_type={config.position_type!r}; pass hf_class= explicitly"
    )
