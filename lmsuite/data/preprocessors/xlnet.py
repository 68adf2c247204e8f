"""XLNet permutation language modelling with span-based partial prediction (Yang et al., 2019).

Layout, as XLNet (functional tokens at the end): `A [SEP] B [SEP] [CLS]`, where A and B are the
chunk split at a uniformly random point (XLNet's pretraining pairs; no random-next B here);
`seg_id` is 0 over `A [SEP]`, 1 over `B [SEP]` and 2 on `[CLS]`.

Which tokens are predicted follows XLNet's `_sample_mask`: n-gram lengths n in 1..max_gram with
p(n) proportional to 1/n; each n-gram sits in a context of n * K tokens (K = mask_alpha /
mask_beta = 6) at a uniformly random offset; spans follow one another left to right until
`num_predict` tokens are chosen (the last n-gram trimmed), and if the chunk ends first the rest are
drawn uniformly among the unchosen tokens. So about 1/K of the tokens are predicted: the last 1/K
of the factorization order. Counting: the released sampler meant n words but, through a bug (it
tests the span's first piece instead of the next one), counts n tokens; we count tokens too, so
the figures match the released data. [SEP]/[CLS] are never predicted here (XLNet could pick them
and then drop them, predicting fewer than `num_predict`).

The factorization order is `_local_perm`'s: a random permutation within each block of
`perm_size` positions (the same one for every block); non-predicted tokens come first (everyone
may see them and they see no predicted token), then the predicted ones in permuted order.
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import lm


def sample_predicted(*, n, goal, seed, max_gram=5, mask_alpha=6, mask_beta=1):
    """Bool [n]: `goal` predicted positions chosen by XLNet's span sampler (token n-grams)."""
    seeds = tf.random.experimental.stateless_split(seed, 3)
    logits = tf.math.log([[1.0 / g for g in range(1, max_gram + 1)]])
    grams = tf.random.stateless_categorical(logits, goal, seeds[0], dtype=tf.int32)[0] + 1
    before = tf.cumsum(grams, exclusive=True)
    grams = tf.maximum(tf.minimum(grams, goal - before), 0)  # trims the span that hits the goal
    context = grams * mask_alpha // mask_beta
    left = tf.cast(
        tf.random.stateless_uniform([goal], seeds[1]) * tf.cast(context, tf.float32), tf.int32
    )
    begin = tf.cumsum(grams + context, exclusive=True) + left
    end = begin + grams
    # XLNet stops at the first n-gram that would reach the end of the segment.
    fits = tf.cast(tf.logical_and(grams > 0, end < n), tf.int32)
    valid = tf.cast(tf.math.cumprod(fits), tf.bool)
    spans = tf.ragged.range(tf.boolean_mask(begin, valid), tf.boolean_mask(end, valid))
    chosen = tf.scatter_nd(
        spans.flat_values[:, None], tf.ones_like(spans.flat_values, tf.bool), [n]
    )
    missing = goal - tf.reduce_sum(tf.cast(chosen, tf.int32))
    scores = tf.where(chosen, -1.0, tf.random.stateless_uniform([n], seeds[2]))
    _, extra = tf.math.top_k(scores, k=missing)
    return tf.tensor_scatter_nd_update(chosen, extra[:, None], tf.ones([missing], tf.bool))


def permutation_features(ids, is_predicted, is_functional, *, num_predict, perm_size, seed):
    """XLNet's `_local_perm` plus the `target_mapping` padding, for one sequence of length L."""
    length = tf.size(ids)
    order = tf.argsort(tf.random.stateless_uniform([perm_size], seed))
    rank = tf.reshape(tf.gather(tf.reshape(tf.range(length), [-1, perm_size]), order, axis=1), [-1])
    seen_by_all = tf.logical_and(tf.logical_not(is_predicted), tf.logical_not(is_functional))
    rev_rank = tf.where(seen_by_all, -1, rank)
    targets = tf.logical_and(is_predicted, tf.logical_not(is_functional))
    self_rank = tf.where(targets, rev_rank, rev_rank + 1)
    # 1 = query i may not attend key j: j comes no earlier than i and j is not seen by all.
    perm_mask = tf.logical_and(
        self_rank[:, None] <= rev_rank[None, :], tf.logical_not(seen_by_all)[None, :]
    )
    positions = tf.cast(tf.where(targets)[:, 0], tf.int32)
    count = tf.size(positions)
    pad = num_predict - count
    return {
        "input_k": ids,
        "input_q": tf.cast(targets, tf.float32),
        "perm_mask": tf.cast(perm_mask, tf.float32),
        "target_mapping": tf.pad(tf.one_hot(positions, length), [[0, pad], [0, 0]]),
        "target": tf.pad(tf.gather(ids, positions), [[0, pad]]),
        "target_mask": tf.pad(tf.ones([count], tf.float32), [[0, pad]]),
    }


