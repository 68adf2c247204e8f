"""The recipe rows of encoder objectives: masked LM on gathered predictions, and the sentence- and
token-level tasks trained beside it (BERT, ALBERT, SpanBERT, ELECTRA, UniLM, StructBERT, ERNIE 2.0,
UniLMv2, and one multi-task mixture).

They share their data side: one converter, `EncoderMlmFeatureConverter`, given per row the
labels, span features and per-token features its loss reads, and the length keys input_ids (L)
and masked_ids (P predictions). What each row pairs, and how a run picks one, is in `recipes`,
whose `RECIPES` lists these rows with the other families'.
"""

import functools
import math
from collections.abc import Callable, Mapping

import seqio

from lmsuite import objectives as losses
from lmsuite.data import feature_converters as fc
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import ernie2 as ernie2_data
from lmsuite.data.preprocessors import mlm as mlm_lib
from lmsuite.data.preprocessors import pmlm as pmlm_data
from lmsuite.data.preprocessors import spanbert
from lmsuite.models import ModelConfig
from lmsuite.models import electra as electra_model
from lmsuite.objectives import electra as electra_loss
from lmsuite.objectives import labels as labels_loss
from lmsuite.objectives import pmlm as pmlm_loss
from lmsuite.objectives import structbert as structbert_loss
from lmsuite.objectives import unilm as unilm_loss
from lmsuite.training import structure_checks
from lmsuite.training.recipe_types import Recipe

ENCODER_MLM_FEATURES = ("input_ids", "masked_positions", "masked_ids", "masked_weights")
# ERNIE 2.0's tasks and their labels (`ernie2`: one LabelHead each).
ERNIE2_OBJECTIVES = (
    "ernie2_capitalization",
    "ernie2_token_document",
    "ernie2_sentence_reordering",
    "ernie2_sentence_distance",
)
ERNIE2_LABELS = (ernie2_data.REORDER_KEY, ernie2_data.DISTANCE_KEY)
ERNIE2_TOKEN_LABELS = (ernie2_data.CAPITALIZATION_KEY, ernie2_data.TOKEN_DOCUMENT_KEY)
ERNIE2_CLASSES = {
    ernie2_data.REORDER_KEY: sum(math.factorial(k) for k in range(1, ernie2_data.MAX_SEGMENTS + 1)),
    ernie2_data.DISTANCE_KEY: 3,
    ernie2_data.CAPITALIZATION_KEY: 2,
    ernie2_data.TOKEN_DOCUMENT_KEY: 2,
}


def _ernie2_heads_fit(config: ModelConfig, lengths) -> list[str]:
    """Each ERNIE 2.0 label head has as many classes as its task's labels."""
    del lengths
    return [
        f"LabelHead {h.name!r} has num_labels = {h.num_labels}; its task's labels take "
        f"{ERNIE2_CLASSES[h.name]} values"
        for h in config.label_heads
        if h.name in ERNIE2_CLASSES and h.num_labels != ERNIE2_CLASSES[h.name]
    ]


# The per-row labels `mlm_multitask` trains, one LabelHead each (-1 where a task lacks one).
MULTITASK_LABELS = ("next_sentence_label", "sentence_order_label", "sentence_relation_label")


def _mlm_lengths(length: int) -> dict[str, int]:
    return {"input_ids": length, "masked_ids": mlm_lib.electra_max_predictions(length)}


def _encoder_mlm(**kwargs) -> Callable[..., seqio.FeatureConverter]:
    return functools.partial(fc.EncoderMlmFeatureConverter, **kwargs)


def _pmlm_lengths(length: int) -> dict[str, int]:
    return {"input_ids": length, "masked_ids": pmlm_data.default_predictions(length)}


def _pmlm_fits(lengths: Mapping[str, int]) -> list[str]:
    length, width = int(lengths["input_ids"]), int(lengths["masked_ids"])
    n = pmlm_data.chunk_length(length, width)
    if n >= 1 and pmlm_data.max_masked(n) <= width:
        return []
    return [
        f"input_ids = {length} with masked_ids = {width} leaves {n}-token chunks whose masked "
        f"tokens (and their [P] and copied slots) do not fit; set masked_ids = "
        f"{pmlm_data.default_predictions(length)}"
    ]


def _mlm_row(name, summary, *, task_objectives, label=None, model="bert_tiny", **kwargs) -> Recipe:
    labels = () if label is None else (label,)
    return Recipe(
        name=name,
        summary=summary,
        task_objectives=task_objectives,
        length_keys=("input_ids", "masked_ids"),
        lengths_for=_mlm_lengths,
        task_features=ENCODER_MLM_FEATURES + labels,
        converter=_encoder_mlm(labels=labels),
        pack=False,
        loss=losses.mlm,
        loss_options={} if label is None else {"sentence_label": label},
        architectures=("encoder",),
        token_types="optional" if label is None else "pairs",
        example_model=model,
        task_ids_along=("masked_ids",),
        **kwargs,
    )


