"""Text hygiene: empty documents, bad Unicode, bounded-memory chunking, sentence splitting."""

import tracemalloc

import pytest

from lmsuite.data import text


def test_empty_and_whitespace_documents_are_dropped_and_counted():
    stats = text.CleaningStats()
    out = list(text.clean_documents(["a", "", "  \n\t ", b"b", b"   "], stats=stats))
    assert out == ["a", "b"]
    assert (stats.documents_in, stats.documents_out, stats.empty_dropped) == (5, 2, 3)


def test_invalid_utf8_is_replaced_and_counted():
    stats = text.CleaningStats()
    out = list(text.clean_documents([b"caf\xc3\xa9 \xff ok \xe2\x82", b"fine"], stats=stats))
    assert out == ["café \ufffd ok \ufffd", "fine"]
    assert stats.invalid_utf8_replaced == 2


def test_lone_surrogates_are_replaced_and_pairs_joined():
    stats = text.CleaningStats()
    out = text.clean_text("a\ud83d\ude00b\udc00c\ud800", stats=stats)
    assert out == "a\U0001f600b\ufffdc\ufffd"
    assert stats.lone_surrogates_replaced == 2
    out.encode("utf-8")  # what TF needs: the result is valid UTF-8


def test_oversized_document_is_chunked_at_boundaries():
    stats = text.CleaningStats()
    document = "word " * 50 + "\n\n" + "x" * 30
    chunks = list(text.clean_documents([document], stats=stats, max_chars=100))
    assert "".join(chunks) == document
    assert all(len(c) <= 100 for c in chunks)
    assert chunks[0].endswith(" ")  # cut at a space, not inside a word
    assert stats.documents_chunked == 1 and stats.documents_out == len(chunks)


def test_chunk_stream_keeps_utf8_split_across_pieces():
    stats = text.CleaningStats()
    data = "é€😀".encode() * 5
    pieces = [data[i : i + 3] for i in range(0, len(data), 3)]  # cuts inside characters
    assert "".join(text.chunk_stream(pieces, chunk_chars=4, stats=stats)) == "é€😀" * 5
    assert stats.invalid_utf8_replaced == 0


def test_ten_megabyte_document_streams_in_bounded_memory():
    chunk_chars, piece_bytes = 100_000, 64 * 1024
    line = b"the quick brown fox jumps over the lazy dog\n"
    total = 10 * 1024 * 1024
    count = total // len(line)

    def pieces():
        buffer = line * (piece_bytes // len(line))
        for _ in range(count // (piece_bytes // len(line))):
            yield buffer

    stats = text.CleaningStats()
    tracemalloc.start()
    emitted = 0
    for chunk in text.chunk_stream(pieces(), chunk_chars=chunk_chars, stats=stats):
        assert len(chunk) <= chunk_chars
        emitted += len(chunk)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert emitted > 10_000_000
    assert stats.max_buffer_chars <= chunk_chars + piece_bytes
    # A few copies of one chunk plus one piece, never the 10 MB document.
    assert peak < 8 * (chunk_chars + piece_bytes), peak


def test_chunk_stream_rejects_tiny_chunks():
    with pytest.raises(ValueError, match="chunk_chars"):
        list(text.chunk_stream(["abc"], chunk_chars=1, stats=text.CleaningStats()))


@pytest.mark.parametrize(
    "paragraph, expected",
    [
        ("Dr. Smith came. Saw J. R. R. Tolkien!", ["Dr. Smith came.", "Saw J. R. R. Tolkien!"]),
        ('He said "Go." Then left.', ['He said "Go."', "Then left."]),
        ("Use e.g. this one. 3 cats ran.", ["Use e.g. this one.", "3 cats ran."]),
        ("no end", ["no end"]),
    ],
)  # fmt: skip
def test_split_sentences(paragraph, expected):
    assert text.split_sentences(paragraph) == expected
