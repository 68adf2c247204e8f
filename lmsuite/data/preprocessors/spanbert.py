"""SpanBERT span masking with span-boundary-objective (SBO) targets, as in the paper.

Joshi et al. 2020: span lengths in WORDS follow Geometric(p=0.2) clipped to 1..10 by
resampling (i.e. the geometric truncated to 1..10 and renormalised; mean 3.797 words); a span
starts at the beginning of a word; exactly the budget of tokens is masked (the last span is cut
when it would overflow); the 80/10/10 decision is taken once per span. SpanBERT's released code
defaults to p=0.3 and no SBO; we follow the paper.

Sampling loop (restated from the paper and its fairseq code): draw a length l and an anchor token
uniformly among maskable tokens; move the anchor to the first piece of its word; reject the draw
if that piece is already masked; otherwise mask the l words from there, piece by piece, until the
budget is reached. The tasks mask rows a group at a time (`mask_spans` on a group: one loop turn
per span tried for the whole group), where a loop per row was most of a SpanBERT row's input CPU.

For the SBO every masked token gets the positions just outside its masked run (s - 1, e + 1) and
its 0-based offset inside the run. Runs are maximal stretches of adjacent masked tokens, so two
sampled spans that touch form one run (their boundaries are then the run's, which are unmasked).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from lmsuite.data.preprocessors import mlm, whole_word

SBO_KEYS = ("span_left_positions", "span_right_positions", "span_offsets")


def span_length_probabilities(*, p: float = 0.2, max_length: int = 10) -> np.ndarray:
    """Geometric(p) truncated to 1..max_length, renormalised: float64 [max_length]."""
    if not 0.0 < p <= 1.0 or max_length < 1:
        raise ValueError(f"p={p} must be in (0, 1] and max_length={max_length} >= 1")
    lengths = np.arange(1, max_length + 1)
    pmf = p * (1.0 - p) ** (lengths - 1)
    return pmf / pmf.sum()


def expected_span_length(*, p: float = 0.2, max_length: int = 10) -> float:
    """Closed-form mean of the truncated geometric.

    E[l | l <= N] = (1 - (N + 1) q^N + N q^(N+1)) / (p (1 - q^N)), q = 1 - p;
    p=0.2, N=10 -> 3.7971...
    """
    q, n = 1.0 - p, max_length
    return (1.0 - (n + 1) * q**n + n * q ** (n + 1)) / (p * (1.0 - q**n))


def span_lengths(uniform: tf.Tensor, *, p: float = 0.2, max_length: int = 10) -> tf.Tensor:
    """Span lengths (words) at uniform draws in [0, 1): the inverse of the truncated
    geometric's cumulative p, int32 of the draws' shape. Example: [0.1, 0.5] -> [1, 3]."""
    cumulative = np.cumsum(span_length_probabilities(p=p, max_length=max_length))[:-1]
    below = tf.cast(uniform[..., None] >= tf.constant(cumulative, tf.float32), tf.int32)
    return 1 + tf.reduce_sum(below, axis=-1)


def sample_span_lengths(
    shape: tf.Tensor | list[int], *, seed: tf.Tensor, p: float = 0.2, max_length: int = 10
) -> tf.Tensor:
    """Draws span lengths (words) from the truncated geometric, int32 of `shape`."""
    uniform = tf.random.stateless_uniform(shape, seed)
    return span_lengths(uniform, p=p, max_length=max_length)


def turn_draws(seed: tf.Tensor, turn: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
    """The sampler's draws at one turn of its loop, float32 [rows, 2]: per row, the uniform
    that sets the span's length (`span_lengths`) and the one that picks its anchor."""
    turn_seed = tf.random.experimental.stateless_fold_in(seed, turn)
    return tf.random.stateless_uniform(tf.stack([rows, 2]), turn_seed)


