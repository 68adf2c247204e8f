"""Encoder pretraining rows cut from documents, the way each paper's data script cuts them.

`encoder_instances(dataset, variant=...)` turns documents into `[CLS] ... [SEP]` rows with
`input_ids`, `token_type_ids` and (when the input has word starts) `word_starts` (1 on the
specials). Variants, each restated from the paper's released code:

* "bert" (google-research/bert create_pretraining_data.py, create_instances_from_document): per
  document a target length `max_seq_length - 3`, or with probability `short_seq_prob` a uniform
  integer in [2, max_seq_length - 3]; whole sentences are gathered until they reach the target;
  A = a uniform number of the gathered sentences, B = the rest (the actual continuation: these
  rows feed MLM-only objectives, so there is no random next); the pair is cut by
  truncate_seq_pair; `[CLS] A [SEP] B [SEP]`, token types 0 then 1. A chunk of one sentence
  has no B and becomes `[CLS] A [SEP]` (BERT would draw a random B for NSP). This is
  `sentence_pairs` with objective "mlm"; see that module for the details.
* "electra" (google-research/electra build_pretraining_dataset.py, ExampleBuilder): sentences
  are gathered until their length reaches the target (`max_seq_length`; after each row, with
  probability 0.05, a uniform integer in [5, max_seq_length] for the next one) or the document
  ends. The first segment's target is `(target - 3) // 2`, or with probability 0.1 unbounded
  (a one-segment row). Each gathered sentence, in order, goes to the first segment if it is
  empty, if the sentence keeps it under its target, or, with probability 1/2, if the second is
  still empty and the first under its target; otherwise to the second. The first is cut to
  `max_seq_length - 2` tokens, the second to what is left after three specials; a row is
  `[CLS] first [SEP] second [SEP]` (types 0 / 1), or `[CLS] first [SEP]` when the second is
  empty. ELECTRA's builder carries the target from one document to the next; here each
  document draws its first target afresh, from the same distribution.
* "full_sentences" (facebookresearch/SpanBERT BlockDataset, break_mode "doc"; RoBERTa's
  FULL-SENTENCES without crossing documents): whole consecutive sentences of one document are
  packed greedily into `[CLS] chunk [SEP]` rows of at most `max_seq_length - 2` tokens, types 0.
  A sentence longer than that is dropped and ends the chunk (SpanBERT's BlockDataset skips it).
* "stride" (lmsuite's own, not a paper's): `tokenization.encoder_chunks`, fixed-stride
  `[CLS] chunk [SEP]` rows of the document's `targets`, sentences ignored.

Input: one example per document; `sentence_ids` ragged int [S, None] and optionally
`sentence_word_starts` [S, None] ("bert", "electra", "full_sentences"; empty sentences are
dropped), or `targets` / `word_starts` ("stride"). The random variants are seeded by `seed` and
the document's running index in the stream they are given, so one pass over a corpus gives
the same rows for the same `seed`. In training the stream is endless: no lmsuite task has a
SeqIO cache step, so SeqIO repeats before every preprocessor, the index keeps counting, and
each pass draws new rows (`wiki_sample_bert_mlm`, unshuffled: 63% of its 4,780 row lengths
agree position by position between the first pass and the second, where a fixed pass would
give 100%; `sentence_pairs` behaves alike). The papers' offline data instead fixes
`dupe_factor` sets of rows.
"""

from __future__ import annotations

import tensorflow as tf

from lmsuite.data import tokenization
from lmsuite.data.preprocessors import mlm, sentence_pairs

VARIANTS = ("bert", "electra", "full_sentences", "stride")
IDS_KEY = sentence_pairs.IDS_KEY
WORD_STARTS_KEY = sentence_pairs.WORD_STARTS_KEY
ELECTRA_ONE_SEGMENT_PROB = 0.1
ELECTRA_RANDOM_LENGTH_PROB = 0.05
ELECTRA_MIN_RANDOM_LENGTH = 5


