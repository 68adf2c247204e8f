"""ALBERT n-gram masking: mask runs of n <= 3 whole words, p(n) proportional to 1/n.

For max_ngram 3, p(n) = 6/11, 3/11, 2/11 before budget cuts. ALBERT's rule
(google-research/albert create_pretraining_data.py), restated:

  visit the words in a random order; at word w draw n from p(n) over every n, whatever is left
  of the row, and cut the n-gram at the row's end (ALBERT draws from
  `ngrams[:len(cand_index_set)]`, which always holds all max_ngram lengths, and slices
  `cand_indexes[idx:idx + n]`: at the second-to-last word the bigram comes 5/11 of the time, not
  the 1/3 of a draw among the n-grams that fit); shorten n while the n-gram's tokens overflow the
  budget (skip w if even one word overflows); skip w if any word of the n-gram is already
  covered; otherwise cover the n words. Stop once the budget is reached.

Each covered token gets its own 80/10/10 draw, as in ALBERT. The `albert_sop` task caps the
budget at ALBERT's `max_predictions_per_seq` = 20 (`MlmSpec.prediction_cap`), whatever L.

The tasks mask rows a group at a time (`mask_ngrams` on a group: the draws of every row at
once, then one loop turn per visit for the whole group), where a loop per row was most of an
ALBERT row's input CPU.
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


def sample_ngram_lengths(shape: tf.Tensor, *, seed: tf.Tensor, max_ngram: int = 3) -> tf.Tensor:
    """Draws n in 1..max_ngram with p(n) proportional to 1/n, int32 of `shape`: the inverse of
    the cumulative p at one uniform draw each.

    Example: shape [4] -> e.g. [1, 1, 3, 2].
    """
    cumulative = tf.constant(np.cumsum(ngram_probabilities(max_ngram))[:-1], tf.float32)
    uniform = tf.random.stateless_uniform(shape, seed)
    return 1 + tf.reduce_sum(tf.cast(uniform[..., None] >= cumulative, tf.int32), axis=-1)


def ngram_draws(
    shape: tf.Tensor, *, seed: tf.Tensor, max_ngram: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """The draws of ALBERT's selection for rows of `shape` [..., L], one per token (a row has
    no more words than tokens): (visiting-order keys, the n of each visit), float32 and int32.
    A row's W words are visited in the order of its first W keys (`choose_drawn_ngrams`)."""
    order_seed, ngram_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    return (
        tf.random.stateless_uniform(shape, order_seed),
        sample_ngram_lengths(shape, seed=ngram_seed, max_ngram=max_ngram),
    )


def choose_drawn_ngrams(
    maskable: tf.Tensor,
    word_starts: tf.Tensor,
    budget: tf.Tensor,
    *,
    order: tf.Tensor,
    drawn: tf.Tensor,
    max_ngram: int,
) -> tf.Tensor:
    """Bool [G, L]: the tokens ALBERT's rule covers in each row of a group, from the rows'
    `ngram_draws` (`order` keys and `drawn` n [G, L]; past a row's words they are not used)
    and `budget` [G].

    The rule visits one word per turn, so a row loops once per visit until its budget is met
    (a dozen or two turns at ALBERT's 20 predictions); the group takes its turns together, one
    loop for all its rows, which turns until its busiest row is done. A row that is done takes
    nothing more, as its own loop would have stopped.

    Example (one row, one-token words 0-5, budget 3): keys ordering the words 5, 0, 1, ..., n
    [3, 3, ...] -> visit word 5: the trigram cut at the row's end to the unigram 5 (1 token);
    visit word 0: the trigram 0 1 2 overflows, cut to the bigram 0 1 (3 tokens): budget met.
    """
    index, num_words = whole_word.unit_index(maskable, word_starts)
    rows, width = tf.shape(maskable)[0], tf.shape(maskable)[1]
    # A row's words in the order of their keys (uniform in [0, 1)); the rest after them.
    words = tf.range(width)[None, :]
    order = tf.argsort(tf.where(words < num_words[:, None], order, 2.0), axis=1, stable=True)
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


