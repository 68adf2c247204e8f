"""Transformer-XL's language-model data: rows of contiguous text, one segment per step.

Reference (read, restated): kimiyoung/transformer-xl `pytorch/data_utils.py` `LMOrderedIterator`
(the corpus as one stream, cut into `bsz` contiguous rows; step t reads `tgt_len` tokens of
every row at offset t * tgt_len and their successors as targets), as `train.py` feeds it with
the memory of the previous step.

Input: one example per document with `targets` (its ids, `tokenization.tokenize_documents`).
Documents are concatenated, each followed by `</s>` (the reference's `<eos>` ends every line;
a document boundary is the boundary lmsuite's corpora keep).

The layout is XLNet's (`xlnet.py`, whose `StreamOptions` and `stream_task` bind it): the stream
is cut into blocks of `batch_size` rows of N = steps_per_block * L + 1 tokens, and element k of
a block is step k // B of row k % B, so batching consecutive elements by exactly B puts segment
t + 1 of row i right after segment t in batch t + 1 (the same contract: batch by B with
drop_remainder, no example shuffle, resume by skipping). Step t of a row reads its tokens
t * L .. t * L + L: `inputs` the first L, `targets` the last L.

Features (L = sequence_length["targets"]): inputs int32 [L]; targets int32 [L] (inputs shifted
left by one); stream_row int32 [], the row; stream_step int32 [], the step in the block (0: the
memory carried in belongs to other text).

Example (L 3, batch_size 2, steps_per_block 2: N = 7; stream s0 .. s13):
  rows: row 0 = s0 .. s6, row 1 = s7 .. s13
  element 0 (step 0, row 0): inputs [s0 s1 s2], targets [s1 s2 s3]
  element 1 (step 0, row 1): inputs [s7 s8 s9], targets [s8 s9 s10]
  element 2 (step 1, row 0): inputs [s3 s4 s5], targets [s4 s5 s6]  (continues element 0)

Deliberate differences from the reference: rows continue for steps_per_block steps (the
reference: the whole corpus), then every row starts new text and its memory is reset; the
reference's variable-length segments (`--varlen`) are not done.
"""

from collections.abc import Mapping

import tensorflow as tf

from lmsuite.data.preprocessors import lm
from lmsuite.data.preprocessors.xlnet import STEPS_PER_BLOCK, StreamOptions


def stream_lm_rows(
    dataset: tf.data.Dataset,
    *,
    seq_len: int,
    batch_size: int,
    eod_id: int,
    steps_per_block: int = STEPS_PER_BLOCK,
) -> tf.data.Dataset:
    """Segments of `seq_len` tokens and their next tokens, `batch_size` interleaved rows (see
    the module docstring for the layout and an example).

    Raises:
      ValueError: naming the value, for seq_len < 1, batch_size < 1 or steps_per_block < 1.
    """
    for name, value in (
        ("seq_len", seq_len),
        ("batch_size", batch_size),
        ("steps_per_block", steps_per_block),
    ):
        if value < 1:
            raise ValueError(f"{name}={value}, expected >= 1")
    row_len = steps_per_block * seq_len + 1
    blocks = lm.chunk_stream_batches(
        dataset,
        chunk_length=batch_size * row_len,
        feature_key="targets",
        eos_id=eod_id,
        min_chunk_length=batch_size * (seq_len + 1),
    ).unbatch()

    def examples(block):
        row_length = tf.size(block) // batch_size
        rows = tf.reshape(block[: batch_size * row_length], [batch_size, row_length])
        steps = (row_length - 1) // seq_len

        def one(k):
            k = tf.cast(k, tf.int32)
            step, row = k // batch_size, k % batch_size
            window = rows[row, step * seq_len : step * seq_len + seq_len + 1]
            return {
                "inputs": tf.ensure_shape(window[:-1], [seq_len]),
                "targets": tf.ensure_shape(window[1:], [seq_len]),
                "stream_row": row,
                "stream_step": step,
            }

        indices = tf.data.Dataset.range(tf.cast(steps * batch_size, tf.int64))
        return indices.map(one, num_parallel_calls=tf.data.AUTOTUNE)

    return blocks.flat_map(examples).prefetch(tf.data.AUTOTUNE)


def stream_lm(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int] | None,
    eod_id: int,
    stream: StreamOptions | None = None,
) -> tf.data.Dataset:
    """The SeqIO preprocessor: `stream_lm_rows` with seq_len = sequence_length["targets"] and
    the rows of `stream` (None: one row; `xlnet.stream_task` binds B rows). Its reuse_len and
    perm_size are XLNet's and must be None here."""
    if not sequence_length or "targets" not in sequence_length:
        raise ValueError(
            f"stream LM tasks need sequence_length={{'targets': L, ...}}, got {sequence_length}"
        )
    stream = StreamOptions() if stream is None else stream
    if stream.reuse_len is not None or stream.perm_size is not None:
        raise ValueError(
            "a stream LM reads contiguous segments: StreamOptions.reuse_len and perm_size must "
            f"be None, got {stream.reuse_len} and {stream.perm_size}"
        )
    return stream_lm_rows(
        dataset,
        seq_len=int(sequence_length["targets"]),
        batch_size=stream.batch_size,
        eod_id=eod_id,
        steps_per_block=stream.steps_per_block,
    )
