"""SQuAD-format data for extractive QA: reading and checking the JSON, the official v1.1 exact
match and F1, and the tokenized windows a span model reads.

  examples = read_squad("dev-v1.1.json")          # QAExample per question, checked
  features = make_features(examples, vocab=model.vocab, max_length=384, doc_stride=128)
  exact_match_and_f1(predictions, examples)       # {"exact_match": 81.2, "f1": 88.5} (0-100)

The metric follows the official SQuAD v1.1 evaluation script: both strings are normalised
(lower case, punctuation removed, the articles a/an/the removed, whitespace collapsed), EM is
equality of the normalised strings, F1 the harmonic mean of token precision and recall over the
bag of normalised tokens, each the maximum over the gold answers, averaged and times 100.
"""

import collections
import dataclasses
import json
import re
import string

import numpy as np

from lmsuite.evaluation import text_offsets

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


@dataclasses.dataclass(frozen=True)
class QAExample:
    """One question on one context; `answers` are (text, character start) pairs (none for an
    unanswerable SQuAD 2.0 question)."""

    qa_id: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]


# ------------------------------------------------------------------------------ reading
def _require(record: dict, key: str, kind: type, where: str):
    if not isinstance(record, dict) or key not in record:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{where}: missing key {key!r} (has {keys})")
    value = record[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(
            f"{where}: {key!r} must be a {kind.__name__}, got {type(value).__name__} {value!r}"
        )
    return value


def parse_squad(dataset: dict, *, source: str = "<squad>") -> list[QAExample]:
    """The questions of a parsed SQuAD JSON object, every record checked.

    Example: {"data": [{"paragraphs": [{"context": "Paris is in France.", "qas": [{"id": "q1",
      "question": "Where is Paris?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]}
      -> [QAExample("q1", "Where is Paris?", "Paris is in France.", (("France", 12),))]

    Raises:
      ValueError: naming the record (article/paragraph index, qa id) and what is wrong: a
        missing key, a value of the wrong type, an answer_start that does not point at the
        answer's text, a repeated id.
    """
    articles = _require(dataset, "data", list, source)
    examples, seen = [], set()
    for a, article in enumerate(articles):
        paragraphs = _require(article, "paragraphs", list, f"{source} data[{a}]")
        for p, paragraph in enumerate(paragraphs):
            where = f"{source} data[{a}].paragraphs[{p}]"
            context = _require(paragraph, "context", str, where)
            for q, qa in enumerate(_require(paragraph, "qas", list, where)):
                qa_id = _require(qa, "id", str, f"{where}.qas[{q}]")
                at = f"{where}.qas[{q}] (id {qa_id!r})"
                if qa_id in seen:
                    raise ValueError(f"{at}: id {qa_id!r} appears twice")
                seen.add(qa_id)
                question = _require(qa, "question", str, at)
                impossible = qa.get("is_impossible", False)
                answers = [] if impossible else _require(qa, "answers", list, at)
                if not impossible and not answers:
                    raise ValueError(f"{at}: 'answers' is empty and is_impossible is not true")
                gold = []
                for n, answer in enumerate(answers):
                    text = _require(answer, "text", str, f"{at} answers[{n}]")
                    start = _require(answer, "answer_start", int, f"{at} answers[{n}]")
                    found = context[start : start + len(text)]
                    if start < 0 or found != text:
                        raise ValueError(
                            f"{at} answers[{n}]: answer_start={start} does not point at the "
                            f"answer text {text!r}; the context there reads {found!r}"
                        )
                    gold.append((text, start))
                examples.append(QAExample(qa_id, question, context, tuple(gold)))
    return examples


def read_squad(path: str) -> list[QAExample]:
    """`parse_squad` of a SQuAD-format JSON file."""
    with open(path, encoding="utf-8") as f:
        try:
            dataset = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not JSON: {error}") from error
    return parse_squad(dataset, source=path)


# ------------------------------------------------------------------------------- metric
def normalize_answer(text: str) -> str:
    """SQuAD v1.1's normalisation: "The  Eiffel-Tower!" -> "eiffeltower"."""
    text = "".join(c for c in text.lower() if c not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def f1(prediction: str, gold: str) -> float:
    """Token F1 of the normalised strings: "the big cat" vs "a big dog" -> 0.5."""
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    same = sum((collections.Counter(predicted) & collections.Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def exact_match_and_f1(predictions: dict[str, str], examples: list[QAExample]) -> dict:
    """Mean EM and F1 (0-100) over the answerable examples, each the max over its golds."""
    scored = [e for e in examples if e.answers]
    if not scored:
        raise ValueError("exact_match_and_f1 needs at least one example with a gold answer")
    missing = [e.qa_id for e in scored if e.qa_id not in predictions]
    if missing:
        raise ValueError(f"no prediction for {len(missing)} ids, e.g. {missing[:5]}")
    em = [max(exact_match(predictions[e.qa_id], g) for g, _ in e.answers) for e in scored]
    f = [max(f1(predictions[e.qa_id], g) for g, _ in e.answers) for e in scored]
    return {"exact_match": 100 * float(np.mean(em)), "f1": 100 * float(np.mean(f))}


# ----------------------------------------------------------------------------- features
@dataclasses.dataclass(frozen=True)
class Features:
    """Tokenized windows, one row per (example, window).

    input_ids, token_type_ids, attention_mask: (N, L). offsets: (N, L, 2) character span of
    each context token in its example's context, (-1, -1) elsewhere. example_index: (N,) the
    row's example. start_positions, end_positions: (N,) the answer's first and last token,
    0 ([CLS]) when the window does not hold the whole first answer or there is none.
    """

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    attention_mask: np.ndarray
    offsets: np.ndarray
    example_index: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray


def _answer_tokens(spans, first: int, answer: tuple[str, int] | None):
    """(start, end) token positions (in the window, offset by `first`) of the answer, or
    (0, 0) when the window's tokens `spans` do not cover it."""
    if answer is None:
        return 0, 0
    char_start, char_end = answer[1], answer[1] + len(answer[0])
    inside = [i for i, (s, e) in enumerate(spans) if e > s and s < char_end and e > char_start]
    if not inside or spans[0][0] > char_start or spans[-1][1] < char_end:
        return 0, 0
    return first + inside[0], first + inside[-1]


def make_features(
    examples: list[QAExample],
    *,
    vocab,
    max_length: int,
    doc_stride: int = 128,
    max_query_length: int = 64,
) -> Features:
    """[CLS] question [SEP] context-window [SEP] rows, the windows `doc_stride` tokens apart.

    Example (one token per word): question "who ?", context "a b c d e", max_length 8 ->
      room for 8 - 2 - 3 = 3 context tokens per window: "a b c", then "c d e" with doc_stride 2
      (the last window ends at the context's end).
    """
    cls_id, sep_id = vocab.token_id("cls_token"), vocab.token_id("sep_token")
    if cls_id is None or sep_id is None:
        raise ValueError("extractive QA needs a vocabulary with [CLS] and [SEP] tokens")
    rows = collections.defaultdict(list)
    for index, example in enumerate(examples):
        question = vocab.encode(example.question, add_special_tokens=False)[:max_query_length]
        context_ids, spans = text_offsets.encode_with_offsets(vocab, example.context)
        room = max_length - len(question) - 3
        if room < 1:
            raise ValueError(
                f"max_length={max_length} leaves no room for the context after a question of "
                f"{len(question)} tokens (max_query_length={max_query_length})"
            )
        if doc_stride < 1:
            raise ValueError(f"doc_stride must be >= 1, got {doc_stride}")
        stride = min(doc_stride, room)  # windows never leave a gap
        starts = list(range(0, max(len(context_ids) - room, 0) + 1, stride))
        if starts[-1] + room < len(context_ids):
            starts.append(len(context_ids) - room)
        answer = example.answers[0] if example.answers else None
        for begin in starts:
            window = slice(begin, begin + room)
            ids = [cls_id, *question, sep_id, *context_ids[window], sep_id]
            first = len(question) + 2
            offsets = np.full((max_length, 2), -1, np.int32)
            window_spans = spans[window]
            offsets[first : first + len(window_spans)] = window_spans
            start, end = _answer_tokens(window_spans, first, answer)
            pad = max_length - len(ids)
            rows["input_ids"].append(ids + [0] * pad)
            rows["token_type_ids"].append([0] * first + [1] * (len(ids) - first) + [0] * pad)
            rows["attention_mask"].append([1] * len(ids) + [0] * pad)
            rows["offsets"].append(offsets)
            rows["example_index"].append(index)
            rows["start_positions"].append(start)
            rows["end_positions"].append(end)
    return Features(**{k: np.asarray(v, np.int32) for k, v in rows.items()})


def best_spans(
    start_NL,
    end_NL,
    features: Features,
    examples: list[QAExample],
    *,
    max_answer_length: int = 30,
    n_best: int = 20,
) -> dict[str, str]:
    """qa_id -> the context text of the highest start + end logit span, over every window of
    the example, with start <= end, both on context tokens and at most `max_answer_length`
    tokens long ("" when no window has such a span)."""
    best: dict[int, tuple[float, str]] = {}
    for row in range(len(features.example_index)):
        index = int(features.example_index[row])
        offsets = features.offsets[row]
        context = examples[index].context
        starts = np.argsort(start_NL[row])[::-1][:n_best]
        ends = np.argsort(end_NL[row])[::-1][:n_best]
        for s in starts:
            for e in ends:
                if offsets[s, 0] < 0 or offsets[e, 0] < 0 or e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(start_NL[row, s] + end_NL[row, e])
                if index not in best or score > best[index][0]:
                    best[index] = (score, context[offsets[s, 0] : offsets[e, 1]])
    return {e.qa_id: best[i][1] if i in best else "" for i, e in enumerate(examples)}
