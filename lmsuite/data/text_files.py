"""The user's own text: a pretraining task over text files for any objective, and a vocabulary
trained on them.

`register_text_task(objective=..., train_files=...)` registers the objective's SeqIO task over
the files (read by `corpora.user_files`: plain text, .gz, JSON lines; one document per file,
blank-line block or line) through `tasks.corpus_task`, the same pipeline as the embedded
corpora's `{corpus}_{objective}` tasks, so a recipe trains it exactly as it trains
`wiki_sample_{objective}` (a recipe's objective: `recipes.get(R).task_objectives[0]`).
Unless named, the task is "text_{objective}_{digest}", the digest of its arguments. `TEXT_TASKS`
holds the spec of each registered text task: `lmsuite train --train_files` writes it to run.json,
and `lmsuite.load` and `lmsuite eval` re-register it from there with `register_recorded`.

  >>> name = register_text_task(objective="t5_span_corruption", train_files="data/*.txt",
  ...                           vocabulary="mine.model")
  >>> name
  'text_t5_span_corruption_5d0c2a77e1'
  >>> ds = seqio.get_mixture_or_task(name).get_dataset({"inputs": 128, "targets": 29})

Validation: the documents of `validation_files`; without them, 5% of the training documents (at
least one), chosen by the SHA-256 of their text (`user_files.hold_out`), so every run with the
same files holds out the same documents and no text is in both splits.

Like the embedded corpora, the documents are held in memory and tokenized once per process;
text of many GB belongs in a TFDS dataset (see the `wikipedia` and `c4` corpora). Sentences are
split as English and the vocabulary marks word starts with "▁", so ERNIE (segmented Chinese) has
no text-file task.
"""

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
from collections.abc import Iterable, Mapping

import seqio
import tensorflow as tf
from google.protobuf.message import DecodeError

from lmsuite.data import tasks as tasks_lib
from lmsuite.data import text as text_lib
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.corpora import base, fetch, user_files

DEFAULT_VOCAB_CORPUS = "wiki_sample"  # lmsuite's default vocabulary (8,000 pieces + 100)
VALIDATION_FRACTION = 0.05  # as HF run_mlm.py's validation_split_percentage
Files = str | os.PathLike | Iterable[str | os.PathLike]


@dataclasses.dataclass(frozen=True)
class TextTaskSpec:
    """What a text-file task is built from (files already expanded to absolute paths)."""

    name: str
    objective: str
    train_files: tuple[str, ...]
    validation_files: tuple[str, ...] = ()
    format: str = "auto"
    split_documents: str | None = None
    jsonl_field: str = "text"
    validation_fraction: float = VALIDATION_FRACTION
    vocabulary: str | None = None  # a SentencePiece model file; None: lmsuite's default

    def to_json(self) -> dict:
        """The spec as JSON values (what run.json records as "text_task")."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}

    @classmethod
    def from_json(cls, values: Mapping) -> "TextTaskSpec":
        """The spec `to_json` wrote; a ValueError names missing and unknown keys."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        required = {n for n, f in fields.items() if f.default is dataclasses.MISSING}
        unknown, missing = sorted(set(values) - set(fields)), sorted(required - set(values))
        if unknown or missing:
            raise ValueError(
                f"a recorded text task has unknown keys {unknown} and lacks {missing}; expected "
                f"the keys {sorted(fields)}"
            )
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


TEXT_TASKS: dict[str, TextTaskSpec] = {}  # task name -> spec, for every registered text task


