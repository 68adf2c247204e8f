"""XLNet permutation-LM pretraining data, as zihangdai/xlnet's `data_utils.py` builds it.

Reference (read, restated, not copied): `create_tfrecords`, `batchify`, `_split_a_and_b`,
`_sample_mask`, `_local_perm` and the parser of `get_dataset` in zihangdai/xlnet `data_utils.py`,
with its flags' defaults (seq_len 512, reuse_len 256, perm_size 256, num_predict 85,
mask_alpha 6, mask_beta 1, max_gram 5).

Input: one example per document with `sentence_ids`, ragged int [S, (T)] (the corpus's sentences,
`tokenization.tokenize_sentences`); the reference reads one sentence per line.

1. Stream. Every document's sentences are concatenated and `<eod>` ends each document, so one
   sits between consecutive documents; `<eod>` belongs to the document's last sentence (the
   reference gives it that sentence's id, so no sentence cut falls just before it).
2. Rows (`batchify`). The stream is cut into blocks of `batch_size * N` tokens and each block
   is reshaped to `batch_size` rows of N = steps_per_block * reuse_len + seq_len - reuse_len
   contiguous tokens (the last, shorter block: N = its length // batch_size, as `batchify`).
3. Windows. Step t of a block reads every row at offset t * reuse_len: the reuse part is
   `reuse_len` tokens, then A <sep> B <sep> <cls> with len(A) + len(B) = seq_len - reuse_len - 3.
   A starts right after the reuse part and ends at a random sentence cut; B is A's true
   continuation from that cut or, with probability 1/2 (always when the window has no cut),
   `is_random`: a span of whole sentences at a uniform place in the same row. Then the longer
   of A and B loses tokens at its right end until they fit (`_split_a_and_b`). The next step's
   reuse part starts where this one's ended, so it begins with this step's A.
4. Predictions (`_sample_mask`; the reuse part gets num_predict - num_predict // 2, the rest
   num_predict // 2: 43 and 42 of 85) and 5. the factorization order (`_local_perm`, each part
   apart, the reuse part blocked from the rest): `xlnet_masks`, which restates them.

Features (L = seq_len, P = num_predict): input_k int32 [L]; seg_id int32 [L] (0 over the reuse
part, A and the first <sep>, 1 over B and the second <sep>, 2 on <cls>); input_q float32 [L],
1 at predicted positions; perm_mask float32 [L, L], 1 where query i may NOT attend key j;
target_mapping float32 [P, L], one-hot rows of the predicted positions in ascending order;
target int32 [P], their ids; target_mask float32 [P] (ones: every example predicts exactly P);
is_random int32 [] (the reference's `label` is 1 - is_random); stream_row int32 [], the row
(0 .. batch_size - 1); stream_step int32 [], the step within the block (0: the memory carried
in belongs to other text).

How batch_size arrives: SeqIO hands a preprocessor only `sequence_length`, and its feature
converter refuses keys that are not features, so the registered `{corpus}_xlnet_plm` task is
one stream (batch_size 1) and `stream_task(task, batch_size=B)` returns (and registers) the
B-row task `{corpus}_xlnet_plm_rowsB`, its XLNet step bound to `StreamOptions`.

The contract with the training side. Elements come step-major: element k is step k // B of row
k % B (B = batch_size), so batching consecutive elements by exactly B puts row i of batch t+1
right after row i of batch t in the stream, across a block's steps_per_block steps. Hence:
  * batch by B, drop_remainder=True (every block yields a multiple of B elements). With SeqIO
    source sharding, one pipeline per process reads its own documents and B is the
    per-process batch; where every process builds the global batch and keeps its slice, B is
    the global batch. Never shard, shuffle, pack or mix the examples after this step;
  * no example shuffle, which would interleave unrelated steps and rows: `stream_task`'s task
    refuses `shuffle=True` (SeqIO raises). Shuffling documents before streaming would be
    harmless (the reference shuffles its input shards), but SeqIO ties the source's file
    shuffle to the example shuffle; the in-memory corpora have a fixed document order anyway;
  * resuming at step s means skipping s * B elements of the same pipeline (same seed, B and
    lengths) or restoring a checkpointed tf.data iterator.

Example (seq_len 12, reuse_len 4, batch_size 2, steps_per_block 2: N = 2 * 4 + 8 = 16; stream
s0 s1 ... s31, <eod> included):
  rows: row 0 = s0 .. s15, row 1 = s16 .. s31; each window holds 12 - 4 - 3 = 5 tokens of A + B
  element 0 (step 0, row 0): reuse s0..s3; a cut at s6, B the continuation:
    input_k = [s0 s1 s2 s3 s4 s5 <sep> s6 s7 s8 <sep> <cls>], is_random 0,
    seg_id  = [0  0  0  0  0  0  0     1  1  1  1     2]
  element 1 (step 0, row 1): reuse s16..s19;  element 2 (step 1, row 0): reuse s4..s7
  (continues element 0);  element 3 (step 1, row 1): reuse s20..s23.

Deliberate differences from the reference:
  * Blocks: the reference batchifies a whole preprocessing shard (a file) at once; a streaming
    pipeline batchifies blocks of steps_per_block steps, so row continuation (and XLNet's
    memory) breaks every steps_per_block steps, where the reference breaks it between files.
    Random B comes from the same row of the block (the reference: the same row of the file).
  * The sentence scan for a window's end stops at the row's end (the reference then drops
    the step and every later one of its file).
  * Exactly num_predict predictions: the reference samples the rest's spans over
    `A <sep> B <sep> <cls>` and drops a functional token it picked (predicting fewer than 42
    there, padded with target_mask 0); here spans are sampled over A + B only.
  * Sentence cuts come from the corpus's own sentence splitting (`text.split_sentences` for
    English prose; non-empty lines for the TFDS corpora); the reference reads one per line.
  * Vocabulary: lmsuite's `</s>` plays `<eod>`, [SEP] `<sep>` and [CLS] `<cls>`. Pieces that may
    start a span are the reference's `_is_start_piece` (a "▁" or "<" prefix, or one ASCII
    punctuation character except "'"), plus lmsuite's bracketed specials; a vocabulary
    without word-start marks (the segmented Chinese one) lets a span start at any token.
  * No `bi_data` (the reference reverses half of every core's rows by default) and no
    next-token LM targets (`extend_target`: the PLM target of a position is its own token).
  * reuse_len need not be seq_len / 2 (the reference asserts it).
  * Randomness: the reference fixes B and the predicted positions when it writes a pass's
    files and draws the permutations when it reads them; here every draw comes from SeqIO's
    per-block seed, new each epoch (SeqIO repeats the source before this step).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Mapping

import numpy as np
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import lm
from lmsuite.data.preprocessors.xlnet_masks import (  # noqa: F401  (public here too)
    block_ranks,
    permutation_features,
    predicted_from_draws,
    prediction_split,
    sample_predicted,
    sampler_draws,
    span_begins,
    start_piece_table,
)
from lmsuite.data.preprocessors.xlnet_windows import (  # noqa: F401  (public here too)
    sentence_tables,
    split_a_and_b,
    split_draws,
    trimmed_lengths,
    uniform_below,
)

# Steps per block of rows: memory continuity breaks once per block (see the module docstring).
STEPS_PER_BLOCK = 64


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    """The layout options `stream_task` binds to a task's XLNet step: SeqIO's get_dataset
    passes a preprocessor only `sequence_length`, which the feature converter then rejects if it
    holds anything but feature lengths.

    batch_size: the rows of the batch this pipeline feeds (per process with SeqIO's source
      sharding; the global batch where every process builds the whole batch and keeps a slice).
    reuse_len: default seq_len // 2 (the reference's 256 of 512).
    perm_size: default reuse_len (the reference's 256); it must divide both parts.
    """

    batch_size: int = 1
    reuse_len: int | None = None
    perm_size: int | None = None
    steps_per_block: int = STEPS_PER_BLOCK


def _check_options(*, seq_len, reuse_len, perm_size, num_predict, batch_size, steps_per_block):
    tot_len = seq_len - reuse_len - 3
    if reuse_len < 1 or tot_len < 2:
        raise ValueError(
            f"reuse_len={reuse_len} must be >= 1 and leave seq_len - reuse_len - 3 >= 2 tokens "
            f"for A and B (seq_len={seq_len})"
        )
    if perm_size < 1 or reuse_len % perm_size or (seq_len - reuse_len) % perm_size:
        raise ValueError(
            f"perm_size={perm_size} must divide reuse_len={reuse_len} and seq_len - reuse_len "
            f"= {seq_len - reuse_len}"
        )
    reuse_goal, rest_goal = prediction_split(num_predict)
    if num_predict < 1 or reuse_goal > reuse_len or rest_goal > tot_len:
        raise ValueError(
            f"num_predict={num_predict} splits into {reuse_goal} predictions in the reuse part "
            f"(at most reuse_len={reuse_len}) and {rest_goal} in A + B (at most {tot_len})"
        )
    if batch_size < 1 or steps_per_block < 1:
        raise ValueError(
            f"batch_size={batch_size} and steps_per_block={steps_per_block} must be >= 1"
        )


def _document_streams(dataset: tf.data.Dataset, *, eod_id: int) -> tf.data.Dataset:
    """Each document's tokens + <eod> as `stream` = id * 2 + (1 on a sentence's first token),
    so one int stream carries both through `lm.chunk_stream_batches`.

    Example (eod 6): sentence_ids [[40, 41], [], [42]] -> stream [81, 82, 85, 12].
    """

    def stream(features):
        sentences = features["sentence_ids"]
        if not isinstance(sentences, tf.RaggedTensor):
            sentences = tf.RaggedTensor.from_tensor(sentences)
        sentences = tf.cast(sentences, tf.int32)
        sentences = tf.ragged.boolean_mask(sentences, sentences.row_lengths() > 0)
        ids = sentences.flat_values
        first = tf.cast(sentences.row_starts(), tf.int32)[:, None]
        starts = tf.scatter_nd(first, tf.ones_like(first[:, 0]), tf.shape(ids))
        return {"stream": tf.concat([ids * 2 + starts, [eod_id * 2]], axis=0)}

    streams = dataset.map(stream, num_parallel_calls=tf.data.AUTOTUNE)
    return streams.filter(lambda x: tf.size(x["stream"]) > 1)  # documents without tokens


def permutation_lm_streams(
    dataset: tf.data.Dataset,
    *,
    seq_len: int,
    reuse_len: int,
    batch_size: int,
    num_predict: int,
    perm_size: int,
    cls_id: int,
    sep_id: int,
    eod_id: int,
    start_pieces: np.ndarray | None = None,
    steps_per_block: int = STEPS_PER_BLOCK,
    max_gram: int = 5,
    mask_alpha: int = 6,
    mask_beta: int = 1,
) -> tf.data.Dataset:
    """XLNet examples from documents' `sentence_ids`, `batch_size` interleaved rows (see the
    module docstring for the layout, the features, the training contract and an example).

    `start_pieces` is `start_piece_table(vocab)` (None: a span may start at any token).

    Raises:
      ValueError: naming the value, for a reuse_len leaving fewer than 2 tokens for A and B, a
        perm_size not dividing both parts, more predictions than a part holds, a batch_size or
        steps_per_block below 1, or sampler options without a context.
    """
    _check_options(
        seq_len=seq_len,
        reuse_len=reuse_len,
        perm_size=perm_size,
        num_predict=num_predict,
        batch_size=batch_size,
        steps_per_block=steps_per_block,
    )
    if max_gram < 1 or not 1 <= mask_beta <= mask_alpha:
        raise ValueError(
            f"max_gram={max_gram}, mask_alpha={mask_alpha}, mask_beta={mask_beta}: expected "
            "max_gram >= 1 and 1 <= mask_beta <= mask_alpha (a context of at least one token)"
        )
    tot_len = seq_len - reuse_len - 3
    reuse_goal, rest_goal = prediction_split(num_predict)
    row_len = steps_per_block * reuse_len + seq_len - reuse_len
    can_start = None if start_pieces is None else tf.constant(start_pieces, tf.bool)
    sampler = dict(mask_alpha=mask_alpha, mask_beta=mask_beta)
    # Examples are built a group at a time from their draws; a group's [G, L, L] masks stay
    # near 16 MB whatever L.
    group_size = max(1, min(64, 2**22 // seq_len**2))

    def draws(k, seed):
        """Every random number of example k of a block (the only per-example work)."""
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 5))
        parts = [(reuse_len, reuse_goal, seeds[1]), (tot_len, rest_goal, seeds[2])]
        reuse, pair = (
            sampler_draws(part_seed, n=size, goal=goal, max_gram=max_gram)
            for size, goal, part_seed in parts
        )
        return {
            "k": k,
            **split_draws(seeds[0]),
            **{f"reuse_{key}": v for key, v in reuse.items()},
            **{f"pair_{key}": v for key, v in pair.items()},
            "reuse_order": tf.random.stateless_uniform([perm_size], seeds[3]),
            "rest_order": tf.random.stateless_uniform([perm_size], seeds[4]),
        }

    def group(ids, tables, d):
        """A group's examples from its stacked draws (see the module docstring, steps 3-5)."""
        step, row = d["k"] // batch_size, d["k"] % batch_size
        begin = (step + 1) * reuse_len
        a_len, b_begin, b_len, is_random = split_a_and_b(
            tables,
            row=row,
            begin=begin,
            tot_len=tot_len,
            coin=d["coin"],
            cut_bits=d["cut_bits"],
            place_bits=d["place_bits"],
        )
        del b_len  # a_len + b_len == tot_len
        take = lambda offsets: tf.gather_nd(
            ids, tf.stack([tf.broadcast_to(row[:, None], tf.shape(offsets)), offsets], axis=2)
        )
        reuse = take(begin[:, None] - reuse_len + tf.range(reuse_len))
        j = tf.range(tot_len)[None, :]
        pair = take(
            tf.where(j < a_len[:, None], begin[:, None] + j, b_begin[:, None] + j - a_len[:, None])
        )
        masks = [
            predicted_from_draws(
                d[f"{part}_grams"],
                d[f"{part}_offsets"],
                d[f"{part}_scores"],
                can_start=None if can_start is None else tf.gather(can_start, tokens),
                **sampler,
            )
            for part, tokens in [("reuse", reuse), ("pair", pair)]
        ]
        # Position p >= reuse_len of the window holds pair token p - reuse_len before the first
        # <sep> (at reuse_len + a_len) and p - reuse_len - 1 after it, up to the last two.
        positions = tf.range(seq_len)[None, :]
        first_sep = reuse_len + a_len[:, None]
        in_pair = tf.logical_and(positions >= reuse_len, positions < seq_len - 2)
        in_pair = tf.logical_and(in_pair, positions != first_sep)
        j = positions - reuse_len - tf.cast(positions > first_sep, tf.int32)
        j = tf.clip_by_value(j, 0, tot_len - 1)
        functional_ids = tf.where(positions == seq_len - 1, cls_id, sep_id)
        input_k = tf.where(
            positions < reuse_len,
            tf.pad(reuse, [[0, 0], [0, seq_len - reuse_len]]),
            tf.where(in_pair, tf.gather(pair, j, batch_dims=1), functional_ids),
        )
        is_masked = tf.where(
            positions < reuse_len,
            tf.pad(masks[0], [[0, 0], [0, seq_len - reuse_len]]),
            tf.logical_and(in_pair, tf.gather(masks[1], j, batch_dims=1)),
        )
        is_functional = tf.logical_or(positions == first_sep, positions >= seq_len - 2)
        features = permutation_features(
            input_k,
            is_masked,
            is_functional,
            reuse_len=reuse_len,
            num_predict=num_predict,
            reuse_order=tf.argsort(d["reuse_order"], axis=1),
            rest_order=tf.argsort(d["rest_order"], axis=1),
        )
        features["seg_id"] = tf.where(
            positions <= first_sep, 0, tf.where(positions < seq_len - 1, 1, 2)
        )
        features["is_random"] = tf.cast(is_random, tf.int32)
        features = _with_shapes(features, seq_len=seq_len, num_predict=num_predict)
        return {**features, "stream_row": row, "stream_step": step}

    def examples(block, seed):
        row_length = tf.size(block) // batch_size
        rows = tf.reshape(block[: batch_size * row_length], [batch_size, row_length])
        ids, tables = rows // 2, sentence_tables(rows % 2 == 1)
        steps = (row_length - seq_len) // reuse_len + 1
        indices = tf.data.Dataset.range(tf.cast(steps * batch_size, tf.int64))

        def draw(k):  # example k's own seed, as each example has had
            k = tf.cast(k, tf.int32)
            return draws(k, tf.random.experimental.stateless_fold_in(seed, k))

        drawn = indices.map(draw, num_parallel_calls=tf.data.AUTOTUNE)
        groups = drawn.batch(group_size).map(
            functools.partial(group, ids, tables), num_parallel_calls=tf.data.AUTOTUNE
        )
        return groups.unbatch()

    blocks = lm.chunk_stream_batches(
        _document_streams(dataset, eod_id=eod_id),
        chunk_length=batch_size * row_len,
        feature_key="stream",
        min_chunk_length=batch_size * seq_len,
    ).unbatch()

    @seqio.map_over_dataset(num_seeds=1)
    def seeded(block, seed):
        return block, seed

    return seeded(blocks).flat_map(examples).prefetch(tf.data.AUTOTUNE)


