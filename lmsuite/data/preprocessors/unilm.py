"""UniLM: one masked-LM encoder trained under four self-attention masks (Dong et al., 2019).

Each example draws a mode: bidirectional (BERT), left-to-right, right-to-left or seq2seq, with
the paper's rates 1/3, 1/6, 1/6, 1/3 ("1/3 of the time bidirectional, 1/3 seq2seq, and both
left-to-right and right-to-left with rate 1/6"). The model builds the attention mask from the
`unilm_mode` and `source_length` features; `unilm_attention_mask` builds it here too (tf only).

Layout: bidirectional and seq2seq examples are a segment pair `[CLS] A [SEP] B [SEP]` (the chunk
split at a uniformly random point); unidirectional examples are one segment `[CLS] X [SEP]`.
Token types tell the modes apart, as UniLM's released code (microsoft/unilm unilm-v1,
`--new_segment_ids`: seq2seq_loader.py and the type-embedding init in modeling.py, type vocab
of 6): bidirectional 0 for `[CLS] A [SEP]` and 1 after, left-to-right 2 throughout,
right-to-left 3 throughout, seq2seq 4 for the source `[CLS] A [SEP]` and 5 for the target
`B [SEP]`. A model reading them needs type_vocab_size >= 6 (`TYPE_VOCAB_SIZE`).

Masking, as the paper: `budget = min(max_predictions, max(1, round(0.15 * n)))` of the n chunk
tokens are predicted ([CLS]/[SEP] never); the predicted tokens form units that are a unigram with
probability 0.8 and a bigram or a trigram with 0.1 each, placed without overlap uniformly at
random over the chunk tokens (the last unit trimmed to the budget; a unit is counted over the
chunk tokens, so one may straddle the middle [SEP]); each predicted token becomes [MASK] with
probability 0.8, a random id with 0.1 and stays itself with 0.1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import lm

BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ = 0, 1, 2, 3
MODE_PROBABILITIES = (1 / 3, 1 / 6, 1 / 6, 1 / 3)
NGRAM_PROBABILITIES = (0.8, 0.1, 0.1)
# (type of [CLS] A [SEP], type of the rest) per mode, indexed by the mode ids above.
MODE_TOKEN_TYPES = ((0, 1), (2, 2), (3, 3), (4, 5))
TYPE_VOCAB_SIZE = 6


def unilm_attention_mask(*, mode, length, source_length=0):
    """Bool [length, length]: entry (i, j) is True when query i may attend to key j.

    Example (mode SEQ2SEQ, length 5, source_length 2), rows are queries:
      [[1 1 0 0 0]
       [1 1 0 0 0]
       [1 1 1 0 0]
       [1 1 1 1 0]
       [1 1 1 1 1]]
    Bidirectional is all ones, left-to-right lower-triangular, right-to-left upper-triangular.
    """
    i = tf.range(length)[:, None]
    j = tf.range(length)[None, :]
    source = j < source_length
    masks = tf.stack(
        [
            tf.ones([length, length], tf.bool),
            j <= i,
            j >= i,
            tf.logical_or(source, tf.logical_and(j <= i, i >= source_length)),
        ]
    )
    return tf.gather(masks, mode)


def _sample_units(*, budget, seed):
    """Unit lengths (1, 2 or 3) summing to `budget`, the last one trimmed."""
    logits = tf.math.log([NGRAM_PROBABILITIES])
    draws = tf.random.stateless_categorical(logits, budget, seed, dtype=tf.int32)[0] + 1
    ends = tf.cumsum(draws)
    num_units = tf.reduce_min(tf.where(ends >= budget)) + 1
    units = draws[:num_units]
    return tf.concat([units[:-1], [budget - tf.reduce_sum(units[:-1])]], axis=0)


def place_units(*, n, units, seed):
    """Bool [n]: `units` (lengths) placed without overlap uniformly among n positions."""
    budget = tf.reduce_sum(units)
    num_units = tf.size(units)
    num_slots = n - budget + num_units
    _, unit_slots = tf.math.top_k(tf.random.stateless_uniform([num_slots], seed), k=num_units)
    is_unit = tf.scatter_nd(
        tf.sort(unit_slots)[:, None], tf.ones([num_units], tf.bool), [num_slots]
    )
    unit_index = tf.maximum(tf.cumsum(tf.cast(is_unit, tf.int32)) - 1, 0)
    width = tf.where(is_unit, tf.gather(units, unit_index), 1)
    first = tf.cumsum(width, exclusive=True)
    masked = tf.ragged.range(
        tf.boolean_mask(first, is_unit), tf.boolean_mask(first + width, is_unit)
    )
    return tf.scatter_nd(masked.flat_values[:, None], tf.ones([budget], tf.bool), [n])


def unilm_example(
    tokens,
    *,
    seed,
    cls_id,
    sep_id,
    mask_id,
    replacement_ids,
    max_predictions,
    mode_probabilities=MODE_PROBABILITIES,
    mask_rate=0.15,
):
    """UniLM features for one chunk of >= 2 token ids (see `unilm` for the example)."""
    seeds = tf.random.experimental.stateless_split(seed, 6)
    n = tf.size(tokens)
    mode = tf.random.stateless_categorical(
        tf.math.log([list(mode_probabilities)]), 1, seeds[0], dtype=tf.int32
    )[0, 0]
    pair = tf.logical_or(tf.equal(mode, BIDIRECTIONAL), tf.equal(mode, SEQ2SEQ))
    split = tf.random.stateless_uniform([], seeds[1], minval=1, maxval=n, dtype=tf.int32)
    split = tf.where(pair, split, n)
    cls, sep = tf.constant([cls_id], tokens.dtype), tf.constant([sep_id], tokens.dtype)
    middle = tf.cond(pair, lambda: sep, lambda: sep[:0])
    ids = tf.concat([cls, tokens[:split], middle, tokens[split:], sep], axis=0)
    source_length = tf.where(pair, split + 2, 0)
    in_second = tf.range(tf.size(ids)) >= tf.where(pair, split + 2, tf.size(ids))
    mode_types = tf.gather(tf.constant(MODE_TOKEN_TYPES, tf.int32), mode)
    types = tf.where(in_second, mode_types[1], mode_types[0])

    budget = tf.cast(tf.round(mask_rate * tf.cast(n, tf.float32)), tf.int32)
    budget = tf.clip_by_value(budget, 1, max_predictions)
    chosen = place_units(n=n, units=_sample_units(budget=budget, seed=seeds[2]), seed=seeds[3])
    chunk_positions = tf.cast(tf.where(chosen)[:, 0], tf.int32)
    # Chunk position p sits at 1 + p in `ids`, one further once past the middle [SEP].
    positions = (
        1 + chunk_positions + tf.cast(tf.logical_and(pair, chunk_positions >= split), tf.int32)
    )
    originals = tf.gather(ids, positions)
    draw = tf.random.stateless_uniform([budget], seeds[4])
    pick = tf.random.stateless_uniform(
        [budget], seeds[5], maxval=tf.size(replacement_ids), dtype=tf.int32
    )
    replaced = tf.where(draw < 0.8, tf.cast(mask_id, ids.dtype), originals)
    replaced = tf.where(
        tf.logical_and(draw >= 0.8, draw < 0.9),
        tf.cast(tf.gather(replacement_ids, pick), ids.dtype),
        replaced,
    )
    ids = tf.tensor_scatter_nd_update(ids, positions[:, None], replaced)
    pad = max_predictions - budget
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "masked_positions": tf.pad(positions, [[0, pad]]),
        "masked_ids": tf.pad(originals, [[0, pad]]),
        "masked_weights": tf.pad(tf.ones([budget], tf.float32), [[0, pad]]),
        "unilm_mode": mode,
        "source_length": source_length,
    }


def unilm(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    cls_id: int,
    sep_id: int,
    mask_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    max_predictions: int | None = None,
    mode_probabilities: Sequence[float] = MODE_PROBABILITIES,
) -> tf.data.Dataset:
    """UniLM examples from the concatenated stream of `targets` documents.

    Chunks hold `sequence_length["targets"] - 3` tokens, so that `input_ids` fit the length.
    `max_predictions` defaults to round(0.15 * that). Random replacements are drawn uniformly
    from the ids in [0, vocab_size) that are not in `special_ids`.

    Output features: input_ids, token_type_ids, masked_positions / masked_ids / masked_weights
    (padded to max_predictions), unilm_mode (0 bidirectional, 1 left-to-right, 2 right-to-left,
    3 seq2seq) and source_length (length of `[CLS] A [SEP]` for the pair modes, 0 otherwise).

    Example (seq2seq, chunk [a b c d e], split after b, c masked, M = mask_id):
      -> {"input_ids": [CLS a b SEP M d e SEP], "token_type_ids": [4 4 4 4 5 5 5 5],
          "masked_positions": [4 0 ...], "masked_ids": [c 0 ...], "masked_weights": [1 0 ...],
          "unilm_mode": 3, "source_length": 4}
    """
    if len(mode_probabilities) != 4 or abs(sum(mode_probabilities) - 1.0) > 1e-6:
        raise ValueError(f"mode_probabilities={mode_probabilities}, expected 4 rates summing to 1")
    (length,) = lm._lengths(sequence_length, "targets")
    if length < 5:
        raise ValueError(f"targets length {length} too short for [CLS] A [SEP] B [SEP]")
    if max_predictions is None:
        max_predictions = max(1, round(0.15 * (length - 3)))
    replacement_ids = np.setdiff1d(np.arange(vocab_size), np.asarray(special_ids, np.int64))
    if replacement_ids.size == 0:
        raise ValueError(f"special_ids={special_ids} leave no replacement ids in [0, {vocab_size})")
    replacement_ids = tf.constant(replacement_ids, tf.int32)
    batches = lm.chunk_stream_batches(dataset, chunk_length=length - 3, min_chunk_length=2)

    @seqio.map_over_dataset(num_seeds=1)
    def make(tokens, seed):
        return unilm_example(
            tokens,
            seed=seed,
            cls_id=cls_id,
            sep_id=sep_id,
            mask_id=mask_id,
            replacement_ids=replacement_ids,
            max_predictions=max_predictions,
            mode_probabilities=mode_probabilities,
        )

    return make(batches.unbatch())