def register_text_task(
    name: str | None = None,
    *,
    objective: str,
    train_files: Files,
    validation_files: Files | None = None,
    format: str = "auto",
    split_documents: str | None = None,
    jsonl_field: str = "text",
    vocabulary: str | os.PathLike | seqio.SentencePieceVocabulary | None = None,
    validation_fraction: float = VALIDATION_FRACTION,
) -> str:
    """Registers `objective`'s task over the user's text files; returns the task name.

    Args:
      name: the task name; default "text_{objective}_{digest of the other arguments}".
      objective: a key of `tasks.OBJECTIVES` (e.g. "bert_mlm", "t5_span_corruption").
      train_files, validation_files: globs, local or gs:// ("a/*.txt,b.jsonl.gz" or a list).
        Without validation files, 5% of the training documents are held out (module docstring).
      format, split_documents, jsonl_field: how files become documents (`user_files`).
      vocabulary: a SentencePiece model path (e.g. from `train_vocab_from_files`) or a
        `seqio.SentencePieceVocabulary` with lmsuite's special ids and 100 sentinels; default
        lmsuite's default vocabulary (wiki_sample's, 8,100 ids).

    The file list is expanded and the vocabulary checked now; the files are read when a split is
    first needed (`read_corpus` reads them at once).

    Raises:
      ValueError: an unknown objective, format or splitting, a glob that matches no file, a file
        that is both a train and a validation file, a vocabulary without lmsuite's special ids.
    """
    if objective not in tasks_lib.OBJECTIVES:
        raise ValueError(
            f"unknown objective {objective!r}; expected one of {sorted(tasks_lib.OBJECTIVES)}"
        )
    if "en" not in tasks_lib.OBJECTIVES[objective].languages:
        raise ValueError(
            f"objective {objective!r} needs segmented Chinese text, which text files do not give;"
            " the text-file objectives are "
            f"{sorted(o for o, s in tasks_lib.OBJECTIVES.items() if 'en' in s.languages)}"
        )
    if format not in user_files.FORMATS:
        raise ValueError(f"format must be one of {user_files.FORMATS}, got {format!r}")
    if split_documents not in (None, *user_files.SPLIT_DOCUMENTS):
        raise ValueError(
            f"split_documents must be one of {user_files.SPLIT_DOCUMENTS} (or None), got "
            f"{split_documents!r}"
        )
    if not 0.0 < validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {validation_fraction}")
    train = user_files.expand_files(train_files, flag="train_files")
    validation = ()
    if validation_files is not None:
        validation = user_files.expand_files(validation_files, flag="validation_files")
    both = sorted(set(train) & set(validation))
    if both:
        raise ValueError(f"{both} are both train_files and validation_files")
    path, vocab = _vocabulary_argument(vocabulary)
    spec = TextTaskSpec(
        name=name or "",
        objective=objective,
        train_files=train,
        validation_files=validation,
        format=format,
        split_documents=split_documents,
        jsonl_field=jsonl_field,
        validation_fraction=validation_fraction,
        vocabulary=path,
    )
    if not name:
        spec = dataclasses.replace(spec, name=f"text_{objective}_{_digest(spec.to_json())}")
    return register_spec(spec, vocabulary=vocab).name


def register_spec(spec: TextTaskSpec, *, vocabulary: seqio.Vocabulary | None = None) -> seqio.Task:
    """Registers the task of a spec without touching its files (they are read on first use)."""
    vocab = vocabulary if vocabulary is not None else _load_vocabulary(spec.vocabulary)
    task = tasks_lib.corpus_task(
        corpus_of(spec), spec.objective, language="en", vocab=vocab, name=spec.name
    )
    TEXT_TASKS[spec.name] = spec
    return task


def register_recorded(values: Mapping) -> str:
    """Re-registers a text task from its `TextTaskSpec.to_json()` (run.json); returns its name."""
    return register_spec(TextTaskSpec.from_json(values)).name


def corpus_of(spec: TextTaskSpec) -> base.Corpus:
    """The corpus of a spec's files (one per set of files and reading options per process)."""
    return _corpus(
        spec.train_files,
        spec.validation_files,
        spec.format,
        spec.split_documents,
        spec.jsonl_field,
        spec.validation_fraction,
    )


@functools.cache
def _corpus(train, validation, format, split_documents, field, fraction) -> base.Corpus:
    reading = dict(format=format, split_documents=split_documents, jsonl_field=field)
    key = dict(train=train, validation=validation, fraction=fraction, **reading)
    return user_files.files_corpus(
        name=f"text_files_{_digest(key)}",
        train_files=train,
        validation_files=validation,
        validation_fraction=fraction,
        **reading,
    )


