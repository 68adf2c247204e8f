"""Labelled text for fine-tuning a classifier: the embedded probes and GLUE-format TSV files.

train, validation, labels = probe_examples("trec_questions")
train, labels = read_glue_tsv("train.tsv")                        # GLUE columns detected
validation, _ = read_glue_tsv("dev.tsv", label_names=labels)      # ids from the train file
ids, types = encode_pair(vocab, "a text", None, max_length=64)    # [CLS] a text [SEP]
ids, types = frame_pair(vocab, "a text", None, max_length=64, framing="xlnet")  # a text [SEP] [CLS]
"""

import csv
import dataclasses

import numpy as np

PROBES = ("vader_sentiment", "trec_questions")
# GLUE's column names: (text, pair) columns in the order they are tried, and label columns.
GLUE_TEXT_COLUMNS = (
    ("sentence1", "sentence2"),  # MRPC, RTE, WNLI, STS-B
    ("question1", "question2"),  # QQP
    ("question", "sentence"),  # QNLI
    ("premise", "hypothesis"),  # MNLI
    ("sentence", None),  # SST-2, CoLA
)
GLUE_LABEL_COLUMNS = ("label", "gold_label", "Quality")


@dataclasses.dataclass(frozen=True)
class TextExample:
    """A text (or a text pair) and its label id."""

    text: str
    label: int
    pair: str | None = None


def probe_examples(name: str) -> tuple[list[TextExample], list[TextExample], tuple[str, ...]]:
    """(train, validation, label names) of an embedded probe corpus (`PROBES`)."""
    if name not in PROBES:
        raise ValueError(f"unknown probe {name!r}; expected one of {PROBES}")
    from lmsuite.data import corpora
    from lmsuite.data.corpora import probes

    corpus = corpora.get_corpus(name)
    splits = [
        [TextExample(d.text, int(d.features["label"])) for d in corpus.documents(split)]
        for split in ("train", "validation")
    ]
    names = ("negative", "positive") if name == "vader_sentiment" else probes.COARSE_LABELS
    return splits[0], splits[1], tuple(names)


def _glue_columns(header: list[str], path: str, text_column, pair_column, label_column):
    if text_column is None:
        found = next((cols for cols in GLUE_TEXT_COLUMNS if cols[0] in header), None)
        if found is None:
            raise ValueError(
                f"{path}: no GLUE text column in the header {header}; expected one of "
                f"{[c[0] for c in GLUE_TEXT_COLUMNS]} or name it with text_column"
            )
        text_column = found[0]
        if pair_column is None and found[1] in header:
            pair_column = found[1]
    if label_column is None:
        label_column = next((c for c in GLUE_LABEL_COLUMNS if c in header), None)
        if label_column is None:
            raise ValueError(
                f"{path}: no label column in the header {header}; expected one of "
                f"{GLUE_LABEL_COLUMNS} or name it with label_column"
            )
    for role, column in (("text", text_column), ("pair", pair_column), ("label", label_column)):
        if column is not None and column not in header:
            raise ValueError(f"{path}: {role} column {column!r} is not in the header {header}")
    return text_column, pair_column, label_column