def _with_shapes(features, *, seq_len, num_predict):
    """A group's features with their static shapes, [G, ...]."""
    shapes = {"perm_mask": [seq_len, seq_len], "target_mapping": [num_predict, seq_len]}
    shapes.update(dict.fromkeys(["target", "target_mask"], [num_predict]))
    shapes.update(dict.fromkeys(["input_k", "input_q", "seg_id"], [seq_len]))
    shapes["is_random"] = []
    return {k: tf.ensure_shape(v, [None, *shapes[k]]) for k, v in features.items()}


def permutation_lm(
    dataset: tf.data.Dataset,
    *,
    sequence_length: Mapping[str, int] | None,
    cls_id: int,
    sep_id: int,
    eod_id: int,
    stream: StreamOptions | None = None,
    start_pieces: np.ndarray | None = None,
    mask_alpha: int = 6,
    mask_beta: int = 1,
) -> tf.data.Dataset:
    """The SeqIO preprocessor: `permutation_lm_streams` with seq_len = sequence_length["input_k"],
    num_predict = sequence_length["target"] (the converter's P; default
    round((L - 3) * mask_beta / mask_alpha), 85 for 512) and the layout of `stream` (None: the
    defaults, one row).

    Example: {"input_k": 512}, StreamOptions(batch_size=16) -> reuse 256, perm 256, 85
    predictions (43 + 42), 16 interleaved rows. An odd L needs explicit reuse_len / perm_size.
    """
    if not sequence_length or "input_k" not in sequence_length:
        raise ValueError(
            f"xlnet tasks need sequence_length={{'input_k': L, ...}}, got {sequence_length}"
        )
    seq_len = int(sequence_length["input_k"])
    stream = StreamOptions() if stream is None else stream
    reuse_len = seq_len // 2 if stream.reuse_len is None else stream.reuse_len
    default_predict = max(1, round((seq_len - 3) * mask_beta / mask_alpha))
    return permutation_lm_streams(
        dataset,
        seq_len=seq_len,
        reuse_len=reuse_len,
        batch_size=stream.batch_size,
        num_predict=int(sequence_length.get("target", default_predict)),
        perm_size=reuse_len if stream.perm_size is None else stream.perm_size,
        cls_id=cls_id,
        sep_id=sep_id,
        eod_id=eod_id,
        start_pieces=start_pieces,
        steps_per_block=stream.steps_per_block,
        mask_alpha=mask_alpha,
        mask_beta=mask_beta,
    )