def choose_spans(
    maskable: tf.Tensor,
    word_starts: tf.Tensor,
    budget: tf.Tensor,
    *,
    seed: tf.Tensor,
    p: float,
    max_length: int,
) -> tf.Tensor:
    """Bool [L] or [G, L]: exactly `budget` (a scalar, or [G]) maskable tokens of each row,
    covered by word-aligned geometric spans drawn from `seed` (`turn_draws`).

    A row loops once per span it tries (rejections included) until its budget is met; a group
    takes its turns together, one loop for all its rows that turns until its busiest row is
    done, and a row that is done takes nothing more, as its own loop would have stopped. A
    turn's draws are the group's (`turn_draws`), so a row's spans depend on its group.

    Example (one row, one-token words 0-5 all maskable, budget 3): turn 0 draws 2 words from
    anchor 4 -> tokens 4, 5; turn 1 draws 1 word from anchor 5 -> rejected (5 is masked);
    turn 2 draws 4 words from anchor 0 -> token 0 only (the budget cuts the span).
    """
    if maskable.shape.rank == 1:
        one = choose_spans(
            maskable[None],
            word_starts[None],
            tf.reshape(budget, [1]),
            seed=seed,
            p=p,
            max_length=max_length,
        )
        return one[0]
    index, _ = whole_word.unit_index(maskable, word_starts)
    rows, width = tf.shape(maskable)[0], tf.shape(maskable)[1]
    positions = tf.range(width)
    # A row's maskable positions first, in order: the anchor is a uniform pick among them.
    candidates = tf.argsort(tf.where(maskable, positions, positions + width), axis=1, stable=True)
    num_candidates = tf.reduce_sum(tf.cast(maskable, tf.int32), axis=1)
    budget = tf.cast(budget, tf.int32)
    max_turns = 100 * tf.reduce_max(tf.concat([[0], budget], 0)) + 100

    def turn(t, count, selected):
        draws = turn_draws(seed, t, rows)
        span_words = span_lengths(draws[:, 0], p=p, max_length=max_length)
        pick = tf.cast(draws[:, 1] * tf.cast(num_candidates, tf.float32), tf.int32)
        pick = tf.maximum(tf.minimum(pick, num_candidates - 1), 0)
        word = tf.gather(index, tf.gather(candidates, pick, batch_dims=1), batch_dims=1)
        in_word = index == word[:, None]
        first_piece = tf.argmax(tf.cast(in_word, tf.int32), axis=1, output_type=tf.int32)
        accept = ~tf.gather(selected, first_piece, batch_dims=1)
        in_span = (index >= word[:, None]) & (index < (word + span_words)[:, None])
        fresh = in_span & ~selected & accept[:, None]
        # Piece by piece up to the budget: a row that is done takes nothing.
        fresh &= tf.cumsum(tf.cast(fresh, tf.int32), axis=1) <= (budget - count)[:, None]
        return t + 1, count + tf.reduce_sum(tf.cast(fresh, tf.int32), axis=1), selected | fresh

    _, count, selected = tf.while_loop(
        lambda t, count, selected: (t < max_turns) & tf.reduce_any(count < budget),
        turn,
        (tf.constant(0), tf.zeros([rows], tf.int32), tf.zeros([rows, width], tf.bool)),
        shape_invariants=(tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None, None])),
    )
    check = tf.debugging.assert_equal(count, budget, message="span sampler missed its budget")
    with tf.control_dependencies([check]):
        return tf.identity(selected)


