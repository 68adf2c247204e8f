"""A corpus: cleaned documents with fixed train/validation splits, exposed as a SeqIO source.

Each corpus module builds a `Corpus` whose `load` function returns every document in a fixed
order. Nothing is downloaded until a split is first read, so registering tasks is free.
Splits are fixed: the documents' ids are sorted, shuffled with `random.Random(split_seed)`, and
the first `validation_documents` go to validation, the rest to train; a corpus with its own rule
(the user's files, `user_files.py`) passes a `splitter` instead.

Every example has the features
  doc_id:    string, the document's stable id (title, file name, line number, ...)
  text:      string, the whole document (paragraphs joined by "\\n")
  sentences: 1-D string, its sentences (or paragraphs, where the corpus marks no sentences)
plus the corpus's own `extra_features` (e.g. `label` for a probe).

Example:
  >>> source = WIKI_SAMPLE.source()          # seqio.FunctionDataSource, nothing fetched yet
  >>> next(iter(source.get_dataset("validation")))["sentences"][:2]
  <tf.Tensor: shape=(2,), dtype=string, numpy=array([b'...', b'...'], dtype=object)>
"""

import dataclasses
import functools
import random
import threading
from collections.abc import Callable, Mapping

import numpy as np
import seqio
import tensorflow as tf

from lmsuite.data import text as text_lib

SPLITS = ("train", "validation")


@dataclasses.dataclass(frozen=True)
class Document:
    """One document; `features` holds the corpus's extra features as numpy values."""

    doc_id: str
    text: str
    sentences: tuple[str, ...]
    features: Mapping[str, np.ndarray | int | str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
    """A named corpus; `load(stats)` returns raw documents, cleaned and split here."""

    name: str
    load: Callable[[text_lib.CleaningStats], list[Document]]  # counts raw-file repairs
    validation_documents: int
    extra_features: Mapping[str, tf.TensorSpec] = dataclasses.field(default_factory=dict)
    split_seed: int = 0
    description: str = ""
    # The cleaned documents -> {"train": [...], "validation": [...]}; None: the rule above.
    splitter: Callable[[list[Document]], Mapping[str, list[Document]]] | None = None

    def documents(self, split: str) -> list[Document]:
        """The cleaned documents of `split`, in a fixed order."""
        if split not in SPLITS:
            raise ValueError(f"corpus {self.name!r} has splits {SPLITS}, got split={split!r}")
        return _split_documents(self)[split]

    def stats(self) -> text_lib.CleaningStats:
        """What cleaning dropped and repaired (loads the corpus)."""
        _split_documents(self)
        return _STATS[self.name]

    def source(self) -> seqio.FunctionDataSource:
        """A lazy SeqIO source over this corpus."""

        def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
            del shuffle_files, seed  # One in-memory "file"; shuffling is the task's business.
            return self.dataset(split)

        return seqio.FunctionDataSource(dataset_fn=dataset_fn, splits=SPLITS)

    def dataset(self, split: str) -> tf.data.Dataset:
        """The documents of `split` in order, one example each, sliced out of in-memory columns.

        The columns are built once per call; each example is a gather or a slice inside
        tf.data, so no Python runs per document (a `from_generator` source held the GIL for
        about 0.3 ms per document while the training loop waited on it).
        """
        documents = self.documents(split)
        signature = {
            "doc_id": tf.TensorSpec([], tf.string),
            "text": tf.TensorSpec([], tf.string),
            "sentences": tf.TensorSpec([None], tf.string),
            **self.extra_features,
        }
        values = {
            "doc_id": [d.doc_id for d in documents],
            "text": [d.text for d in documents],
            "sentences": [d.sentences for d in documents],
            **{k: [d.features[k] for d in documents] for k in self.extra_features},
        }
        columns = {k: _Column.build(k, values[k], spec) for k, spec in signature.items()}
        return tf.data.Dataset.range(len(documents)).map(
            lambda index: {k: column.example(index) for k, column in columns.items()}
        )


@dataclasses.dataclass(frozen=True)
class _Column:
    """One feature of every document: a scalar per document, or 1-D values with row splits."""

    values: tf.Tensor
    splits: tf.Tensor | None  # None for a scalar feature

    @classmethod
    def build(cls, name: str, values: list, spec: tf.TensorSpec) -> "_Column":
        dtype = object if spec.dtype == tf.string else spec.dtype.as_numpy_dtype
        if spec.shape.rank == 0:
            return cls(tf.constant(np.asarray(values, dtype=dtype), spec.dtype), None)
        if spec.shape.as_list() != [None]:
            raise ValueError(
                f"corpus feature {name!r} has shape {spec.shape}; a source holds scalars or "
                "1-D values of any length"
            )
        rows = [np.asarray(v, dtype=dtype).reshape(-1) for v in values]
        splits = np.cumsum([0] + [len(r) for r in rows], dtype=np.int64)
        flat = np.concatenate(rows) if rows else np.zeros([0], dtype)
        return cls(tf.constant(flat, spec.dtype), tf.constant(splits))

    def example(self, index: tf.Tensor) -> tf.Tensor:
        if self.splits is None:
            return tf.gather(self.values, index)
        return self.values[self.splits[index] : self.splits[index + 1]]


_STATS: dict[str, text_lib.CleaningStats] = {}
_LOCK = threading.Lock()


@functools.cache
def _split_documents(corpus: Corpus) -> dict[str, list[Document]]:
    with _LOCK:
        stats = text_lib.CleaningStats()
        documents = [_clean(d, stats) for d in corpus.load(stats)]
        documents = [d for d in documents if d is not None]
        ids = sorted(d.doc_id for d in documents)
        if len(set(ids)) != len(ids):
            raise ValueError(f"corpus {corpus.name!r} has duplicate document ids")
        if corpus.splitter is not None:
            splits = corpus.splitter(documents)
            _STATS[corpus.name] = stats
            return {split: list(splits[split]) for split in SPLITS}
        if not 0 < corpus.validation_documents < len(ids):
            raise ValueError(
                f"corpus {corpus.name!r} has {len(ids)} documents; cannot hold out "
                f"validation_documents={corpus.validation_documents}"
            )
        random.Random(corpus.split_seed).shuffle(ids)
        validation_ids = set(ids[: corpus.validation_documents])
        _STATS[corpus.name] = stats
        return {
            "train": [d for d in documents if d.doc_id not in validation_ids],
            "validation": [d for d in documents if d.doc_id in validation_ids],
        }


def _clean(document: Document, stats: text_lib.CleaningStats) -> Document | None:
    stats.documents_in += 1
    text = text_lib.clean_text(document.text, stats=stats)
    sentences = tuple(
        s for s in (text_lib.clean_text(s, stats=stats).strip() for s in document.sentences) if s
    )
    if not text.strip() or not sentences:
        stats.empty_dropped += 1
        return None
    stats.documents_out += 1
    return dataclasses.replace(document, text=text, sentences=sentences)
