"""Every published size in lmsuite/gin/models/ has exactly the parameter count of its HF twin.

The HF model is built on torch's meta device from the config our converter writes for
`to_hf`, so the comparison is against HF's own module code, not a typed-in number.
"""

import pytest
import torch
import transformers

from lmsuite import cli
from lmsuite.cli import model_config_from_gin
from lmsuite.convert import registry
from lmsuite.models.summary import summarize

SIZES = {
    "bert_base": "BertForPreTraining",
    "bert_large": "BertForPreTraining",
    "bert_tiny": "BertForPreTraining",
    "roberta_base": "RobertaForMaskedLM",
    "roberta_tiny": "RobertaForMaskedLM",
    "albert_base": "AlbertForPreTraining",
    "albert_large": "AlbertForPreTraining",
    "albert_xlarge": "AlbertForPreTraining",
    "albert_xxlarge": "AlbertForPreTraining",
    "albert_tiny": "AlbertForPreTraining",
    "electra_small_discriminator": "ElectraForPreTraining",
    "electra_small_generator": "ElectraForMaskedLM",
    "electra_base_discriminator": "ElectraForPreTraining",
    "electra_base_generator": "ElectraForMaskedLM",
    "electra_tiny_discriminator": "ElectraForPreTraining",
    "electra_tiny_generator": "ElectraForMaskedLM",
    "gpt2_small": "GPT2LMHeadModel",
    "gpt2_tiny": "GPT2LMHeadModel",
    "t5_small": "T5ForConditionalGeneration",
    "t5_base": "T5ForConditionalGeneration",
    "t5_tiny": "T5ForConditionalGeneration",
    "t5_1_1_small": "T5ForConditionalGeneration",
    "t5_1_1_base": "T5ForConditionalGeneration",
    "t5_1_1_tiny": "T5ForConditionalGeneration",
    "bart_base": "BartForConditionalGeneration",
    "bart_tiny": "BartForConditionalGeneration",
    "deberta_base": "DebertaForMaskedLM",
    "deberta_tiny": "DebertaForMaskedLM",
    "deberta_v3_base": "DebertaV2ForMaskedLM",
    "deberta_v3_tiny": "DebertaV2ForMaskedLM",
    "xlnet_base": "XLNetLMHeadModel",
    "xlnet_large": "XLNetLMHeadModel",
    "xlnet_tiny": "XLNetLMHeadModel",
}


@pytest.mark.parametrize("name", sorted(SIZES))
def test_parameter_count_equals_hf(name):
    hf_class = SIZES[name]
    config = model_config_from_gin([f"models/{name}.gin"])
    family = registry.families_by_class()[hf_class]
    assert registry.infer_hf_class(config) == hf_class
    hf_config = family.config_to_hf(config, hf_class)
    with torch.device("meta"):
        hf_model = getattr(transformers, hf_class)(hf_config)
        if hf_class == "T5ForConditionalGeneration" and not config.tie_embeddings:
            # HF 5 builds every T5 with a tied head and unties it only when a checkpoint's
            # lm_head differs from its embeddings, as every T5 1.1 checkpoint's does. Do the same.
            hf_model.lm_head.weight = torch.nn.Parameter(torch.empty_like(hf_model.lm_head.weight))
    assert summarize(config)["total"] == hf_model.num_parameters()


def test_every_size_file_is_checked():
    import pathlib

    gin_dir = pathlib.Path(cli.GIN_DIR) / "models"
    families = {"bert", "roberta", "albert", "electra", "gpt2", "t5", "t5_1_1", "bart"}
    families |= {"deberta", "deberta_v3", "xlnet", "tupe", "transformer_xl", "ernie2"}
    sizes = {p.stem for p in gin_dir.glob("*.gin")} - families
    # Pretraining-only models have no HF class to count against; each builds in its recipe's
    # matrix test (tests/training/test_recipes.py) instead.
    # (transformers 5 dropped TransfoXL; the multi-task encoder has a head per task.)
    no_hf_twin = {"electra_tiny", "unilm_tiny", "structbert_tiny", "tupe_tiny", "tupe_base"}
    no_hf_twin |= {"txl_tiny", "bert_multitask_tiny", "ernie2_tiny", "ernie2_base"}
    assert sizes == set(SIZES) | no_hf_twin
    for name in no_hf_twin:
        assert summarize(model_config_from_gin([f"models/{name}.gin"]))["total"] > 0


def test_tupe_base_is_bert_base_with_positions_untied():
    """HF has no TUPE class: the count is BERT's with its input position table (512 x D) traded
    for TUPE's (513 x D, a LayerNorm, U^Q and U^K with biases, TUPE-R's 33 x H relative bias)."""
    tupe = model_config_from_gin(["models/tupe_base.gin"])
    learned = tupe.replace(position_type="learned", tupe=None)
    d, h = 768, 12
    untied = 513 * d + 2 * d + 2 * (d * d + d) + 33 * h
    assert summarize(tupe)["total"] == summarize(learned)["total"] - 512 * d + untied