def run_boundaries(selected: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """First and last position of the maximal masked run holding each token, int32 [L] (or
    [G, L] for a group of rows).

    Values at unselected positions are meaningless. Example: selected [F, T, T, F, T]
    -> starts [., 1, 1, ., 4], ends [., 2, 2, ., 4].
    """
    if selected.shape.rank == 1:
        starts, ends = run_boundaries(selected[None])
        return starts[0], ends[0]
    rows, width = tf.shape(selected)[0], tf.shape(selected)[1]
    as_int = tf.cast(selected, tf.int32)
    previous = tf.concat([tf.zeros_like(as_int[:, :1]), as_int[:, :-1]], 1)
    run = tf.cumsum(as_int * (1 - previous), axis=1) - 1
    # One segment per (row, run); a row's unselected tokens share a last, unread one.
    run_slot = tf.where(selected, run, width)
    slot = run_slot + (width + 1) * tf.range(rows)[:, None]
    positions = tf.broadcast_to(tf.range(width), tf.shape(slot))
    segments = rows * (width + 1)
    starts = tf.reshape(tf.math.unsorted_segment_min(positions, slot, segments), [rows, -1])
    ends = tf.reshape(tf.math.unsorted_segment_max(positions, slot, segments), [rows, -1])
    return tf.gather(starts, run_slot, batch_dims=1), tf.gather(ends, run_slot, batch_dims=1)


def mask_spans(
    features: mlm.Features,
    *,
    seed: tf.Tensor,
    spec: mlm.MlmSpec,
    p: float = 0.2,
    max_length: int = 10,
    lengths: tf.Tensor | None = None,
) -> mlm.Features:
    """SpanBERT masking of one example, or of a group of rows, with SBO targets.

    Input: `input_ids` [L], `word_starts` [L]; or a group [G, L] with the rows' `lengths` [G]
    (tokens past them are padding, never masked). Output: as `mlm.mask_tokens`, plus, aligned
    with `masked_positions` and padded to max_predictions: `span_left_positions` (s - 1),
    `span_right_positions` (e + 1), `span_offsets` (position - s), where [s, e] is the token's
    masked run; boundaries are clipped to the row's [0, length - 1] (only reachable without
    [CLS]/[SEP]). Every row draws from `seed` (`choose_spans`, then one 80/10/10 draw per
    span), so a row's mask depends on the group it is masked in, as a BERT row's does.

    Example (mask_id 4, specials (2, 3), budget 3): input_ids [2, 10, 11, 12, 13, 14, 3],
    word_starts [1, 1, 0, 1, 1, 1, 1], a 2-word span from word "10 11" -> tokens 10 11 12:
    input_ids [2, 4, 4, 4, 13, 14, 3] (one 80/10/10 decision for the whole span),
    masked_positions [1, 2, 3, 0...], span_left_positions [0, 0, 0, 0...],
    span_right_positions [4, 4, 4, 0...], span_offsets [0, 1, 2, 0...].
    """
    mlm.require_features(features, ["input_ids", "word_starts"], where="mask_spans")
    if lengths is None:  # one example: a group of one
        one = mask_spans(
            {k: v[None] for k, v in features.items()},
            seed=seed,
            spec=spec,
            p=p,
            max_length=max_length,
            lengths=tf.size(features["input_ids"])[None],
        )
        return {k: v[0] for k, v in one.items()}
    choose_seed, replace_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    maskable = mlm.maskable_tokens(features, spec=spec, lengths=lengths)
    budget = mlm.prediction_budget(tf.reduce_sum(tf.cast(maskable, tf.int32), axis=-1), spec=spec)
    selected = choose_spans(
        maskable, features["word_starts"], budget, seed=choose_seed, p=p, max_length=max_length
    )
    starts, ends = run_boundaries(selected)
    positions = tf.range(tf.shape(selected)[1])[None, :]
    decision_index = tf.where(selected, starts, positions)
    out = mlm.finish_masking(
        features, selected, seed=replace_seed, spec=spec, decision_index=decision_index
    )
    last = tf.cast(lengths, tf.int32)[:, None] - 1
    sbo = {
        "span_left_positions": tf.maximum(starts - 1, 0),
        "span_right_positions": tf.minimum(ends + 1, last),
        "span_offsets": positions - starts,
    }
    valid = out["masked_weights"] > 0
    for key, values in sbo.items():
        aligned = tf.gather(values, out["masked_positions"], batch_dims=1)
        out[key] = tf.where(valid, aligned, tf.zeros_like(aligned))
    return out


def spanbert_dynamic_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, p: float = 0.2, max_length: int = 10
) -> tf.data.Dataset:
    """SpanBERT masking with a fresh mask each time an example is seen, `mlm.GROUP_SIZE`
    examples per call (`mlm.grouped_dynamic_masking`)."""
    return mlm.grouped_dynamic_masking(
        dataset, mask_fn=mask_spans, spec=spec, p=p, max_length=max_length
    )


def spanbert_static_mlm(
    dataset: tf.data.Dataset,
    *,
    spec: mlm.MlmSpec,
    p: float = 0.2,
    max_length: int = 10,
    dupe_factor: int = 10,
) -> tf.data.Dataset:
    """SpanBERT masking, `dupe_factor` fixed masks per example."""
    return mlm.static_masking(
        dataset,
        mask_fn=mask_spans,
        dupe_factor=dupe_factor,
        spec=spec,
        p=p,
        max_length=max_length,
    )
