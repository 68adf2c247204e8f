"""Recipes: the one place where a task, its feature converter, its loss and the model meet.

A row is the pairing: the task objectives it accepts (`lmsuite.data.tasks.OBJECTIVES`, or any
task whose examples carry the row's task features), the sequence-length keys, the feature
converter, the loss with this row's options, and the model families that can train it. What the
loss reads and reports (features, heads, metrics) it declares itself (`Recipe.objective`,
`lmsuite.objectives.Objective`); `tests/training/test_objective_contracts.py` holds each row's
converter and model to that declaration. Gin picks a row by name (`RECIPE =
't5_span_corruption'`, `train.recipe = @make_recipe()` in `runs/pretrain.gin`), `lmsuite train`
checks the run against it before anything compiles (`preflight`), and
`tests/training/test_recipes.py` trains every row for two steps through the CLI. Objectives that
have data but no trainable recipe yet are listed in `DATA_ONLY`, each with the reason, so nothing
is data-only without the table saying so.

  >>> choice = make_recipe(name="t5_span_corruption")
  >>> built = build(choice, model_config=config)       # after `preflight.check_run` passed
  >>> built.feature_converter, built.objective          # EncDecFeatureConverter(pack=True), seq2seq
"""

import dataclasses
import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import seqio

from lmsuite import objectives as losses
from lmsuite.data import feature_converters as fc
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import ernie2 as ernie2_data
from lmsuite.data.preprocessors import mass, span_corruption, spanbert, ul2
from lmsuite.data.preprocessors import mlm as mlm_lib
from lmsuite.data.preprocessors import pmlm as pmlm_data
from lmsuite.did_you_mean import nearest
from lmsuite.models import ModelConfig
from lmsuite.models import electra as electra_model
from lmsuite.objectives import Objective, per_task, seq2seq
from lmsuite.objectives import electra as electra_loss
from lmsuite.objectives import labels as labels_loss
from lmsuite.objectives import pmlm as pmlm_loss
from lmsuite.objectives import structbert as structbert_loss
from lmsuite.objectives import unilm as unilm_loss
from lmsuite.training import recipe_checks, structure_checks
from lmsuite.training.recipe_types import DataOnly, Recipe

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


def _span_corruption_lengths(length: int) -> dict[str, int]:
    return {
        "inputs": length,
        "targets": span_corruption.random_spans_helper(inputs_length=length)[1],
    }


def _encoder_mlm(**kwargs) -> Callable[..., seqio.FeatureConverter]:
    return functools.partial(fc.EncoderMlmFeatureConverter, **kwargs)


def _spans_fit(lengths: Mapping[str, int]) -> list[str]:
    problem = span_corruption.targets_length_problem(lengths)
    return [] if problem is None else [problem]


def _ul2_fits(lengths: Mapping[str, int]) -> list[str]:
    problem = ul2.targets_length_problem(lengths)
    return [] if problem is None else [problem]


def _mass_fits(lengths: Mapping[str, int]) -> list[str]:
    problem = mass.targets_length_problem(lengths)
    return [] if problem is None else [problem]


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