def read_glue_tsv(
    path: str,
    *,
    text_column: str | None = None,
    pair_column: str | None = None,
    label_column: str | None = None,
    label_names: tuple[str, ...] | None = None,
) -> tuple[list[TextExample], tuple[str, ...]]:
    """(examples, label names) of a GLUE-format TSV: a header row, then one example a line.

    Columns left None are detected from GLUE's names (`GLUE_TEXT_COLUMNS`,
    `GLUE_LABEL_COLUMNS`). Without `label_names` (a training file) the labels are the file's
    distinct values, sorted; with them (a validation file, given the training file's names)
    each label must be one of them.

    Example: "sentence\\tlabel\\nso good\\t1\\nso bad\\t0\\n" -> ([TextExample("so good", 1),
      TextExample("so bad", 0)], ("0", "1"))

    Raises:
      ValueError: a missing column (naming the header), a short row, or a label outside
        `label_names` (naming the label, the file and line, and the label set).
    """
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise ValueError(f"{path} is empty; expected a header row, then one example a line")
    header = rows[0]
    text_c, pair_c, label_c = _glue_columns(header, path, text_column, pair_column, label_column)
    index = {name: i for i, name in enumerate(header)}
    records = []
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise ValueError(f"{path} line {line}: {len(row)} fields, the header has {len(header)}")
        pair = row[index[pair_c]] if pair_c is not None else None
        records.append((line, row[index[text_c]], pair, row[index[label_c]]))
    if label_names is None:
        label_names = tuple(sorted({label for *_, label in records}))
    ids = {name: i for i, name in enumerate(label_names)}
    examples = []
    for line, text, pair, label in records:
        if label not in ids:
            raise ValueError(
                f"{path} line {line}: label {label!r} is not in the label set {list(label_names)}"
            )
        examples.append(TextExample(text, ids[label], pair))
    return examples, tuple(label_names)


def _cut_to_fit(first: list[int], second: list[int], room: int) -> tuple[list[int], list[int]]:
    """Drops the last piece of the longer part until both fit in `room` (BERT's
    truncate_seq_pair)."""
    while len(first) + len(second) > room:
        if len(first) >= len(second):
            first = first[:-1]
        else:
            second = second[:-1]
    return first, second


def _special_ids(vocab, roles: tuple[str, ...], framing: str) -> list[int]:
    ids = [vocab.token_id(role) for role in roles]
    missing = [role for role, i in zip(roles, ids, strict=True) if i is None]
    if missing:
        raise ValueError(
            f"framing {framing!r} needs a vocabulary with {list(roles)}; this one lacks {missing}"
        )
    return ids


def encode_pair(vocab, text: str, pair: str | None, *, max_length: int):
    """(ids, token types) of [CLS] text [SEP] (pair [SEP]), the longer part cut first to fit.

    Example: pieces a b c / d, max_length 6 -> [CLS] a b [SEP] d [SEP], types 0 0 0 0 1 1.
    """
    return frame_pair(vocab, text, pair, max_length=max_length, framing="cls_sep")


# How each family's texts are framed (`probe_models` names one per family); "xlnet" rows are
# padded on the left, the others on the right.
FRAMINGS = ("cls_sep", "eos", "xlnet")
LEFT_PADDED = ("xlnet",)


def frame_pair(vocab, text: str, pair: str | None, *, max_length: int, framing: str):
    """(ids, token types) of a text (or pair) framed as a family's pretraining framed it.

      cls_sep  [CLS] a [SEP] (b [SEP]), types 0 then 1: the encoders (BERT's fine-tuning).
      eos      a </s> (b </s>), types 0: encoder-decoders, decoders and Transformer-XL, whose
               lmsuite tasks end a text with </s> (`tokenizer_export.template_for`).
      xlnet    a [SEP] (b [SEP]) [CLS], types 0, 1 then 2 on [CLS]: XLNet's `A <sep> B <sep>
               <cls>` (lmsuite's XLNet data plays <sep> with [SEP] and <cls> with [CLS]).

    The longer part loses its last piece first until the framing fits in `max_length`.

    Example: pieces a b c / d, max_length 6:
      cls_sep -> [CLS] a b [SEP] d [SEP], types 0 0 0 0 1 1
      eos     -> a b c </s> d </s>,      types 0 0 0 0 0 0
      xlnet   -> a b [SEP] d [SEP] [CLS], types 0 0 0 1 1 2
    """
    if framing not in FRAMINGS:
        raise ValueError(f"framing must be one of {FRAMINGS}, got {framing!r}")
    if framing == "cls_sep":
        cls_id, sep_id = vocab.token_id("cls_token"), vocab.token_id("sep_token")
        if cls_id is None or sep_id is None:
            raise ValueError("classification needs a vocabulary with [CLS] and [SEP] tokens")
        specials = 3 if pair is not None else 2
    elif framing == "eos":
        (eos_id,) = _special_ids(vocab, ("eos_token",), framing)
        specials = 2 if pair is not None else 1
    else:
        cls_id, sep_id = _special_ids(vocab, ("cls_token", "sep_token"), framing)
        specials = 3 if pair is not None else 2
    first = vocab.encode(text, add_special_tokens=False)
    second = [] if pair is None else vocab.encode(pair, add_special_tokens=False)
    room = max_length - specials
    if room < 1:
        raise ValueError(f"max_length={max_length} leaves no room for text")
    first, second = _cut_to_fit(first, second, room)
    if framing == "cls_sep":
        ids = [cls_id, *first, sep_id]
        types = [0] * len(ids)
        if pair is not None:
            ids += [*second, sep_id]
            types += [1] * (len(second) + 1)
        return ids, types
    if framing == "eos":
        ids = [*first, eos_id] + ([] if pair is None else [*second, eos_id])
        return ids, [0] * len(ids)
    ids, types = [*first, sep_id], [0] * (len(first) + 1)
    if pair is not None:
        ids += [*second, sep_id]
        types += [1] * (len(second) + 1)
    return ids + [cls_id], types + [2]


