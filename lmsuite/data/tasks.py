"""SeqIO tasks `{corpus}_{objective}`, probe tasks and mixtures, registered on import.

`import lmsuite.data.tasks` registers, without downloading or training anything (sources and
vocabularies are lazy), one task per (pretraining corpus, objective), e.g.
`wiki_sample_bert_mlm`, `shakespeare_t5_span_corruption`, `peoples_daily_ernie` (ERNIE is
Chinese only, ERNIE 2.0's capitalization English only; every other objective also runs on
peoples_daily's segmentation), the probe
tasks `{corpus}_probe_vader_sentiment` / `{corpus}_probe_trec_questions` (English corpora,
tokenized with that corpus's vocabulary), and mixtures of objectives that share features
(`{corpus}_seq2seq_mixture`, `{corpus}_encoder_mlm_mixture`, `{corpus}_mlm_multitask_mixture`,
`{corpus}_ernie2_mixture`, `wikipedia_c4_{objective}`) and UL2's mixture of denoisers
`{corpus}_ul2` at the paper's rates (`preprocessors.ul2`).
The production corpora (`wikipedia`, `c4`) use the wiki_sample vocabulary by default.
Tasks over the user's own text files (`text_files.register_text_task`) are built by the same
`corpus_task`, so an objective runs the same steps whatever its source.

Sequence lengths come from SeqIO at `get_dataset` time:
  encoder objectives:  {"input_ids": L}            ([CLS] ... [SEP], MLM features; unilm too),
                       optionally "masked_ids": P, the padded number of predictions
                       (unilm2: L counts the 2 x P appended [P] and copied slots too)
  seq2seq objectives:  {"inputs": L, "targets": M} (span corruption, iid, prefix LM, BART, MASS)
  decoder objectives:  {"targets": L}              (causal LM)
  permutation LM:      {"input_k": L}              (XLNet, one stream; B rows: xlnet.stream_task)
  stream LM:           {"inputs": L, "targets": L} (Transformer-XL; B rows: xlnet.stream_task)
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

import functools

import seqio
import tensorflow as tf

from lmsuite.data import corpora, tokenization
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import ul2
from lmsuite.data.task_objectives import (  # noqa: F401  (tasks.X: the public spelling)
    DECODER,
    ENCODER,
    OBJECTIVES,
    PERMUTATION,
    SEQ2SEQ,
    STREAM,
    TaskObjective,
    chunking,
    chunks,
    encoder_length,
    output_features,
)


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
    (`tokenization.tokenize_corpus_documents`, `tokenize_corpus_sentences`) instead of once per
    epoch, and cuts encoder chunks once too (`tokenization.corpus_encoder_chunks`); the
    examples are the same.

    Raises:
      ValueError: for an unknown objective, a corpus in the wrong language, or an objective
        needing sentinels on a vocabulary without them (naming the missing ids).
    """
    return corpus_task(
        corpora.get_corpus(corpus),
        objective,
        language=corpora.language(corpus),
        vocab=vocab if vocab is not None else default_vocabulary(corpus),
        name=name or f"{corpus}_{objective}",
        register=register,
        memoize_tokens=memoize_tokens,
    )


def corpus_task(
    corpus: corpora.Corpus | corpora.TfdsCorpus,
    objective: str,
    *,
    language: str,
    vocab: seqio.Vocabulary,
    name: str,
    register: bool = True,
    memoize_tokens: bool = True,
) -> seqio.Task:
    """`objective`'s task over any corpus object, named `name`: the corpus source, its own
    preprocessors, the objective's steps (`OBJECTIVES`) and its EOS step. `build_task` (the
    embedded and TFDS corpora) and `text_files` (the user's files) both build through here, so
    the same objective runs the same pipeline whatever the source. Raises as `build_task`."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; expected one of {sorted(OBJECTIVES)}")
    spec = OBJECTIVES[objective]
    if language not in spec.languages:
        raise ValueError(
            f"objective {objective!r} needs a corpus in {spec.languages}, got {corpus.name!r} "
            f"({language})"
        )
    if spec.needs_sentinels:
        vocab_lib.require_sentinels(
            vocab, needed=vocab_lib.NUM_SENTINELS, purpose=f"task {name!r} ({objective})"
        )
    corpus_steps = list(getattr(corpus, "preprocessors", ()))
    steps = spec.steps(vocab)
    if memoize_tokens and not corpus_steps and isinstance(corpus, corpora.Corpus):
        steps = _memoized(steps, corpus)
    task = seqio.Task(
        name,
        source=corpus.source(),
        preprocessors=[*corpus_steps, *steps, *_eos_steps(spec.kind, spec.seqio_appends_eos)],
        output_features=output_features(spec.kind, vocab, add_eos=spec.seqio_appends_eos),
    )
    if register:
        _add(task)
    return task


def _memoized(steps: list, corpus) -> list:
    """`steps` with `tokenize_documents` and `tokenize_sentences` replaced by their
    once-per-corpus versions, the first fused with a following `chunks` into
    `tokenization.corpus_encoder_chunks`."""
    out: list = []
    for step in steps:
        if _is(step, chunks) and out and _is(out[-1], tokenization.tokenize_corpus_documents):
            out[-1] = functools.partial(_memoized_chunks, corpus=corpus, **step.keywords)
        elif _is(step, tokenization.tokenize_documents):
            out.append(
                functools.partial(
                    tokenization.tokenize_corpus_documents, corpus=corpus, **step.keywords
                )
            )
        elif _is(step, tokenization.tokenize_sentences):
            out.append(
                functools.partial(
                    tokenization.tokenize_corpus_sentences, corpus=corpus, **step.keywords
                )
            )
        else:
            out.append(step)
    return out


def _is(step, function) -> bool:
    return isinstance(step, functools.partial) and step.func is function


def _memoized_chunks(dataset, sequence_length, *, vocab, corpus):
    return tokenization.corpus_encoder_chunks(
        dataset, vocab=vocab, corpus=corpus, **chunking(vocab, sequence_length)
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
    length = encoder_length(sequence_length)

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


def _add_mixture(name: str, tasks: list[str], rates: list[float] | None = None) -> None:
    seqio.MixtureRegistry.remove(name)
    seqio.MixtureRegistry.add(name, list(zip(tasks, rates or [1.0] * len(tasks), strict=True)))


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
        # ERNIE 2.0's tasks (capitalization is English only), recipe `ernie2`.
        ernie2 = [f"{corpus}_{o}" for o in OBJECTIVES if o.startswith("ernie2_")]
        _add_mixture(f"{corpus}_ernie2_mixture", [t for t in ernie2 if t in PRETRAINING_TASKS])
        # Three sentence-level tasks for one multi-task encoder (recipe `mlm_multitask`).
        _add_mixture(
            f"{corpus}_mlm_multitask_mixture",
            [f"{corpus}_{o}" for o in ("bert_mlm_nsp", "albert_sop", "structbert")],
        )
        _add_mixture(
            f"{corpus}_ul2",
            [f"{corpus}_{d.name}" for d in ul2.DENOISERS],
            [d.rate for d in ul2.DENOISERS],
        )
    for objective, spec in OBJECTIVES.items():
        if "en" in spec.languages:
            _add_mixture(f"wikipedia_c4_{objective}", [f"wikipedia_{objective}", f"c4_{objective}"])
    return names


# Task name -> (corpus, objective) of every registered pretraining task.
PRETRAINING_TASKS: dict[str, tuple[str, str]] = {}
TASK_NAMES = register_all()
