"""Production corpora read through TFDS: English Wikipedia and C4, selectable by name.

These are far too large to fetch from a package registry; they are prepared by TFDS
(`tfds build` / a GCS `data_dir`) and read with `seqio.TfdsDataSource`. TFDS Wikipedia has only
a train split, so its last 0.1% is held out as validation. Each source is followed by
`tfds_to_document`, which gives the examples the corpus features (`doc_id`, `text`, `sentences`),
taking the non-empty lines of the text as its paragraphs, replacing invalid UTF-8 by U+FFFD and
dropping documents without any non-blank line (count them by comparing dataset sizes).

Example (`c4/en` record):
  {"text": "Hi there.\\n\\nBye.", "url": "http://x"} ->
  {"doc_id": "http://x", "text": "Hi there.\\n\\nBye.", "sentences": ["Hi there.", "Bye."]}
"""

import dataclasses
from collections.abc import Mapping

import seqio
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class TfdsCorpus:
    """A TFDS dataset that becomes a corpus after the `preprocessors` run."""

    name: str
    tfds_name: str
    splits: Mapping[str, str]
    id_feature: str
    language: str = "en"
    description: str = ""

    def source(self) -> seqio.TfdsDataSource:
        return seqio.TfdsDataSource(tfds_name=self.tfds_name, splits=dict(self.splits))

    @property
    def preprocessors(self) -> tuple:
        return (self.tfds_to_document,)

    def tfds_to_document(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Maps a TFDS record to `doc_id`, `text` and `sentences` (its non-empty lines)."""
        dataset = dataset.map(
            lambda ex: to_document(ex, id_feature=self.id_feature),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
        return dataset.filter(lambda ex: tf.size(ex["sentences"]) > 0)


def to_document(example: Mapping[str, tf.Tensor], *, id_feature: str) -> dict[str, tf.Tensor]:
    """Maps one TFDS record to the corpus features.

    Example: {"text": "a\\n\\n b", id_feature: "x"}
      -> {"doc_id": "x", "text": "a\\n\\n b", "sentences": ["a", "b"]}
    """
    text = tf.strings.unicode_transcode(
        example["text"], "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )
    lines = tf.strings.strip(tf.strings.split(text, "\n"))
    sentences = tf.boolean_mask(lines, tf.strings.length(lines) > 0)
    return {"doc_id": example[id_feature], "text": text, "sentences": sentences}


WIKIPEDIA = TfdsCorpus(
    name="wikipedia",
    tfds_name="wikipedia/20230601.en:1.0.0",
    splits={"train": "train[:99.9%]", "validation": "train[99.9%:]"},
    id_feature="title",
    description="English Wikipedia dump of 2023-06-01 (TFDS wikipedia/20230601.en).",
)
C4 = TfdsCorpus(
    name="c4",
    tfds_name="c4/en:3.1.0",
    splits={"train": "train", "validation": "validation"},
    id_feature="url",
    description="Colossal Clean Crawled Corpus, English (TFDS c4/en 3.1.0).",
)