def encoder_instances(
    dataset: tf.data.Dataset,
    *,
    variant: str,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    seed: int = 0,
    short_seq_prob: float = 0.1,
) -> tf.data.Dataset:
    """Documents -> encoder rows cut as `variant`'s paper cuts them (see the module doc).

    Example ("full_sentences", max_seq_length 8, cls 2, sep 3): sentence_ids
    [[10, 11], [12, 13, 14], [15, 16], [17] * 7, [18]] -> {"input_ids": [2, 10, .., 14, 3]},
    {"input_ids": [2, 15, 16, 3]} (the 7-token sentence is dropped), {"input_ids": [2, 18, 3]},
    all token types 0. "bert" with max_seq_length 16 and short_seq_prob 0 on
    [[10, 11], [12, 13, 14], [15]] -> e.g. [2, 10, 11, 3, 12, 13, 14, 15, 3], types [0]*4+[1]*5.
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}, expected one of {VARIANTS}")
    if variant == "stride":
        return tokenization.encoder_chunks(
            dataset, max_seq_length=max_seq_length, cls_id=cls_id, sep_id=sep_id
        )
    if variant == "bert":
        return sentence_pairs.sentence_pairs(
            dataset,
            objective="mlm",
            seed=seed,
            max_seq_length=max_seq_length,
            cls_id=cls_id,
            sep_id=sep_id,
            short_seq_prob=short_seq_prob,
        )
    if max_seq_length < ELECTRA_MIN_RANDOM_LENGTH:
        raise ValueError(f"max_seq_length={max_seq_length}, expected >= 5")
    if IDS_KEY not in dataset.element_spec:
        raise ValueError(f"missing feature {IDS_KEY!r}; got {sorted(dataset.element_spec)}")
    if variant == "full_sentences":
        rows = lambda features: _full_sentence_rows(
            features, max_seq_length=max_seq_length, cls_id=cls_id, sep_id=sep_id
        )
        return dataset.map(tf.autograph.experimental.do_not_convert(rows)).unbatch()
    base_seed = tf.constant([seed, 1], tf.int64)

    @tf.autograph.experimental.do_not_convert
    def electra_rows(index, features):
        doc_seed = tf.random.experimental.stateless_fold_in(base_seed, index)
        out = _electra_rows(features, seed=doc_seed, max_seq_length=max_seq_length)
        return _framed(out, cls_id=cls_id, sep_id=sep_id)

    return dataset.enumerate().map(electra_rows).unbatch()


def _document(features) -> tuple[tf.RaggedTensor, tf.RaggedTensor | None]:
    ids = sentence_pairs._sentences(features, IDS_KEY)
    starts = None
    if WORD_STARTS_KEY in features:
        starts = sentence_pairs._sentences(features, WORD_STARTS_KEY)
    return sentence_pairs._drop_empty(ids, starts)


def _electra_groups(lengths: tf.Tensor, *, seed: tf.Tensor, max_seq_length: int):
    """Per sentence: its row number and segment (0 first, 1 second), by ExampleBuilder's rule."""
    num = tf.shape(lengths)[0]
    draws = tf.random.stateless_uniform([num + 1, 4], seed)

    def next_target(u_short, u_length):
        span = max_seq_length - ELECTRA_MIN_RANDOM_LENGTH + 1
        random_length = ELECTRA_MIN_RANDOM_LENGTH + tf.minimum(
            tf.cast(u_length * span, tf.int32), span - 1
        )
        return tf.where(u_short < ELECTRA_RANDOM_LENGTH_PROB, random_length, max_seq_length)

    def step(state, elems):
        row, used, target, first_target, first, second, _ = state
        length, u = elems
        starting = used == 0
        two_segments = (target - 3) // 2
        first_target = tf.where(
            starting,
            tf.where(u[0] < ELECTRA_ONE_SEGMENT_PROB, 100_000, two_segments),
            first_target,
        )
        first = tf.where(starting, 0, first)
        second = tf.where(starting, 0, second)
        to_first = (
            (first == 0)
            | (first + length < first_target)
            | ((second == 0) & (first < first_target) & (u[1] < 0.5))
        )
        first += tf.where(to_first, length, 0)
        second += tf.where(to_first, 0, length)
        used += length
        closes = used >= target
        out_row = row
        row = tf.where(closes, row + 1, row)
        target = tf.where(closes, next_target(u[2], u[3]), target)
        used = tf.where(closes, 0, used)
        segment = 1 - tf.cast(to_first, tf.int32)
        return (row, used, target, first_target, first, second, tf.stack([out_row, segment]))

    zero = tf.constant(0)
    initial = (
        zero,
        zero,
        next_target(draws[0, 2], draws[0, 3]),
        zero,
        zero,
        zero,
        tf.zeros([2], tf.int32),
    )
    outputs = tf.scan(step, (tf.cast(lengths, tf.int32), draws[1:]), initializer=initial)
    return outputs[-1][:, 0], outputs[-1][:, 1]


