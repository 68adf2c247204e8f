"""MASS: masked sequence-to-sequence pretraining (Song et al., 2019).

The encoder sees a sentence with one contiguous fragment masked; the decoder predicts the
fragment, given the fragment shifted right by one. Here a "sentence" is a chunk of a document of
at most `inputs - 1` tokens (room for EOS), cut by `lm.split_documents`.

For a chunk of n tokens the fragment has k = max(1, round(fragment_fraction * n)) tokens and
starts uniformly in [0, n - k] (the paper's choice; the released code favours the first and
last positions). Each fragment token of the encoder input becomes [MASK] with probability 0.8, a
random id in [random_low, vocab_size) with 0.1 and stays itself otherwise (as BERT, and the paper).
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import lm


def mask_fragment(
    tokens, *, mask_id, bos_id, vocab_size, random_low, fragment_fraction, seed, rates=(0.8, 0.1)
):
    """MASS features for one token sequence (see `mass` for the example)."""
    n = tf.size(tokens)
    k = tf.cast(tf.round(tf.cast(n, tf.float32) * fragment_fraction), tf.int32)
    k = tf.clip_by_value(k, 1, n)
    seeds = tf.random.experimental.stateless_split(seed, 3)
    start = tf.random.stateless_uniform([], seeds[0], minval=0, maxval=n - k + 1, dtype=tf.int32)
    position = tf.range(n)
    in_fragment = tf.logical_and(position >= start, position < start + k)
    draw = tf.random.stateless_uniform([n], seeds[1])
    random_ids = tf.random.stateless_uniform(
        [n], seeds[2], minval=random_low, maxval=vocab_size, dtype=tokens.dtype
    )
    corrupted = tf.where(draw < rates[0], tf.cast(mask_id, tokens.dtype), tokens)
    corrupted = tf.where(
        tf.logical_and(draw >= rates[0], draw < rates[0] + rates[1]), random_ids, corrupted
    )
    fragment = tokens[start : start + k]
    previous = tf.where(start > 0, tokens[tf.maximum(start - 1, 0)], tf.cast(bos_id, tokens.dtype))
    return {
        "inputs": tf.where(in_fragment, corrupted, tokens),
        "targets": fragment,
        "decoder_input_tokens": tf.concat([[previous], fragment[:-1]], axis=0),
        "decoder_positions": tf.range(start, start + k),
    }


def mass(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    mask_id: int,
    bos_id: int,
    vocab_size: int,
    random_low: int = 7,
    fragment_fraction: float = 0.5,
) -> tf.data.Dataset:
    """MASS examples from documents of `targets` token ids.

    Output features:
      inputs: the chunk with the fragment corrupted (80% [MASK] / 10% random / 10% kept).
      targets: the fragment.
      decoder_input_tokens: the fragment shifted right; its first token is the token just before
        the fragment (MASS feeds the previous source token), or `bos_id` at position 0. SeqIO's
        `EncDecFeatureConverter` ignores this feature and shifts `targets` itself, which differs
        only in that first token.
      decoder_positions: positions of the fragment tokens in the chunk (MASS keeps the source
        positions in the decoder).

    Example (n=8, k=4, start=2, every fragment token masked, M = mask_id):
      {"targets": [a b c d e f g h]} ->
      {"inputs": [a b M M M M g h], "targets": [c d e f],
       "decoder_input_tokens": [b c d e], "decoder_positions": [2 3 4 5]}
    """
    if not 0.0 < fragment_fraction <= 1.0:
        raise ValueError(f"fragment_fraction={fragment_fraction}, expected in (0, 1]")
    if not 0 <= random_low < vocab_size:
        raise ValueError(f"random_low={random_low}, expected in [0, vocab_size={vocab_size})")
    (inputs_length,) = lm._lengths(sequence_length, "inputs")
    chunks = lm.split_documents(dataset, chunk_length=inputs_length - 1)

    @seqio.map_over_dataset(num_seeds=1)
    def corrupt(x, seed):
        return mask_fragment(
            x["targets"],
            mask_id=mask_id,
            bos_id=bos_id,
            vocab_size=vocab_size,
            random_low=random_low,
            fragment_fraction=fragment_fraction,
            seed=seed,
        )

    return corrupt(chunks)
