"""Text hygiene for corpora: drop empty documents, repair bad Unicode, chunk huge documents.

Every corpus passes its raw documents through `clean_documents`, which counts what it changed in
a `CleaningStats` so tests (and curious users) can see it:

  >>> stats = CleaningStats()
  >>> list(clean_documents([b"ok \\xff", "   ", "a\\ud800b"], stats=stats))
  ['ok \\ufffd', 'a\\ufffdb']
  >>> (stats.empty_dropped, stats.invalid_utf8_replaced, stats.lone_surrogates_replaced)
  (1, 1, 1)

`chunk_stream` splits one arbitrarily large document, given as an iterable of pieces (e.g. file
reads), into chunks of at most `chunk_chars` characters, cutting at a paragraph break, else a
line break, else a space where one exists in the second half of the chunk; it never buffers more
than `chunk_chars` plus one piece. `split_sentences` is a small English sentence splitter.
"""

import codecs
import contextvars
import dataclasses
import re
from collections.abc import Iterable, Iterator

_REPLACEMENT = "\ufffd"
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclasses.dataclass
class CleaningStats:
    """Counters updated in place by `clean_documents` and `chunk_stream`."""

    documents_in: int = 0
    documents_out: int = 0
    empty_dropped: int = 0
    invalid_utf8_replaced: int = 0
    lone_surrogates_replaced: int = 0
    documents_chunked: int = 0
    chunks_out: int = 0
    max_buffer_chars: int = 0


_current_stats: contextvars.ContextVar[CleaningStats | None] = contextvars.ContextVar(
    "lmsuite_cleaning_stats", default=None
)


def _count_and_replace(error: UnicodeDecodeError) -> tuple[str, int]:
    stats = _current_stats.get()
    if stats is not None:
        stats.invalid_utf8_replaced += 1
    return _REPLACEMENT, error.end


codecs.register_error("lmsuite_count_replace", _count_and_replace)


def decode_utf8(data: bytes, *, stats: CleaningStats) -> str:
    """Decodes UTF-8, replacing each invalid sequence by U+FFFD and counting it."""
    return _utf8_decoder(stats)(data, final=True)


def _utf8_decoder(stats: CleaningStats):
    decoder = codecs.getincrementaldecoder("utf-8")(errors="lmsuite_count_replace")

    def decode(data: bytes, final: bool) -> str:
        token = _current_stats.set(stats)
        try:
            return decoder.decode(data, final)
        finally:
            _current_stats.reset(token)

    return decode


def repair_surrogates(text: str, *, stats: CleaningStats) -> str:
    """Joins valid UTF-16 surrogate pairs into one code point and replaces lone ones by U+FFFD.

    Example: "a\\ud83d\\ude00b\\udc00" -> "a\\U0001f600b\\ufffd" (one lone surrogate counted).
    """
    if not _LONE_SURROGATE.search(text):
        return text
    text = _SURROGATE_PAIR.sub(
        lambda m: chr(0x10000 + ((ord(m[0][0]) - 0xD800) << 10) + (ord(m[0][1]) - 0xDC00)), text
    )
    text, count = _LONE_SURROGATE.subn(_REPLACEMENT, text)
    stats.lone_surrogates_replaced += count
    return text


def clean_text(text: str | bytes, *, stats: CleaningStats) -> str:
    """Returns valid Unicode text: bytes decoded as UTF-8 and surrogates repaired, counting both."""
    if isinstance(text, bytes):
        text = decode_utf8(text, stats=stats)
    return repair_surrogates(text, stats=stats)


def clean_documents(
    documents: Iterable[str | bytes], *, stats: CleaningStats, max_chars: int | None = None
) -> Iterator[str]:
    """Yields cleaned documents, dropping whitespace-only ones and chunking those over `max_chars`.

    Example (max_chars=8): ["", "aaaa bbbb cc"] -> ["aaaa ", "bbbb cc"], empty_dropped=1.
    """
    for document in documents:
        stats.documents_in += 1
        text = clean_text(document, stats=stats)
        if not text.strip():
            stats.empty_dropped += 1
            continue
        if max_chars is not None and len(text) > max_chars:
            stats.documents_chunked += 1
            pieces = (text[i : i + max_chars] for i in range(0, len(text), max_chars))
            for chunk in chunk_stream(pieces, chunk_chars=max_chars, stats=stats):
                stats.documents_out += 1
                yield chunk
        else:
            stats.documents_out += 1
            yield text


def chunk_stream(
    pieces: Iterable[str | bytes], *, chunk_chars: int, stats: CleaningStats
) -> Iterator[str]:
    """Splits a stream of pieces into chunks of at most `chunk_chars`, holding one chunk at most.

    Bytes pieces are decoded incrementally (a UTF-8 sequence split across pieces is kept whole).
    Whitespace-only chunks are dropped.

    Example (chunk_chars=6): ["ab cd", " ef\\n\\ngh"] -> ["ab cd ", "ef\\n\\ngh"].
    """
    if chunk_chars < 2:
        raise ValueError(f"chunk_chars must be at least 2, got {chunk_chars}")
    decode = _utf8_decoder(stats)
    buffer = ""
    for piece in pieces:
        text = decode(piece, False) if isinstance(piece, bytes) else piece
        buffer += repair_surrogates(text, stats=stats)
        stats.max_buffer_chars = max(stats.max_buffer_chars, len(buffer))
        while len(buffer) > chunk_chars:
            cut = _cut_point(buffer, chunk_chars)
            yield from _emit(buffer[:cut], stats)
            buffer = buffer[cut:]
    buffer += decode(b"", True)
    while buffer:
        cut = _cut_point(buffer, chunk_chars) if len(buffer) > chunk_chars else len(buffer)
        yield from _emit(buffer[:cut], stats)
        buffer = buffer[cut:]


def _cut_point(buffer: str, chunk_chars: int) -> int:
    window = buffer[:chunk_chars]
    for separator in ("\n\n", "\n", " "):
        position = window.rfind(separator)
        if position >= chunk_chars // 2:
            return position + len(separator)
    return chunk_chars


def _emit(chunk: str, stats: CleaningStats) -> Iterator[str]:
    if chunk.strip():
        stats.chunks_out += 1
        yield chunk


_ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr prof gen col lt sgt capt gov rev vs etc no vol pp fig inc ltd co mt "
    "jan feb mar apr jun jul aug sep sept oct nov dec e.g i.e cf approx ca al".split()
)
_SENTENCE_END = re.compile(r"([.!?]+[\"'\u201d\u2019)\]]*)\s+(?=[\"'\u201c\u2018(\[]?[A-Z0-9])")


def split_sentences(paragraph: str) -> list[str]:
    """Splits English prose at sentence-final punctuation followed by a capitalised word.

    Abbreviations ("Dr.", "e.g.") and initials ("J. R. R.") do not end a sentence.

    Example: "Dr. Smith came. He saw J. R. Tolkien!" -> ["Dr. Smith came.", "He saw J. R. Tolkien!"]
    """
    sentences, start = [], 0
    for match in _SENTENCE_END.finditer(paragraph):
        before = paragraph[start : match.start(1)].rsplit(None, 1)
        last_word = before[-1].lstrip("(\"'") if before else ""
        if match.group(1) == "." and (
            last_word.lower() in _ABBREVIATIONS or (len(last_word) == 1 and last_word.isupper())
        ):
            continue
        sentences.append(paragraph[start : match.end(1)].strip())
        start = match.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return [s for s in sentences if s]
