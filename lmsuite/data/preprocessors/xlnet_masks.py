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

How it runs: each example draws its random numbers from its own seed (`sampler_draws`; the
stream's `split_draws`), and everything else runs on a group of examples at once
(`predicted_from_draws`, `permutation_features` with a leading dimension G). Done one example
at a time, the few hundred small ops per example, not their arithmetic, were most of XLNet's
input cost.
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

    Rank-generic: next_start [n + 1], left and advance [K] (one example), or with a leading
    batch dimension [G, n + 1] and [G, K] (K static). The cursor recursion is sequential, so it
    runs span by span, each step one gather for the whole group (a doubling scan over tables
    of every cursor did G * K * n work for log2(K) steps: slower on groups). Cursors past n
    are clipped to n, where no span fits any more.
    """
    if next_start.shape.rank == 1:
        return span_begins(next_start[None], left[None], advance[None])[0]
    if left.shape[1] == 0:
        return left
    n = tf.shape(next_start)[1] - 1
    cursor, begins = tf.zeros_like(left[:, 0]), []
    for left_k, advance_k in zip(
        tf.unstack(left, axis=1), tf.unstack(advance, axis=1), strict=True
    ):
        at = tf.minimum(cursor + left_k, n)
        begins.append(tf.gather(next_start, at[:, None], batch_dims=1)[:, 0])
        cursor = begins[-1] + advance_k
    return tf.stack(begins, axis=1)


def sampler_draws(seed, *, n, goal, max_gram=5) -> dict[str, tf.Tensor]:
    """The random numbers `_sample_mask` uses for one example, drawn from `seed`: n-gram lengths
    (`grams` [goal], 1..max_gram with p(n) proportional to 1/n), context offsets (`offsets`
    [goal], uniform in [0, 1)) and the top-up's scores (`scores` [n]).

    Drawing is the only per-example work (stateless draws take one seed each); everything
    after it runs on a group of examples at once (`predicted_from_draws`).
    """
    seeds = tf.random.experimental.stateless_split(seed, 3)
    logits = tf.math.log([[1.0 / g for g in range(1, max_gram + 1)]])
    grams = tf.random.stateless_categorical(logits, goal, seeds[0], dtype=tf.int32)[0] + 1
    return {
        "grams": grams,
        "offsets": tf.random.stateless_uniform([goal], seeds[1]),
        "scores": tf.random.stateless_uniform([n], seeds[2]),
    }


def predicted_from_draws(
    grams, offsets, scores, *, can_start=None, mask_alpha=6, mask_beta=1
) -> tf.Tensor:
    """Bool [G, n]: each example's `goal` predicted positions (`_sample_mask`, token n-grams),
    from a group's `sampler_draws` stacked ([G, goal], [G, goal], [G, n]).

    `can_start` (bool [G, n]) marks where a span may begin (None: anywhere).
    """
    n, goal = tf.shape(scores)[1], grams.shape[1]
    before = tf.cumsum(grams, axis=1, exclusive=True)
    grams = tf.maximum(tf.minimum(grams, goal - before), 0)  # trims the span that hits the goal
    context = grams * mask_alpha // mask_beta
    left = tf.cast(offsets * tf.cast(context, tf.float32), tf.int32)
    positions = tf.range(n + 1)
    if can_start is None:
        next_start = tf.broadcast_to(positions, [tf.shape(scores)[0], n + 1])
    else:  # the first allowed position at or after each p (n: none)
        allowed = tf.sort(tf.where(can_start, positions[:-1], n), axis=1)
        allowed = tf.pad(allowed, [[0, 0], [0, 1]], constant_values=n)
        before_p = tf.pad(tf.cumsum(tf.cast(can_start, tf.int32), axis=1), [[0, 0], [1, 0]])
        next_start = tf.gather(allowed, before_p, batch_dims=1)
    begin = span_begins(next_start, left, grams + context - left)
    end = begin + grams
    # The reference stops at the first n-gram that would reach the end of the segment. Taken
    # spans never overlap (each cursor moves past the span's end): mark [begin, end) by +1 / -1.
    fits = tf.cast(tf.logical_and(grams > 0, end < n), tf.int32)
    valid = tf.math.cumprod(fits, axis=1)
    rows = tf.broadcast_to(tf.range(tf.shape(begin)[0])[:, None], tf.shape(begin))
    edges = tf.concat([tf.stack([rows, tf.minimum(b, n)], axis=-1) for b in (begin, end)], 1)
    delta = tf.tensor_scatter_nd_add(
        tf.zeros(tf.stack([tf.shape(begin)[0], n + 1]), tf.int32),
        edges,
        tf.concat([valid, -valid], axis=1),
    )
    chosen = tf.cumsum(delta, axis=1)[:, :-1] > 0
    # The rest uniformly among the unchosen: the `missing` highest scores (top_k's set).
    missing = goal - tf.reduce_sum(tf.cast(chosen, tf.int32), axis=1)
    order = tf.argsort(tf.where(chosen, -1.0, scores), axis=1, direction="DESCENDING", stable=True)
    rank = tf.argsort(order, axis=1, stable=True)
    return tf.logical_or(chosen, rank < missing[:, None])


def sample_predicted(
    *, n, goal, seed, can_start=None, max_gram=5, mask_alpha=6, mask_beta=1
) -> tf.Tensor:
    """Bool [n]: exactly `goal` predicted positions chosen as `_sample_mask` (token n-grams), for
    one example (`sampler_draws` then `predicted_from_draws`).

    `can_start` (bool [n]) marks where a span may begin (None: anywhere). Example (n 12, goal 2,
    an n-gram of 2 in a context of 12 at offset 3): [0 0 0 1 1 0 0 0 0 0 0 0].
    """
    draws = sampler_draws(seed, n=n, goal=goal, max_gram=max_gram)
    return predicted_from_draws(
        **{k: v[None] for k, v in draws.items()},
        can_start=None if can_start is None else can_start[None],
        mask_alpha=mask_alpha,
        mask_beta=mask_beta,
    )[0]


def block_ranks(length: int, order) -> tf.Tensor:
    """Each position's rank in `_local_perm`'s order: `order` ([perm_size], or [G, perm_size]
    for a group) permutes every block of perm_size positions alike.
    Example (length 4, order [1, 0]) -> [1, 0, 3, 2].
    """
    perm_size = tf.shape(order)[-1]
    positions = tf.range(length)
    return positions - positions % perm_size + tf.gather(order, positions % perm_size, axis=-1)


def permutation_features(
    input_k, is_masked, is_functional, *, reuse_len, num_predict, reuse_order, rest_order
) -> dict[str, tf.Tensor]:
    """The reference parser's features from one example's masks and the two parts' orders, or
    from a group's (a leading dimension G on every argument).

    Returns input_k, input_q, perm_mask, target_mapping, target, target_mask (see the module
    docstring). Example (L 4, reuse_len 2, orders [0, 1], [0, 1], masked [0 1 1 0], functional
    [0 0 0 1], num_predict 3): input_q [0 1 1 0], perm_mask rows [0 1 1 1], [0 1 1 1],
    [0 0 1 1], [0 0 0 0] (the <cls> sees the whole reuse part and the masked 2 before it),
    target_mapping rows one-hot 1, one-hot 2, zeros; target_mask [1 1 0].
    """
    if input_k.shape.rank == 1:
        one = permutation_features(
            *(x[None] for x in (input_k, is_masked, is_functional)),
            reuse_len=reuse_len,
            num_predict=num_predict,
            reuse_order=reuse_order[None],
            rest_order=rest_order[None],
        )
        return {k: v[0] for k, v in one.items()}
    length = tf.shape(input_k)[1]
    unmasked = tf.logical_and(tf.logical_not(is_masked), tf.logical_not(is_functional))
    is_target = tf.logical_and(is_masked, tf.logical_not(is_functional))
    # `_local_perm` per part: unmasked tokens rank first (-1), so every token of the part sees
    # them and they see only each other; a target does not see itself, a functional token does.
    # The rest's ranks are shifted past the reuse part's, so one comparison also blocks the
    # reuse part from the rest and lets the rest see the whole reuse part.
    rank = tf.concat(
        [block_ranks(reuse_len, reuse_order), block_ranks(length - reuse_len, rest_order)], axis=1
    )
    rank = tf.where(unmasked, -1, rank) + tf.where(tf.range(length) < reuse_len, 0, reuse_len + 1)
    own_rank = tf.where(is_target, rank, rank + 1)
    perm_mask = own_rank[:, :, None] <= rank[:, None, :]  # i may not attend j
    # Slot s of the targets is the s-th predicted position, in ascending order.
    slot = tf.cumsum(tf.cast(is_target, tf.int32), axis=1, exclusive=True)
    mapping = tf.logical_and(
        tf.equal(slot[:, None, :], tf.range(num_predict)[None, :, None]), is_target[:, None, :]
    )
    return {
        "input_k": input_k,
        "input_q": tf.cast(is_target, tf.float32),
        "perm_mask": tf.cast(perm_mask, tf.float32),
        "target_mapping": tf.cast(mapping, tf.float32),
        "target": tf.reduce_sum(tf.where(mapping, input_k[:, None, :], 0), axis=2),
        "target_mask": tf.cast(tf.reduce_any(mapping, axis=2), tf.float32),
    }
