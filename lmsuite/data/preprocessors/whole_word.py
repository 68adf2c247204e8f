"""Whole-word masking: predict every piece of a chosen word (or of any multi-token unit).

Units are runs of maskable tokens that begin where `word_starts` is 1 (or right after a
non-maskable token). BERT's whole-word rule: visit the units in a random order and take a unit
whole when it fits in the remaining budget, else skip it and try the next; stop at the budget.
The budget is BERT's (see `mlm.prediction_budget`), counted in tokens, so a sequence may end a
few tokens short of it when the remaining units are all too long. Each token of a chosen unit
gets its own 80/10/10 draw, as in BERT's create_pretraining_data.py.

The same unit machinery (`unit_index`, `greedy_fit`) serves Chinese whole-word masking (units =
segmented words) and ERNIE's phrase / entity masking, which selects units independently rather
than by this budget (see `ernie.py`).
"""

from __future__ import annotations

import tensorflow as tf

from lmsuite.data.preprocessors import mlm

WORD_STARTS_KEY = "word_starts"


def unit_index(maskable: tf.Tensor, unit_starts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-token unit number (-1 for non-maskable tokens) and the number of units, of a row
    [L] or of each row of a group [..., L] (numbers [..., L], counts [...]).

    A unit starts at a maskable token flagged in `unit_starts` or following a non-maskable one.

    Example: maskable [F, T, T, T, F, T], unit_starts [1, 1, 0, 1, 1, 0]
    -> ([-1, 0, 0, 1, -1, 2], 3).
    """
    previous_maskable = tf.concat([tf.zeros_like(maskable[..., :1]), maskable[..., :-1]], -1)
    starts = maskable & (tf.cast(unit_starts, tf.bool) | ~previous_maskable)
    number = tf.cumsum(tf.cast(starts, tf.int32), axis=-1) - 1
    return tf.where(maskable, number, -1), tf.reduce_sum(tf.cast(starts, tf.int32), axis=-1)


def unit_lengths(index: tf.Tensor, num_units: tf.Tensor) -> tf.Tensor:
    """Tokens per unit, int32 [num_units]. Example: index [-1, 0, 0, 1] -> [2, 1]."""
    valid = index >= 0
    return tf.math.unsorted_segment_sum(
        tf.cast(valid, tf.int32), tf.where(valid, index, num_units), num_units + 1
    )[:num_units]


def greedy_fit(lengths: tf.Tensor, budget: tf.Tensor) -> tf.Tensor:
    """Bool mask over `lengths` (in visiting order): take each one that still fits the budget.

    Example: lengths [3, 2, 4, 1], budget 6 -> [T, T, F, T] (4 skipped, 1 still fits).

    BERT's rule is a loop over every unit; a `tf.scan` of it ran once per unit (about a
    hundred per 128-token row) and was most of a whole-word row's input CPU. The same result
    without it: a unit longer than the whole budget is never taken; of the others, those before
    the first that overflows the budget are taken together (a cumulative sum), then each later
    one that fits the rest is found by a vectorized search, one loop turn per unit taken: a few
    at most, since the rest is then smaller than the unit that overflowed, and none when every
    unit fits (ERNIE's independent selection, which passes int32's maximum for the units it
    never takes). Lengths must be >= 0. A group [..., U] (one budget, or one per row) is
    fitted row by row, in one loop that turns until its busiest row is done.
    """
    lengths = tf.convert_to_tensor(lengths)
    budget = tf.cast(budget, lengths.dtype)  # scalar, or one per row of a group [..., U]
    eligible = lengths <= budget[..., None]
    counted = tf.where(eligible, lengths, 0)  # each <= budget: the sums cannot overflow
    # A prefix of each row's eligible units.
    leading = eligible & (tf.cumsum(counted, axis=-1) <= budget[..., None])
    remaining = budget - tf.reduce_sum(tf.where(leading, counted, 0), axis=-1)
    size = tf.shape(lengths)[-1]
    positions = tf.range(size)
    batch_dims = lengths.shape.rank - 1

    def next_fit(remaining, start):
        """The first position >= `start` whose unit fits `remaining`; `size` if none."""
        fits = eligible & (positions >= start[..., None]) & (counted <= remaining[..., None])
        return tf.minimum(tf.reduce_min(tf.where(fits, positions, size), axis=-1), size)

    def take(remaining, taken, at):
        # A row of a group that is done (at == size) takes nothing and stays done.
        taken |= tf.equal(positions, at[..., None])
        remaining -= tf.gather(counted, tf.minimum(at, size - 1), batch_dims=batch_dims)
        return remaining, taken, next_fit(remaining, at + 1)

    # The first unit not taken together: every eligible one after it is tried in turn.
    overflow = tf.reduce_min(tf.where(eligible & ~leading, positions, size), axis=-1)
    _, taken, _ = tf.while_loop(
        lambda remaining, taken, at: tf.reduce_any(at < size),
        take,
        (remaining, leading, next_fit(remaining, overflow)),
    )
    return taken


def choose_units(
    maskable: tf.Tensor, unit_starts: tf.Tensor, budget: tf.Tensor, *, seed: tf.Tensor
) -> tf.Tensor:
    """Bool [L]: whole units chosen in random order by BERT's fit-or-skip rule."""
    index, num_units = unit_index(maskable, unit_starts)
    lengths = unit_lengths(index, num_units)
    order = tf.argsort(tf.random.stateless_uniform([num_units], seed), stable=True)
    taken_in_order = greedy_fit(tf.gather(lengths, order), budget)
    taken = tf.scatter_nd(order[:, None], taken_in_order, [num_units])
    return maskable & tf.gather(
        tf.concat([taken, [False]], 0), tf.where(index >= 0, index, num_units)
    )


