"""StructBERT's two structural objectives (Wang et al. 2020).

* Word structure: after MLM masking, shuffle 5% of the trigrams of UNMASKED tokens and predict
  the original token at every shuffled position. The number of trigrams is
  `min(max_trigrams, round(rate * T))`, T = the number of trigram positions whose three tokens
  are all unmasked and non-special. Trigrams are drawn without overlap from the aligned blocks
  [o + 3j, o + 3j + 3) for a random offset o in {0, 1, 2}; each gets one of the five non-identity
  permutations of three, uniformly (the identity would teach nothing).
* Sentence structure: a pair (S1, S2) where S2 is the next sentence, the previous one or one from
  another document, 1/3 each: `sentence_pairs.sentence_pairs(objective="structbert")`.
"""

from __future__ import annotations

import tensorflow as tf

from lmsuite.data.preprocessors import mlm, sentence_pairs

_PERMUTATIONS = ((0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))


def shuffle_trigrams(
    features: mlm.Features,
    *,
    seed: tf.Tensor,
    spec: mlm.MlmSpec,
    max_trigrams: int,
    rate: float = 0.05,
) -> mlm.Features:
    """Word-structure objective on one (possibly already MLM-masked) example.

    Input: `input_ids` [L]; optional `masked_positions`/`masked_weights` (tokens to leave alone).
    Output adds `shuffled_positions` (int32), `shuffled_ids` (original ids), `shuffled_weights`
    (float32), each [3 * max_trigrams], and shuffles input_ids in place.

    Example (specials (2, 3), rate 0.5, max_trigrams 1): input_ids [2, 10, 11, 12, 13, 3],
    T = 2 -> one trigram; offset 1, permutation (2, 0, 1) -> input_ids [2, 12, 10, 11, 13, 3],
    shuffled_positions [1, 2, 3], shuffled_ids [10, 11, 12], shuffled_weights [1., 1., 1.].
    """
    if max_trigrams < 1 or not 0.0 < rate <= 1.0:
        raise ValueError(f"max_trigrams={max_trigrams} must be >= 1, rate={rate} in (0, 1]")
    ids = features["input_ids"]
    length = tf.shape(ids)[0]
    free = mlm.maskable_tokens(features, spec=spec)
    if "masked_positions" in features:
        taken = tf.cast(features["masked_positions"][features["masked_weights"] > 0], tf.int32)
        hit = tf.scatter_nd(taken[:, None], tf.ones_like(taken), [length]) > 0
        free &= ~hit
    free_int = tf.cast(free, tf.int32)
    num_trigrams = tf.reduce_sum(free_int[:-2] * free_int[1:-1] * free_int[2:])

    offset_seed, pick_seed, perm_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    offset = tf.random.stateless_uniform([], offset_seed, minval=0, maxval=3, dtype=tf.int32)
    num_blocks = tf.maximum(length - offset, 0) // 3
    block_tokens = offset + 3 * tf.range(num_blocks)[:, None] + tf.range(3)[None, :]
    eligible = tf.reduce_all(tf.gather(free, block_tokens), axis=1)
    wanted = tf.cast(tf.round(rate * tf.cast(num_trigrams, tf.float64)), tf.int32)
    count = tf.minimum(tf.minimum(wanted, max_trigrams), tf.reduce_sum(tf.cast(eligible, tf.int32)))
    draws = tf.random.stateless_uniform([num_blocks], pick_seed)
    rank = tf.math.invert_permutation(tf.argsort(tf.where(eligible, draws, 2.0), stable=True))
    chosen = rank < count
    permutation = tf.gather(
        tf.constant(_PERMUTATIONS, tf.int32),
        tf.random.stateless_uniform([num_blocks], perm_seed, minval=0, maxval=5, dtype=tf.int32),
    )
    sources = tf.gather(block_tokens, permutation, batch_dims=1)
    chosen_tokens = tf.boolean_mask(block_tokens, chosen)
    chosen_sources = tf.boolean_mask(sources, chosen)
    source = tf.tensor_scatter_nd_update(
        tf.range(length), tf.reshape(chosen_tokens, [-1, 1]), tf.reshape(chosen_sources, [-1])
    )
    positions = tf.sort(tf.reshape(chosen_tokens, [-1]))
    width = 3 * max_trigrams
    out = dict(features)
    out["input_ids"] = tf.gather(ids, source)
    out["shuffled_positions"] = mlm.pad_to(positions, width, name="shuffled_positions")
    out["shuffled_ids"] = mlm.pad_to(tf.gather(ids, positions), width, name="shuffled_ids")
    out["shuffled_weights"] = mlm.pad_to(
        tf.ones_like(positions, tf.float32), width, name="shuffled_weights"
    )
    return out


def mask_and_shuffle(
    features: mlm.Features,
    *,
    seed: tf.Tensor,
    spec: mlm.MlmSpec,
    max_trigrams: int,
    rate: float = 0.05,
) -> mlm.Features:
    """StructBERT's input corruption: token MLM, then trigram shuffling of unmasked tokens."""
    mask_seed, shuffle_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    masked = mlm.mask_tokens(features, seed=mask_seed, spec=spec)
    return shuffle_trigrams(
        masked, seed=shuffle_seed, spec=spec, max_trigrams=max_trigrams, rate=rate
    )


def structbert_dynamic_mlm(
    dataset: tf.data.Dataset, *, spec: mlm.MlmSpec, max_trigrams: int, rate: float = 0.05
) -> tf.data.Dataset:
    """MLM + word structure with fresh draws each time an example is seen."""
    return mlm.dynamic_masking(
        dataset, mask_fn=mask_and_shuffle, spec=spec, max_trigrams=max_trigrams, rate=rate
    )


def structbert_sentence_pairs(dataset: tf.data.Dataset, **kwargs) -> tf.data.Dataset:
    """3-way sentence relation pairs (next / previous / other document); see `sentence_pairs`."""
    return sentence_pairs.sentence_pairs(dataset, objective="structbert", **kwargs)