def permutation_lm(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    cls_id: int,
    sep_id: int,
    num_predict: int | None = None,
    perm_size: int | None = None,
    max_gram: int = 5,
    mask_alpha: int = 6,
    mask_beta: int = 1,
) -> tf.data.Dataset:
    """XLNet pretraining examples of length L = `sequence_length["targets"]`.

    Chunks of L - 3 tokens are cut from the concatenated `targets` stream; the stream's last,
    shorter chunk is dropped (XLNet has no padding). Every example predicts exactly
    `num_predict` tokens, by default round((L - 3) * mask_beta / mask_alpha) (85 for L = 512).

    Output features: input_k [L] ids; input_q [L] float, 1 at predicted positions; seg_id [L];
    perm_mask [L, L] float, 1 where query i may not attend key j; target_mapping
    [num_predict, L] one-hot rows of the predicted positions; target [num_predict] their ids;
    target_mask [num_predict] ones.

    perm_mask[i, j] = 1 unless j is neither predicted nor functional, or j comes before i in the
    factorization order (a predicted token never sees itself; an unpredicted one sees only the
    unpredicted).

    Example (L=8, num_predict 2, chunk [a b c d e], split after b, predicted c d, order
    SEP(2) < d < c < SEP(6) < CLS):
      input_k = [a b SEP c d e SEP CLS], seg_id = [0 0 0 1 1 1 1 2],
      input_q = [0 0 0 1 1 0 0 0], target = [c d], target_mapping rows = one-hot 3, 4,
      perm_mask row 3 (c) = [0 0 0 1 0 0 1 1], row 4 (d) = [0 0 0 1 1 0 1 1],
      row 0 (a) = [0 0 1 1 1 0 1 1].
    """
    (length,) = lm._lengths(sequence_length, "targets")
    n = length - 3
    if n < 2:
        raise ValueError(f"targets length {length} too short for A [SEP] B [SEP] [CLS]")
    if num_predict is None:
        num_predict = max(1, round(n * mask_beta / mask_alpha))
    if not 1 <= num_predict <= n:
        raise ValueError(f"num_predict={num_predict}, expected in [1, {n}]")
    perm_size = length if perm_size is None else perm_size
    if length % perm_size:
        raise ValueError(f"perm_size={perm_size} must divide the sequence length {length}")
    batches = lm.chunk_stream_batches(dataset, chunk_length=n, min_chunk_length=n)

    @seqio.map_over_dataset(num_seeds=1)
    def make(tokens, seed):
        seeds = tf.random.experimental.stateless_split(seed, 3)
        split = tf.random.stateless_uniform([], seeds[0], minval=1, maxval=n, dtype=tf.int32)
        sep = tf.constant([sep_id], tokens.dtype)
        ids = tf.concat([tokens[:split], sep, tokens[split:], sep, [cls_id]], axis=0)
        positions = tf.range(length)
        seg_id = tf.where(positions <= split, 0, tf.where(positions < length - 1, 1, 2))
        is_functional = tf.logical_or(tf.equal(positions, split), positions >= length - 2)
        chosen = sample_predicted(
            n=n,
            goal=num_predict,
            seed=seeds[1],
            max_gram=max_gram,
            mask_alpha=mask_alpha,
            mask_beta=mask_beta,
        )
        # Chunk position p lands at p, or p + 1 once past the middle [SEP].
        layout = tf.range(n) + tf.cast(tf.range(n) >= split, tf.int32)
        is_predicted = tf.scatter_nd(layout[:, None], chosen, [length])
        features = permutation_features(
            ids,
            is_predicted,
            is_functional,
            num_predict=num_predict,
            perm_size=perm_size,
            seed=seeds[2],
        )
        features["seg_id"] = seg_id
        return features

    return make(batches.unbatch())
