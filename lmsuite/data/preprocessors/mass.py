"""MASS: masked sequence-to-sequence pretraining (Song et al., 2019), as its code builds it.

The reference is `restricted_mask_sent` and `mask_word` in microsoft/MASS
`MASS-unsupNMT/src/trainer.py`. There a sentence is `</s> w1 .. wn </s>`; one contiguous
fragment of it is corrupted in the encoder input, and the decoder, fed the original tokens one to
the left of the fragment, predicts the fragment:

  source = [EOS] + chunk + [EOS], n = len(source)
  k      = clip(round(fragment_fraction * n), 1, n - 1)   (round half to even, as Python's round)
  start  = 1 (probability 0.2), n - k (0.2), else uniform in [1, n - k]
  inputs               = source, fragment source[start : start + k] corrupted token by token:
                         [MASK] 80%, kept 10%, a random id 10%
  targets              = source[start : start + k]            (exactly k tokens, no extra EOS)
  decoder_input_tokens = source[start - 1 : start + k - 1]    (original tokens, never corrupted)
  decoder_positions    = start - 1, ..., start + k - 2        (the source positions of those)

Position 0 (the leading EOS) is never in the fragment, so the decoder's first input is always a
real source token (EOS when start = 1), and a fragment at the end includes the final EOS.
Both EOS are placed here, so the task's features have `add_eos=False` and no
`append_eos_after_trim`.

Deliberate differences from the reference:
* Sentences are chunks: each document is cut by `lm.split_documents` into chunks of at most
  `inputs - 2` tokens (room for the two EOS), where the reference trains on the corpus's
  sentences (one per line).
* k is computed per example from its own n. The reference takes one k per batch from the padded
  batch length (its longest sentence) and the number of start slots from the batch's first
  sentence, and applies both to every sentence of the batch.
* k is clipped to [1, n - 1]; the reference has no clip (at fraction 0.5 and n >= 3 the clip never
  binds; at fraction 1.0 the reference would index past the sentence).
* Random replacement ids are drawn from [random_low, vocab_size), which the task sets to the
  SentencePiece pieces without the special ids and sentinels; the reference draws from the whole
  dictionary (`np.random.randint(n_words)`), specials included.
* One contiguous fragment, always: the reference's `lambda_span` option (the fragment cut into
  shuffled pieces of `lambda_span` tokens) is not built; its default (10000) gives one fragment.
* The reference's decoder does not attend to encoder positions holding [MASK] (`enc_mask` in
  `mass_step`). That is a model option, not data: it can be recomputed from
  `encoder_input_tokens == mask_id`.
* Randomness comes from SeqIO's per-example stateless seeds (deterministic per seed), not from
  global numpy/torch generators.
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import lm

# The reference's `--word_mask_keep_rand 0.8,0.1,0.1`: [MASK] / kept / random (the rest).
MASK_RATE, KEEP_RATE = 0.8, 0.1
# `shuffle_segments` places the fragment first when p >= 0.8 and last when 0.6 <= p < 0.8.
FIRST_FROM, LAST_FROM = 0.8, 0.6


def fragment_length(n: int, fragment_fraction: float) -> int:
    """k for a source of n tokens (both EOS included): the Python mirror of the tf computation.

    Example: n=3 -> round(1.5) = 2; n=8 -> 4; n=5 -> round(2.5) = 2 (half to even), all at 0.5.
    """
    return min(max(round(n * fragment_fraction), 1), n - 1)


def targets_length_problem(
    sequence_length: Mapping[str, int], *, fragment_fraction: float = 0.5
) -> str | None:
    """Why a "targets" length cannot hold the longest fragment (k for n = L), or None if it can
    (or no targets length is given).

    Example: {"inputs": 64, "targets": 31} -> "targets length 31 < 32, ...".
    """
    (inputs_length,) = lm._lengths(sequence_length, "inputs")
    targets_length = sequence_length.get("targets")
    longest = fragment_length(inputs_length, fragment_fraction)
    if targets_length is None or targets_length >= longest:
        return None
    return (
        f"targets length {targets_length} < {longest}, the fragment of a full chunk (inputs "
        f"length {inputs_length} at fragment_fraction={fragment_fraction}); set targets >= "
        f"{longest}"
    )


def mass_example(source, *, mask_id, vocab_size, random_low, fragment_fraction, seed):
    """MASS features of one `source` = [EOS] + chunk + [EOS] (see the module docstring).

    Example (source [E a b c d e f E], n=8, k=4, start=2, every fragment token masked, M=mask_id):
      {"inputs": [E a M M M M f E], "targets": [b c d e],
       "decoder_input_tokens": [a b c d], "decoder_positions": [1 2 3 4]}
    """
    n = tf.size(source)
    # float64 so that the product is Python's, and tf.round rounds half to even as Python does.
    k = tf.cast(tf.round(tf.cast(n, tf.float64) * fragment_fraction), tf.int32)
    k = tf.clip_by_value(k, 1, n - 1)
    seeds = tf.random.experimental.stateless_split(seed, 4)
    p = tf.random.stateless_uniform([], seeds[0])
    anywhere = tf.random.stateless_uniform([], seeds[1], minval=1, maxval=n - k + 1, dtype=tf.int32)
    start = tf.where(p >= FIRST_FROM, 1, tf.where(p >= LAST_FROM, n - k, anywhere))
    fragment = source[start : start + k]
    draw = tf.random.stateless_uniform([k], seeds[2])
    random_ids = tf.random.stateless_uniform(
        [k], seeds[3], minval=random_low, maxval=vocab_size, dtype=source.dtype
    )
    corrupted = tf.where(
        draw < MASK_RATE,
        tf.cast(mask_id, source.dtype),
        tf.where(draw < MASK_RATE + KEEP_RATE, fragment, random_ids),
    )
    return {
        "inputs": tf.concat([source[:start], corrupted, source[start + k :]], axis=0),
        "targets": fragment,
        "decoder_input_tokens": source[start - 1 : start + k - 1],
        "decoder_positions": tf.range(start - 1, start + k - 1),
    }


def mass(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    mask_id: int,
    eos_id: int,
    vocab_size: int,
    random_low: int = 7,
    fragment_fraction: float = 0.5,
) -> tf.data.Dataset:
    """MASS examples from documents of `targets` token ids.

    Args:
      sequence_length: {"inputs": L, ...}; chunks hold at most L - 2 tokens. If a "targets"
        length is given it must hold the longest fragment, k for n = L (SeqIO would cut it).
      mask_id, eos_id: the [MASK] and EOS ids.
      vocab_size, random_low: random replacements are uniform in [random_low, vocab_size).
      fragment_fraction: the reference's `--word_mass` (0.5 in its MASS runs).

    Output features (int32): inputs [n], targets, decoder_input_tokens, decoder_positions [k].

    Example (chunk length 6 -> n=8, k=4, E = eos_id, M = mask_id, every fragment token masked):
      {"targets": [a b c d e f]} with start=2 ->
        {"inputs": [E a M M M M f E], "targets": [b c d e],
         "decoder_input_tokens": [a b c d], "decoder_positions": [1 2 3 4]}
      with start=n-k=4 (the fragment takes the final EOS) ->
        {"inputs": [E a b c M M M M], "targets": [d e f E],
         "decoder_input_tokens": [c d e f], "decoder_positions": [3 4 5 6]}
      {"targets": [a]} -> n=3, k=2, start=1:
        {"inputs": [E M M], "targets": [a E], "decoder_input_tokens": [E a],
         "decoder_positions": [0 1]}

    Raises:
      ValueError: for ids, rates or lengths out of range, naming the value and the range.
    """
    if not 0.0 < fragment_fraction <= 1.0:
        raise ValueError(f"fragment_fraction={fragment_fraction}, expected in (0, 1]")
    if vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size}, expected >= 1")
    if not 0 <= random_low < vocab_size:
        raise ValueError(f"random_low={random_low}, expected in [0, vocab_size={vocab_size})")
    for name, value in (("mask_id", mask_id), ("eos_id", eos_id)):
        if value < 0:
            raise ValueError(f"{name}={value}, expected a token id >= 0")
    if mask_id == eos_id:
        raise ValueError(f"mask_id={mask_id} equals eos_id={eos_id}; expected distinct ids")
    (inputs_length,) = lm._lengths(sequence_length, "inputs")
    if inputs_length < 3:
        raise ValueError(
            f"inputs length {inputs_length}, expected >= 3 (EOS, at least one token, EOS)"
        )
    problem = targets_length_problem(sequence_length, fragment_fraction=fragment_fraction)
    if problem is not None:
        raise ValueError(problem)
    chunks = lm.split_documents(dataset, chunk_length=inputs_length - 2)

    @seqio.map_over_dataset(num_seeds=1)
    def corrupt(x, seed):
        chunk = x["targets"]
        eos = tf.constant([eos_id], chunk.dtype)
        return mass_example(
            tf.concat([eos, chunk, eos], axis=0),
            mask_id=mask_id,
            vocab_size=vocab_size,
            random_low=random_low,
            fragment_fraction=fragment_fraction,
            seed=seed,
        )

    return corrupt(chunks)
