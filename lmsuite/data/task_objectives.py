"""What each task objective runs: its preprocessing steps after the corpus source, its feature
kind and output features, its languages (`OBJECTIVES`). `lmsuite.data.tasks` builds and
registers a task per (corpus, objective) from these; the sequence-length keys of each kind are
in its docstring.
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping

import seqio
import tensorflow as tf

from lmsuite.data import tokenization
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import (
    bart,
    ernie,
    ernie2,
    instances,
    lm,
    mass,
    mlm,
    ngram,
    pmlm,
    sentence_pairs,
    span_corruption,
    spanbert,
    stream_lm,
    structbert,
    ul2,
    unilm,
    whole_word,
    xlnet,
)

ENCODER, SEQ2SEQ, DECODER, PERMUTATION = "encoder", "seq2seq", "decoder", "permutation"
STREAM = "stream"  # rows of contiguous text, one segment per step (Transformer-XL)
KINDS = (ENCODER, SEQ2SEQ, DECODER, PERMUTATION, STREAM)
PAIR_SEED = 0
# ALBERT's run_pretraining.py / create_pretraining_data.py flag `max_predictions_per_seq`: a
# constant 20 (its pretraining runs use max_seq_length 512), not scaled with the length.
ALBERT_MAX_PREDICTIONS = 20
MASKINGS = ("bert", "electra", "albert", "ernie")
ERNIE2_TASKS = ("capitalization", "token_document", "sentence_reordering", "sentence_distance")


@dataclasses.dataclass(frozen=True)
class TaskObjective:
    """How to turn a corpus into one objective's examples."""

    name: str
    kind: str  # one of KINDS: which features the task outputs.
    steps: Callable[[vocab_lib.CorpusVocabulary], list]  # preprocessors after the source
    needs_sentinels: bool = False
    # False where the preprocessor places every EOS itself (MASS frames each source with two):
    # the output features then have add_eos=False and SeqIO appends nothing.
    seqio_appends_eos: bool = True
    # Chinese runs every objective on the corpus segmentation (word starts = segmented words).
    languages: tuple[str, ...] = ("en", "zh")


def _spec(vocab, sequence_length, *, masking: str = "bert") -> mlm.MlmSpec:
    """Masking spec; `sequence_length["masked_ids"]` (if given) is the padded width P.

    masking "bert": 80/10/10, P (default ELECTRA's int(0.155 * L): 19 for L=128, 79 for L=512)
    caps the predictions. "electra": `MlmSpec.electra` (85% [MASK], 15% kept; count capped at
    int(0.155 * L) even when P is wider). "albert": 80/10/10 capped at ALBERT's 20 whatever L
    and P (P defaults to 20). "ernie": P defaults to int(0.3 * L): ERNIE's per-unit selection
    has no budget, so the width only bounds rare overflows (see `ernie.py`).
    """
    if masking not in MASKINGS:
        raise ValueError(f"masking={masking!r}, expected one of {MASKINGS}")
    ids = vocab_lib.special_ids(vocab)
    length = encoder_length(sequence_length)
    width = sequence_length.get("masked_ids")
    common = dict(mask_id=ids.mask, vocab_size=vocab.vocab_size, special_ids=ids.all)
    if masking == "electra":
        return mlm.MlmSpec.electra(
            max_seq_length=length,
            max_predictions=None if width is None else int(width),
            **common,
        )
    defaults = {
        "bert": mlm.electra_max_predictions(length, mask_prob=0.15),
        "albert": ALBERT_MAX_PREDICTIONS,
        "ernie": max(1, int(ernie.DEFAULT_WIDTH_RATE * length)),
    }
    return mlm.MlmSpec(
        max_predictions=int(width if width is not None else defaults[masking]),
        prediction_cap=ALBERT_MAX_PREDICTIONS if masking == "albert" else None,
        **common,
    )


def encoder_length(sequence_length) -> int:
    if not sequence_length or "input_ids" not in sequence_length:
        raise ValueError(
            f"encoder tasks need sequence_length={{'input_ids': L}}, got {sequence_length}"
        )
    return int(sequence_length["input_ids"])


def chunking(vocab, sequence_length) -> dict:
    ids = vocab_lib.special_ids(vocab)
    return {
        "max_seq_length": encoder_length(sequence_length),
        "cls_id": ids.cls,
        "sep_id": ids.sep,
    }


def chunks(dataset, sequence_length, *, vocab):
    """lmsuite's fixed-stride `[CLS] chunk [SEP]` rows (no task uses them now; `tasks` still
    memoizes them when a step list has tokenize_documents then chunks)."""
    return tokenization.encoder_chunks(dataset, **chunking(vocab, sequence_length))