def _seq2seq_row(name, objective, summary, *, lengths_for, model, **kwargs) -> Recipe:
    defaults = dict(
        length_keys=("inputs", "targets"),
        task_features=("inputs", "targets"),
        converter=seqio.EncDecFeatureConverter,
        pack=True,
        loss=seq2seq.seq2seq,
        architectures=("encoder_decoder",),
        task_ids_along=("targets",),
    )
    return Recipe(
        name=name,
        summary=summary,
        task_objectives=kwargs.pop("task_objectives", (objective,)),
        lengths_for=lengths_for,
        example_model=model,
        **(defaults | kwargs),
    )


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


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in [
        # BERT's instances are [CLS] A [SEP] B [SEP] with types 0/1; models with one type
        # (RoBERTa) or none (DeBERTa) read them without types (`build`).
        _mlm_row(
            "bert_mlm",
            "masked LM on gathered predictions (BERT/RoBERTa; whole-word and ERNIE masking)",
            task_objectives=("bert_mlm", "wwm", "ernie"),
            reference="google-research/bert create_pretraining_data.py "
            "(create_instances_from_document) and run_pretraining.py (get_masked_lm_output)",
            differences="dynamic masking (RoBERTa) by default; B is always the actual "
            "continuation (no NSP), a one-sentence chunk becomes [CLS] A [SEP]",
        ),
        _mlm_row(
            "bert_mlm_nsp",
            "masked LM + next-sentence prediction (BERT)",
            task_objectives=("bert_mlm_nsp",),
            label="next_sentence_label",
            reference="google-research/bert run_pretraining.py (get_next_sentence_output)",
        ),
        _mlm_row(
            "albert_sop",
            "n-gram masked LM + sentence-order prediction (ALBERT)",
            task_objectives=("albert_sop",),
            label="sentence_order_label",
            model="albert_tiny",
            reference="google-research/albert run_pretraining.py (SOP through the NSP head)",
        ),
        Recipe(
            name="causal_lm",
            summary="left-to-right LM, packed (GPT-2)",
            task_objectives=("causal_lm",),
            length_keys=("targets",),
            lengths_for=lambda n: {"targets": n},
            task_features=("targets",),
            converter=seqio.LMFeatureConverter,
            pack=True,
            loss=losses.causal_lm,
            architectures=("decoder",),
            example_model="gpt2_tiny",
            task_ids_along=("targets",),
            reference="t5 preprocessors (causal LM); seqio LMFeatureConverter",
        ),
        Recipe(
            name="decoder_prefix_lm",
            summary="prefix LM on a decoder-only model: bidirectional prefix, causal rest (T5)",
            task_objectives=("prefix_lm",),
            length_keys=("inputs", "targets"),
            lengths_for=lambda n: {"inputs": n // 2, "targets": n // 2},
            task_features=("inputs", "targets"),
            converter=seqio.PrefixLMFeatureConverter,
            pack=True,
            # No per-task metrics: SeqIO's converter adds a padding target to an example with
            # no targets, which would shift task ids against the tokens of the packed row.
            task_ids_along=(),
            loss=losses.prefix_lm,
            architectures=("prefix_lm",),
            example_model="gpt2_tiny",
            example_bindings=("ModelConfig.architecture = 'prefix_lm'",),
            reference="t5 preprocessors.prefix_lm; seqio PrefixLMFeatureConverter",
        ),
        _seq2seq_row(
            "t5_span_corruption",
            "t5_span_corruption",
            "T5 span corruption: 15% noise in spans of mean 3, one sentinel per span",
            lengths_for=_span_corruption_lengths,
            model="t5_1_1_tiny",
            check_lengths=_spans_fit,
            reference="t5 preprocessors.span_corruption; t5x EncoderDecoderModel.loss_fn",
        ),
        _seq2seq_row(
            "iid_denoising",
            "iid_denoising",
            "T5 i.i.d. denoising: each token noise with probability 0.15",
            lengths_for=lambda n: {"inputs": n, "targets": n // 2},
            model="t5_tiny",
            reference="t5 preprocessors.iid_denoising",
        ),
        _seq2seq_row(
            "prefix_lm",
            "prefix_lm",
            "T5's prefix LM, encoder-decoder: the encoder reads a prefix, the decoder the rest",
            lengths_for=lambda n: {"inputs": n, "targets": n},
            model="t5_tiny",
            reference="t5 preprocessors.prefix_lm",
        ),
        _seq2seq_row(
            "bart_denoising",
            "bart_denoising",
            "BART: sentence permutation + text infilling (Poisson(3) spans, 30%)",
            lengths_for=lambda n: {"inputs": n, "targets": n},
            model="bart_tiny",
            loss_options={"z_loss": 0.0},
            reference="fairseq denoising_dataset.py; fairseq cross_entropy criterion (no z-loss)",
        ),
        _seq2seq_row(
            "mass",
            "mass",
            "MASS: the encoder masks a fragment of half the sentence, the decoder predicts it",
            lengths_for=lambda n: {"inputs": n, "targets": mass.fragment_length(n, 0.5)},
            task_features=("inputs", "targets", "decoder_input_tokens", "decoder_positions"),
            converter=lambda pack: fc.MassFeatureConverter(pack=pack),
            task_ids_along=(),  # its converter builds the decoder side itself: no passthrough
            loss_options={
                "z_loss": 0.0,
                "cross_attention_ignores": vocab_lib.MASK_ID,
                "given_decoder_positions": True,
            },
            model="bart_tiny",
            check_lengths=_mass_fits,
            reference="microsoft/MASS MASS-unsupNMT/src/trainer.py (mass_step)",
        ),
        Recipe(
            name="xlnet_plm",
            summary="XLNet permutation LM: two streams, 1/6 of the tokens predicted, "
            "Transformer-XL memory carried from step to step",
            task_objectives=("xlnet_plm",),
            length_keys=("input_k", "target"),
            lengths_for=recipe_checks.xlnet_lengths,
            task_features=("input_k", "target"),
            converter=lambda pack: fc.PermutationLmFeatureConverter(pack=pack),
            pack=False,
            loss=losses.permutation_lm,
            architectures=("xlnet",),
            example_model="xlnet_tiny",
            example_bindings=("XLNetOptions.mem_len = 48", "XLNetOptions.reuse_len = 32"),
            check_model=recipe_checks.xlnet_model_problems,
            rows_task=recipe_checks.xlnet_rows,
            reference="zihangdai/xlnet train_gpu.py, function_builder.two_stream_loss, "
            "modeling.lm_loss",
            differences="a row's memory is reset to zeros (the reference's initial memory) "
            "where its stream starts; the reference never resets; no bi_data",
        ),
        Recipe(
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
        ),
        Recipe(
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
        ),
        Recipe(
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
        ),
        Recipe(
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
        ),
        Recipe(
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
        ),
        Recipe(
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
        ),
        Recipe(
            name="txl_lm",
            summary="Transformer-XL LM: next-token prediction over contiguous segments, "
            "relative positions, memory of the previous segment carried from step to step",
            task_objectives=("txl_lm",),
            length_keys=("inputs", "targets"),
            lengths_for=lambda n: {"inputs": n, "targets": n},
            task_features=("inputs", "targets"),
            converter=lambda pack: fc.StreamLmFeatureConverter(pack=pack),
            pack=False,
            loss=losses.stream_lm,
            architectures=("transformer_xl",),
            example_model="txl_tiny",
            check_model=recipe_checks.txl_model_problems,
            rows_task=recipe_checks.txl_rows,
            reference="kimiyoung/transformer-xl pytorch/mem_transformer.py (MemTransformerLM, "
            "RelPartialLearnableMultiHeadAttn, _update_mems), pytorch/train.py, "
            "pytorch/data_utils.py (LMOrderedIterator); tf/model.py",
            differences="a full softmax over the vocabulary (no adaptive softmax or adaptive "
            "input); rows continue for steps_per_block steps, then start new text with their "
            "memory reset to zeros (the reference: one stream per row for the whole corpus, "
            "never reset); documents end with </s>; no variable-length segments (--varlen)",
        ),
        Recipe(
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
            check_lengths=_pmlm_fits,
            reference="Bao et al. 2020 (arXiv 2002.12804) Algorithm 1, section 2 and Figure 3 "
            "(paper only: microsoft/unilm releases no UniLMv2 pretraining code); the mask "
            "read against microsoft/unilm s2s-ft/s2s_ft/modeling.py "
            "(BertForSequenceToSequenceWithPseudoMask.create_attention_mask, fine-tuning)",
            differences=pmlm_loss.DIFFERENCES,
        ),
        # Train it on the mixture `{corpus}_ul2` (per-denoiser metrics); each denoiser's task
        # also trains alone.
        _seq2seq_row(
            "ul2",
            ul2.DENOISERS[0].name,
            "UL2 mixture of denoisers: R (spans 3, 8 at 15%), X (spans 3, 8 at 50%; 64 at 15%, "
            "50%) and S (prefix LM), each input led by its mode token [NLU]/[NLG]/[S2S]",
            task_objectives=tuple(d.name for d in ul2.DENOISERS),
            lengths_for=ul2.lengths,
            model="t5_1_1_tiny",
            check_lengths=_ul2_fits,
            reference="Tay et al. 2022 (arXiv 2205.05131) §3.1 and its appendix ul2_objective "
            "(t5 random_spans_helper, span_corruption/denoise, prefix_lm, prepend_prompt), the "
            "T5X UL2 configs' prefixes [NLU]/[NLG]/[S2S]; t5x EncoderDecoderModel.loss_fn",
            differences=ul2.DIFFERENCES,
        ),
    ]
}

# A new objective's data may land here first, with the converter that carries its features.
DATA_ONLY: dict[str, DataOnly] = {}


# ------------------------------------------------------------------------------- choosing
@dataclasses.dataclass(frozen=True)
class RecipeChoice:
    """What gin chose: a row, its packing and loss options (see `make_recipe`)."""

    recipe: Recipe
    pack: bool
    loss_options: Mapping[str, Any]
    task_weights: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Built:
    """A recipe made concrete for one model and one task or mixture: the converter and the
    loss the run uses. For a mixture, `tasks` are its task names (task ids 1, 2, ...) and
    `task_ids_along` the features its task ids run along (None: a task, or a row that cannot
    carry them); its loss then reports per-task metrics (`lmsuite.objectives.per_task`)."""

    recipe: Recipe
    feature_converter: seqio.FeatureConverter
    objective: Objective
    pack: bool
    tasks: tuple[str, ...] = ()
    task_ids_along: tuple[str, ...] | None = None


def get(name: str) -> Recipe:
    """The row called `name`; a ValueError names the rows (and the closest one)."""
    if name not in RECIPES:
        pending = f" ({name!r} is data-only: {DATA_ONLY[name].reason})" if name in DATA_ONLY else ""
        raise ValueError(
            f"unknown recipe {name!r}{nearest(name, RECIPES)}{pending}; the recipes are "
            f"{sorted(RECIPES)}"
        )
    return RECIPES[name]


def loss_parameters(recipe: Recipe) -> list[str]:
    """The options its loss factory takes (what `loss_options` may set)."""
    return [p for p in inspect.signature(recipe.loss).parameters if p != "name"]


def make_recipe(
    *,
    name: str,
    pack: bool | None = None,
    loss_options: Mapping[str, Any] | None = None,
    task_weights: Mapping[str, float] | None = None,
) -> RecipeChoice:
    """Selects the row `name`; `pack` overrides its default packing; `loss_options` its loss's
    keyword options (e.g. {'z_loss': 0.0, 'label_smoothing': 0.1}); `task_weights` ({task:
    weight}, 1 for a task not named) weigh a mixture's tasks in the loss
    (`lmsuite.objectives.per_task`).

    Raises:
      ValueError: an unknown row or loss option (naming the valid ones), or packing a row whose
        converter cannot pack.
    """
    recipe = get(name)
    options = dict(loss_options or {})
    valid = loss_parameters(recipe)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(
            f"recipe {name!r}: loss option(s) {unknown} are not options of its loss "
            f"{getattr(recipe.loss, 'func', recipe.loss).__module__}."
            f"{getattr(recipe.loss, 'func', recipe.loss).__name__}; expected some of {valid}"
        )
    pack = recipe.pack if pack is None else bool(pack)
    if pack and not recipe.can_pack():
        raise ValueError(
            f"recipe {name!r} cannot pack (its sentence-level labels are one per row); "
            "set make_recipe.pack = False"
        )
    if task_weights and not recipe.task_ids_along:
        raise ValueError(
            f"recipe {name!r} cannot weigh a mixture's tasks: its feature converter does not "
            "carry task ids; drop make_recipe.task_weights"
        )
    return RecipeChoice(
        recipe=recipe,
        pack=pack,
        loss_options={**recipe.loss_options, **options},
        task_weights=dict(task_weights or {}),
    )


def build(choice: RecipeChoice, *, model_config: ModelConfig, tasks: Sequence[str] = ()) -> Built:
    """The converter and loss of `choice` for `model_config` (token types only where the model
    has a type table); with the `tasks` of a mixture (`mixtures.task_names`), per-task metrics
    where the row can carry task ids."""
    recipe = choice.recipe
    options = dict(choice.loss_options)
    if recipe.token_types == "optional" and model_config.type_vocab_size < 2:
        options["token_type_ids"] = None  # the model has no second segment type to read
    objective = recipe.loss(**options)
    if choice.task_weights and not tasks:
        raise ValueError(
            f"make_recipe.task_weights = {dict(choice.task_weights)} weigh a mixture's tasks, but "
            "the run's task is not a mixture"
        )
    if not (tasks and recipe.task_ids_along):
        return Built(
            recipe=recipe,
            feature_converter=recipe.converter(pack=choice.pack),
            objective=objective,
            pack=choice.pack,
        )
    return Built(
        recipe=recipe,
        feature_converter=fc.with_task_ids(recipe.converter(pack=choice.pack)),
        objective=per_task.per_task(objective, tasks, weights=choice.task_weights),
        pack=choice.pack,
        tasks=tuple(tasks),
        task_ids_along=recipe.task_ids_along,
    )