def encode_examples(
    examples: list[TextExample], *, vocab, max_length: int, framing: str = "cls_sep"
) -> dict:
    """input_ids, token_type_ids, attention_mask (N, max_length) and labels (N,), each text
    framed by `frame_pair`; padding (id 0, type 0, mask 0) on the right, or on the left for
    the framings in `LEFT_PADDED` (XLNet's classifier reads the last position).

    Example: pieces a b, max_length 5, framing "xlnet" -> ids 0 a b [SEP] [CLS], mask
      0 1 1 1 1, types 0 0 0 0 2; framing "eos" -> ids a b </s> 0 0, mask 1 1 1 0 0.
    """
    n = len(examples)
    out = {
        "input_ids": np.zeros((n, max_length), np.int32),
        "token_type_ids": np.zeros((n, max_length), np.int32),
        "attention_mask": np.zeros((n, max_length), np.int32),
        "labels": np.asarray([e.label for e in examples], np.int32),
    }
    for row, example in enumerate(examples):
        ids, types = frame_pair(
            vocab, example.text, example.pair, max_length=max_length, framing=framing
        )
        where = slice(max_length - len(ids), None) if framing in LEFT_PADDED else slice(len(ids))
        out["input_ids"][row, where] = ids
        out["token_type_ids"][row, where] = types
        out["attention_mask"][row, where] = 1
    return out


CLASSIFICATION_TASKS = (*PROBES, "glue_tsv")


def classification_data(
    task: str,
    *,
    train_file: str | None = None,
    validation_file: str | None = None,
    text_column: str | None = None,
    pair_column: str | None = None,
    label_column: str | None = None,
) -> tuple[list[TextExample], list[TextExample], tuple[str, ...]]:
    """(train, validation, label names) of a probe by name, or of "glue_tsv" train and
    validation files (the validation labels mapped with the training file's label set)."""
    if task in PROBES:
        if train_file or validation_file:
            raise ValueError(
                f"task {task!r} is embedded; train_file/validation_file are for glue_tsv"
            )
        return probe_examples(task)
    if task != "glue_tsv":
        raise ValueError(f"unknown task {task!r}; expected one of {CLASSIFICATION_TASKS}")
    if not train_file or not validation_file:
        raise ValueError(
            f"task 'glue_tsv' needs train_file and validation_file, got {train_file!r}, "
            f"{validation_file!r}"
        )
    columns = dict(text_column=text_column, pair_column=pair_column, label_column=label_column)
    train, names = read_glue_tsv(train_file, **columns)
    validation, _ = read_glue_tsv(validation_file, label_names=names, **columns)
    return train, validation, names
