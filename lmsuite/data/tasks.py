"""SeqIO tasks `{corpus}_{objective}`, probe tasks and mixtures, registered on import.

`import lmsuite.data.tasks` registers, without downloading or training anything (sources and
vocabularies are lazy), one task per (pretraining corpus, objective), e.g.
`wiki_sample_bert_mlm`, `shakespeare_t5_span_corruption`, `peoples_daily_ernie` (ERNIE is
Chinese only; every other objective also runs on peoples_daily's segmentation), the probe
tasks `{corpus}_probe_vader_sentiment` / `{corpus}_probe_trec_questions` (English corpora,
tokenized with that corpus's vocabulary), and mixtures of objectives that share features
(`{corpus}_seq2seq_mixture`, `{corpus}_encoder_mlm_mixture`, `wikipedia_c4_{objective}`).
The production corpora (`wikipedia`, `c4`) use the wiki_sample vocabulary by default.

Sequence lengths come from SeqIO at `get_dataset` time:
  encoder objectives:  {"input_ids": L}            ([CLS] ... [SEP], MLM features; unilm too),
                       optionally "masked_ids": P, the padded number of predictions
  seq2seq objectives:  {"inputs": L, "targets": M} (span corruption, iid, prefix LM, BART, MASS)
  decoder objectives:  {"targets": L}              (causal LM)
  permutation LM:      {"input_k": L}              (XLNet, one stream; B rows: xlnet.stream_task)
Special ids are read from the vocabulary only when a dataset is built. An objective that needs
sentinels fails when its task is built, naming the missing `<extra_id_k>`, if the vocabulary
has fewer than 100 extra ids.

Example:
  >>> import lmsuite.data.tasks, seqio
  >>> ds = seqio.get_mixture_or_task("wiki_sample_bert_mlm").get_dataset(
  ...     {"input_ids": 128}, split="validation", shuffle=False)
  >>> sorted(next(iter(ds)))
  ['input_ids', 'masked_ids', 'masked_positions', 'masked_weights', 'token_type_ids', ...]
"""

import dataclasses
import functools
from collections.abc import Callable, Mapping

import seqio
import tensorflow as tf

from lmsuite.data import corpora, tokenization
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
    length = _encoder_length(sequence_length)
    return mlm.MlmSpec(
        mask_id=ids.mask,
        vocab_size=vocab.vocab_size,
        special_ids=ids.all,
        max_predictions=int(
            sequence_length.get("masked_ids", mlm.electra_max_predictions(length, mask_prob=0.15))
        ),
    )


def _encoder_length(sequence_length) -> int:
    if not sequence_length or "input_ids" not in sequence_length:
        raise ValueError(
            f"encoder tasks need sequence_length={{'input_ids': L}}, got {sequence_length}"
        )
    return int(sequence_length["input_ids"])


def _chunking(vocab, sequence_length) -> dict:
    ids = vocab_lib.special_ids(vocab)
    return {
        "max_seq_length": _encoder_length(sequence_length),
        "cls_id": ids.cls,
        "sep_id": ids.sep,
    }


def _chunks(dataset, sequence_length, *, vocab):
    return tokenization.encoder_chunks(dataset, **_chunking(vocab, sequence_length))


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
        max_seq_length=_encoder_length(sequence_length),
        cls_id=ids.cls,
        sep_id=ids.sep,
    )


def _ernie(dataset, sequence_length, *, vocab, level):
    length = _encoder_length(sequence_length)
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
    length = _encoder_length(sequence_length)
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
        sequence_length={"targets": _encoder_length(sequence_length)},
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
            functools.partial(_chunks, vocab=vocab),
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


def _source_and_steps(corpus_name: str) -> tuple[seqio.DataSource, list]:
    corpus = corpora.get_corpus(corpus_name)
    steps = list(getattr(corpus, "preprocessors", ()))
    return corpus.source(), steps


