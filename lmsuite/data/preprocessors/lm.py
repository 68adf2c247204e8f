"""Language-modelling objectives and the token-stream chunking the seq2seq family shares.

Input examples carry a 1-D int `targets` feature: the token ids of one document (the output of
SeqIO's `tokenize` on a task whose text feature was rekeyed to `targets`, as in T5's C4 tasks).

Two ways to cut documents into examples:

* `chunk_stream_batches` concatenates documents into one stream and cuts it into chunks of
  exactly `chunk_length` tokens (T5's `reduce_concat_tokens` + `split_tokens`, except that the
  stream really is continuous: T5 concatenates groups of 128 documents and leaves a short chunk
  at the end of every group; here only the very last chunk of the dataset can be short). It
  yields 2-D batches of chunks so that objectives can noise a whole batch with a few ops.
* `split_documents` keeps documents apart and cuts each into chunks of at most `chunk_length`.

Empty documents are dropped (they hold no tokens). Chunks shorter than `min_chunk_length` are
dropped too; that is only ever the last chunk of the stream (or of a document), so a test measures
it by comparing dataset sizes.

Objectives here, each output feature documented on the function:

* `full_lm`: decoder-only LM over the concatenated stream, EOS between documents (T5 `full_lm`).
* `causal_lm`: decoder-only LM per document, EOS left to SeqIO (`add_eos=True`).
* `prefix_lm`: split each chunk at a uniformly random point into `inputs` (prefix) and `targets`
  (T5 `prefix_lm` with noise density 0.5).
"""

from __future__ import annotations

from collections.abc import Mapping

import seqio
import tensorflow as tf

# Documents concatenated per step of the stream chunker; larger amortises per-step overhead.
DOCS_PER_GROUP = 128


def _lengths(sequence_length: Mapping[str, int] | None, *keys: str) -> list[int]:
    """Reads `keys` from SeqIO's `sequence_length`, failing loudly when absent."""
    if sequence_length is None:
        raise ValueError(f"sequence_length is None; expected a mapping with keys {keys}")
    missing = [k for k in keys if sequence_length.get(k) is None]
    if missing:
        raise ValueError(f"sequence_length={dict(sequence_length)} lacks lengths for {missing}")
    return [int(sequence_length[k]) for k in keys]


def _document_tokens(dataset: tf.data.Dataset, *, feature_key: str, eos_id: int | None):
    """Maps examples to their 1-D int32 token vector (plus EOS), dropping empty documents."""

    def tokens(x):
        t = tf.cast(x[feature_key], tf.int32)
        if eos_id is not None:
            t = tf.concat([t, [eos_id]], axis=0)
        return t

    ds = dataset.filter(lambda x: tf.size(x[feature_key]) > 0)
    return ds.map(tokens, num_parallel_calls=tf.data.AUTOTUNE)


def chunk_stream_batches(
    dataset: tf.data.Dataset,
    *,
    chunk_length: int,
    feature_key: str = "targets",
    eos_id: int | None = None,
    min_chunk_length: int = 1,
    docs_per_group: int = DOCS_PER_GROUP,
) -> tf.data.Dataset:
    """Concatenates documents and yields 2-D int32 batches `[n, chunk_length]` of chunks.

    The final element may be a single shorter chunk `[1, r]` (the tail of the stream), kept when
    `r >= min_chunk_length`. Every row of one element has the same length.

    Example (chunk_length=4): documents [1 2 3], [4 5 6 7 8], [9] with eos_id=None yield the
    element [[1 2 3 4], [5 6 7 8]] and then the tail element [[9]].
    """
    if chunk_length < 1:
        raise ValueError(f"chunk_length={chunk_length}, expected >= 1")
    if not 1 <= min_chunk_length <= chunk_length:
        raise ValueError(f"min_chunk_length={min_chunk_length}, expected in [1, {chunk_length}]")
    # No per-document work beyond selecting the feature: casting, EOS and dropping empty
    # documents (which add nothing to the stream) happen once per group of documents.
    docs = dataset.map(lambda x: x[feature_key], num_parallel_calls=tf.data.AUTOTUNE)

    def flatten(batch):
        if not isinstance(batch, tf.RaggedTensor):  # documents of equal length batch densely
            batch = tf.RaggedTensor.from_tensor(batch)
        if eos_id is not None:
            eos = tf.fill([batch.nrows(), 1], tf.cast(eos_id, batch.dtype))
            batch = tf.concat([batch, eos], axis=1)
        return tf.cast(batch.flat_values, tf.int32), False

    groups = docs.ragged_batch(docs_per_group).map(flatten)
    flush = tf.data.Dataset.from_tensors((tf.zeros([0], tf.int32), True))
    groups = groups.concatenate(flush)

    def step(carry, element):
        values, is_last = element
        stream = tf.concat([carry, values], axis=0)
        num_full = tf.size(stream) // chunk_length
        cut = num_full * chunk_length
        full = tf.reshape(stream[:cut], [num_full, chunk_length])
        rest = stream[cut:]
        keep_tail = tf.logical_and(is_last, tf.size(rest) >= min_chunk_length)
        tail = tf.reshape(rest, [1, -1])[: tf.cast(keep_tail, tf.int32)]
        return rest, (full, tail)

    def to_batches(full, tail):
        both = tf.data.Dataset.from_tensors(full).concatenate(tf.data.Dataset.from_tensors(tail))
        return both.filter(lambda b: tf.shape(b)[0] > 0)

    chunks = groups.scan(tf.zeros([0], tf.int32), step)
    return chunks.flat_map(to_batches).prefetch(tf.data.AUTOTUNE)


