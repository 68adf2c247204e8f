"""ALBERT n-gram masking: mask runs of n <= 3 whole words, p(n) proportional to 1/n.

For max_ngram 3, p(n) = 6/11, 3/11, 2/11 before budget cuts. ALBERT's rule
(google-research/albert create_pretraining_data.py), restated:

  visit the words in a random order; at word w draw n from p(n) restricted to the n-grams that
  exist from w (n <= words left); shorten n while the n-gram's tokens overflow the budget
  (skip w if even one word overflows); skip w if any word of the n-gram is already covered;
  otherwise cover the n words. Stop once the budget is reached.

Each covered token gets its own 80/10/10 draw, as in ALBERT. The `albert_sop` task caps the
budget at ALBERT's `max_predictions_per_seq` = 20 (`MlmSpec.prediction_cap`), whatever L.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from lmsuite.data.preprocessors import mlm, whole_word


def ngram_probabilities(max_ngram: int) -> np.ndarray:
    """p(n) proportional to 1/n, n = 1..max_ngram. Example: 3 -> [6/11, 3/11, 2/11]."""
    if max_ngram < 1:
        raise ValueError(f"max_ngram={max_ngram}, expected >= 1")
    inverse = 1.0 / np.arange(1, max_ngram + 1)
    return inverse / inverse.sum()


def sample_ngram_lengths(*, seed: tf.Tensor, available: tf.Tensor, max_ngram: int = 3) -> tf.Tensor:
    """Draws n in 1..min(max_ngram, available[i]) with p(n) proportional to 1/n, int32 [N].

    Example: available [3, 3, 1] -> e.g. [1, 2, 1] (the last can only be 1).
    """
    ns = tf.range(1, max_ngram + 1)
    logits = tf.where(
        ns[None, :] <= tf.cast(available, tf.int32)[:, None],
        tf.math.log(1.0 / tf.cast(ns, tf.float32))[None, :],
        -np.inf,
    )
    draws = tf.random.stateless_categorical(logits, 1, seed, dtype=tf.int32)[:, 0]
    return draws + 1


def ngram_draws(
    maskable: tf.Tensor, word_starts: tf.Tensor, *, seed: tf.Tensor, max_ngram: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """The draws of ALBERT's selection for one row [L]: (the words in visiting order, the n
    drawn at each visit), int32 [W] each for the row's W words (`choose_drawn_ngrams`)."""
    _, num_words = whole_word.unit_index(maskable, word_starts)
    order_seed, ngram_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    order = tf.argsort(tf.random.stateless_uniform([num_words], order_seed), stable=True)
    drawn = sample_ngram_lengths(
        seed=ngram_seed, available=tf.minimum(max_ngram, num_words - order), max_ngram=max_ngram
    )
    return order, drawn


def choose_drawn_ngrams(
    maskable: tf.Tensor,
    word_starts: tf.Tensor,
    budget: tf.Tensor,
    *,
    order: tf.Tensor,
    drawn: tf.Tensor,
    max_ngram: int,
) -> tf.Tensor:
    """Bool [G, L]: the tokens ALBERT's rule covers in each row of a group, from each row's
    `ngram_draws` (`order`, `drawn` [G, W], zero past a row's own words) and `budget` [G].

    The rule visits one word per turn, so a row loops once per visit until its budget is met
    (a dozen or two turns at ALBERT's 20 predictions); the group takes its turns together, one
    loop for all its rows, which turns until its busiest row is done. A row that is done takes
    nothing more, as its own loop would have stopped.

    Example (one row, one-token words 0-5, budget 3): order [4, 0, 1, ...], n [2, 3, ...] ->
    visit word 4: the bigram 4 5 (2 tokens); visit word 0: the trigram 0 1 2 overflows, cut to
    the unigram 0 (3 tokens): words 0, 4, 5 covered, budget met.
    """
    index, num_words = whole_word.unit_index(maskable, word_starts)
    rows, width = tf.shape(maskable)[0], tf.shape(order)[1]
    # Tokens per word, then before each word: a row's non-maskable tokens count to a dropped
    # last column.
    slot = tf.where(index >= 0, index, width) + (width + 1) * tf.range(rows)[:, None]
    lengths = tf.reshape(
        tf.math.unsorted_segment_sum(tf.ones_like(slot), slot, rows * (width + 1)),
        [rows, width + 1],
    )[:, :width]
    prefix = tf.concat([tf.zeros([rows, 1], tf.int32), tf.cumsum(lengths, axis=1)], 1)
    budget = tf.cast(budget, tf.int32)
    ns = tf.range(1, max_ngram + 1)[None, :]
    words = tf.range(width)[None, :]

    def busy(j, count):
        return (j < num_words) & (count < budget)

    def visit(j, count, covered):
        column = tf.minimum(j, tf.maximum(width - 1, 0))  # a done row reads any visit: unused
        start, n = order[:, column], drawn[:, column]
        ends = tf.minimum(start[:, None] + ns, num_words[:, None])
        before = tf.gather(prefix, start, batch_dims=1)
        tokens = tf.gather(prefix, ends, batch_dims=1) - before[:, None]
        fits = (
            (ns <= n[:, None])
            & (start[:, None] + ns <= num_words[:, None])
            & (count[:, None] + tokens <= budget[:, None])
        )
        n_cut = tf.reduce_max(tf.where(fits, ns, 0), axis=1)
        in_gram = (words >= start[:, None]) & (words < (start + n_cut)[:, None])
        take = busy(j, count) & (n_cut > 0) & ~tf.reduce_any(in_gram & covered, axis=1)
        covered = tf.where(take[:, None], covered | in_gram, covered)
        count += tf.where(take, tf.gather(prefix, start + n_cut, batch_dims=1) - before, 0)
        return j + 1, count, covered

    _, _, covered = tf.while_loop(
        lambda j, count, covered: tf.reduce_any(busy(j, count)),
        visit,
        (tf.constant(0), tf.zeros([rows], tf.int32), tf.zeros([rows, width], tf.bool)),
    )
    padded = tf.concat([covered, tf.zeros([rows, 1], tf.bool)], 1)
    return maskable & tf.gather(padded, tf.where(index >= 0, index, width), batch_dims=1)


