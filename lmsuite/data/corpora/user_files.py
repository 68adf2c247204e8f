"""A corpus read from the user's own files: plain text, gzip, or JSON lines, local or gs://.

`expand_files` turns globs (a string of comma-separated globs, or a list of them) into the sorted
absolute paths they match; `read_documents` turns one file into documents; `files_corpus` makes a
`base.Corpus` of many files whose validation split is either validation files of their own or a
deterministic hold-out of the training documents (`hold_out`).

Formats ("auto": "jsonl" for *.jsonl, *.ndjson and *.json, else "text"; a *.gz file is gunzipped
first, so "a.jsonl.gz" is JSON lines):
  text:   the file's text (UTF-8; invalid bytes become U+FFFD and are counted)
  jsonl:  one JSON object per non-blank line; the string in its `jsonl_field` is the record's text
Documents (`split_documents`; default "file" for text, "line" for JSON lines):
  file:        one per file (a JSON-lines file's records one after another)
  blank_line:  one per block of lines between blank lines (within each record, for JSON lines)
  line:        one per non-blank line (one per record, for JSON lines)
Within a document, as in the embedded Wikipedia sample and the TFDS corpora, every non-blank line
is a paragraph: `text` holds the stripped paragraphs joined by "\\n", and `sentences` are each
paragraph's `text.split_sentences` (the sentence-pair objectives pair them). A document's id is
"PATH:LINE", the line where it starts ("PATH:LINE.K" for the K-th block of a JSON record).

Example (/data/a.txt, split_documents="blank_line"):
  "Dr. Ada came. She won.\\n  The end.\\n\\n\\nNext story.\\n"
  -> [Document("/data/a.txt:1", text="Dr. Ada came. She won.\\nThe end.",
               sentences=("Dr. Ada came.", "She won.", "The end.")),
      Document("/data/a.txt:5", text="Next story.", sentences=("Next story.",))]
"""

import collections
import gzip
import hashlib
import json
import os
import zlib
from collections.abc import Iterable, Sequence

import tensorflow as tf

from lmsuite.data import text as text_lib
from lmsuite.data.corpora import base

FORMATS = ("auto", "text", "jsonl")
SPLIT_DOCUMENTS = ("file", "blank_line", "line")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


def patterns(files: str | Iterable[str]) -> list[str]:
    """The globs in `files`: "a/*.txt,b.txt" or ["a/*.txt", "b.txt,c.txt"] -> each glob."""
    items = [files] if isinstance(files, str | os.PathLike) else list(files)
    return [p.strip() for item in items for p in os.fspath(item).split(",") if p.strip()]


def absolute(path: str) -> str:
    """`path` with `~` expanded and made absolute; URLs (gs://...) unchanged."""
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def expand_files(files: str | Iterable[str], *, flag: str = "files") -> tuple[str, ...]:
    """The sorted, de-duplicated absolute paths that the globs in `files` match.

    Raises:
      ValueError: no glob given, a glob that matches nothing or matches a directory (naming it).
    """
    globs = patterns(files)
    if not globs:
        raise ValueError(f"{flag}: no file or glob given, got {files!r}")
    found: set[str] = set()
    for glob in globs:
        where = absolute(glob)
        try:
            matches = tf.io.gfile.glob(where)
        except tf.errors.OpError as error:
            raise ValueError(f"{flag}: cannot list {glob!r}: {error.message}") from error
        if not matches:
            looked = f" (looked for {where})" if where != glob else ""
            raise ValueError(f"{flag}: {glob!r} matches no file{looked}")
        for match in matches:
            if tf.io.gfile.isdir(match):
                raise ValueError(
                    f"{flag}: {glob!r} matches the directory {match}; name its files, e.g. "
                    f"{match}/*.txt"
                )
        found.update(matches)
    return tuple(sorted(found))