def mask_whole_words(
    features: mlm.Features,
    *,
    seed: tf.Tensor,
    spec: mlm.MlmSpec,
    unit_starts_key: str = WORD_STARTS_KEY,
) -> mlm.Features:
    """Whole-word masking of one example.

    Input: `input_ids` int [L] and `word_starts` int/bool [L] (1 where a token begins a word;
    for Chinese, the corpus segmentation). Output: as `mlm.mask_tokens`.

    Example (mask_id 4, specials (2, 3), rate 0.5): input_ids [2, 10, 11, 12, 13, 3],
    word_starts [1, 1, 0, 1, 1, 1] (words "10 11", "12", "13"), n=4 -> budget 2:
    either the word "10 11" -> input_ids [2, 4, 4, 12, 13, 3], masked_positions [1, 2, ...],
    or the two one-piece words 12 and 13 -> [2, 10, 11, 4, 4, 3]; never half of "10 11".
    """
    mlm.require_features(features, ["input_ids", unit_starts_key], where="mask_whole_words")
    choose_seed, replace_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    maskable = mlm.maskable_tokens(features, spec=spec)
    budget = mlm.prediction_budget(tf.reduce_sum(tf.cast(maskable, tf.int32)), spec=spec)
    selected = choose_units(maskable, features[unit_starts_key], budget, seed=choose_seed)
    out = mlm.finish_masking(features, selected, seed=replace_seed, spec=spec)
    return out


def whole_word_dynamic_mlm(dataset: tf.data.Dataset, *, spec: mlm.MlmSpec) -> tf.data.Dataset:
    """Whole-word MLM, fresh mask each time an example is seen."""
    return mlm.dynamic_masking(dataset, mask_fn=mask_whole_words, spec=spec)


def whole_word_static_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, dupe_factor: int = 10
) -> tf.data.Dataset:
    """Whole-word MLM, `dupe_factor` fixed masks per example."""
    return mlm.static_masking(dataset, mask_fn=mask_whole_words, dupe_factor=dupe_factor, spec=spec)