def choose_ngrams(
    maskable: tf.Tensor,
    word_starts: tf.Tensor,
    budget: tf.Tensor,
    *,
    seed: tf.Tensor,
    max_ngram: int,
) -> tf.Tensor:
    """Bool [L] or [G, L]: the tokens ALBERT's rule covers in a row or a group of rows (`budget`
    a scalar or [G]), drawing every row's numbers from `seed` (`ngram_draws`)."""
    if maskable.shape.rank == 1:
        one = choose_ngrams(
            maskable[None],
            word_starts[None],
            tf.reshape(budget, [1]),
            seed=seed,
            max_ngram=max_ngram,
        )
        return one[0]
    order, drawn = ngram_draws(tf.shape(maskable), seed=seed, max_ngram=max_ngram)
    return choose_drawn_ngrams(
        maskable, word_starts, budget, order=order, drawn=drawn, max_ngram=max_ngram
    )


def mask_ngrams(
    features: mlm.Features,
    *,
    seed: tf.Tensor,
    spec: mlm.MlmSpec,
    max_ngram: int = 3,
    lengths: tf.Tensor | None = None,
) -> mlm.Features:
    """ALBERT n-gram masking of one example, or of a group of rows (as `mlm.mask_tokens`).

    Input: `input_ids` [L], `word_starts` [L]; or a group [G, L] with the rows' `lengths` [G]
    (tokens past them are padding, never masked). Output: as `mlm.mask_tokens`. Every row
    draws its own numbers from `seed` (`ngram_draws` and the 80/10/10 replacements, one per
    token), so a row's mask depends on the group it is masked in, as a BERT row's does.

    Example (mask_id 4, specials (2, 3), max_predictions 3): input_ids
    [2, 10, 11, 12, 13, ..., 29, 3] with one-piece words, 20 maskable -> budget 3, e.g. the
    trigram 15 16 17 -> [2, ..., 14, 4, 4, 17, 18, ...] (17 kept by its own 10% draw),
    masked_positions [6, 7, 8], masked_ids [15, 16, 17]; or a bigram plus a unigram.
    """
    mlm.require_features(features, ["input_ids", "word_starts"], where="mask_ngrams")
    if lengths is None:  # one example: a group of one
        one = mask_ngrams(
            {k: v[None] for k, v in features.items()},
            seed=seed,
            spec=spec,
            max_ngram=max_ngram,
            lengths=tf.size(features["input_ids"])[None],
        )
        return {k: v[0] for k, v in one.items()}
    choose_seed, replace_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    maskable = mlm.maskable_tokens(features, spec=spec, lengths=lengths)
    budget = mlm.prediction_budget(tf.reduce_sum(tf.cast(maskable, tf.int32), axis=-1), spec=spec)
    selected = choose_ngrams(
        maskable, features["word_starts"], budget, seed=choose_seed, max_ngram=max_ngram
    )
    return mlm.finish_masking(features, selected, seed=replace_seed, spec=spec)


def ngram_dynamic_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, max_ngram: int = 3
) -> tf.data.Dataset:
    """ALBERT n-gram MLM with a fresh mask each time an example is seen, `mlm.GROUP_SIZE`
    examples per call (`mlm.grouped_dynamic_masking`)."""
    return mlm.grouped_dynamic_masking(dataset, mask_fn=mask_ngrams, spec=spec, max_ngram=max_ngram)


def ngram_static_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, max_ngram: int = 3, dupe_factor: int = 10
) -> tf.data.Dataset:
    """ALBERT n-gram MLM, `dupe_factor` fixed masks per example (ALBERT's offline data)."""
    return mlm.static_masking(
        dataset, mask_fn=mask_ngrams, dupe_factor=dupe_factor, spec=spec, max_ngram=max_ngram
    )
