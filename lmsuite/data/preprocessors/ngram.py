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


def sample_ngram_lengths(*, seed: tf.Tensor, num: tf.Tensor, max_ngram: int = 3) -> tf.Tensor:
    """Draws `num` n's in 1..max_ngram with p(n) proportional to 1/n, int32 [num].

    Not restricted to the words left: `choose_ngrams` cuts an n-gram at the row's end, as ALBERT
    does. Example: num 4 -> e.g. [1, 3, 1, 2].
    """
    logits = tf.math.log(ngram_probabilities(max_ngram).astype(np.float32))
    logits = tf.tile(logits[None, :], tf.stack([num, 1]))
    draws = tf.random.stateless_categorical(logits, 1, seed, dtype=tf.int32)[:, 0]
    return draws + 1


def choose_ngrams(
    maskable: tf.Tensor,
    word_starts: tf.Tensor,
    budget: tf.Tensor,
    *,
    seed: tf.Tensor,
    max_ngram: int,
) -> tf.Tensor:
    """Bool [L]: tokens covered by ALBERT's n-gram selection."""
    index, num_words = whole_word.unit_index(maskable, word_starts)
    lengths = whole_word.unit_lengths(index, num_words)
    prefix = tf.concat([[0], tf.cumsum(lengths)], 0)
    order_seed, ngram_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    order = tf.argsort(tf.random.stateless_uniform([num_words], order_seed), stable=True)
    drawn = sample_ngram_lengths(seed=ngram_seed, num=num_words, max_ngram=max_ngram)
    ns = tf.range(1, max_ngram + 1)

    def body(j, count, covered):
        start, n = order[j], drawn[j]
        ends = tf.minimum(start + ns, num_words)
        tokens = tf.gather(prefix, ends) - prefix[start]
        # n-grams running past the row's end are cut there (ALBERT's slice)
        fits = (ns <= n) & (start + ns <= num_words) & (count + tokens <= budget)
        n_cut = tf.reduce_max(tf.where(fits, ns, 0))
        span = tf.range(num_words)
        in_gram = (span >= start) & (span < start + n_cut)
        take = (n_cut > 0) & ~tf.reduce_any(in_gram & covered)
        covered = tf.where(take, covered | in_gram, covered)
        count += tf.where(take, prefix[start + n_cut] - prefix[start], 0)
        return j + 1, count, covered

    _, _, covered = tf.while_loop(
        lambda j, count, covered: (j < num_words) & (count < budget),
        body,
        (tf.constant(0), tf.constant(0), tf.zeros([num_words], tf.bool)),
    )
    padded = tf.concat([covered, [False]], 0)
    return maskable & tf.gather(padded, tf.where(index >= 0, index, num_words))


def mask_ngrams(
    features: mlm.Features, *, seed: tf.Tensor, spec: mlm.MlmSpec, max_ngram: int = 3
) -> mlm.Features:
    """ALBERT n-gram masking of one example.

    Input: `input_ids` [L], `word_starts` [L]. Output: as `mlm.mask_tokens`.

    Example (mask_id 4, specials (2, 3), max_predictions 3): input_ids
    [2, 10, 11, 12, 13, ..., 29, 3] with one-piece words, 20 maskable -> budget 3, e.g. the
    trigram 15 16 17 -> [2, ..., 14, 4, 4, 17, 18, ...] (17 kept by its own 10% draw),
    masked_positions [6, 7, 8], masked_ids [15, 16, 17]; or a bigram plus a unigram.
    """
    mlm.require_features(features, ["input_ids", "word_starts"], where="mask_ngrams")
    choose_seed, replace_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    maskable = mlm.maskable_tokens(features, spec=spec)
    budget = mlm.prediction_budget(tf.reduce_sum(tf.cast(maskable, tf.int32)), spec=spec)
    selected = choose_ngrams(
        maskable, features["word_starts"], budget, seed=choose_seed, max_ngram=max_ngram
    )
    return mlm.finish_masking(features, selected, seed=replace_seed, spec=spec)


def ngram_dynamic_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, max_ngram: int = 3
) -> tf.data.Dataset:
    """ALBERT n-gram MLM with a fresh mask each time an example is seen."""
    return mlm.dynamic_masking(dataset, mask_fn=mask_ngrams, spec=spec, max_ngram=max_ngram)


def ngram_static_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, max_ngram: int = 3, dupe_factor: int = 10
) -> tf.data.Dataset:
    """ALBERT n-gram MLM, `dupe_factor` fixed masks per example (ALBERT's offline data)."""
    return mlm.static_masking(
        dataset, mask_fn=mask_ngrams, dupe_factor=dupe_factor, spec=spec, max_ngram=max_ngram
    )