# BERT's instances are [CLS] A [SEP] B [SEP] with types 0/1; models with one type (RoBERTa) or
# none (DeBERTa) read them without types (`recipes.build`).
BERT_MLM = _mlm_row(
    "bert_mlm",
    "masked LM on gathered predictions (BERT/RoBERTa; whole-word and ERNIE masking)",
    task_objectives=("bert_mlm", "wwm", "ernie"),
    reference="google-research/bert create_pretraining_data.py "
    "(create_instances_from_document) and run_pretraining.py (get_masked_lm_output)",
    differences="dynamic masking (RoBERTa) by default; B is always the actual "
    "continuation (no NSP), a one-sentence chunk becomes [CLS] A [SEP]",
)

BERT_MLM_NSP = _mlm_row(
    "bert_mlm_nsp",
    "masked LM + next-sentence prediction (BERT)",
    task_objectives=("bert_mlm_nsp",),
    label="next_sentence_label",
    reference="google-research/bert run_pretraining.py (get_next_sentence_output)",
)

ALBERT_SOP = _mlm_row(
    "albert_sop",
    "n-gram masked LM + sentence-order prediction (ALBERT)",
    task_objectives=("albert_sop",),
    label="sentence_order_label",
    model="albert_tiny",
    reference="google-research/albert run_pretraining.py (SOP through the NSP head)",
)

SPANBERT = Recipe(
    name="spanbert",
    summary="SpanBERT: word-span masking, masked LM + span boundary objective (SBO)",
    task_objectives=("spanbert",),
    length_keys=("input_ids", "masked_ids"),
    lengths_for=_mlm_lengths,
    task_features=ENCODER_MLM_FEATURES + spanbert.SBO_KEYS,
    converter=_encoder_mlm(span_features=spanbert.SBO_KEYS),
    task_ids_along=("masked_ids",),
    pack=False,
    loss=losses.span_boundary,
    # The reference masks blocks before adding [CLS]/[SEP]: never an SBO boundary.
    loss_options={"excluded_boundary_ids": (vocab_lib.CLS_ID, vocab_lib.SEP_ID)},
    architectures=("encoder",),
    token_types="optional",
    example_model="bert_tiny",
    example_bindings=("ModelConfig.heads = ('mlm', 'sbo')",),
    reference="facebookresearch/SpanBERT pretraining/fairseq: models/pair_bert.py "
    "(BertPairTargetPredictionHead), criterions/spanbert_loss.py, data/masking.py",
    differences="the SBO mean divides by its target count, not count + 1; weights "
    "start truncated normal (the reference: normal)",
)

ELECTRA = Recipe(
    name="electra",
    summary="ELECTRA: a small MLM generator fills the masked slots with samples, the "
    "discriminator detects replaced tokens; one joint step, loss MLM + 50 x RTD",
    task_objectives=("electra",),
    length_keys=("input_ids", "masked_ids"),
    lengths_for=_mlm_lengths,
    task_features=ENCODER_MLM_FEATURES,
    converter=_encoder_mlm(),
    pack=False,
    loss=electra_loss.electra,
    architectures=("encoder",),
    token_types="optional",
    example_model="electra_tiny",
    task_ids_along=("masked_ids",),
    check_model=electra_model.recipe_problems,
    reference="google-research/electra run_pretraining.py (PretrainingModel, "
    "get_generator_config), pretrain/pretrain_helpers.py (mask, sample_from_softmax), "
    "configure_pretraining.py",
    differences=electra_loss.DIFFERENCES,
)

UNILM = Recipe(
    name="unilm",
    summary="UniLM: masked LM in one encoder under per-example bidirectional, "
    "left-to-right, right-to-left or seq2seq attention masks (token types 0..5)",
    task_objectives=("unilm",),
    length_keys=("input_ids", "masked_ids"),
    lengths_for=_mlm_lengths,
    task_features=ENCODER_MLM_FEATURES + ("token_type_ids",) + unilm_loss.FEATURES,
    converter=_encoder_mlm(labels=unilm_loss.FEATURES),
    pack=False,
    loss=unilm_loss.unilm_mlm,
    architectures=("encoder",),
    token_types="pairs",
    example_model="unilm_tiny",
    task_ids_along=("masked_ids",),
    check_model=structure_checks.unilm_model_problems,
    reference="microsoft/unilm unilm-v1/src: biunilm/seq2seq_loader.py (the per-example "
    "input_mask, --new_segment_ids), pytorch_pretrained_bert/modeling.py",
    differences="no NSP term for the bidirectional mode (B is always the continuation); "
    "padding queries see what a token there would (the reference: source keys only); "
    "trained from scratch, not from BERT-Large",
)