def _instances(dataset, sequence_length, *, vocab, variant):
    keys = ("sentence_ids", "sentence_word_starts")
    dataset = dataset.map(lambda ex: {k: ex[k] for k in keys})
    return instances.encoder_instances(
        dataset, variant=variant, seed=PAIR_SEED, **chunking(vocab, sequence_length)
    )


def _masked(dataset, sequence_length, *, vocab, masker, masking="bert", **kwargs):
    spec = _spec(vocab, sequence_length, masking=masking)
    return masker(dataset, spec=spec, **kwargs)


def _pairs(dataset, sequence_length, *, vocab, objective):
    ids = vocab_lib.special_ids(vocab)
    keys = ("sentence_ids", "sentence_word_starts")
    dataset = dataset.map(lambda ex: {k: ex[k] for k in keys})
    return sentence_pairs.sentence_pairs(
        dataset,
        objective=objective,
        seed=PAIR_SEED,
        max_seq_length=encoder_length(sequence_length),
        cls_id=ids.cls,
        sep_id=ids.sep,
    )


def _ernie(dataset, sequence_length, *, vocab, level):
    length = encoder_length(sequence_length)
    ids = vocab_lib.special_ids(vocab)
    dataset = tokenization.segmented_passages(dataset, vocab=vocab, max_tokens=length - 2)
    return ernie.ernie_dynamic_mlm(
        dataset,
        spec=_spec(vocab, sequence_length, masking="ernie"),
        level=level,
        cls_id=ids.cls,
        sep_id=ids.sep,
        max_seq_length=length,
    )


def _ernie2_rows(dataset, sequence_length, *, vocab, task):
    """ERNIE 2.0's rows for `task` (see `preprocessors/ernie2.py`), before masking."""
    length = encoder_length(sequence_length)
    ids = vocab_lib.special_ids(vocab)
    if task == "sentence_distance":
        return ernie2.sentence_distance_pairs(
            dataset, seed=PAIR_SEED, max_seq_length=length, cls_id=ids.cls, sep_id=ids.sep
        )
    if task == "sentence_reordering":  # [CLS] and one [SEP] per segment
        passages = ernie2.document_passages(dataset, max_tokens=length - 1 - ernie2.MAX_SEGMENTS)
        return passages.map(
            lambda ex: {k: v for k, v in ex.items() if k != "sentence_token_document"}
        )
    rows = ernie2.document_passages(dataset, max_tokens=length - 2).map(
        functools.partial(ernie2.single_segment_row, cls_id=ids.cls, sep_id=ids.sep)
    )
    if task == "token_document":
        return rows
    upper, bare = (tf.constant(t) for t in ernie2.capital_tables(vocab))

    def capitalization(ex):
        ex = {k: v for k, v in ex.items() if k != ernie2.TOKEN_DOCUMENT_KEY}
        labels = ernie2.capitalization_labels(
            ex["input_ids"], ex["word_starts"], upper=upper, bare=bare
        )
        return {**ex, ernie2.CAPITALIZATION_KEY: labels}

    return rows.map(capitalization)


def _ernie2_masked(dataset, sequence_length, *, vocab, task):
    """ERNIE 2.0's word masking, `mask_words` on each row, run on groups of rows from each
    row's own draws (`mlm.grouped_dynamic_masking`'s `draw_fn`): the same masks."""
    spec = _spec(vocab, sequence_length, masking="ernie")
    draw = functools.partial(ernie.unit_mask_draws, spec=spec)
    if task == "sentence_reordering":
        ids = vocab_lib.special_ids(vocab)
        draw = functools.partial(ernie2.reorder_and_draw, spec=spec, cls_id=ids.cls, sep_id=ids.sep)
    return mlm.grouped_dynamic_masking(
        dataset, draw_fn=draw, mask_fn=functools.partial(ernie2.mask_drawn_words, spec=spec)
    )


def _ernie2_steps(task):
    """Sentences -> ERNIE 2.0's rows for `task` -> word-unit ERNIE masking."""

    def steps(vocab):
        return [
            *_sents(vocab),
            functools.partial(_ernie2_rows, vocab=vocab, task=task),
            functools.partial(_ernie2_masked, vocab=vocab, task=task),
        ]

    return steps


def _structbert_mlm(dataset, sequence_length, *, vocab):
    length = encoder_length(sequence_length)
    return structbert.structbert_dynamic_mlm(
        dataset, spec=_spec(vocab, sequence_length), max_trigrams=max(1, round(0.05 * length))
    )


def _denoise(dataset, sequence_length, *, vocab, noiser):
    return noiser(
        dataset,
        sequence_length=sequence_length,
        sentinel_ids=vocab_lib.special_ids(vocab).sentinels,
    )


def _ul2(dataset, sequence_length, *, vocab, denoiser):
    return ul2.denoise(
        dataset,
        sequence_length=sequence_length,
        denoiser=denoiser,
        mode_ids=[int(i) for i in vocab.encode(denoiser.mode)],
        sentinel_ids=vocab_lib.special_ids(vocab).sentinels,
    )


