"""T5 span corruption and i.i.d. denoising, noising whole batches of chunks at once.

Both objectives replace each run of noise tokens in `inputs` by one sentinel and put the noise
runs, each behind its sentinel, in `targets` (T5's `noise_span_to_unique_sentinel` /
`nonnoise_span_to_unique_sentinel`; see below for the one case where we differ).
Sentinel ids are passed explicitly: `sentinel_ids[i]` is the id of `<extra_id_i>` (SeqIO's
convention puts `<extra_id_0>` at vocab_size - 1, decreasing).

Where EOS goes: with `eos_id=None` (the default, as T5) neither feature gets an EOS here and
SeqIO appends it (`add_eos=True` on both output features); with `eos_id` set, it is appended
here to both. Either way EOS is the last token and the sentinel structure sits before it:

  chunk    = [a b c d e f g h]   noise spans (c d) and (g h)
  inputs   = [a b <0> e f <1>] + [EOS]
  targets  = [<0> c d <1> g h] + [EOS]

Unlike T5, documents are not first cut to a random 65,536-token window (`select_random_chunk`)
and the stream does not restart every 128 documents (see `lm.chunk_stream_batches`): every token
is used and only the dataset's last chunk is short.

T5's span mask alternates non-noise and noise spans beginning with non-noise and ending with
noise, so `inputs` always end with a sentinel (before EOS) and `targets` always start with
`<extra_id_0>`. Interleaving the two recovers the chunk: `a b` `c d` `e f` `g h`.

I.i.d. masks may start and end either way. T5 builds targets with
`nonnoise_span_to_unique_sentinel`: a sentinel for every non-noise run, so a chunk that ends with
non-noise gets a trailing sentinel in the targets; `iid_denoising` adds it too. On every mask that
starts with non-noise, both features then equal T5's exactly:

  chunk [a b c d e f], noise (b c):  inputs [a <0> d e f]  targets [<0> b c <1>]

Deliberate difference: where the mask starts with noise, lmsuite keeps <k> in the targets
before noise run k, the run <k> replaced in the inputs; T5 numbers the non-noise runs, so its
<k> follows noise run k and the pairing is off by one. lmsuite's targets are then <0> followed
by T5's with every <k> renumbered <k+1> (the inputs are the same):

  chunk [a b c d e f], noise (a), (d):  inputs [<0> b c <1> e f] (T5: the same)
                                        targets [<0> a <1> d <2>] (T5: [a <0> d <1>])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import lm


def _noise_counts(length: int, noise_density: float, mean_noise_span_length: float):
    """Python mirror of the per-chunk counts: (noise tokens, noise spans) for `length` tokens."""
    num_noise = int(round(length * noise_density))
    num_spans = int(round(num_noise / mean_noise_span_length))
    return num_noise, num_spans


def random_spans_helper(
    *,
    inputs_length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
    """Raw chunk length and targets length for a requested inputs length (T5's arithmetic).

    Returns the largest raw length whose corrupted inputs (non-noise tokens, one sentinel per
    span, one EOS) fit `inputs_length`, and the targets length it produces (noise tokens, one
    sentinel per span, one EOS).

    Example: inputs_length=512 -> (568, 114): 568 raw tokens hold round(85.2) = 85 noise tokens in
    round(85 / 3) = 28 spans, so inputs = 483 + 28 + 1 = 512 and targets = 85 + 28 + 1 = 114.
    """
    if inputs_length < 2:
        raise ValueError(f"inputs_length={inputs_length}, expected >= 2")
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density={noise_density}, expected in (0, 1)")

    def corrupted_lengths(tokens_length):
        num_noise, num_spans = _noise_counts(tokens_length, noise_density, mean_noise_span_length)
        return (
            tokens_length - num_noise + num_spans * extra_tokens_per_span_inputs + 1,
            num_noise + num_spans * extra_tokens_per_span_targets + 1,
        )

    tokens_length = inputs_length - 1
    while corrupted_lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = corrupted_lengths(tokens_length)
    # T5 nudges density-0.5 setups so that targets are no longer than inputs.
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def targets_length_problem(
    sequence_length: Mapping[str, int],
    *,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
) -> str | None:
    """Why `sequence_length` cannot hold span corruption's targets, or None if it can.

    Example: {"inputs": 512, "targets": 100} -> "targets length 100 < 114, ... set
    SEQUENCE_LENGTH = {'inputs': 512, 'targets': 114}".
    """
    inputs_length, targets_length = lm._lengths(sequence_length, "inputs", "targets")
    raw_length, needed = random_spans_helper(
        inputs_length=inputs_length,
        noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length,
    )
    if targets_length >= needed:
        return None
    return (
        f"targets length {targets_length} < {needed}, the targets length t5's random_spans_helper "
        f"gives for inputs {inputs_length} (raw chunks of {raw_length} tokens, noise density "
        f"{noise_density}, mean span {mean_noise_span_length}); set SEQUENCE_LENGTH = "
        f"{{'inputs': {inputs_length}, 'targets': {needed}}}"
    )


def _random_composition(*, rows, total, parts, seed):
    """[rows, parts] positive ints summing to `total` per row, uniform over compositions.

    The cut points are a uniformly random (parts - 1)-subset of 1..total-1: the top-k of iid
    uniforms, which is the distribution T5 draws with a full shuffle, for a cheaper top_k.
    """
    scores = tf.random.stateless_uniform([rows, total - 1], seed=seed)
    _, cuts = tf.math.top_k(scores, k=parts - 1, sorted=False)
    cuts = tf.sort(cuts + 1, axis=1)
    zeros = tf.zeros([rows, 1], tf.int32)
    ends = tf.fill([rows, 1], total)
    bounds = tf.concat([zeros, cuts, ends], axis=1)
    return bounds[:, 1:] - bounds[:, :-1]


def random_spans_noise_mask(*, rows, length, noise_density, mean_noise_span_length, seed):
    """T5's random-spans noise mask for `rows` chunks of `length >= 2` tokens: bool [rows, length].

    Counts are fixed by the length: N = clip(round(length * density), 1, length - 1) noise
    tokens in S = clip(round(N / mean), 1, min(N, length - N)) spans; spans alternate
    non-noise, noise, ..., starting with non-noise and ending with noise; all such masks are
    equally likely.

    Example (length 8, density 0.25, mean 1 -> N=2, S=2): [F F T F F F F T] is one outcome.
    """
    length_f = tf.cast(length, tf.float32)
    num_noise = tf.cast(tf.round(length_f * noise_density), tf.int32)
    num_noise = tf.clip_by_value(num_noise, 1, length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length), tf.int32)
    num_spans = tf.clip_by_value(num_spans, 1, tf.minimum(num_noise, length - num_noise))
    seeds = tf.random.experimental.stateless_split(seed, 2)
    noise_lengths = _random_composition(rows=rows, total=num_noise, parts=num_spans, seed=seeds[0])
    plain_lengths = _random_composition(
        rows=rows, total=length - num_noise, parts=num_spans, seed=seeds[1]
    )
    interleaved = tf.reshape(tf.stack([plain_lengths, noise_lengths], axis=2), [rows, -1])
    # The start of every span after the first; each flips noise on or off.
    starts = tf.cumsum(interleaved, axis=1)[:, :-1]
    flat_starts = starts + tf.range(rows)[:, None] * length
    flips = tf.scatter_nd(
        tf.reshape(flat_starts, [-1, 1]), tf.ones([tf.size(flat_starts)], tf.int32), [rows * length]
    )
    span_index = tf.cumsum(tf.reshape(flips, [rows, length]), axis=1)
    return tf.equal(span_index % 2, 1)


def _check_sentinels(sentinel_ids: Sequence[int]) -> tf.Tensor:
    ids = [int(i) for i in sentinel_ids]
    if not ids:
        raise ValueError(
            "sentinel_ids is empty; expected the ids of <extra_id_0>, <extra_id_1>, ..."
        )
    if len(set(ids)) != len(ids):
        raise ValueError(f"sentinel_ids has repeated ids: {ids}")
    return tf.constant(ids, tf.int32)


def _sentinel_fill(tokens, noise, sentinels, *, close_nonnoise_tail=False):
    """Inputs and targets (as values + keep masks) of the unique-sentinel corruption.

    Noise run k becomes <k> in the inputs; in the targets <k> precedes the tokens of run k. This
    equals T5's pair of functions on span-corruption masks (which start with non-noise and end
    with noise) and keeps the sentinels aligned when a mask starts with noise (i.i.d. masks),
    where T5's do not. With `close_nonnoise_tail`, a row that ends with non-noise gets one more
    sentinel at the end of its targets, as T5's `nonnoise_span_to_unique_sentinel` gives it.

    Example (one row [a b c d e f], noise (b c), close_nonnoise_tail=True):
      inputs [a <0> d e f], targets [<0> b c <1>] (after boolean-masking by the keep masks).

    Returns (inputs_values, inputs_keep, targets_values, targets_keep): boolean-masking the
    values ([rows, L] and [rows, L + 1], or [rows, L + 2] with `close_nonnoise_tail`) by their
    keep masks gives the corrupted sequences.
    """
    prev_noise = tf.pad(noise[:, :-1], [[0, 0], [1, 0]])
    first_noise = tf.logical_and(noise, tf.logical_not(prev_noise))
    noise_run = tf.cumsum(tf.cast(first_noise, tf.int32), axis=1) - 1
    num_runs = noise_run[:, -1] + 1
    tail = tf.logical_and(close_nonnoise_tail, tf.logical_not(noise[:, -1]))
    # The trailing sentinel is <num_runs>, one more id than the noise runs use.
    needed = num_runs + tf.cast(tail, tf.int32)
    check = tf.debugging.assert_less_equal(
        tf.reduce_max(needed),
        tf.size(sentinels),
        message="more sentinels needed (one per noise span, plus the closing one) than"
        " sentinel ids; pass more sentinel_ids",
    )
    with tf.control_dependencies([check]):
        inputs = tf.where(first_noise, tf.gather(sentinels, tf.maximum(noise_run, 0)), tokens)
    inputs_keep = tf.logical_or(tf.logical_not(noise), first_noise)
    # A leading placeholder column gives a run that starts the chunk a slot for its sentinel:
    # the sentinel of run k replaces the non-noise token just before it.
    padded_tokens = tf.pad(tokens, [[0, 0], [1, 0]])
    padded_noise = tf.pad(noise, [[0, 0], [1, 0]])
    slot = tf.logical_and(tf.logical_not(padded_noise), tf.pad(noise, [[0, 0], [0, 1]]))
    slot_run = tf.maximum(tf.cumsum(tf.cast(slot, tf.int32), axis=1) - 1, 0)
    targets = tf.where(slot, tf.gather(sentinels, slot_run), padded_tokens)
    targets_keep = tf.logical_or(padded_noise, slot)
    if close_nonnoise_tail:
        # Clamped: rows without a tail gather a valid id they then drop.
        closing = tf.gather(sentinels, tf.minimum(num_runs, tf.size(sentinels) - 1))
        targets = tf.concat([targets, closing[:, None]], axis=1)
        targets_keep = tf.concat([targets_keep, tail[:, None]], axis=1)
    return inputs, inputs_keep, targets, targets_keep


def _append_eos(features, eos_id):
    if eos_id is None:
        return features
    return {k: tf.concat([v, [eos_id]], axis=0) for k, v in features.items()}


def span_corruption(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    sentinel_ids: Sequence[int],
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    eos_id: int | None = None,
) -> tf.data.Dataset:
    """T5 span corruption of the concatenated document stream.

    The stream of `targets` token ids is cut into chunks of R raw tokens, R from
    `random_spans_helper(inputs_length=sequence_length["inputs"])` (512 -> 568). A full chunk
    gets exactly N = round(R * density) noise tokens in S = round(N / mean) spans, so its inputs
    hold R - N + S tokens and its targets N + S (plus EOS: 512 and 114). Only the stream's last
    chunk can be shorter; a last chunk of one token is dropped.

    Example (R=8, N=4 in S=2 spans, <k> = sentinel_ids[k], eos_id=None):
      {"targets": [a b c d e f g h]} ->
      {"inputs": [a b <0> e f <1>], "targets": [<0> c d <1> g h]}  (noise = c d, g h)

    Raises:
      ValueError: if the targets length is below what the inputs length produces, or a full
        chunk has more spans than `sentinel_ids`.
    """
    problem = targets_length_problem(
        sequence_length, noise_density=noise_density, mean_noise_span_length=mean_noise_span_length
    )
    if problem is not None:
        raise ValueError(problem)
    raw_length, _ = random_spans_helper(
        inputs_length=int(sequence_length["inputs"]),
        noise_density=noise_density,
        mean_noise_span_length=mean_noise_span_length,
    )
    _, full_spans = _noise_counts(raw_length, noise_density, mean_noise_span_length)
    if full_spans > len(sentinel_ids):
        raise ValueError(
            f"{full_spans} spans per chunk of {raw_length} tokens but only"
            f" {len(sentinel_ids)} sentinel_ids"
        )
    sentinels = _check_sentinels(sentinel_ids)
    batches = lm.chunk_stream_batches(dataset, chunk_length=raw_length, min_chunk_length=2)

    @seqio.map_over_dataset(num_seeds=1)
    def corrupt(tokens, seed):
        rows, length = tf.shape(tokens)[0], tf.shape(tokens)[1]
        noise = random_spans_noise_mask(
            rows=rows,
            length=length,
            noise_density=noise_density,
            mean_noise_span_length=mean_noise_span_length,
            seed=seed,
        )
        inputs, inputs_keep, targets, targets_keep = _sentinel_fill(tokens, noise, sentinels)
        # Every row has the same counts, so the kept values reshape back to a dense batch.
        return {
            "inputs": tf.reshape(tf.boolean_mask(inputs, inputs_keep), [rows, -1]),
            "targets": tf.reshape(tf.boolean_mask(targets, targets_keep), [rows, -1]),
        }

    examples = corrupt(batches).unbatch()
    if eos_id is not None:
        examples = examples.map(lambda x: _append_eos(x, eos_id))
    return examples.prefetch(tf.data.AUTOTUNE)


def iid_denoising(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    sentinel_ids: Sequence[int],
    noise_density: float = 0.15,
    eos_id: int | None = None,
) -> tf.data.Dataset:
    """T5's i.i.d. denoising baseline: each token is noise with probability `noise_density`.

    The stream is cut into chunks of `inputs - 1` tokens (room for EOS); consecutive noise tokens
    form one span and are replaced by one sentinel, as in `span_corruption`. A chunk that ends
    with non-noise also ends its targets with the next sentinel (T5's
    `nonnoise_span_to_unique_sentinel`); where the chunk starts with noise, see the module
    docstring. Lengths vary per example; targets are not trimmed here (SeqIO trims to the
    targets length).

    Example (noise = b, c, f): {"targets": [a b c d e f]} ->
      {"inputs": [a <0> d e <1>], "targets": [<0> b c <1> f]}
    Example (noise = b, c; ends with non-noise): {"targets": [a b c d e f]} ->
      {"inputs": [a <0> d e f], "targets": [<0> b c <1>]}
    """
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density={noise_density}, expected in (0, 1)")
    inputs_length, _ = lm._lengths(sequence_length, "inputs", "targets")
    sentinels = _check_sentinels(sentinel_ids)
    batches = lm.chunk_stream_batches(dataset, chunk_length=inputs_length - 1)

    @seqio.map_over_dataset(num_seeds=1)
    def corrupt(tokens, seed):
        noise = tf.random.stateless_uniform(tf.shape(tokens), seed=seed) < noise_density
        inputs, inputs_keep, targets, targets_keep = _sentinel_fill(
            tokens, noise, sentinels, close_nonnoise_tail=True
        )
        return {
            "inputs": tf.ragged.boolean_mask(inputs, inputs_keep),
            "targets": tf.ragged.boolean_mask(targets, targets_keep),
        }

    examples = corrupt(batches).unbatch()
    if eos_id is not None:
        examples = examples.map(lambda x: _append_eos(x, eos_id))
    return examples.prefetch(tf.data.AUTOTUNE)
