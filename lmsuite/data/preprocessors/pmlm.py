"""UniLMv2's pseudo-masked LM (PMLM; Bao et al. 2020, arXiv 2002.12804): one row that trains an
autoencoding (AE) and a partially autoregressive (PAR) masked LM in one forward pass.

Masking (the paper's Algorithm 1, "blockwise masking"): blocks are drawn until they cover at
least 15% of the n chunk tokens, `budget = ceil(0.15 * n)`; a block is an n-gram of length
uniform in 2..6 with probability 0.4 and a single token otherwise. The last block is kept whole
(so up to `budget + 5` tokens are masked), trimmed only where it would not fit in the chunk. The
blocks are placed without overlap uniformly at random over the chunk (`unilm.place_units`;
the paper redraws a start until the block lands on unmasked tokens). The factorization order is
a uniformly random permutation of the blocks: each PAR step predicts one block.

Layout: the main sequence `[CLS] x [SEP]` with every masked token replaced by [M] (the AE
inputs: they see the whole main sequence), then, for each step in the factorization order, one
pseudo token [P] per token of its block followed by a copy of the block's original tokens. A
pseudo or copied token carries the position id of the token it stands for.

Replacement: each masked token's [P] follows BERT's 80/10/10 (one uniform draw: [P] with
probability 0.8, a random ordinary piece with 0.1, the original with 0.1), as the released
UniLMv2 code treats its pseudo tokens (microsoft/unilm `s2s-ft`, the pseudo-masking fine-tuning
`mask_way='v2'`: `get_masked_token` with `keep_prob` = `random_prob` = 0.1). The paper's text
does not say. A kept [P] shows its own target to itself and to the [P] queries of its block,
as a kept pseudo token does in that code when a span shares its span id. Every masked token
stays [M] in the main sequence: the [P] queries of every step see the whole main sequence (the
paper's "conventional masks provide global masking information"), so a token kept there would
show earlier steps a later block's original, which the factorization forbids.
`replace_main=True` lets the same draw decide the main-sequence token too (so [M], the random
piece or the original stand in both places; the released code's corrupted target tokens take
their pseudo token's value likewise, but only later spans see them there). With
`mask_fraction=1.0, random_fraction=0.0` every masked token is [M] and [P] (lmsuite's rows
before 2026-12-05; docs/research/encoder_twins.md compares the three).

The attention mask is not a feature: the model side builds it (`lmsuite.objectives.pmlm`) from
two small per-token features, `pmlm_step` (0 on the main sequence and padding, k on the tokens
appended for the k-th step) and `pmlm_pseudo` (1 on [P] tokens). Main-sequence queries see the
main sequence; the [P] tokens of step k see the main sequence, the copied originals of steps
before k and the [P] tokens of step k; the copied originals of step k see the main sequence and
the copied originals of steps up to k.

The AE predictions (`masked_positions`/`masked_ids`/`masked_weights`) are listed in the
factorization order, so `pseudo_positions[i]`, the index of the [P] token that predicts the same
token, is aligned with `masked_ids[i]`: the PAR targets are the AE targets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import lm, mlm
from lmsuite.data.preprocessors.unilm import place_units, shuffle_units

MASK_RATE = 0.15
SPAN_RATE = 0.4
MIN_SPAN, MAX_SPAN = 2, 6
FEATURES = ("position_ids", "pmlm_step", "pmlm_pseudo")  # per token, [L]
PSEUDO_POSITIONS = "pseudo_positions"  # per prediction, [P]


def masked_budget(n: int, mask_rate: float = MASK_RATE) -> int:
    """Algorithm 1's stopping point: blocks are drawn until they cover this many of n tokens."""
    return max(1, math.ceil(round(mask_rate * n, 6)))


def max_masked(n: int, mask_rate: float = MASK_RATE) -> int:
    """The most tokens blocks can cover in a chunk of n (the last block may overshoot)."""
    return min(n, masked_budget(n, mask_rate) + MAX_SPAN - 1)