def _ul2_objective(denoiser: ul2.Denoiser) -> TaskObjective:
    return TaskObjective(
        denoiser.name,
        SEQ2SEQ,
        lambda vocab: [*_docs(vocab), functools.partial(_ul2, vocab=vocab, denoiser=denoiser)],
        needs_sentinels=not denoiser.is_prefix_lm,
    )


def _bart(dataset, sequence_length, *, vocab):
    dataset = dataset.map(lambda ex: {k: ex[k] for k in ("sentence_ids", "sentence_word_starts")})
    return bart.bart_denoising(
        dataset,
        sequence_length=sequence_length,
        mask_id=vocab_lib.special_ids(vocab).mask,
        use_word_starts=True,
    )


def _mass(dataset, sequence_length, *, vocab):
    ids = vocab_lib.special_ids(vocab)
    return mass.mass(
        dataset,
        sequence_length=sequence_length,
        mask_id=ids.mask,
        eos_id=ids.eos,
        # Random replacements come from the SentencePiece pieces: no specials, no sentinels.
        vocab_size=vocab.vocab_size - vocab.extra_ids,
        random_low=vocab_lib.EOS_ID + 1,
    )


def _unilm(dataset, sequence_length, *, vocab):
    ids = vocab_lib.special_ids(vocab)
    return unilm.unilm(
        dataset,
        sequence_length={"targets": encoder_length(sequence_length)},
        cls_id=ids.cls,
        sep_id=ids.sep,
        mask_id=ids.mask,
        vocab_size=vocab.vocab_size,
        special_ids=ids.all,
        max_predictions=sequence_length.get("masked_ids"),
    )


def _pmlm(dataset, sequence_length, *, vocab):
    ids = vocab_lib.special_ids(vocab)
    return pmlm.pmlm(
        dataset,
        sequence_length=sequence_length,
        cls_id=ids.cls,
        sep_id=ids.sep,
        mask_id=ids.mask,
        # The vocabulary has no [P] piece: the first sentinel <extra_id_0> plays it.
        pseudo_id=ids.sentinels[0],
        vocab_size=vocab.vocab_size,
        special_ids=ids.all,
    )


def _xlnet(dataset, sequence_length, *, vocab, stream=None):
    ids = vocab_lib.special_ids(vocab)  # </s> plays <eod>; xlnet.stream_task binds `stream`
    return xlnet.permutation_lm(
        dataset,
        sequence_length=sequence_length,
        cls_id=ids.cls,
        sep_id=ids.sep,
        eod_id=ids.eos,
        stream=stream,
        start_pieces=xlnet.start_piece_table(vocab),
    )


def _stream_lm(dataset, sequence_length, *, vocab, stream=None):
    eod = vocab_lib.special_ids(vocab).eos  # </s> ends each document; stream_task binds `stream`
    return stream_lm.stream_lm(dataset, sequence_length=sequence_length, eod_id=eod, stream=stream)


def _docs(vocab):
    return [functools.partial(tokenization.tokenize_documents, vocab=vocab)]


def _sents(vocab):
    return [functools.partial(tokenization.tokenize_sentences, vocab=vocab)]


def _mlm_steps(masker, *, variant, **kwargs):
    """Sentences -> `instances.encoder_instances(variant=...)` rows -> `masker`."""

    def steps(vocab):
        return [
            *_sents(vocab),
            functools.partial(_instances, vocab=vocab, variant=variant),
            functools.partial(_masked, vocab=vocab, masker=masker, **kwargs),
        ]

    return steps


def _pair_steps(objective, masker, **kwargs):
    def steps(vocab):
        return [
            *_sents(vocab),
            functools.partial(_pairs, vocab=vocab, objective=objective),
            functools.partial(_masked, vocab=vocab, masker=masker, **kwargs),
        ]

    return steps