def stream_task(
    task: seqio.Task,
    *,
    batch_size: int,
    reuse_len: int | None = None,
    perm_size: int | None = None,
    steps_per_block: int = STEPS_PER_BLOCK,
    name: str | None = None,
    register: bool = True,
) -> seqio.Task:
    """`task` (an `*_xlnet_plm` or `*_txl_lm` task) with its stream step bound to these
    `StreamOptions` (the stream LM takes batch_size and steps_per_block only), named
    `name` (default `{task.name}_rows{batch_size}`) and registered unless `register=False`.

    The new task refuses `shuffle=True` (SeqIO raises: its shuffle_buffer_size is None), since
    an example shuffle breaks row continuation. Example:
      stream_task(seqio.get_mixture_or_task("c4_xlnet_plm"), batch_size=16).name
      -> "c4_xlnet_plm_rows16"; get_dataset({"input_k": 512, "target": 85}, shuffle=False)
    """
    options = StreamOptions(batch_size, reuse_len, perm_size, steps_per_block)
    # The stream step is the one preprocessor taking `stream` (`_xlnet`, `_stream_lm`).
    takes_stream = ["stream" in inspect.signature(step).parameters for step in task.preprocessors]
    if sum(takes_stream) != 1:
        raise ValueError(
            f"task {task.name!r} has {sum(takes_stream)} preprocessors taking `stream` "
            "(StreamOptions); expected exactly 1, the XLNet step"
        )
    steps = [
        functools.partial(step, stream=options) if takes else step
        for step, takes in zip(task.preprocessors, takes_stream, strict=True)
    ]
    new = seqio.Task(
        name or f"{task.name}_rows{batch_size}",
        source=task.source,
        output_features=task.output_features,
        preprocessors=steps,
        shuffle_buffer_size=None,
    )
    if register:
        seqio.TaskRegistry.remove(new.name)
        seqio.TaskRegistry.add_provider(new.name, new)
    return new
