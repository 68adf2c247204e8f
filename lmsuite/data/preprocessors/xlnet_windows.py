"""XLNet's windows: where A and B come from (zihangdai/xlnet `data_utils.py`'s `_split_a_and_b`,
read, restated, not copied), for `xlnet.py`'s stream.

Step 3 of the stream (`lmsuite.data.preprocessors.xlnet` has the whole pipeline): each example
draws its own random numbers (`split_draws`), and a group of windows is split at once from its
rows' sentence tables (`sentence_tables`, `split_a_and_b`).
"""

from __future__ import annotations

import tensorflow as tf


def trimmed_lengths(a_len, b_len, *, total):
    """The lengths `_split_a_and_b` trims A and B to: the longer (B on ties) loses one token at a
    time until a_len + b_len <= total. Closed form, so it vectorises.

    Example (total 10): (7, 5) -> (5, 5); (9, 2) -> (8, 2); (3, 20) -> (3, 7); (6, 6) -> (5, 5).
    """
    excess = tf.maximum(a_len + b_len - total, 0)
    only_a = a_len - excess >= b_len
    only_b = b_len - excess >= a_len
    a = tf.where(only_a, a_len - excess, tf.where(only_b, a_len, (total + 1) // 2))
    b = tf.where(only_a, b_len, tf.where(only_b, b_len - excess, total // 2))
    return a, b


def uniform_below(bits, high):
    """int32 in [0, high) from 32 random bits (int32), as TF's stateless uniform int draws it
    (`stateless_uniform(..., minval=0, maxval=high, dtype=tf.int32)` on the same seed): the
    bits as unsigned, modulo high. Example: bits -1 (2**32 - 1), high 10 -> 5."""
    unsigned = tf.cast(tf.bitcast(bits, tf.uint32), tf.int64)
    return tf.cast(unsigned % tf.cast(high, tf.int64), tf.int32)


def split_draws(seed) -> dict[str, tf.Tensor]:
    """The random numbers `split_a_and_b` uses for one example: a coin (float in [0, 1)) and
    two 32-bit draws for the cut and the random B's place (`uniform_below`)."""
    seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 5))
    bits = lambda s: tf.random.stateless_uniform([], s, minval=None, maxval=None, dtype=tf.int32)
    return {
        "coin": tf.random.stateless_uniform([], seeds[0]),
        "cut_bits": bits(seeds[1]),
        "place_bits": bits(seeds[2]),
    }


def sentence_tables(starts):
    """(count, position) for bool `starts` [R, N] (True on each sentence's first token):
    count [R, N + 1], the sentence starts before p; position [R, N + 1], the j-th start of the
    row (N past the last). So the first start at or after p is position[count[p]].
    Example: starts [[1 0 0 1 0]] -> count [[0 1 1 1 2 2]], position [[0 3 5 5 5 5]].
    """
    size = tf.shape(starts)[1]
    count = tf.pad(tf.cumsum(tf.cast(starts, tf.int32), axis=1), [[0, 0], [1, 0]])
    position = tf.sort(tf.where(starts, tf.range(size), size), axis=1)
    return count, tf.pad(position, [[0, 0], [0, 1]], constant_values=size)


def split_a_and_b(tables, *, row, begin, tot_len, coin, cut_bits, place_bits):
    """`_split_a_and_b` on a group of windows: where A and B come from, as (a_len, b_begin,
    b_len, is_random), each [G].

    `tables` is `sentence_tables` of the block's rows; window g reads row `row[g]` and A starts
    at `begin[g]`; the draws are `split_draws`'s, stacked. Cuts are the sentence starts strictly
    inside (begin, begin + tot_len); the window's end is the first sentence start at or after
    begin + tot_len (the row's end if none). With a cut and probability 1/2, A ends at a uniform
    cut and B continues to the window's end; otherwise (is_random) A ends at a uniform cut (the
    window's end if there is none) and B covers the sentences around a uniform span of
    max(1, tot_len - len(A)) tokens of the row. Then `trimmed_lengths`. Example (tot_len 5,
    sentence starts at 0, 4, 7, begin 1, a cut at 4, not random): A = row[1:4], B = row[4:6].
    """
    count, position = tables
    n = tf.shape(position)[1] - 1
    at = lambda table, p: tf.gather_nd(table, tf.stack([row, p], axis=1))
    first_cut = at(count, begin + 1)
    num_cuts = at(count, begin + tot_len) - first_cut
    end = at(position, at(count, begin + tot_len))
    is_random = tf.logical_or(num_cuts == 0, coin < 0.5)
    pick = uniform_below(cut_bits, tf.maximum(num_cuts, 1))
    a_end = tf.where(num_cuts > 0, at(position, first_cut + pick), end)
    other_len = tf.maximum(1, tot_len - (a_end - begin))
    other_begin = uniform_below(place_bits, n - other_len)
    other_end = other_begin + other_len
    # Widen to whole sentences (the reference stops the right end at n - 1).
    last_before = at(count, other_begin + 1) - 1
    other_begin = tf.where(last_before >= 0, at(position, tf.maximum(last_before, 0)), 0)
    other_end = tf.minimum(at(position, at(count, other_end)), n - 1)
    b_begin = tf.where(is_random, other_begin, a_end)
    b_end = tf.where(is_random, other_end, end)
    a_len, b_len = trimmed_lengths(a_end - begin, b_end - b_begin, total=tot_len)
    return a_len, b_begin, b_len, is_random
