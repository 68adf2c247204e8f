"""BART denoising: sentence permutation and text infilling (Lewis et al., 2019; fairseq).

Tokenized input format (H1's tokenize step): one example per document with
  `sentence_ids`: int ragged [num_sentences, None], the token ids of each sentence, and
  optionally `sentence_word_starts`: ragged of the same shape, 1 where a token begins a word.

`bart_denoising` chains the three steps below; each is usable alone:

1. `pack_sentences`: consecutive sentences packed greedily into blocks of <= max_tokens tokens
   (a longer sentence is cut into pieces first), one example per block.
2. `sentence_permutation`: `targets` = the block, `inputs` = its sentences shuffled.
3. `text_infilling`: spans of `inputs` replaced by one [MASK] each.

Text infilling, as fairseq's `add_whole_word_mask` with `replace_length=1`, except that spans never
overlap, so exactly `budget = ceil(noise_density * units)` units are masked (units are tokens, or
words with `use_word_starts=True`): span lengths are drawn from Poisson(poisson_lambda) until they
sum to the budget, the last one trimmed; the spans are placed among the unmasked units uniformly
at random; each span becomes one [MASK]; a zero-length span inserts a [MASK] (fairseq's
insertion noise). fairseq's 10% random-token replacement of masks (`--mask-random`) is not done.
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

from lmsuite.data import tokenization
from lmsuite.data.preprocessors import lm

# Poisson draws beyond the budget, so that their sum reaches it (P(fail) <= e^{-20 lambda}).
_EXTRA_DRAWS = 20


def sample_span_lengths(*, budget, poisson_lambda: float, seed):
    """Poisson span lengths summing to `budget >= 1`, the last one trimmed: int32 [num_spans].

    Example (budget 7, draws 3 0 5 2 ...): -> [3 0 4].
    """
    draws = tf.random.stateless_poisson([budget + _EXTRA_DRAWS], seed, poisson_lambda, tf.int32)
    ends = tf.cumsum(draws)
    num_spans = tf.reduce_min(tf.where(ends >= budget)) + 1
    lengths = draws[:num_spans]
    previous = tf.reduce_sum(lengths[:-1])
    return tf.concat([lengths[:-1], [budget - previous]], axis=0)


def _infill(tokens, word_starts, *, mask_id, noise_density, poisson_lambda, seed):
    """Text infilling of one token sequence whose units (words) begin where `word_starts`."""
    n_tokens = tf.size(tokens)
    starts = tf.logical_or(tf.cast(word_starts, tf.bool), tf.equal(tf.range(n_tokens), 0))
    unit_begin = tf.cast(tf.where(starts)[:, 0], tf.int32)
    unit_length = tf.concat([unit_begin[1:], [n_tokens]], axis=0) - unit_begin
    n_units = tf.size(unit_begin)
    # float64, so that e.g. ceil(50 * 0.3) is 15 as in Python (float32 gives 16).
    budget = tf.cast(tf.math.ceil(tf.cast(n_units, tf.float64) * noise_density), tf.int32)
    seeds = tf.random.experimental.stateless_split(seed, 2)
    spans = sample_span_lengths(budget=budget, poisson_lambda=poisson_lambda, seed=seeds[0])
    n_spans = tf.size(spans)
    # Slots: the n_units - budget kept units and the spans, in a uniformly random order.
    n_slots = n_units - budget + n_spans
    scores = tf.random.stateless_uniform([n_slots], seed=seeds[1])
    _, span_slots = tf.math.top_k(scores, k=n_spans)
    span_slots = tf.sort(span_slots)
    is_span = tf.scatter_nd(span_slots[:, None], tf.ones([n_spans], tf.bool), [n_slots])
    span_index = tf.cumsum(tf.cast(is_span, tf.int32)) - 1
    units_per_slot = tf.where(is_span, tf.gather(spans, tf.maximum(span_index, 0)), 1)
    first_unit = tf.cumsum(units_per_slot, exclusive=True)
    # A kept unit contributes its tokens; a span contributes one [MASK] (index n_tokens below).
    safe_unit = tf.minimum(first_unit, n_units - 1)
    begin = tf.where(is_span, n_tokens, tf.gather(unit_begin, safe_unit))
    length = tf.where(is_span, 1, tf.gather(unit_length, safe_unit))
    index = tf.ragged.range(begin, begin + length).flat_values
    return tf.gather(tf.concat([tokens, [tf.cast(mask_id, tokens.dtype)]], axis=0), index)


def text_infilling(
    dataset: tf.data.Dataset,
    *,
    mask_id: int,
    noise_density: float = 0.3,
    poisson_lambda: float = 3.0,
    use_word_starts: bool = False,
) -> tf.data.Dataset:
    """Replaces random spans of `inputs` (default: a copy of `targets`) by one [MASK] each.

    With `use_word_starts`, units are words (the `word_starts` feature, aligned with the noised
    feature); otherwise tokens. `targets` is left as it is (the original text).

    Example (units = tokens, budget ceil(0.3 * 8) = 3, spans [2 0 1], M = mask_id):
      {"targets": [a b c d e f g h]} ->
      {"inputs": [a M d e M f M h], "targets": [a b c d e f g h]}
      (b c -> M, an inserted M before f, g -> M)
    """
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density={noise_density}, expected in (0, 1)")
    if poisson_lambda <= 0.0:
        raise ValueError(f"poisson_lambda={poisson_lambda}, expected > 0")

    @seqio.map_over_dataset(num_seeds=1)
    def infill(x, seed):
        source = x["inputs"] if "inputs" in x else x["targets"]
        if use_word_starts:
            if "word_starts" not in x:
                raise ValueError(f"use_word_starts=True but the example has only {sorted(x)}")
            word_starts = x["word_starts"]
        else:
            word_starts = tf.ones_like(source)
        noised = _infill(
            source,
            word_starts,
            mask_id=mask_id,
            noise_density=noise_density,
            poisson_lambda=poisson_lambda,
            seed=seed,
        )
        return {"inputs": noised, "targets": x["targets"]}

    return infill(dataset)


def _shuffled_rows(ragged, order):
    return tf.gather(ragged, order).flat_values


def sentence_permutation(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`targets` = the sentences in order, `inputs` = the same sentences shuffled.

    If `sentence_word_starts` is present, `word_starts` (aligned with `inputs`) is added.

    Example (permutation [2 0 1]): {"sentence_ids": [[1 2] [3] [4 5 6]]} ->
      {"inputs": [4 5 6 1 2 3], "targets": [1 2 3 4 5 6]}
    """

    @seqio.map_over_dataset(num_seeds=1)
    def permute(x, seed):
        sentences = x["sentence_ids"]
        order = tf.argsort(tf.random.stateless_uniform([sentences.nrows()], seed=seed))
        out = {"inputs": _shuffled_rows(sentences, order), "targets": sentences.flat_values}
        if "sentence_word_starts" in x:
            out["word_starts"] = _shuffled_rows(x["sentence_word_starts"], order)
        return out

    return permute(dataset)