def split_documents(
    dataset: tf.data.Dataset,
    *,
    chunk_length: int,
    feature_key: str = "targets",
    min_chunk_length: int = 1,
) -> tf.data.Dataset:
    """Cuts each document into chunks of at most `chunk_length`, yielding {feature_key: chunk}.

    Example (chunk_length=3): documents [1 2 3 4 5], [6] yield [1 2 3], [4 5], [6].
    """
    if chunk_length < 1:
        raise ValueError(f"chunk_length={chunk_length}, expected >= 1")

    def split(tokens):
        n = tf.size(tokens)
        num_chunks = (n + chunk_length - 1) // chunk_length
        lengths = tf.fill([num_chunks], chunk_length)
        lengths = tf.concat([lengths[:-1], [n - (num_chunks - 1) * chunk_length]], axis=0)
        return tf.RaggedTensor.from_row_lengths(tokens, lengths)

    docs = _document_tokens(dataset, feature_key=feature_key, eos_id=None)
    chunks = docs.map(split, num_parallel_calls=tf.data.AUTOTUNE).unbatch()
    chunks = chunks.filter(lambda c: tf.size(c) >= min_chunk_length)
    return chunks.map(lambda c: {feature_key: c})


def full_lm(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    eos_id: int,
) -> tf.data.Dataset:
    """Decoder-only LM over the document stream with EOS only at document ends (T5 `full_lm`).

    Chunks hold exactly `sequence_length["targets"]` tokens (EOS included, so the task's
    `targets` feature must have `add_eos=False`); only the last chunk can be shorter.

    Example (targets length 4, eos_id=1): documents [5 6 7], [8 9] yield
    {"targets": [5 6 7 1]}, {"targets": [8 9 1]}.
    """
    (length,) = _lengths(sequence_length, "targets")
    batches = chunk_stream_batches(dataset, chunk_length=length, eos_id=eos_id)
    return batches.unbatch().map(lambda t: {"targets": t})


def causal_lm(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
) -> tf.data.Dataset:
    """Decoder-only LM per document: chunks of `targets - 1` tokens, EOS appended by SeqIO.

    Documents are never mixed inside an example (no cross-document attention needed); the room
    left for EOS means every example fits `sequence_length["targets"]` after SeqIO appends it.

    Example (targets length 4): documents [5 6 7 8 9], [3] yield
    {"targets": [5 6 7]}, {"targets": [8 9]}, {"targets": [3]}.
    """
    (length,) = _lengths(sequence_length, "targets")
    if length < 2:
        raise ValueError(f"targets length {length} leaves no room for tokens and EOS")
    return split_documents(dataset, chunk_length=length - 1)


def prefix_lm(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int],
    noise_density: float = 0.5,
) -> tf.data.Dataset:
    """Prefix LM: each chunk is split at a random point into `inputs` and `targets` (T5).

    Documents are cut (not concatenated, as T5) into chunks of `inputs - 1` tokens; chunks of one
    token are dropped. A chunk of n tokens keeps a prefix of k tokens as `inputs` and the rest as
    `targets`, with k uniform in [k_min, n - 1], k_min = max(1, round((1 - 2 * noise_density) *
    (n - 1))) (so k is uniform in [1, n - 1] at the default density 0.5). For a decoder-only
    prefix LM, SeqIO's `PrefixLMFeatureConverter` concatenates the two and marks the prefix.

    Example (split point k=2): {"targets": [5 6 7 8]} -> {"inputs": [5 6], "targets": [7 8]}.
    """
    if not 0.0 < noise_density <= 0.5:
        raise ValueError(f"noise_density={noise_density}, expected in (0, 0.5]")
    (length,) = _lengths(sequence_length, "inputs")
    if length < 3:
        raise ValueError(f"inputs length {length} too short for a prefix and a target")
    chunks = split_documents(dataset, chunk_length=length - 1, min_chunk_length=2)

    @seqio.map_over_dataset(num_seeds=1)
    def split(x, seed):
        tokens = x["targets"]
        max_prefix = tf.size(tokens) - 1
        min_prefix = tf.cast(
            tf.round((1.0 - 2.0 * noise_density) * tf.cast(max_prefix, tf.float32)), tf.int32
        )
        min_prefix = tf.clip_by_value(min_prefix, 1, max_prefix)
        k = tf.random.stateless_uniform(
            [], seed=seed, minval=min_prefix, maxval=max_prefix + 1, dtype=tf.int32
        )
        return {"inputs": tokens[:k], "targets": tokens[k:]}

    return split(chunks)