def build_task(
    corpus: str,
    objective: str,
    *,
    vocab: seqio.Vocabulary | None = None,
    name: str | None = None,
    register: bool = True,
    memoize_tokens: bool = True,
) -> seqio.Task:
    """Builds (and by default registers) the task `{corpus}_{objective}`.

    On an in-memory corpus, `memoize_tokens` tokenizes each document once per process
    (`tokenization.tokenize_corpus_documents`) instead of once per epoch, and cuts encoder
    chunks once too (`tokenization.corpus_encoder_chunks`); the examples are the same.

    Raises:
      ValueError: for an unknown objective, a corpus in the wrong language, or an objective
        needing sentinels on a vocabulary without them (naming the missing ids).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {sorted(OBJECTIVES)}")
    spec = OBJECTIVES[objective]
    language = corpora.language(corpus)
    if language not in spec.languages:
        raise ValueError(
            f"objective {objective!r} needs a corpus in {spec.languages}, got {corpus!r} "
            f"({language})"
        )
    vocab = vocab if vocab is not None else default_vocabulary(corpus)
    name = name or f"{corpus}_{objective}"
    if spec.needs_sentinels:
        vocab_lib.require_sentinels(
            vocab, needed=vocab_lib.NUM_SENTINELS, purpose=f"task {name!r} ({objective})"
        )
    source, corpus_steps = _source_and_steps(corpus)
    steps = spec.steps(vocab)
    if (
        memoize_tokens
        and not corpus_steps
        and isinstance(corpora.get_corpus(corpus), corpora.Corpus)
    ):
        steps = _memoized(steps, corpora.get_corpus(corpus))
    task = seqio.Task(
        name,
        source=source,
        preprocessors=[*corpus_steps, *steps, *_eos_steps(spec.kind, spec.seqio_appends_eos)],
        output_features=output_features(spec.kind, vocab, add_eos=spec.seqio_appends_eos),
    )
    if register:
        _add(task)
    return task


def _memoized(steps: list, corpus) -> list:
    """`steps` with `tokenize_documents` replaced by its once-per-corpus version, fused with a
    following `_chunks` into `tokenization.corpus_encoder_chunks`."""
    out: list = []
    for step in steps:
        if _is(step, _chunks) and out and _is(out[-1], tokenization.tokenize_corpus_documents):
            out[-1] = functools.partial(_memoized_chunks, corpus=corpus, **step.keywords)
        elif _is(step, tokenization.tokenize_documents):
            out.append(
                functools.partial(
                    tokenization.tokenize_corpus_documents, corpus=corpus, **step.keywords
                )
            )
        else:
            out.append(step)
    return out


def _is(step, function) -> bool:
    return isinstance(step, functools.partial) and step.func is function


def _memoized_chunks(dataset, sequence_length, *, vocab, corpus):
    return tokenization.corpus_encoder_chunks(
        dataset, vocab=vocab, corpus=corpus, **_chunking(vocab, sequence_length)
    )


def _eos_steps(kind: str, seqio_appends_eos: bool) -> list:
    if seqio_appends_eos and kind in (SEQ2SEQ, DECODER):
        return [seqio.preprocessors.append_eos_after_trim]
    return []


def _add(task: seqio.Task) -> None:
    seqio.TaskRegistry.remove(task.name)
    seqio.TaskRegistry.add_provider(task.name, task)


def default_vocabulary(corpus: str) -> vocab_lib.CorpusVocabulary:
    """The corpus's own default vocabulary (production corpora share wiki_sample's)."""
    if corpus in vocab_lib.DEFAULT_SIZES:
        return vocab_lib.get_vocabulary(corpus)
    return vocab_lib.get_vocabulary("wiki_sample")


def _classify(dataset, sequence_length, *, vocab):
    ids = vocab_lib.special_ids(vocab)
    length = _encoder_length(sequence_length)

    def to_features(ex):
        tokens = tf.cast(vocab.encode_tf(ex["text"]), tf.int32)[: length - 2]
        input_ids = tf.concat([[ids.cls], tokens, [ids.sep]], axis=0)
        return {
            "input_ids": input_ids,
            "token_type_ids": tf.zeros_like(input_ids),
            "label": ex["label"],
        }

    return dataset.map(to_features, num_parallel_calls=tf.data.AUTOTUNE)


def build_probe_task(
    probe: str, *, vocab_corpus: str, vocab=None, name=None, register=True
) -> seqio.Task:
    """Task `{vocab_corpus}_probe_{probe}`: `[CLS] text [SEP]` ids and an int `label`.

    Example: "So lucky." -> {"input_ids": [2, 812, 77, 9, 3], "token_type_ids": [0]*5, "label": 1}
    """
    if probe not in corpora.PROBES:
        raise ValueError(f"unknown probe {probe!r}; expected one of {sorted(corpora.PROBES)}")
    vocab = vocab if vocab is not None else default_vocabulary(vocab_corpus)
    task = seqio.Task(
        name or f"{vocab_corpus}_probe_{probe}",
        source=corpora.PROBES[probe].source(),
        preprocessors=[functools.partial(_classify, vocab=vocab)],
        output_features=output_features(ENCODER, vocab),
    )
    if register:
        _add(task)
    return task


def _add_mixture(name: str, tasks: list[str]) -> None:
    seqio.MixtureRegistry.remove(name)
    seqio.MixtureRegistry.add(name, [(t, 1.0) for t in tasks])


def register_all() -> list[str]:
    """Registers every task and mixture; returns the task names."""
    names = []
    for corpus in corpora.PRETRAINING:
        for objective, spec in OBJECTIVES.items():
            if corpora.language(corpus) in spec.languages:
                names.append(build_task(corpus, objective).name)
                PRETRAINING_TASKS[names[-1]] = (corpus, objective)
    for corpus in ("wiki_sample", "shakespeare"):
        for probe in corpora.PROBES:
            names.append(build_probe_task(probe, vocab_corpus=corpus).name)
    for corpus in ("wiki_sample", "shakespeare", "peoples_daily", "wikipedia", "c4"):
        _add_mixture(
            f"{corpus}_seq2seq_mixture",
            [f"{corpus}_{o}" for o in ("t5_span_corruption", "iid_denoising", "prefix_lm")],
        )
        _add_mixture(
            f"{corpus}_encoder_mlm_mixture", [f"{corpus}_{o}" for o in ("bert_mlm", "wwm")]
        )
    for objective, spec in OBJECTIVES.items():
        if "en" in spec.languages:
            _add_mixture(f"wikipedia_c4_{objective}", [f"wikipedia_{objective}", f"c4_{objective}"])
    return names


# Task name -> (corpus, objective) of every registered pretraining task.
PRETRAINING_TASKS: dict[str, tuple[str, str]] = {}
TASK_NAMES = register_all()
