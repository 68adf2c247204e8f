"""What each task objective runs: its preprocessing steps after the corpus source, its feature
kind and output features, its languages (`OBJECTIVES`). `lmsuite.data.tasks` builds and
registers a task per (corpus, objective) from these; the sequence-length keys of each kind are
in its docstring.
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping

import seqio

from lmsuite.data import tokenization
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import (
    bart,
    ernie,
    lm,
    mass,
    mlm,
    ngram,
    sentence_pairs,
    span_corruption,
    spanbert,
    structbert,
    unilm,
    whole_word,
    xlnet,
)

ENCODER, SEQ2SEQ, DECODER, PERMUTATION = "encoder", "seq2seq", "decoder", "permutation"
PAIR_SEED = 0


@dataclasses.dataclass(frozen=True)
class Objective:
    """How to turn a corpus into one objective's examples."""

    name: str
    kind: str  # ENCODER, SEQ2SEQ, DECODER or PERMUTATION: which features the task outputs.
    steps: Callable[[vocab_lib.CorpusVocabulary], list]  # preprocessors after the source
    needs_sentinels: bool = False
    # False where the preprocessor places every EOS itself (MASS frames each source with two):
    # the output features then have add_eos=False and SeqIO appends nothing.
    seqio_appends_eos: bool = True
    # Chinese runs every objective on the corpus segmentation (word starts = segmented words).
    languages: tuple[str, ...] = ("en", "zh")


def _spec(vocab, sequence_length) -> mlm.MlmSpec:
    """Masking spec; `sequence_length["masked_ids"]` (if given) caps the predictions, else
    ELECTRA's int(0.155 * L) (19 for L=128, 79 for L=512)."""
    ids = vocab_lib.special_ids(vocab)
    length = encoder_length(sequence_length)
    return mlm.MlmSpec(
        mask_id=ids.mask,
        vocab_size=vocab.vocab_size,
        special_ids=ids.all,
        max_predictions=int(
            sequence_length.get("masked_ids", mlm.electra_max_predictions(length, mask_prob=0.15))
        ),
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
    return tokenization.encoder_chunks(dataset, **chunking(vocab, sequence_length))


def _masked(dataset, sequence_length, *, vocab, masker, **kwargs):
    spec = _spec(vocab, sequence_length)
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
        spec=_spec(vocab, sequence_length),
        level=level,
        cls_id=ids.cls,
        sep_id=ids.sep,
        max_seq_length=length,
    )


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


def _docs(vocab):
    return [functools.partial(tokenization.tokenize_documents, vocab=vocab)]


def _sents(vocab):
    return [functools.partial(tokenization.tokenize_sentences, vocab=vocab)]


def _mlm_steps(masker, **kwargs):
    def steps(vocab):
        return [
            *_docs(vocab),
            functools.partial(chunks, vocab=vocab),
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


OBJECTIVES: dict[str, Objective] = {
    o.name: o
    for o in [
        Objective("bert_mlm", ENCODER, _mlm_steps(mlm.bert_dynamic_mlm)),
        Objective("bert_mlm_nsp", ENCODER, _pair_steps("nsp", mlm.bert_dynamic_mlm)),
        Objective("wwm", ENCODER, _mlm_steps(whole_word.whole_word_dynamic_mlm)),
        Objective("albert_sop", ENCODER, _pair_steps("sop", ngram.ngram_dynamic_mlm)),
        Objective("spanbert", ENCODER, _mlm_steps(spanbert.spanbert_dynamic_mlm)),
        Objective(
            "structbert",
            ENCODER,
            lambda vocab: [
                *_sents(vocab),
                functools.partial(_pairs, vocab=vocab, objective="structbert"),
                functools.partial(_structbert_mlm, vocab=vocab),
            ],
        ),
        # ELECTRA's generator trains on BERT-style MLM data with ELECTRA's prediction cap.
        Objective("electra", ENCODER, _mlm_steps(mlm.bert_dynamic_mlm)),
        Objective(
            "ernie",
            ENCODER,
            lambda vocab: [functools.partial(_ernie, vocab=vocab, level="entity")],
            languages=("zh",),
        ),
        Objective(
            "t5_span_corruption",
            SEQ2SEQ,
            lambda vocab: [
                *_docs(vocab),
                functools.partial(_denoise, vocab=vocab, noiser=span_corruption.span_corruption),
            ],
            needs_sentinels=True,
        ),
        Objective(
            "iid_denoising",
            SEQ2SEQ,
            lambda vocab: [
                *_docs(vocab),
                functools.partial(_denoise, vocab=vocab, noiser=span_corruption.iid_denoising),
            ],
            needs_sentinels=True,
        ),
        Objective("prefix_lm", SEQ2SEQ, lambda vocab: [*_docs(vocab), lm.prefix_lm]),
        Objective("causal_lm", DECODER, lambda vocab: [*_docs(vocab), lm.causal_lm]),
        Objective(
            "bart_denoising",
            SEQ2SEQ,
            lambda vocab: [*_sents(vocab), functools.partial(_bart, vocab=vocab)],
        ),
        Objective(
            "mass",
            SEQ2SEQ,
            lambda vocab: [*_docs(vocab), functools.partial(_mass, vocab=vocab)],
            seqio_appends_eos=False,
        ),
        Objective(
            "unilm", ENCODER, lambda vocab: [*_docs(vocab), functools.partial(_unilm, vocab=vocab)]
        ),
        Objective(
            "xlnet_plm",
            PERMUTATION,
            lambda vocab: [*_sents(vocab), functools.partial(_xlnet, vocab=vocab)],
        ),
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
    raise ValueError(
        f"objective kind must be one of {ENCODER, SEQ2SEQ, DECODER, PERMUTATION}, got {kind!r}"
    )