def read_corpus(spec: TextTaskSpec) -> dict[str, int]:
    """Reads and splits a spec's files now (raising their errors); the documents per split."""
    corpus = corpus_of(spec)
    return {split: len(corpus.documents(split)) for split in base.SPLITS}


def _digest(values) -> str:
    text = json.dumps(values, sort_keys=True, default=list)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]


def _load_vocabulary(path: str | None) -> seqio.Vocabulary:
    if path is None:
        return tasks_lib.default_vocabulary(DEFAULT_VOCAB_CORPUS)
    return seqio.SentencePieceVocabulary(path, extra_ids=vocab_lib.NUM_SENTINELS)


def _vocabulary_argument(vocabulary) -> tuple[str | None, seqio.Vocabulary | None]:
    """(the model path to record, the vocabulary to use) of `vocabulary`, checked."""
    if vocabulary is None:
        return None, None
    if isinstance(vocabulary, seqio.SentencePieceVocabulary):
        if vocabulary.extra_ids != vocab_lib.NUM_SENTINELS:
            raise ValueError(
                f"vocabulary {vocabulary!r} has extra_ids={vocabulary.extra_ids}; a text task's "
                f"vocabulary has lmsuite's {vocab_lib.NUM_SENTINELS} sentinels"
            )
        return user_files.absolute(vocabulary.sentencepiece_model_file), vocabulary
    if not isinstance(vocabulary, str | os.PathLike):
        raise ValueError(
            "vocabulary must be a SentencePiece model path or a seqio.SentencePieceVocabulary, "
            f"got a {type(vocabulary).__name__}"
        )
    path = user_files.absolute(os.fspath(vocabulary))
    if not tf.io.gfile.exists(path):
        raise ValueError(f"vocabulary {path}: no such file (train one with `lmsuite vocab train`)")
    vocab = _load_vocabulary(path)
    try:
        vocab_lib.special_ids(vocab)
    except (DecodeError, RuntimeError, ValueError, tf.errors.OpError) as error:
        raise ValueError(
            f"vocabulary {path} is not an lmsuite SentencePiece model (`lmsuite vocab train` "
            f"writes one): {error}"
        ) from error
    return path, vocab


def train_vocab_from_files(
    *,
    text_files: Files,
    size: int,
    out_dir: str | os.PathLike | None = None,
    seed: int = 0,
    format: str = "auto",
    split_documents: str | None = None,
    jsonl_field: str = "text",
    model_type: str = "unigram",
) -> pathlib.Path:
    """Trains a SentencePiece model on the sentences of the user's files; returns its path.

    The trainer and its settings are `vocab.train_vocab`'s (lmsuite's special ids, 100 sentinels
    added by the SeqIO vocabulary, one thread, the files' order, a fixed seed), so the same files
    give the same bytes. Every file trains (no hold-out); the model is retrained each call, as
    files change under their names. It is written atomically to
    `out_dir/text-{digest of the file list and options}-sp{size}-seed{seed}.model` (default
    out_dir: the lmsuite cache's vocab/).

    Raises:
      ValueError: the file errors of `register_text_task`, files without any text, or a size
        SentencePiece cannot reach on this text (naming the files and the line count).
    """
    vocab_lib.check_size(size)
    files = user_files.expand_files(text_files, flag="text_files")
    reading = dict(format=format, split_documents=split_documents, jsonl_field=jsonl_field)
    stats = text_lib.CleaningStats()
    lines = [
        sentence
        for path in files
        for document in user_files.read_documents(path, stats=stats, **reading)
        for sentence in document.sentences
    ]
    where = user_files.describe(files)
    if not lines:
        raise ValueError(f"{where} hold no text to train a vocabulary on")
    directory = pathlib.Path(out_dir) if out_dir is not None else fetch.cache_dir() / "vocab"
    key = _digest(dict(files=files, model_type=model_type, **reading))
    suffix = "" if model_type == "unigram" else f"-{model_type}"
    path = directory / f"text-{key}-sp{size}-seed{seed}{suffix}.model"
    vocab_lib.train_sentencepiece(
        lines, path=path, size=size, seed=seed, model_type=model_type, source=where
    )
    return path
