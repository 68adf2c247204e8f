"""XLNet's predicted spans and factorization order: zihangdai/xlnet `data_utils.py`'s
`_sample_mask` and `_local_perm` (read, restated, not copied), for `xlnet.py`'s stream.

Steps 4 and 5 of the stream (`lmsuite.data.preprocessors.xlnet` has the whole pipeline):

4. Predictions (`_sample_mask`), num_predict split as the reference splits it: the reuse part
   gets num_predict - num_predict // 2, the rest num_predict // 2 (43 and 42 of 85).
   n-gram lengths n in 1..max_gram with p(n) proportional to 1/n; each n-gram sits in a context
   of n * K tokens (K = mask_alpha / mask_beta = 6) at a uniformly random offset, its start
   moved forward to the next piece that may start a word (`start_piece_table`); spans follow
   one another left to right until the goal is reached (the last n-gram trimmed), and if the
   segment ends first the rest are drawn uniformly among the unchosen tokens. Counting: the
   released sampler meant n words but, through a bug (it tests the span's first piece instead
   of the next one), counts n tokens; we count tokens too, so the figures match the released
   data.
5. Factorization order (`_local_perm`), separately for the reuse part and the rest: a random
   permutation of `perm_size` positions, the same in every block of `perm_size`; unpredicted
   tokens see every unpredicted token of their part and nothing else of it; a predicted or
   functional token sees the masked and functional tokens ranked before it (a predicted one
   never itself, a functional one itself too). Every reuse position is blocked from every
   non-reuse position, and every non-reuse position sees the whole reuse part.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# The reference's `_is_start_piece` punctuation (its literal lists '"' twice and no "'").
_START_PUNCTUATION = frozenset('!"#$%&()*+,-./:;?@[\\]^_`{|}~')


def start_piece_table(vocab) -> np.ndarray | None:
    """Bool [vocab_size]: True for pieces a predicted span may start at (`_is_start_piece`).

    None for a vocabulary without word-start marks (`vocab.segmented`): any token may start.
    Example: pieces "▁the", "s", ".", "'", "</s>" -> True, False, True, False, True.
    """
    if getattr(vocab, "segmented", False):
        return None
    tokenizer = vocab.tokenizer
    table = np.ones([vocab.vocab_size], dtype=bool)  # sentinels: specials, like "<...>" pieces
    for i in range(tokenizer.get_piece_size()):
        piece = tokenizer.id_to_piece(i)
        table[i] = (
            piece.startswith(("\u2581", "<"))
            or piece in _START_PUNCTUATION
            or tokenizer.is_control(i)
            or tokenizer.is_unknown(i)
        )
    return table


def prediction_split(num_predict: int) -> tuple[int, int]:
    """(reuse part, rest) predictions, as `create_tfrecords` splits them: 85 -> (43, 42)."""
    return num_predict - num_predict // 2, num_predict // 2


def span_begins(next_start, left, advance):
    """beg_k = next_start[min(c_k + left_k, n)], c_0 = 0, c_{k+1} = beg_k + advance_k, for all k.

    The cursor recursion is sequential; composing the per-span maps c -> c_{k+1} as tables over
    c in [0, n] by doubling (a prefix scan) computes every cursor with log2(K) gathers instead
    of K loop steps. Cursors past n are clipped to n, where no span fits any more.
    """
    n = tf.size(next_start) - 1
    cursor = tf.range(n + 1)
    jump = tf.gather(next_start, tf.minimum(cursor[None, :] + left[:, None], n))
    maps = tf.minimum(jump + advance[:, None], n)  # [K, n + 1]: span k moves cursor c here
    count, offset = left.shape[0], 1
    while offset < count:
        earlier = tf.concat([tf.tile(cursor[None, :], [offset, 1]), maps[:-offset]], axis=0)
        maps = tf.gather(maps, earlier, batch_dims=1)  # maps[k] after maps[k - offset]
        offset *= 2
    cursors = tf.concat([[0], maps[:-1, 0]], axis=0)
    return tf.gather(next_start, tf.minimum(cursors + left, n))


def sample_predicted(
    *, n, goal, seed, can_start=None, max_gram=5, mask_alpha=6, mask_beta=1
) -> tf.Tensor:
    """Bool [n]: exactly `goal` predicted positions chosen as `_sample_mask` (token n-grams).

    `can_start` (bool [n]) marks where a span may begin (None: anywhere). Example (n 12, goal 2,
    an n-gram of 2 in a context of 12 at offset 3): [0 0 0 1 1 0 0 0 0 0 0 0].
    """
    seeds = tf.random.experimental.stateless_split(seed, 3)
    logits = tf.math.log([[1.0 / g for g in range(1, max_gram + 1)]])
    grams = tf.random.stateless_categorical(logits, goal, seeds[0], dtype=tf.int32)[0] + 1
    before = tf.cumsum(grams, exclusive=True)
    grams = tf.maximum(tf.minimum(grams, goal - before), 0)  # trims the span that hits the goal
    context = grams * mask_alpha // mask_beta
    left = tf.cast(
        tf.random.stateless_uniform([goal], seeds[1]) * tf.cast(context, tf.float32), tf.int32
    )
    if can_start is None:
        next_start = tf.range(n + 1)
    else:
        allowed = tf.concat([tf.cast(tf.where(can_start)[:, 0], tf.int32), [n]], axis=0)
        next_start = tf.gather(allowed, tf.searchsorted(allowed, tf.range(n + 1)))
    begin = span_begins(next_start, left, grams + context - left)
    end = begin + grams
    # The reference stops at the first n-gram that would reach the end of the segment.
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


def block_ranks(length: int, order) -> tf.Tensor:
    """Each position's rank in `_local_perm`'s order: `order` permutes every block of
    len(order) positions alike. Example (length 4, order [1, 0]) -> [1, 0, 3, 2]."""
    perm_size = tf.size(order)
    blocks = tf.reshape(tf.range(length), [-1, perm_size])
    return tf.reshape(tf.gather(blocks, order, axis=1), [-1])


def local_perm(is_masked, is_functional, rank):
    """`_local_perm`'s attention mask for one part: (perm_mask bool [n, n], is_target bool [n]).

    perm_mask[i, j] = 1: i may not attend j. Unmasked tokens rank first (-1): all see them and
    they see only each other; targets (masked, not functional) do not see themselves.
    Example (rank [0, 1, 2], masked [0, 1, 0], functional [0, 0, 1]):
      perm_mask [[0 1 1], [0 1 1], [0 0 0]], is_target [0 1 0] (the functional 2 sees itself).
    """
    unmasked = tf.logical_and(tf.logical_not(is_masked), tf.logical_not(is_functional))
    is_target = tf.logical_and(is_masked, tf.logical_not(is_functional))
    rank = tf.where(unmasked, -1, rank)
    own_rank = tf.where(is_target, rank, rank + 1)
    perm_mask = tf.logical_and(
        own_rank[:, None] <= rank[None, :], tf.logical_not(unmasked)[None, :]
    )
    return perm_mask, is_target


def permutation_features(
    input_k, is_masked, is_functional, *, reuse_len, num_predict, reuse_order, rest_order
) -> dict[str, tf.Tensor]:
    """The reference parser's features from one example's masks and the two parts' orders.

    Returns input_k, input_q, perm_mask, target_mapping, target, target_mask (see the module
    docstring). Example (L 4, reuse_len 2, orders [0, 1], [0, 1], masked [0 1 1 0], functional
    [0 0 0 1], num_predict 3): input_q [0 1 1 0], perm_mask rows [0 1 1 1], [0 1 1 1],
    [0 0 1 1], [0 0 0 0] (the <cls> sees the whole reuse part and the masked 2 before it),
    target_mapping rows one-hot 1, one-hot 2, zeros; target_mask [1 1 0].
    """
    length = tf.size(input_k)
    rest_len = length - reuse_len
    reuse_mask, reuse_target = local_perm(
        is_masked[:reuse_len], is_functional[:reuse_len], block_ranks(reuse_len, reuse_order)
    )
    rest_mask, rest_target = local_perm(
        is_masked[reuse_len:], is_functional[reuse_len:], block_ranks(rest_len, rest_order)
    )
    perm_mask = tf.concat(
        [
            tf.concat([reuse_mask, tf.ones([reuse_len, rest_len], tf.bool)], axis=1),
            tf.concat([tf.zeros([rest_len, reuse_len], tf.bool), rest_mask], axis=1),
        ],
        axis=0,
    )
    is_target = tf.concat([reuse_target, rest_target], axis=0)
    positions = tf.cast(tf.where(is_target)[:, 0], tf.int32)
    count = tf.size(positions)
    pad = num_predict - count
    return {
        "input_k": input_k,
        "input_q": tf.cast(is_target, tf.float32),
        "perm_mask": tf.cast(perm_mask, tf.float32),
        "target_mapping": tf.pad(tf.one_hot(positions, length), [[0, pad], [0, 0]]),
        "target": tf.pad(tf.gather(input_k, positions), [[0, pad]]),
        "target_mask": tf.pad(tf.ones([count], tf.float32), [[0, pad]]),
    }