def file_format(path: str, format: str = "auto") -> str:
    """ "text" or "jsonl": `format`, or for "auto" what the file name says."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {format!r}")
    if format != "auto":
        return format
    return "jsonl" if path.removesuffix(".gz").endswith(JSONL_SUFFIXES) else "text"


def read_text(path: str, *, stats: text_lib.CleaningStats) -> str:
    """The text of a file (gunzipped if *.gz), with "\\n" line ends and no byte-order mark."""
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
    except tf.errors.OpError as error:
        raise ValueError(f"cannot read {path}: {error.message}") from error
    if path.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:
            raise ValueError(f"{path} is not a readable gzip file: {error}") from error
    text = text_lib.clean_text(data, stats=stats).removeprefix("\ufeff")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _records(path: str, text: str, field: str, stats) -> list[tuple[int, str]]:
    """(line number, text) of each JSON-lines record; a ValueError names the file and line."""
    records = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}:{number}: not a JSON line ({error.msg} at column {error.colno})"
            ) from error
        if not isinstance(record, dict):
            raise ValueError(
                f"{path}:{number}: a JSON {type(record).__name__}, expected an object with a "
                f"{field!r} field"
            )
        if field not in record:
            raise ValueError(
                f"{path}:{number}: the record has no field {field!r}; its fields are "
                f"{sorted(record)} (set jsonl_field)"
            )
        if not isinstance(record[field], str):
            raise ValueError(
                f"{path}:{number}: field {field!r} holds a {type(record[field]).__name__}, "
                "expected a string"
            )
        records.append((number, text_lib.repair_surrogates(record[field], stats=stats)))
    return records


def _blocks(lines: Sequence[str]) -> list[tuple[int, list[str]]]:
    """(1-based first line, lines) of each block between blank lines."""
    blocks, current, start = [], [], 0
    for number, line in enumerate(lines, start=1):
        if line.strip():
            if not current:
                start = number
            current.append(line)
        elif current:
            blocks.append((start, current))
            current = []
    if current:
        blocks.append((start, current))
    return blocks


def _document(doc_id: str, lines: Iterable[str]) -> base.Document | None:
    paragraphs = [line.strip() for line in lines if line.strip()]
    if not paragraphs:
        return None
    sentences = tuple(s for p in paragraphs for s in text_lib.split_sentences(p))
    return base.Document(doc_id=doc_id, text="\n".join(paragraphs), sentences=sentences)


def read_documents(
    path: str,
    *,
    format: str = "auto",
    split_documents: str | None = None,
    jsonl_field: str = "text",
    stats: text_lib.CleaningStats | None = None,
) -> list[base.Document]:
    """The non-empty documents of one file, in file order (see the module docstring)."""
    stats = stats if stats is not None else text_lib.CleaningStats()
    kind = file_format(path, format)
    split = split_documents or ("line" if kind == "jsonl" else "file")
    if split not in SPLIT_DOCUMENTS:
        raise ValueError(f"split_documents must be one of {SPLIT_DOCUMENTS}, got {split!r}")
    text = read_text(path, stats=stats)
    if kind == "text":
        lines = text.split("\n")
        if split == "file":
            units = [(f"{path}:1", lines)]
        elif split == "blank_line":
            units = [(f"{path}:{n}", block) for n, block in _blocks(lines)]
        else:
            units = [(f"{path}:{n}", [line]) for n, line in enumerate(lines, start=1)]
    else:
        records = _records(path, text, jsonl_field, stats)
        if split == "file":
            first = records[0][0] if records else 1
            units = [(f"{path}:{first}", [ln for _, value in records for ln in value.split("\n")])]
        elif split == "blank_line":
            units = [
                (f"{path}:{n}.{k}", block)
                for n, value in records
                for k, (_, block) in enumerate(_blocks(value.split("\n")), start=1)
            ]
        else:
            units = [(f"{path}:{n}", value.split("\n")) for n, value in records]
    return [d for d in (_document(doc_id, lines) for doc_id, lines in units) if d is not None]


def file_of(doc_id: str) -> str:
    """The file of a document id: "/data/a.txt:5" -> "/data/a.txt"."""
    return doc_id.rsplit(":", 1)[0]


def hold_out(
    documents: Sequence[base.Document], *, fraction: float, where: str
) -> dict[str, list[base.Document]]:
    """Splits documents into train and validation by their text, the same way on every run.

    The documents are ranked by the SHA-256 of their text (then their id); whole groups of equal
    text go to validation, smallest digest first, until it holds max(1, round(fraction * n))
    documents. So a text never lands in both splits, the split does not depend on file names or
    order, and adding files moves only documents whose digest falls below the new cut. `where`
    names the files in error messages.

    Example (fraction 0.5): texts "a", "b", "c", "a" (digests: "c" < "b" < "a")
      -> validation ["b", "c"], train ["a", "a"]
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation_fraction must be in (0, 1), got {fraction}")
    if len(documents) < 2:
        raise ValueError(
            f"{where} hold {len(documents)} document(s): too few to hold out a validation "
            "document; pass validation files, or split the files into more documents "
            "(split_documents='blank_line' or 'line')"
        )
    digest = {d.doc_id: hashlib.sha256(d.text.encode("utf-8")).hexdigest() for d in documents}
    counts = collections.Counter(digest.values())
    wanted = max(1, round(fraction * len(documents)))
    chosen, held = set(), 0
    for value in sorted(counts):
        if held >= wanted:
            break
        chosen.add(value)
        held += counts[value]
    if len(chosen) == len(counts):
        raise ValueError(
            f"{where}: all {len(documents)} documents have the same text; nothing is left to "
            "train on after holding out validation"
        )
    return {
        "train": [d for d in documents if digest[d.doc_id] not in chosen],
        "validation": [d for d in documents if digest[d.doc_id] in chosen],
    }