def pack_sentences(dataset: tf.data.Dataset, *, max_tokens: int) -> tf.data.Dataset:
    """Packs each document's consecutive sentences greedily into blocks of <= max_tokens.

    A sentence longer than max_tokens is first cut into pieces of max_tokens. Empty sentences
    and documents are dropped.

    Example (max_tokens 4): {"sentence_ids": [[1 2] [3] [4 5 6] [7 8 9 10 11]]} ->
      {"sentence_ids": [[1 2] [3]]}, {"sentence_ids": [[4 5 6]]},
      {"sentence_ids": [[7 8 9 10]]}, {"sentence_ids": [[11]]}
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens}, expected >= 1")
    keys = ("sentence_ids", "sentence_word_starts")

    def cut(r):
        # Pieces of <= max_tokens per sentence: row lengths after splitting every row.
        lengths = r.row_lengths()
        pieces = (lengths + max_tokens - 1) // max_tokens
        piece_row = tf.repeat(tf.range(tf.size(lengths, tf.int64)), pieces)
        piece_rank = tf.range(tf.size(piece_row, tf.int64)) - tf.gather(
            tf.cumsum(pieces, exclusive=True), piece_row
        )
        piece_len = tf.minimum(tf.gather(lengths, piece_row) - piece_rank * max_tokens, max_tokens)
        return tf.RaggedTensor.from_row_lengths(r.flat_values, piece_len)

    def blocks(x):
        pieces = {k: cut(x[k]) for k in keys if k in x}
        block_of = tokenization.passage_ids(
            pieces["sentence_ids"].row_lengths(), max_tokens=max_tokens
        )
        row_lengths = tf.math.bincount(tf.cast(block_of, tf.int32), minlength=0)
        return {
            k: tf.RaggedTensor.from_row_lengths(v, tf.cast(row_lengths, tf.int64))
            for k, v in pieces.items()
        }

    ds = dataset.filter(lambda x: tf.size(x["sentence_ids"].flat_values) > 0)
    ds = ds.map(lambda x: {k: _drop_empty_rows(x[k], x["sentence_ids"]) for k in keys if k in x})
    return ds.map(blocks, num_parallel_calls=tf.data.AUTOTUNE).unbatch()


def _drop_empty_rows(r, reference):
    keep = reference.row_lengths() > 0
    return tf.ragged.boolean_mask(r, keep)


def bart_denoising(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    mask_id: int,
    permute_sentences: bool = True,
    noise_density: float = 0.3,
    poisson_lambda: float = 3.0,
    use_word_starts: bool = False,
) -> tf.data.Dataset:
    """BART's pretraining input: pack, permute sentences, infill text. EOS is left to SeqIO.

    Blocks hold <= `sequence_length["targets"] - 1` tokens (room for EOS); `inputs` are at most
    a few tokens longer only when many zero-length spans are drawn (SeqIO trims them).

    Example (one block, permutation [1 0], span "c d" masked):
      {"sentence_ids": [[a b] [c d e]]} -> {"inputs": [M e a b], "targets": [a b c d e]}
    """
    (targets_length,) = lm._lengths(sequence_length, "targets")
    ds = pack_sentences(dataset, max_tokens=targets_length - 1)
    if permute_sentences:
        ds = sentence_permutation(ds)
    else:
        ds = ds.map(lambda x: _in_order(x))
    return text_infilling(
        ds,
        mask_id=mask_id,
        noise_density=noise_density,
        poisson_lambda=poisson_lambda,
        use_word_starts=use_word_starts,
    )


def _in_order(x):
    out = {"targets": x["sentence_ids"].flat_values}
    if "sentence_word_starts" in x:
        out["word_starts"] = x["sentence_word_starts"].flat_values
    return out
