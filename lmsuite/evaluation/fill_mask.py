"""Masked-token predictions in the shape HF's fill-mask pipeline returns them.

For each text: the probabilities (softmax of the MLM logits) at every mask position, the top k
of them as dicts {score, token, token_str, sequence}. The nesting follows the pipeline:

  one text, one mask          [dict, ...]                 (top_k dicts)
  one text, several masks     [[dict, ...], ...]          (one list per mask, in text order)
  several texts               [result of each text]       (a list of one text unwraps, as HF)

`sequence` is the text with the prediction in place, padding removed, decoded without special
tokens when there is one mask and with them (the other masks) when there are several.
"""

from collections.abc import Callable, Sequence

import numpy as np


def _softmax(logits_PV: np.ndarray) -> np.ndarray:
    shifted = logits_PV - logits_PV.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def fill_mask(
    inputs: str | Sequence[str],
    *,
    vocab,
    logits_of: Callable[[list[list[int]]], list[np.ndarray]],
    top_k: int = 5,
):
    """Top-k predictions at the mask tokens of `inputs` (see the module docstring).

    Args:
      inputs: a text or a list of texts, each with at least one mask token.
      vocab: the model's text interface (`tokenizer_export.SentencePieceText` / `TokenizersText`).
      logits_of: id lists -> one (L, V) array of MLM logits per list.
      top_k: predictions per mask, 1 <= top_k <= V.
    """
    texts = [inputs] if isinstance(inputs, str) else list(inputs)
    if not texts:
        raise ValueError("fill_mask needs at least one text, got an empty list")
    mask_token, mask_id = vocab.mask_token, vocab.token_id("mask_token")
    if mask_token is None or mask_id is None:
        raise ValueError("fill_mask needs a vocabulary with a mask token; this one has none")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")
    ids = [vocab.encode(text) for text in texts]
    for text, row in zip(texts, ids, strict=True):
        if mask_id not in row:
            raise ValueError(f"text {text!r} has no mask token {mask_token!r} (id {mask_id})")
    logits = logits_of(ids)
    vocab_size = logits[0].shape[-1]
    if top_k > vocab_size:
        raise ValueError(f"top_k={top_k} exceeds the model's vocabulary of {vocab_size} ids")
    pad_id = vocab.token_id("pad_token")
    results = [
        _predictions(row, logits_LV, vocab=vocab, mask_id=mask_id, pad_id=pad_id, top_k=top_k)
        for row, logits_LV in zip(ids, logits, strict=True)
    ]
    return results[0] if len(results) == 1 else results


def _predictions(ids_L, logits_LV, *, vocab, mask_id, pad_id, top_k):
    ids_L = np.asarray(ids_L)
    positions = np.flatnonzero(ids_L == mask_id)
    probs_PV = _softmax(np.asarray(logits_LV, np.float32)[positions])
    single = len(positions) == 1
    per_mask = []
    for position, probs_V in zip(positions, probs_PV, strict=True):
        best = np.argsort(-probs_V, kind="stable")[:top_k]
        row = []
        for token in best:
            filled = ids_L.copy()
            filled[position] = token
            if pad_id is not None:
                filled = filled[filled != pad_id]
            row.append(
                {
                    "score": float(probs_V[token]),
                    "token": int(token),
                    "token_str": vocab.decode([int(token)]),
                    "sequence": vocab.decode(filled, skip_special_tokens=single),
                }
            )
        per_mask.append(row)
    return per_mask[0] if single else per_mask