MLM_MULTITASK = Recipe(
    name="mlm_multitask",
    summary="masked LM + a head per sentence-level task of a mixture (NSP 2-way, SOP "
    "2-way, StructBERT's sentence structure 3-way): each example trains the MLM and "
    "its own task's head",
    task_objectives=("bert_mlm_nsp", "albert_sop", "structbert", "bert_mlm", "wwm"),
    length_keys=("input_ids", "masked_ids"),
    lengths_for=_mlm_lengths,
    task_features=ENCODER_MLM_FEATURES,
    converter=_encoder_mlm(labels=MULTITASK_LABELS),
    pack=False,
    loss=functools.partial(labels_loss.mlm_with_labels, labels=MULTITASK_LABELS),
    architectures=("encoder",),
    token_types="pairs",
    example_model="bert_multitask_tiny",
    task_ids_along=("masked_ids",),
    reference="the rows of bert_mlm_nsp, albert_sop and structbert, trained jointly "
    "as a SeqIO mixture ({corpus}_mlm_multitask_mixture)",
    differences="one encoder, one pooler + classifier per task (the single-task rows "
    "share one classifier); a label term averages over the examples of its task; "
    "StructBERT's word structure is not trained here",
)

ERNIE2 = Recipe(
    name="ernie2",
    summary="ERNIE 2.0: masked LM + capitalization and token-document relation per "
    "token + sentence reordering (9 classes) and sentence distance (3) per row, over "
    "{corpus}_ernie2_mixture, in continual stages (`train.stages`); each example trains "
    "its own task's head",
    task_objectives=tuple(ERNIE2_OBJECTIVES),
    length_keys=("input_ids", "masked_ids"),
    lengths_for=_mlm_lengths,
    task_features=ENCODER_MLM_FEATURES,
    converter=_encoder_mlm(labels=ERNIE2_LABELS, token_labels=ERNIE2_TOKEN_LABELS),
    pack=False,
    loss=functools.partial(
        labels_loss.mlm_with_labels,
        labels=ERNIE2_LABELS,
        token_labels=ERNIE2_TOKEN_LABELS,
    ),
    architectures=("encoder",),
    token_types="pairs",
    example_model="ernie2_tiny",
    check_model=_ernie2_heads_fit,
    task_ids_along=("masked_ids",),
    reference="Sun et al. 2020 (AAAI) §4; the pretraining code was not released "
    "(PaddlePaddle/ERNIE issues #261, #404)",
    differences="the continual stages are the run's `train.stages` (no stages: every "
    "task from step 0; experiments/ernie2_tiny.gin: three stages, their lengths and "
    "rates ours, the paper gives none); the tasks' own differences are in "
    "docs/objectives.md (ERNIE 2.0's tasks); "
    "discourse relation and IR relevance are not built (no labelled corpus)",
)

STRUCTBERT = Recipe(
    name="structbert",
    summary="StructBERT: masked LM + trigram word structure (through the MLM head) + "
    "3-way sentence structure (next / previous / other document)",
    task_objectives=("structbert",),
    length_keys=("input_ids", "masked_ids"),
    lengths_for=_mlm_lengths,
    task_features=ENCODER_MLM_FEATURES
    + structbert_loss.SHUFFLED_FEATURES
    + (structbert_loss.SENTENCE_LABEL,),
    converter=_encoder_mlm(
        labels=(structbert_loss.SENTENCE_LABEL,),
        span_features=structbert_loss.SHUFFLED_FEATURES,
    ),
    pack=False,
    loss=structbert_loss.structbert,
    architectures=("encoder",),
    token_types="pairs",
    example_model="structbert_tiny",
    task_ids_along=("masked_ids",),
    check_lengths=structure_checks.structbert_lengths_fit,
    check_model=structure_checks.structbert_model_problems,
    reference="Wang et al. 2020 (arXiv 1908.04577) §2.2-2.3 (no pretraining code read)",
    differences="each term is a mean over its own targets before the sum; the "
    "shuffled weights travel as int32 through the converter's span features",
)

UNILM2 = Recipe(
    name="unilm2",
    summary="UniLMv2 pseudo-masked LM: autoencoding MLM at [M] + partially "
    "autoregressive prediction of the masked blocks at appended [P] tokens, one pass",
    task_objectives=("unilm2",),
    length_keys=("input_ids", "masked_ids"),
    lengths_for=_pmlm_lengths,
    task_features=ENCODER_MLM_FEATURES + (pmlm_data.PSEUDO_POSITIONS,) + pmlm_data.FEATURES,
    converter=_encoder_mlm(
        span_features=(pmlm_data.PSEUDO_POSITIONS,),
        sequence_features=pmlm_data.FEATURES,
    ),
    pack=False,
    loss=pmlm_loss.pmlm,
    architectures=("encoder",),
    token_types="optional",
    example_model="bert_tiny",
    # UniLMv2's released positions, so the matrix trains the bias over shared position ids.
    example_bindings=("ModelConfig.position_type = 'learned_relative'",),
    check_lengths=_pmlm_fits,
    reference="Bao et al. 2020 (arXiv 2002.12804) Algorithm 1, section 2 and Figure 3 "
    "(paper only: microsoft/unilm releases no UniLMv2 pretraining code); the mask "
    "read against microsoft/unilm s2s-ft/s2s_ft/modeling.py "
    "(BertForSequenceToSequenceWithPseudoMask.create_attention_mask, fine-tuning)",
    differences=pmlm_loss.DIFFERENCES,
)