def chunk_length(length: int, predictions: int) -> int:
    """Tokens per chunk in a row of `length` holding [CLS] chunk [SEP] + 2 x `predictions`."""
    return length - 2 - 2 * predictions


def default_predictions(length: int) -> int:
    """The smallest prediction width P whose row layout fits every example of a `length` row.

    Example: 128 -> 19 (88-token chunks: at most ceil(0.15 * 88) + 5 = 19 masked tokens).
    """
    for predictions in range(1, length // 2):
        n = chunk_length(length, predictions)
        if n >= 1 and max_masked(n) <= predictions:
            return predictions
    raise ValueError(f"input_ids length {length} leaves no room for a PMLM chunk")


def sample_blocks(*, rows, budget, n, seed):
    """Int32 [rows, budget]: each row's block lengths in draw order, drawn until their sum
    reaches `budget` (the last trimmed only to keep the sum <= n), zeros after.

    Example (budget 3, n 20): draws [1, 4, 1] -> [1, 4, 0].
    """
    draw_seeds = tf.random.experimental.stateless_split(seed, 2)
    is_span = tf.random.stateless_uniform([rows, budget], draw_seeds[0]) < SPAN_RATE
    span = tf.random.stateless_uniform(
        [rows, budget], draw_seeds[1], minval=MIN_SPAN, maxval=MAX_SPAN + 1, dtype=tf.int32
    )
    draws = tf.where(is_span, span, 1)
    before = tf.cumsum(draws, axis=1, exclusive=True)
    return tf.where(before < budget, tf.minimum(draws, n - before), 0)


def _replacements(originals, *, seed, spec: mlm.MlmSpec, pseudo_id: int, replace_main: bool):
    """The main-sequence and [P] values of the masked tokens `originals` (in any order): BERT's
    replacement (`mlm.apply_replacements`, one draw each) gives [P] where it gives [M], else the
    random piece or the original; the main sequence shows [M], or with `replace_main` what the
    same draw gave (the same random piece).

    Example (mask_fraction 0.8, random_fraction 0.1): originals [17, 18, 19], draws 0.3, 0.85,
    0.95, random piece 40 -> pseudo [P, 40, 19]; main [M, M, M], with replace_main
    [M, 40, 19].
    """
    corrupted = mlm.apply_replacements(
        originals, tf.ones_like(originals, tf.bool), seed=seed, spec=spec
    )
    masked = corrupted == spec.mask_id  # an original or a random piece is never [M]
    pseudo = tf.where(masked, tf.cast(pseudo_id, originals.dtype), corrupted)
    mask = tf.fill(tf.shape(originals), tf.cast(spec.mask_id, originals.dtype))
    return (corrupted if replace_main else mask), pseudo


def pmlm_rows(
    tokens, *, seed, cls_id, sep_id, pseudo_id, spec: mlm.MlmSpec, replace_main: bool = False
):
    """PMLM features for chunks `tokens` [R, n] (n >= 1; see `pmlm` for the example): the
    per-token features ragged [R, None], the per-prediction ones [R, P]. `spec` gives [M]
    (`mask_id`), the width P `max_predictions` and the replacement fractions. The rows draw
    from the one `seed`, each its own numbers."""
    max_predictions = spec.max_predictions
    seeds = tf.random.experimental.stateless_split(seed, 5)
    rows, n = tf.shape(tokens)[0], tf.shape(tokens)[1]
    budget = tf.cast(tf.math.ceil(MASK_RATE * tf.cast(n, tf.float32) - 1e-4), tf.int32)
    budget = tf.clip_by_value(budget, 1, n)
    blocks = sample_blocks(rows=rows, budget=budget, n=n, seed=seeds[0])  # [R, B]
    # The last block drawn (the one that reaches the budget) is likelier long than the others:
    # placed in any order, so that it does not always sit rightmost.
    blocks = shuffle_units(units=blocks, seed=seeds[4])
    masked = tf.reduce_sum(blocks, axis=1)
    num_blocks = tf.reduce_sum(tf.cast(blocks > 0, tf.int32), axis=1)
    checks = [
        tf.debugging.assert_less_equal(
            masked, max_predictions, message="PMLM: more masked tokens than max_predictions"
        )
    ]
    # place_units lays the blocks out left to right in that order: the k-th masked chunk
    # position of a row belongs to the block whose cumulative length first exceeds k.
    chosen = place_units(n=n, units=blocks, seed=seeds[1])  # [R, n]
    rank = tf.cumsum(tf.cast(chosen, tf.int32), axis=1, exclusive=True)
    block_of = tf.searchsorted(tf.cumsum(blocks, axis=1), rank, side="right")

    # The factorization order, a uniform permutation of each row's blocks: step -> block.
    block = tf.range(tf.shape(blocks)[1])[None, :]
    keys = tf.random.stateless_uniform(tf.shape(blocks), seeds[2])
    order = tf.argsort(tf.where(block < num_blocks[:, None], keys, 2.0), axis=1)
    step_of_block = tf.argsort(order, axis=1)
    step = tf.gather(step_of_block, tf.minimum(block_of, tf.shape(blocks)[1] - 1), batch_dims=1)
    # Masked chunk positions by step, left to right within a block; the unmasked after them.
    key = tf.where(chosen, step * n, tf.shape(blocks)[1] * n) + tf.range(n)[None, :]
    with tf.control_dependencies(checks):
        by_step = tf.RaggedTensor.from_tensor(tf.argsort(key, axis=1), lengths=masked)
    row = tf.cast(by_step.value_rowids(), tf.int32)
    chunk_positions = by_step.flat_values  # flat over the rows' masked tokens
    step = tf.gather_nd(step, tf.stack([row, chunk_positions], 1))
    positions = 1 + chunk_positions  # in [CLS] chunk [SEP]
    originals = tf.gather_nd(tokens, tf.stack([row, chunk_positions], 1))
    step_lengths = tf.gather(blocks, order, batch_dims=1)
    step_starts = tf.cumsum(step_lengths, axis=1, exclusive=True)
    at_step = tf.stack([row, step], 1)
    start = tf.gather_nd(step_starts, at_step)  # masked tokens of the row's earlier steps
    index = tf.range(tf.size(row)) - tf.gather(tf.cast(by_step.row_starts(), tf.int32), row)
    # The steps before take 2 x `start` appended slots; this token is `index - start` into its
    # block, whose [P]s come first.
    pseudo_slot = start + index
    copy_slot = pseudo_slot + tf.gather_nd(step_lengths, at_step)

    main_length = n + 2
    appended_lengths = 2 * masked

    def row_of(main, pseudo_values, copy_values):
        """[R, None]: `main` [R, n + 2], then each row's [P] and copied slots."""
        slots = tf.concat([pseudo_slot, copy_slot], 0)
        indices = tf.stack([tf.concat([row, row], 0), slots], 1)
        values = tf.concat([pseudo_values, copy_values], 0)
        appended = tf.scatter_nd(indices, tf.cast(values, tf.int32), [rows, 2 * max_predictions])
        appended = tf.RaggedTensor.from_tensor(appended, lengths=appended_lengths)
        return tf.concat([tf.RaggedTensor.from_tensor(main), appended], axis=1)

    main = tf.concat([tf.fill([rows, 1], cls_id), tokens, tf.fill([rows, 1], sep_id)], axis=1)
    main_values, pseudo_values = _replacements(
        originals, seed=seeds[3], spec=spec, pseudo_id=pseudo_id, replace_main=replace_main
    )
    main = tf.tensor_scatter_nd_update(main, tf.stack([row, positions], 1), main_values)
    ones = tf.ones_like(row)
    zeros = tf.zeros([rows, main_length], tf.int32)

    def predictions(values, dtype=tf.int32):
        return by_step.with_flat_values(tf.cast(values, dtype)).to_tensor(
            shape=[rows, max_predictions]
        )

    return {
        "input_ids": row_of(main, pseudo_values, originals),
        "position_ids": row_of(
            tf.tile(tf.range(main_length)[None, :], [rows, 1]), positions, positions
        ),
        "pmlm_step": row_of(zeros, step + 1, step + 1),
        "pmlm_pseudo": row_of(zeros, ones, 0 * ones),
        "masked_positions": predictions(positions),
        "masked_ids": predictions(originals),
        "masked_weights": predictions(ones, tf.float32),
        PSEUDO_POSITIONS: predictions(main_length + pseudo_slot),
    }


def pmlm(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    cls_id: int,
    sep_id: int,
    mask_id: int,
    pseudo_id: int,
    vocab_size: int,
    special_ids: Sequence[int],
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
    replace_main: bool = False,
) -> tf.data.Dataset:
    """PMLM rows from the concatenated stream of `targets` documents.

    `sequence_length` {"input_ids": L, "masked_ids": P} (P defaults to `default_predictions(L)`)
    sets the row: chunks of `chunk_length(L, P)` tokens, so that [CLS] chunk [SEP] and the 2 x P
    appended slots fit L. Output features (unpadded rows of n + 2 + 2m tokens for m masked):
    input_ids, position_ids, pmlm_step, pmlm_pseudo; masked_positions / masked_ids /
    masked_weights and pseudo_positions, padded to P. A masked token's [P] is kept or replaced by
    a random id (drawn from the ids outside `special_ids`, [M] and [P]) by `mask_fraction` and
    `random_fraction` (BERT's 0.8 and 0.1); its main-sequence token too with `replace_main`
    (see the module docstring).

    Example (chunk [a b c d e f], blocks {b} and {d e}, factorization order {d e} then {b},
    every draw below 0.8; M = mask_id, Q = pseudo_id):
      -> {"input_ids":    [CLS a M c M M f SEP  Q Q d e  Q b],
          "position_ids": [0   1 2 3 4 5 6 7    4 5 4 5  2 2],
          "pmlm_step":    [0   0 0 0 0 0 0 0    1 1 1 1  2 2],
          "pmlm_pseudo":  [0   0 0 0 0 0 0 0    1 1 0 0  1 0],
          "masked_positions": [4 5 2 0 ...], "masked_ids": [d e b 0 ...],
          "masked_weights": [1 1 1 0 ...], "pseudo_positions": [8 9 12 0 ...]}

    Raises:
      ValueError: when P is too small for the masked tokens a chunk of that length can get.
    """
    (length,) = lm._lengths(sequence_length, "input_ids")
    predictions = sequence_length.get("masked_ids")
    predictions = default_predictions(length) if predictions is None else int(predictions)
    n = chunk_length(length, predictions)
    if n < 1 or max_masked(n) > predictions:
        raise ValueError(
            f"sequence_length {dict(sequence_length)}: chunks of {max(n, 0)} tokens get up to "
            f"{max_masked(max(n, 1))} masked tokens, more than masked_ids = {predictions}; "
            f"use masked_ids = {default_predictions(length)}"
        )
    spec = mlm.MlmSpec(
        mask_id=mask_id,
        vocab_size=vocab_size,
        special_ids=(*special_ids, pseudo_id),
        max_predictions=predictions,
        mask_fraction=mask_fraction,
        random_fraction=random_fraction,
    )
    batches = lm.chunk_stream_batches(dataset, chunk_length=n, min_chunk_length=1)

    # One seed per batch of chunks: the rows are built together and then flattened.
    @seqio.map_over_dataset(num_seeds=1)
    def make(tokens, seed):
        return pmlm_rows(
            tokens,
            seed=seed,
            cls_id=cls_id,
            sep_id=sep_id,
            pseudo_id=pseudo_id,
            spec=spec,
            replace_main=replace_main,
        )

    return make(batches).unbatch()
