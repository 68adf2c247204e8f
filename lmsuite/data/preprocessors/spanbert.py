"""SpanBERT span masking with span-boundary-objective (SBO) targets, as in the paper.

Joshi et al. 2020: span lengths in WORDS follow Geometric(p=0.2) clipped to 1..10 by
resampling (i.e. the geometric truncated to 1..10 and renormalised; mean 3.797 words); a span
starts at the beginning of a word; exactly the budget of tokens is masked (the last span is cut
when it would overflow); the 80/10/10 decision is taken once per span. SpanBERT's released code
defaults to p=0.3 and no SBO; we follow the paper.

Sampling loop (restated from the paper and its fairseq code): draw a length l and an anchor token
uniformly among maskable tokens; move the anchor to the first piece of its word; reject the draw
if that piece is already masked; otherwise mask the l words from there, piece by piece, until the
budget is reached.

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


def sample_span_lengths(
    *, seed: tf.Tensor, num: int | tf.Tensor, p: float = 0.2, max_length: int = 10
) -> tf.Tensor:
    """Draws `num` span lengths (words) from the truncated geometric, int32 [num]."""
    logits = tf.math.log(tf.constant(span_length_probabilities(p=p, max_length=max_length)))
    draws = tf.random.stateless_categorical(logits[None, :], num, seed, dtype=tf.int32)
    return draws[0] + 1


def choose_spans(
    maskable: tf.Tensor,
    word_starts: tf.Tensor,
    budget: tf.Tensor,
    *,
    seed: tf.Tensor,
    p: float,
    max_length: int,
) -> tf.Tensor:
    """Bool [L]: exactly `budget` maskable tokens covered by word-aligned geometric spans."""
    length = tf.shape(maskable)[0]
    index, num_words = whole_word.unit_index(maskable, word_starts)
    positions = tf.range(length)
    first_piece = tf.math.unsorted_segment_min(
        positions, tf.where(index >= 0, index, num_words), num_words + 1
    )[:num_words]
    candidates = tf.cast(tf.where(maskable)[:, 0], tf.int32)
    num_candidates = tf.shape(candidates)[0]
    max_iterations = 100 * budget + 100

    def body(it, count, selected):
        it_seed = tf.random.experimental.stateless_fold_in(seed, it)
        len_seed, anchor_seed = tf.unstack(tf.random.experimental.stateless_split(it_seed, 2))
        span_words = sample_span_lengths(seed=len_seed, num=1, p=p, max_length=max_length)[0]
        anchor = candidates[
            tf.random.stateless_uniform(
                [], anchor_seed, minval=0, maxval=num_candidates, dtype=tf.int32
            )
        ]
        word = index[anchor]
        accept = ~selected[first_piece[word]]
        in_span = (index >= word) & (index < word + span_words)
        fresh = in_span & ~selected & accept
        fresh &= tf.cumsum(tf.cast(fresh, tf.int32)) <= budget - count
        return it + 1, count + tf.reduce_sum(tf.cast(fresh, tf.int32)), selected | fresh

    _, count, selected = tf.while_loop(
        lambda it, count, selected: (count < budget) & (it < max_iterations),
        body,
        (tf.constant(0), tf.constant(0), tf.zeros([length], tf.bool)),
    )
    check = tf.debugging.assert_equal(count, budget, message="span sampler missed its budget")
    with tf.control_dependencies([check]):
        return tf.identity(selected)


def run_boundaries(selected: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """First and last position of the maximal masked run holding each token, int32 [L].

    Values at unselected positions are meaningless. Example: selected [F, T, T, F, T]
    -> starts [., 1, 1, ., 4], ends [., 2, 2, ., 4].
    """
    as_int = tf.cast(selected, tf.int32)
    previous = tf.concat([[0], as_int[:-1]], 0)
    following = tf.concat([as_int[1:], [0]], 0)
    run_starts = tf.cast(tf.where((as_int == 1) & (previous == 0))[:, 0], tf.int32)
    run_ends = tf.cast(tf.where((as_int == 1) & (following == 0))[:, 0], tf.int32)
    run = tf.maximum(tf.cumsum(as_int * (1 - previous)) - 1, 0)
    padded_starts = tf.concat([run_starts, [0]], 0)
    padded_ends = tf.concat([run_ends, [0]], 0)
    return tf.gather(padded_starts, run), tf.gather(padded_ends, run)


def mask_spans(
    features: mlm.Features,
    *,
    seed: tf.Tensor,
    spec: mlm.MlmSpec,
    p: float = 0.2,
    max_length: int = 10,
) -> mlm.Features:
    """SpanBERT masking of one example, with SBO targets.

    Input: `input_ids` [L], `word_starts` [L]. Output: as `mlm.mask_tokens`, plus, aligned with
    `masked_positions` and padded to max_predictions: `span_left_positions` (s - 1),
    `span_right_positions` (e + 1), `span_offsets` (position - s), where [s, e] is the token's
    masked run; boundaries are clipped to [0, L - 1] (only reachable without [CLS]/[SEP]).

    Example (mask_id 4, specials (2, 3), budget 3): input_ids [2, 10, 11, 12, 13, 14, 3],
    word_starts [1, 1, 0, 1, 1, 1, 1], a 2-word span from word "10 11" -> tokens 10 11 12:
    input_ids [2, 4, 4, 4, 13, 14, 3] (one 80/10/10 decision for the whole span),
    masked_positions [1, 2, 3, 0...], span_left_positions [0, 0, 0, 0...],
    span_right_positions [4, 4, 4, 0...], span_offsets [0, 1, 2, 0...].
    """
    mlm.require_features(features, ["input_ids", "word_starts"], where="mask_spans")
    choose_seed, replace_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    maskable = mlm.maskable_tokens(features, spec=spec)
    budget = mlm.prediction_budget(tf.reduce_sum(tf.cast(maskable, tf.int32)), spec=spec)
    selected = choose_spans(
        maskable, features["word_starts"], budget, seed=choose_seed, p=p, max_length=max_length
    )
    starts, ends = run_boundaries(selected)
    positions = tf.range(tf.shape(selected)[0])
    decision_index = tf.where(selected, starts, positions)
    out = mlm.finish_masking(
        features, selected, seed=replace_seed, spec=spec, decision_index=decision_index
    )
    last = tf.shape(selected)[0] - 1
    masked = tf.where(selected)[:, 0]
    sbo = {
        "span_left_positions": tf.maximum(starts - 1, 0),
        "span_right_positions": tf.minimum(ends + 1, last),
        "span_offsets": positions - starts,
    }
    for key, values in sbo.items():
        out[key] = mlm.pad_to(tf.gather(values, masked), spec.max_predictions, name=key)
    return out


def spanbert_dynamic_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, p: float = 0.2, max_length: int = 10
) -> tf.data.Dataset:
    """SpanBERT masking with a fresh mask each time an example is seen."""
    return mlm.dynamic_masking(dataset, mask_fn=mask_spans, spec=spec, p=p, max_length=max_length)


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