def _by_file(documents, *, validation_files: frozenset[str], train_where: str, val_where: str):
    splits = {
        "train": [d for d in documents if file_of(d.doc_id) not in validation_files],
        "validation": [d for d in documents if file_of(d.doc_id) in validation_files],
    }
    for split, where in (("train", train_where), ("validation", val_where)):
        if not splits[split]:
            raise ValueError(f"{where} hold no document (empty or blank files)")
    return splits


def describe(files: Sequence[str]) -> str:
    """ "the 3 files /d/a.txt, /d/b.txt, ..." for messages."""
    shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
    return f"the {len(files)} file(s) {shown}"


def files_corpus(
    *,
    name: str,
    train_files: Sequence[str],
    validation_files: Sequence[str] = (),
    format: str = "auto",
    split_documents: str | None = None,
    jsonl_field: str = "text",
    validation_fraction: float = 0.05,
) -> base.Corpus:
    """A corpus of the documents of expanded, absolute file paths; nothing is read until a split
    is first needed. Validation is the documents of `validation_files`, or without them
    `hold_out(train documents, fraction=validation_fraction)`."""
    train_files, validation_files = tuple(train_files), tuple(validation_files)
    reading = dict(format=format, split_documents=split_documents, jsonl_field=jsonl_field)

    def load(stats: text_lib.CleaningStats) -> list[base.Document]:
        paths = (*train_files, *validation_files)
        return [d for path in paths for d in read_documents(path, stats=stats, **reading)]

    def split(documents: list[base.Document]) -> dict[str, list[base.Document]]:
        train_where = f"train files ({describe(train_files)})"
        if not validation_files:
            return hold_out(documents, fraction=validation_fraction, where=train_where)
        return _by_file(
            documents,
            validation_files=frozenset(validation_files),
            train_where=train_where,
            val_where=f"validation files ({describe(validation_files)})",
        )

    return base.Corpus(
        name=name,
        load=load,
        validation_documents=0,  # the splitter decides
        splitter=split,
        description=f"the user's text: {describe(train_files)}",
    )
