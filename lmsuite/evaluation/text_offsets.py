"""Token ids with the character span each token covers in the text: what extractive QA needs to
turn a predicted token span back into the context's own characters.

HF tokenizers report offsets themselves. For an lmsuite SentencePiece vocabulary the spans come
from SentencePiece's own alignment: `encode(text, return_type="proto")` gives each piece's
`begin`/`end` as byte positions in the *original* (unnormalised) UTF-8 text, so NFKC folding
("ﬁ" -> "fi") and collapsed spaces keep pointing at the right characters. Bytes are turned
into character positions, and the whitespace a word-initial piece absorbs ("▁w" covers "  w")
is left out of its span.

  >>> encode_with_offsets(vocab, "Paris  is")
  ([ids of ▁Paris, ▁is], [(0, 5), (7, 9)])
"""

import numpy as np

from lmsuite.evaluation.tokenizer_export import SentencePieceText, TokenizersText


def _char_positions(text: str) -> np.ndarray:
    """Byte position -> character position, for every byte boundary of text's UTF-8 (len+1)."""
    lengths = [len(c.encode("utf-8")) for c in text]
    positions = np.zeros(sum(lengths) + 1, np.int64)
    byte = 0
    for char, n in enumerate(lengths):
        positions[byte : byte + n] = char
        byte += n
    positions[byte] = len(text)
    return positions


def _sentencepiece_offsets(sp, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    proto = sp.encode(text, return_type="proto")
    chars = _char_positions(text)
    ids, spans = [], []
    for piece in proto.pieces:
        start, end = int(chars[piece.begin]), int(chars[piece.end])
        while start < end and text[start].isspace():
            start += 1
        ids.append(piece.id)
        spans.append((start, end))
    return ids, spans


def encode_with_offsets(vocab, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """(ids, [(char start, char end)] per id) of `text` without special tokens.

    Args:
      vocab: a `tokenizer_export.SentencePieceText` or `TokenizersText` (`LoadedModel.vocab`).
    """
    if isinstance(vocab, TokenizersText):
        encoding = vocab.tokenizer.encode(text, add_special_tokens=False)
        return list(encoding.ids), [tuple(map(int, o)) for o in encoding.offsets]
    if isinstance(vocab, SentencePieceText):
        ids, spans = _sentencepiece_offsets(vocab.vocab.tokenizer, text)
        if ids != vocab.encode(text, add_special_tokens=False):
            raise ValueError(
                "the context holds special-token text (e.g. '[SEP]'), which SentencePieceText "
                f"reads as one id and SentencePiece does not; got {text[:80]!r}"
            )
        return ids, spans
    raise ValueError(
        f"cannot compute character offsets for a {type(vocab).__name__}; expected a "
        "SentencePieceText or a TokenizersText (lmsuite.evaluation.tokenizer_export)"
    )