OBJECTIVES: dict[str, TaskObjective] = {
    o.name: o
    for o in [
        # BERT's sentence-aligned [CLS] A [SEP] B [SEP] instances, B the actual continuation.
        TaskObjective("bert_mlm", ENCODER, _mlm_steps(mlm.bert_dynamic_mlm, variant="bert")),
        TaskObjective("bert_mlm_nsp", ENCODER, _pair_steps("nsp", mlm.bert_dynamic_mlm)),
        TaskObjective(
            "wwm", ENCODER, _mlm_steps(whole_word.whole_word_dynamic_mlm, variant="bert")
        ),
        TaskObjective(
            "albert_sop", ENCODER, _pair_steps("sop", ngram.ngram_dynamic_mlm, masking="albert")
        ),
        # SpanBERT: single segments of whole sentences (its BlockDataset, break_mode "doc").
        TaskObjective(
            "spanbert",
            ENCODER,
            _mlm_steps(spanbert.spanbert_dynamic_mlm, variant="full_sentences"),
        ),
        TaskObjective(
            "structbert",
            ENCODER,
            lambda vocab: [
                *_sents(vocab),
                functools.partial(_pairs, vocab=vocab, objective="structbert"),
                functools.partial(_structbert_mlm, vocab=vocab),
            ],
        ),
        # ELECTRA's generator data: its ExampleBuilder rows and its mask() (85/15/0, its count).
        TaskObjective(
            "electra",
            ENCODER,
            _mlm_steps(mlm.bert_dynamic_mlm, variant="electra", masking="electra"),
        ),
        TaskObjective(
            "ernie",
            ENCODER,
            lambda vocab: [functools.partial(_ernie, vocab=vocab, level="entity")],
            languages=("zh",),
        ),
        # ERNIE 2.0's word- and structure-aware tasks, each with word-unit ERNIE masking.
        *[
            TaskObjective(
                f"ernie2_{task}",
                ENCODER,
                _ernie2_steps(task),
                # Chinese has no case; the other tasks read the corpus segmentation's words.
                languages=("en",) if task == "capitalization" else ("en", "zh"),
            )
            for task in ERNIE2_TASKS
        ],
        TaskObjective(
            "t5_span_corruption",
            SEQ2SEQ,
            lambda vocab: [
                *_docs(vocab),
                functools.partial(_denoise, vocab=vocab, noiser=span_corruption.span_corruption),
            ],
            needs_sentinels=True,
        ),
        TaskObjective(
            "iid_denoising",
            SEQ2SEQ,
            lambda vocab: [
                *_docs(vocab),
                functools.partial(_denoise, vocab=vocab, noiser=span_corruption.iid_denoising),
            ],
            needs_sentinels=True,
        ),
        TaskObjective("prefix_lm", SEQ2SEQ, lambda vocab: [*_docs(vocab), lm.prefix_lm]),
        TaskObjective("causal_lm", DECODER, lambda vocab: [*_docs(vocab), lm.causal_lm]),
        TaskObjective(
            "bart_denoising",
            SEQ2SEQ,
            lambda vocab: [*_sents(vocab), functools.partial(_bart, vocab=vocab)],
        ),
        TaskObjective(
            "mass",
            SEQ2SEQ,
            lambda vocab: [*_docs(vocab), functools.partial(_mass, vocab=vocab)],
            seqio_appends_eos=False,
        ),
        TaskObjective(
            "unilm", ENCODER, lambda vocab: [*_docs(vocab), functools.partial(_unilm, vocab=vocab)]
        ),
        # UniLMv2's pseudo-masked LM: [CLS] x-with-[M] [SEP] + per step [P]s and the originals.
        TaskObjective(
            "unilm2",
            ENCODER,
            lambda vocab: [*_docs(vocab), functools.partial(_pmlm, vocab=vocab)],
            needs_sentinels=True,
        ),
        TaskObjective(
            "xlnet_plm",
            PERMUTATION,
            lambda vocab: [*_sents(vocab), functools.partial(_xlnet, vocab=vocab)],
        ),
        # Transformer-XL's LM: contiguous segments of B rows, memory carried across steps.
        TaskObjective(
            "txl_lm",
            STREAM,
            lambda vocab: [*_docs(vocab), functools.partial(_stream_lm, vocab=vocab)],
            seqio_appends_eos=False,
        ),
        # UL2's seven denoisers (R, X: span corruption; S: prefix LM), each with its mode token.
        *[_ul2_objective(d) for d in ul2.DENOISERS],
    ]
}


def output_features(
    kind: str, vocab: seqio.Vocabulary, *, add_eos: bool = True
) -> Mapping[str, seqio.Feature]:
    """The SeqIO output features of an objective kind; `add_eos=False` keeps SeqIO from
    appending EOS to seq2seq and decoder features (the preprocessor placed it)."""
    if kind == ENCODER:
        return {"input_ids": seqio.Feature(vocabulary=vocab, add_eos=False)}
    if kind == SEQ2SEQ:
        return {
            "inputs": seqio.Feature(vocabulary=vocab, add_eos=add_eos),
            "targets": seqio.Feature(vocabulary=vocab, add_eos=add_eos),
        }
    if kind == DECODER:
        return {"targets": seqio.Feature(vocabulary=vocab, add_eos=add_eos)}
    if kind == PERMUTATION:
        return {"input_k": seqio.Feature(vocabulary=vocab, add_eos=False)}
    if kind == STREAM:
        return {
            "inputs": seqio.Feature(vocabulary=vocab, add_eos=False),
            "targets": seqio.Feature(vocabulary=vocab, add_eos=False),
        }
    raise ValueError(f"objective kind must be one of {KINDS}, got {kind!r}")