def _electra_rows(features, *, seed: tf.Tensor, max_seq_length: int) -> dict:
    """The (first, second) segments of one document's ELECTRA rows, as flat-value indices."""
    ids, starts = _document(features)
    lengths = tf.cast(ids.row_lengths(), tf.int32)
    row, segment = _electra_groups(lengths, seed=seed, max_seq_length=max_seq_length)
    num_rows = tf.reduce_max(tf.concat([[-1], row], 0)) + 1
    # Tokens regrouped by (row, segment), each segment's sentences in document order.
    key = tf.repeat(2 * row + segment, lengths)
    order = tf.argsort(key, stable=True)
    sizes = tf.math.unsorted_segment_sum(lengths, 2 * row + segment, 2 * num_rows)
    begins = tf.cumsum(sizes, exclusive=True)
    first_len = tf.minimum(sizes[0::2], max_seq_length - 2)
    second_len = tf.minimum(sizes[1::2], tf.maximum(0, max_seq_length - first_len - 3))
    first = tf.gather(order, tf.ragged.range(begins[0::2], begins[0::2] + first_len))
    second = tf.gather(order, tf.ragged.range(begins[1::2], begins[1::2] + second_len))
    return _segments(ids, starts, first, second)


def _full_sentence_rows(features, *, max_seq_length: int, cls_id: int, sep_id: int) -> mlm.Features:
    """One document's SpanBERT doc-mode rows, stacked as ragged [N, None].

    A chunk from sentence s takes the sentences after it while their tokens fit (a binary
    search over the sentence boundaries; a too-long sentence never fits, so it ends the chunk);
    its successor is the first sentence after it that fits at all, and the chunks are the
    successors reached from the document's first sentence that fits
    (`tokenization.reached_from_first`, log2 of the sentence count loop turns): no turn per
    sentence or per chunk.

    Example (max_seq_length 8, limit 6): sentence lengths [2, 3, 2, 7, 1] -> chunks from
    sentence 0 (sentences 0-1, 5 tokens: the third would make 7), 2 (sentence 2: the 7-token
    sentence 3 never fits) and 4 (sentence 4).
    """
    ids, starts = _document(features)
    splits = tf.cast(ids.row_splits, tf.int32)
    num = tf.shape(splits)[0] - 1
    # The last sentence of a chunk from each sentence; s - 1 where sentence s alone is too long.
    last = tf.searchsorted(splits, splits[:-1] + max_seq_length - 2, side="right") - 2
    fitting = tf.range(num) <= last
    fits = tf.cast(tf.where(fitting)[:, 0], tf.int32)
    # The first sentence at or after each index (num included) that fits; num past the last.
    next_fitting = tf.gather(
        tf.concat([fits, [num]], 0), tf.searchsorted(fits, tf.range(num + 1), side="left")
    )
    # A chunk's successor; for a sentence that is too long, the next that fits (only the first
    # sentence is reached that way, and it starts no chunk).
    successor = tf.concat([tf.gather(next_fitting, last + 1), [num]], 0)
    reached = tokenization.reached_from_first(tf.cast(successor, tf.int64))
    chunk = tf.cast(tf.where(reached & fitting)[:, 0], tf.int32)
    begin = tf.gather(splits, chunk)
    empty = tf.zeros_like(chunk)
    return sentence_pairs._framed(
        ids.flat_values,
        None if starts is None else starts.flat_values,
        first=begin,
        first_length=tf.gather(splits, tf.gather(last, chunk) + 1) - begin,
        second=empty,
        second_length=empty,
        cls_id=cls_id,
        sep_id=sep_id,
    )


def _segments(ids, starts, first, second) -> dict:
    first, second = first.with_row_splits_dtype(tf.int64), second.with_row_splits_dtype(tf.int64)
    out = {"first": tf.gather(ids.flat_values, first), "second": tf.gather(ids.flat_values, second)}
    if starts is not None:
        values = tf.cast(starts.flat_values, tf.int32)
        out["first_starts"] = tf.gather(values, first)
        out["second_starts"] = tf.gather(values, second)
    return out


def _framed(segments: dict, *, cls_id: int, sep_id: int) -> mlm.Features:
    """`[CLS] first [SEP] (second [SEP])` rows, token types 0 / 1, word starts 1 on specials."""
    first, second = segments["first"], segments["second"]
    column = tf.ones_like(first.row_lengths()[:, None], tf.int32)
    has_second = tf.cast(second.row_lengths() > 0, tf.int64)
    tail = tf.ones_like(tf.ragged.range(has_second), tf.int32)

    def join(left, a, middle, b, right):
        return tf.concat([left, a, middle, b, right], axis=1)

    out = {
        "input_ids": join(column * cls_id, first, column * sep_id, second, tail * sep_id),
        "token_type_ids": join(
            column * 0, tf.zeros_like(first), column * 0, tf.ones_like(second), tail
        ),
    }
    if "first_starts" in segments:
        out["word_starts"] = join(
            column, segments["first_starts"], column, segments["second_starts"], tail
        )
    return out
