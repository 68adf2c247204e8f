"""How likely a model finds a text: (pseudo-)log-likelihood and perplexity.

  masked LM     pseudo-log-likelihood (Salazar et al. 2020): each non-special token is masked
                in turn and scored given all the others; the sum over the tokens.
  causal LM     log p(x_t | x_<t) summed over every token that has a left context (the first
                token too when the model reads a start token first, as lmsuite's decoders do).
  seq2seq       log p(target | input), the decoder reading the target shifted right after the
                decoder start token.

Natural logarithms; perplexity = exp(-log_likelihood / num_tokens).
"""

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

MAX_ROWS = 64  # masked copies per forward pass when scoring an MLM


@dataclasses.dataclass(frozen=True)
class Score:
    """The score of one text; `pseudo` marks an MLM's pseudo-log-likelihood."""

    log_likelihood: float
    num_tokens: int
    pseudo: bool = False

    @property
    def perplexity(self) -> float:
        return math.exp(-self.log_likelihood / self.num_tokens)


def _log_softmax(logits_LV: np.ndarray) -> np.ndarray:
    x = np.asarray(logits_LV, np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _check_texts(texts, what: str) -> list:
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise ValueError(f"score needs at least one {what}, got an empty list")
    return texts


def pseudo_log_likelihood(
    texts: Sequence[str],
    *,
    vocab,
    logits_of: Callable[[list[list[int]]], list[np.ndarray]],
) -> list[Score]:
    """MLM pseudo-log-likelihood of each text (special tokens are context, never scored)."""
    texts = _check_texts(texts, "text")
    mask_id = vocab.token_id("mask_token")
    if mask_id is None:
        raise ValueError("a pseudo-log-likelihood needs a vocabulary with a mask token")
    scores = []
    for text in texts:
        ids = vocab.encode(text)
        positions = [p for p, i in enumerate(ids) if i not in vocab.special_ids]
        if not positions:
            raise ValueError(f"text {text!r} has no token to score (ids {ids})")
        total = 0.0
        for start in range(0, len(positions), MAX_ROWS):
            chunk = positions[start : start + MAX_ROWS]
            copies = []
            for p in chunk:
                masked = list(ids)
                masked[p] = mask_id
                copies.append(masked)
            for p, logits_LV in zip(chunk, logits_of(copies), strict=True):
                total += float(_log_softmax(logits_LV[p])[ids[p]])
        scores.append(Score(total, len(positions), pseudo=True))
    return scores


def causal_log_likelihood(
    texts: Sequence[str],
    *,
    vocab,
    logits_of: Callable[[list[list[int]]], list[np.ndarray]],
    start_id: int | None,
) -> list[Score]:
    """Left-to-right log-likelihood; `start_id` is read before the first token if not None."""
    texts = _check_texts(texts, "text")
    rows = []
    for text in texts:
        ids = vocab.encode(text)
        row = ([start_id] if start_id is not None else []) + list(ids)
        if len(row) < 2:
            raise ValueError(f"text {text!r} has no token with a left context to score (ids {ids})")
        rows.append(row)
    scores = []
    for row, logits_LV in zip(rows, logits_of(rows), strict=True):
        log_probs = _log_softmax(logits_LV[:-1])
        picked = log_probs[np.arange(len(row) - 1), np.asarray(row[1:])]
        scores.append(Score(float(picked.sum()), len(row) - 1))
    return scores


def seq2seq_log_likelihood(
    pairs: Sequence[tuple[str, str]],
    *,
    vocab,
    logits_of: Callable[[list[list[int]], list[list[int]]], list[np.ndarray]],
    start_id: int,
) -> list[Score]:
    """log p(target | input) for each (input, target) pair."""
    pairs = _check_texts(pairs, "(input, target) pair")
    encoder_rows, decoder_rows, targets = [], [], []
    for pair in pairs:
        if isinstance(pair, str) or len(pair) != 2:
            raise ValueError(
                f"a seq2seq model scores (input, target) pairs, got {pair!r}; call "
                "score(inputs, targets) or score([(input, target), ...])"
            )
        target = vocab.encode(pair[1])
        if not target:
            raise ValueError(f"target {pair[1]!r} has no token to score")
        encoder_rows.append(vocab.encode(pair[0]))
        decoder_rows.append([start_id, *target[:-1]])
        targets.append(target)
    scores = []
    for target, logits_LV in zip(targets, logits_of(encoder_rows, decoder_rows), strict=True):
        log_probs = _log_softmax(logits_LV)
        picked = log_probs[np.arange(len(target)), np.asarray(target)]
        scores.append(Score(float(picked.sum()), len(target)))
    return scores