def ngram_mask_draws(
    features: mlm.Features, *, seed: tf.Tensor, spec: mlm.MlmSpec, max_ngram: int = 3
) -> mlm.Features:
    """Every random number of one row's n-gram masking, added as 1-D features: `ngram_draws`
    (which need the row's word count) and the per-token replacement draws
    (`mlm.replacement_draws`). `mask_drawn_ngrams` then masks a group of such rows as
    `mask_ngrams` masks each."""
    mlm.require_features(features, ["input_ids", "word_starts"], where="mask_ngrams")
    choose_seed, replace_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    maskable = mlm.maskable_tokens(features, spec=spec)
    order, ngrams = ngram_draws(
        maskable, features["word_starts"], seed=choose_seed, max_ngram=max_ngram
    )
    decisions, random_ids = mlm.replacement_draws(
        tf.shape(features["input_ids"]), seed=replace_seed, spec=spec
    )
    drawn = {"order": order, "ngrams": ngrams, "decisions": decisions, "random_ids": random_ids}
    return {**features, **{mlm.DRAWS_PREFIX + k: v for k, v in drawn.items()}}


def mask_drawn_ngrams(
    rows: mlm.Features, *, lengths: tf.Tensor, spec: mlm.MlmSpec, max_ngram: int = 3
) -> mlm.Features:
    """`mask_ngrams` on a group of rows [G, L] (their own `lengths` [G], zero-padded past them)
    carrying their `ngram_mask_draws`; the draws are dropped."""
    drawn, rows = mlm.split_draws(rows)
    maskable = mlm.maskable_tokens(rows, spec=spec, lengths=lengths)
    budget = mlm.prediction_budget(tf.reduce_sum(tf.cast(maskable, tf.int32), axis=-1), spec=spec)
    selected = choose_drawn_ngrams(
        maskable,
        rows["word_starts"],
        budget,
        order=drawn["order"],
        drawn=drawn["ngrams"],
        max_ngram=max_ngram,
    )
    return mlm.finish_masking(
        rows, selected, spec=spec, drawn=(drawn["decisions"], drawn["random_ids"])
    )


def mask_ngrams(
    features: mlm.Features, *, seed: tf.Tensor, spec: mlm.MlmSpec, max_ngram: int = 3
) -> mlm.Features:
    """ALBERT n-gram masking of one example: `ngram_mask_draws` then `mask_drawn_ngrams` on a
    group of one (the tasks draw row by row and mask groups, with the same masks).

    Input: `input_ids` [L], `word_starts` [L]. Output: as `mlm.mask_tokens`.

    Example (mask_id 4, specials (2, 3), max_predictions 3): input_ids
    [2, 10, 11, 12, 13, ..., 29, 3] with one-piece words, 20 maskable -> budget 3, e.g. the
    trigram 15 16 17 -> [2, ..., 14, 4, 4, 17, 18, ...] (17 kept by its own 10% draw),
    masked_positions [6, 7, 8], masked_ids [15, 16, 17]; or a bigram plus a unigram.
    """
    drawn = ngram_mask_draws(features, seed=seed, spec=spec, max_ngram=max_ngram)
    one = mask_drawn_ngrams(
        {k: v[None] for k, v in drawn.items()},
        lengths=tf.size(features["input_ids"])[None],
        spec=spec,
        max_ngram=max_ngram,
    )
    return {k: v[0] for k, v in one.items()}


def ngram_dynamic_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, max_ngram: int = 3
) -> tf.data.Dataset:
    """ALBERT n-gram MLM with a fresh mask each time an example is seen: each row draws under
    its own seed (`ngram_mask_draws`), groups of rows are masked together (the same masks)."""
    return mlm.grouped_dynamic_masking(
        dataset,
        draw_fn=ngram_mask_draws,
        mask_fn=mask_drawn_ngrams,
        spec=spec,
        max_ngram=max_ngram,
    )


def ngram_static_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, max_ngram: int = 3, dupe_factor: int = 10
) -> tf.data.Dataset:
    """ALBERT n-gram MLM, `dupe_factor` fixed masks per example (ALBERT's offline data)."""
    return mlm.static_masking(
        dataset, mask_fn=mask_ngrams, dupe_factor=dupe_factor, spec=spec, max_ngram=max_ngram
    )
