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

from lmsuite.data.preprocessors import lm, sentence_pairs

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


def sample_units(*, rows, budget, seed):
    """Int32 [rows, budget]: each row's unit lengths (1, 2 or 3 by `NGRAM_PROBABILITIES`) in
    draw order, drawn until they reach `budget`, the last one trimmed to it, zeros after.

    Example (budget 5): draws [3, 1, 3, 2, 1] -> [3, 1, 1, 0, 0].
    """
    logits = tf.math.log([NGRAM_PROBABILITIES])
    draws = tf.random.stateless_categorical(logits, rows * budget, seed, dtype=tf.int32) + 1
    draws = tf.reshape(draws, [rows, budget])
    before = tf.cumsum(draws, axis=1, exclusive=True)
    return tf.where(before < budget, tf.minimum(draws, budget - before), 0)


def shuffle_units(*, units, seed):
    """`units` [rows, U] (zeros after each row's last) with each row's units in a uniformly
    random order, zeros still after.

    Units are drawn until they reach a budget, so the last one drawn is not like the others
    (trimmed here, size-biased in UniLMv2's blocks); placed in draw order it would always be
    the rightmost, and the positions near a chunk's end would be masked more or less often
    than those near its start.

    Example: [[3, 1, 2, 0]] -> one of [[3, 1, 2, 0]], [[2, 3, 1, 0]], ... (6 orders).
    """
    slot = tf.range(tf.shape(units)[1])[None, :]
    num_units = tf.reduce_sum(tf.cast(units > 0, tf.int32), axis=1, keepdims=True)
    keys = tf.where(slot < num_units, tf.random.stateless_uniform(tf.shape(units), seed), 2.0)
    return tf.gather(units, tf.argsort(keys, axis=1), batch_dims=1)


def place_units(*, n, units, seed):
    """Bool [rows, n]: each row's `units` (lengths [rows, U], zeros after its last) placed
    without overlap, every layout that keeps their order equally likely (`shuffle_units`
    first makes every layout of the units equally likely).

    A row with u units covering b positions has n - b + u slots: its u units and n - b single
    unmasked positions. The units take u of the slots chosen uniformly (the slots with the u
    largest uniforms), in order.

    Example (n 5, units [[2, 1]]): 4 slots; units in slots 0 and 2 -> [T T F T F].
    """
    rows = tf.shape(units)[0]
    num_units = tf.reduce_sum(tf.cast(units > 0, tf.int32), axis=1)
    num_slots = n - tf.reduce_sum(units, axis=1) + num_units
    slot = tf.range(n)[None, :]
    valid = slot < num_slots[:, None]
    draws = tf.random.stateless_uniform([rows, n], seed)
    # Rank 0 for the largest uniform; slots past a row's last come after all of its slots.
    rank = tf.argsort(tf.argsort(tf.where(valid, -draws, 2.0), axis=1), axis=1)
    is_unit = rank < num_units[:, None]
    unit_index = tf.maximum(tf.cumsum(tf.cast(is_unit, tf.int32), axis=1) - 1, 0)
    width = tf.where(is_unit, tf.gather(units, unit_index, batch_dims=1), 1)
    ends = tf.cumsum(tf.where(valid, width, 0), axis=1)
    # Position p lies in the first slot ending after it.
    slot_of = tf.searchsorted(ends, tf.tile(slot, [rows, 1]), side="right")
    return tf.gather(is_unit, slot_of, batch_dims=1)


def unilm_rows(
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
    """UniLM features for chunks `tokens` [R, n] (n >= 2; see `unilm` for the example): the
    1-D features are ragged [R, None], the others [R, max_predictions] and [R]. The rows draw
    from the one `seed`, each its own numbers."""
    seeds = tf.random.experimental.stateless_split(seed, 7)
    rows, n = tf.shape(tokens)[0], tf.shape(tokens)[1]
    mode = tf.random.stateless_categorical(
        tf.math.log([list(mode_probabilities)]), rows, seeds[0], dtype=tf.int32
    )[0]
    pair = (mode == BIDIRECTIONAL) | (mode == SEQ2SEQ)
    split = tf.random.stateless_uniform([rows], seeds[1], minval=1, maxval=n, dtype=tf.int32)
    split = tf.where(pair, split, n)
    framed = sentence_pairs._framed(
        tf.reshape(tokens, [-1]),
        None,
        first=tf.range(rows) * n,
        first_length=split,
        second=tf.range(rows) * n + split,
        second_length=n - split,
        cls_id=cls_id,
        sep_id=sep_id,
    )
    ids = framed["input_ids"]
    mode_types = tf.gather(tf.constant(MODE_TOKEN_TYPES, tf.int32), mode)
    types = framed["token_type_ids"]
    types = types.with_flat_values(
        tf.gather(
            tf.reshape(mode_types, [-1]),
            2 * tf.cast(types.value_rowids(), tf.int32) + types.flat_values,
        )
    )

    budget = tf.cast(tf.round(mask_rate * tf.cast(n, tf.float32)), tf.int32)
    budget = tf.clip_by_value(budget, 1, max_predictions)
    units = sample_units(rows=rows, budget=budget, seed=seeds[2])
    units = shuffle_units(units=units, seed=seeds[6])  # the trimmed last unit anywhere
    chosen = place_units(n=n, units=units, seed=seeds[3])
    # Every row has exactly `budget` chosen positions, listed in increasing order.
    chunk_positions = tf.reshape(tf.cast(tf.where(chosen)[:, 1], tf.int32), [rows, budget])
    # Chunk position p sits at 1 + p in a row, one further once past the middle [SEP].
    positions = 1 + chunk_positions + tf.cast(chunk_positions >= split[:, None], tf.int32)
    originals = tf.gather(tokens, chunk_positions, batch_dims=1)
    draw = tf.random.stateless_uniform([rows, budget], seeds[4])
    pick = tf.random.stateless_uniform(
        [rows, budget], seeds[5], maxval=tf.size(replacement_ids), dtype=tf.int32
    )
    replaced = tf.where(draw < 0.8, mask_id, originals)
    replaced = tf.where((draw >= 0.8) & (draw < 0.9), tf.gather(replacement_ids, pick), replaced)
    flat = positions + tf.cast(ids.row_starts(), tf.int32)[:, None]
    ids = ids.with_flat_values(
        tf.tensor_scatter_nd_update(
            ids.flat_values, tf.reshape(flat, [-1, 1]), tf.reshape(replaced, [-1])
        )
    )
    pad = [[0, 0], [0, max_predictions - budget]]
    return {
        "input_ids": ids,
        "token_type_ids": types,
        "masked_positions": tf.pad(positions, pad),
        "masked_ids": tf.pad(originals, pad),
        "masked_weights": tf.pad(tf.ones([rows, budget], tf.float32), pad),
        "unilm_mode": mode,
        "source_length": tf.where(pair, split + 2, 0),
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

    # One seed per batch of chunks: the rows are built together and then flattened.
    @seqio.map_over_dataset(num_seeds=1)
    def make(tokens, seed):
        return unilm_rows(
            tokens,
            seed=seed,
            cls_id=cls_id,
            sep_id=sep_id,
            mask_id=mask_id,
            replacement_ids=replacement_ids,
            max_predictions=max_predictions,
            mode_probabilities=mode_probabilities,
        )

    return make(batches).unbatch()
