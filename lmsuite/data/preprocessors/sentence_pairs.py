"""Sentence-pair instances: BERT NSP, ALBERT SOP, StructBERT's 3-way sentence relation, and
BERT's instances for MLM-only objectives.

Input: one example per document with `sentence_ids`, ragged int [S, None] (token ids of each
sentence, no specials) and optionally `sentence_word_starts`, ragged [S, None]. Empty sentences
are dropped first.

Chunking follows BERT's create_pretraining_data.py, restated: per document, draw the target
length (`max_seq_length - 3`, or with probability `short_seq_prob` a uniform integer in
[2, max_seq_length - 3]); gather consecutive sentences into a chunk until its length reaches the
target or the document ends; split the chunk at a uniform point a_end in [1, k - 1] (a_end = 1
when the chunk has k = 1 sentence): segment A = sentences [0, a_end), B = the rest. Then:

* "nsp": with probability 1/2 (always when k = 1) B is replaced by consecutive sentences from
  ANOTHER document, starting at a uniform sentence and long enough to reach the target; the
  unused sentences of the chunk go back to the document. `next_sentence_label` 1 = random, 0 =
  actual next.
* "sop" (ALBERT): A and B are swapped with probability 1/2; `sentence_order_label` 1 = swapped.
  A chunk of one sentence cannot make a pair: it is SKIPPED and counted (ALBERT would fall back to
  a random document; we keep SOP pure).
* "structbert": 1/3 B follows A (label 0), 1/3 B precedes A (swapped, label 1), 1/3 B from
  another document (label 2, always when k = 1); `sentence_relation_label`.
* "mlm" (BERT's instances for objectives without a sentence task): B is always the rest of
  the chunk, no label. A chunk of one sentence has no B: it becomes `[CLS] A [SEP]` (types 0),
  A truncated to `max_seq_length - 3` as truncate_seq_pair would with an empty B.

The pair is truncated as BERT's truncate_seq_pair: remove one token at a time from the longer
segment (the second on ties), at its front or back with probability 1/2 each, until
len(A) + len(B) <= max_seq_length - 3. (The final lengths are deterministic, so we compute
them and draw the front removals from a Binomial(removed, 1/2): the same distribution.)

Output per instance: `input_ids` = [CLS] A [SEP] B [SEP], `token_type_ids` (0 up to the first
[SEP], 1 after), `word_starts` (if given; 1 on the specials) and the label.

Another document comes from a shuffle buffer over the (repeated) corpus, one per source
document, shared by that document's random-next instances (BERT draws one per instance from the
whole corpus; a streaming pipeline cannot). If the buffer yields the document itself we use the
next document instead; a corpus of one document gets no random pairs (skipped and counted).

Skipped chunks (plus documents without any sentence) are counted: `instances_per_document` yields
`num_skipped` per document and `count_skipped_pairs` totals it.
"""

from __future__ import annotations

import tensorflow as tf

from lmsuite.data.preprocessors import mlm

IDS_KEY = "sentence_ids"
WORD_STARTS_KEY = "sentence_word_starts"
LABEL_KEYS = {
    "nsp": "next_sentence_label",
    "sop": "sentence_order_label",
    "structbert": "sentence_relation_label",
    "mlm": None,
}
_NO_OTHER_DOCUMENT = ("sop", "mlm")
_OTHER = "other_"


def _uniform_int(seed: tf.Tensor, low: tf.Tensor, high: tf.Tensor) -> tf.Tensor:
    """A uniform integer in [low, high] inclusive (as Python's random.randint)."""
    return tf.random.stateless_uniform(
        [], seed, minval=low, maxval=tf.maximum(high, low) + 1, dtype=tf.int32
    )


def _sentences(features: mlm.Features, key: str) -> tf.RaggedTensor:
    rt = features[key]
    if not isinstance(rt, tf.RaggedTensor):
        raise ValueError(f"feature {key!r} must be a ragged [S, None] tensor, got {rt!r}")
    return tf.cast(rt, tf.int32)


def _drop_empty(ids: tf.RaggedTensor, starts: tf.RaggedTensor | None):
    keep = ids.row_lengths() > 0
    ids = tf.ragged.boolean_mask(ids, keep)
    starts = None if starts is None else tf.ragged.boolean_mask(starts, keep)
    return ids, starts


def _first_reaching(splits: tf.Tensor, start: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """Last sentence of the run from `start` whose length first reaches `target` (else the last)."""
    num = tf.shape(splits)[0] - 1
    reached = splits[start + 1 :] - splits[start] >= target
    offsets = tf.range(num - start)
    return start + tf.reduce_min(tf.where(reached, offsets, num - start - 1))


def _truncated_lengths(a: tf.Tensor, b: tf.Tensor, limit: tf.Tensor):
    """Final lengths of BERT's truncate_seq_pair: trim the longer (second on ties)."""
    shorter = tf.minimum(a, b)
    balanced_first = (limit + 1) // 2
    balanced = (balanced_first, limit - balanced_first)
    one_sided_first = tf.where(a <= b, a, limit - b)
    one_sided = (one_sided_first, limit - one_sided_first)
    keep_shorter = 2 * shorter <= limit
    final_a = tf.where(a + b <= limit, a, tf.where(keep_shorter, one_sided[0], balanced[0]))
    final_b = tf.where(a + b <= limit, b, tf.where(keep_shorter, one_sided[1], balanced[1]))
    return final_a, final_b


def _document_instances(
    features: mlm.Features,
    *,
    seed: tf.Tensor,
    objective: str,
    max_seq_length: int,
    short_seq_prob: float,
    cls_id: int,
    sep_id: int,
) -> mlm.Features:
    """All instances of one document, stacked as ragged [N, None], plus `num_skipped`."""
    max_tokens = max_seq_length - 3
    has_starts = WORD_STARTS_KEY in features
    own, own_starts = _drop_empty(
        _sentences(features, IDS_KEY),
        _sentences(features, WORD_STARTS_KEY) if has_starts else None,
    )
    if objective in _NO_OTHER_DOCUMENT:
        other, other_starts = own[:0], None if own_starts is None else own_starts[:0]
    else:
        other, other_starts = _drop_empty(
            _sentences(features, _OTHER + IDS_KEY),
            _sentences(features, _OTHER + WORD_STARTS_KEY) if has_starts else None,
        )
    num_own = own.nrows(out_type=tf.int32)
    num_other = tf.where(features["_other_is_self"], 0, other.nrows(out_type=tf.int32))
    splits = tf.cast(own.row_splits, tf.int32)
    other_splits = tf.cast(other.row_splits, tf.int32)
    offset = splits[-1]
    tokens = tf.concat([own.flat_values, other.flat_values], 0)

    target_seed, loop_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    short_draw, length_seed = tf.unstack(tf.random.experimental.stateless_split(target_seed, 2))
    is_short = tf.random.stateless_uniform([], short_draw) < short_seq_prob
    target = tf.where(is_short, _uniform_int(length_seed, 2, max_tokens), max_tokens)

    def body(step, start, skipped, arrays):
        draws = tf.random.stateless_uniform(
            [4], tf.random.experimental.stateless_fold_in(loop_seed, step)
        )
        trunc_seed = tf.random.experimental.stateless_fold_in(loop_seed, step + (1 << 20))
        end = _first_reaching(splits, start, target)
        k = end - start + 1
        a_end = tf.where(k >= 2, 1 + tf.cast(draws[0] * tf.cast(k - 1, tf.float32), tf.int32), 1)
        a_end = tf.minimum(a_end, tf.maximum(k - 1, 1))
        if objective == "nsp":
            random_next, swap = (k == 1) | (draws[1] < 0.5), tf.constant(False)
            label = tf.cast(random_next, tf.int32)
        elif objective == "sop":
            random_next, swap = tf.constant(False), draws[1] < 0.5
            label = tf.cast(swap, tf.int32)
        elif objective == "mlm":
            random_next, swap, label = tf.constant(False), tf.constant(False), tf.constant(0)
        else:
            random_next = (k == 1) | (draws[1] >= 2.0 / 3.0)
            swap = ~random_next & (draws[1] >= 1.0 / 3.0)
            label = tf.where(random_next, 2, tf.cast(swap, tf.int32))
        a_lo, a_hi = splits[start], splits[start + a_end]
        # The random document's run starts at a uniform sentence and reaches the target.
        r = tf.minimum(
            tf.cast(draws[2] * tf.cast(num_other, tf.float32), tf.int32),
            tf.maximum(num_other - 1, 0),
        )
        safe_other = tf.maximum(num_other, 1)
        r_end = tf.cond(
            num_other > 0,
            lambda: _first_reaching(other_splits, r, target - (a_hi - a_lo)),
            lambda: tf.constant(0),
        )
        b_lo = tf.where(random_next, offset + other_splits[tf.minimum(r, safe_other - 1)], a_hi)
        b_hi = tf.where(
            random_next, offset + other_splits[tf.minimum(r_end + 1, num_other)], splits[end + 1]
        )
        first = (tf.where(swap, b_lo, a_lo), tf.where(swap, b_hi, a_hi))
        second = (tf.where(swap, a_lo, b_lo), tf.where(swap, a_hi, b_hi))
        len1, len2 = first[1] - first[0], second[1] - second[0]
        fin1, fin2 = _truncated_lengths(len1, len2, max_tokens)
        fronts = tf.cast(
            tf.random.stateless_binomial(
                [2],
                trunc_seed,
                counts=tf.cast(tf.stack([len1 - fin1, len2 - fin2]), tf.float32),
                probs=0.5,
            ),
            tf.int32,
        )
        first = (first[0] + fronts[0], first[0] + fronts[0] + fin1)
        second = (second[0] + fronts[1], second[0] + fronts[1] + fin2)
        invalid = (objective == "sop") & (k == 1)
        invalid |= random_next & (num_other == 0)
        invalid |= (fin1 < 1) | ((fin2 < 1) & ((objective != "mlm") | (k >= 2)))
        next_start = tf.where(random_next & ~invalid, start + a_end, end + 1)
        row = tf.stack([first[0], first[1], second[0], second[1], label])
        arrays = tf.cond(invalid, lambda: arrays, lambda: arrays.write(arrays.size(), row))
        return step + 1, next_start, skipped + tf.cast(invalid, tf.int32), arrays

    _, _, skipped, arrays = tf.while_loop(
        lambda step, start, skipped, arrays: start < num_own,
        body,
        (
            tf.constant(0),
            tf.constant(0),
            tf.constant(0),
            tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[5]),
        ),
    )
    rows = tf.reshape(arrays.stack(), [-1, 5])
    first = tf.ragged.range(rows[:, 0], rows[:, 1])
    second = tf.ragged.range(rows[:, 2], rows[:, 3])
    column = tf.ones_like(rows[:, :1])
    # The closing [SEP] of B; "mlm" rows without a B end at A's [SEP].
    tail = tf.ones_like(tf.ragged.range(tf.cast(rows[:, 3] > rows[:, 2], tf.int32)))

    def join(left, a, middle, b, right):
        return tf.concat([left, a, middle, b, right], axis=1)

    out = {
        "input_ids": join(
            column * cls_id,
            tf.gather(tokens, first),
            column * sep_id,
            tf.gather(tokens, second),
            tail * sep_id,
        ),
        "token_type_ids": join(
            column * 0, tf.zeros_like(first), column * 0, tf.ones_like(second), tail
        ),
        "num_skipped": skipped + tf.cast(num_own == 0, tf.int32),
    }
    if LABEL_KEYS[objective] is not None:
        out[LABEL_KEYS[objective]] = rows[:, 4]
    if has_starts:
        starts = tf.concat([own_starts.flat_values, other_starts.flat_values], 0)
        starts = tf.cast(starts, tf.int32)
        out["word_starts"] = join(
            column, tf.gather(starts, first), column, tf.gather(starts, second), tail
        )
    return out


def _with_other_documents(dataset: tf.data.Dataset, *, seed: int, buffer_size: int):
    """Adds `other_*` sentence features from a different document and `_doc_index`."""
    keys = [k for k in (IDS_KEY, WORD_STARTS_KEY) if k in dataset.element_spec]
    pool = dataset.enumerate().repeat().shuffle(buffer_size, seed=seed)
    fallback = dataset.enumerate().repeat().skip(1)

    @tf.autograph.experimental.do_not_convert
    def pick(own, drawn, following):
        index, features = own
        use_drawn = drawn[0] != index
        other_index = tf.where(use_drawn, drawn[0], following[0])
        features = dict(features)
        for key in keys:
            features[_OTHER + key] = tf.cond(
                use_drawn, lambda k=key: drawn[1][k], lambda k=key: following[1][k]
            )
        features["_doc_index"] = index
        features["_other_is_self"] = other_index == index
        return features

    return tf.data.Dataset.zip((dataset.enumerate(), pool, fallback)).map(pick)


def instances_per_document(
    dataset: tf.data.Dataset,
    *,
    objective: str,
    seed: int,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    short_seq_prob: float = 0.1,
    buffer_size: int = 1000,
) -> tf.data.Dataset:
    """One element per document: its instances stacked (ragged [N, None]) and `num_skipped`.

    `sentence_pairs` flattens this; read `num_skipped` here to count what was dropped.
    """
    if objective not in LABEL_KEYS:
        raise ValueError(f"objective={objective!r}, expected one of {sorted(LABEL_KEYS)}")
    if max_seq_length < 5:
        raise ValueError(f"max_seq_length={max_seq_length}, expected >= 5")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob={short_seq_prob}, expected in [0, 1]")
    if IDS_KEY not in dataset.element_spec:
        raise ValueError(f"missing feature {IDS_KEY!r}; got {sorted(dataset.element_spec)}")
    if objective in _NO_OTHER_DOCUMENT:
        dataset = dataset.enumerate().map(
            lambda i, f: {**f, "_doc_index": i, "_other_is_self": tf.constant(True)}
        )
    else:
        dataset = _with_other_documents(dataset, seed=seed, buffer_size=buffer_size)
    base_seed = tf.constant([seed, 0], tf.int64)

    @tf.autograph.experimental.do_not_convert
    def build(features):
        doc_seed = tf.random.experimental.stateless_fold_in(base_seed, features["_doc_index"])
        return _document_instances(
            features,
            seed=doc_seed,
            objective=objective,
            max_seq_length=max_seq_length,
            short_seq_prob=short_seq_prob,
            cls_id=cls_id,
            sep_id=sep_id,
        )

    return dataset.map(build, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def sentence_pairs(
    dataset: tf.data.Dataset,
    *,
    objective: str,
    seed: int,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    short_seq_prob: float = 0.1,
    buffer_size: int = 1000,
) -> tf.data.Dataset:
    """Documents -> sentence-pair instances for "nsp", "sop", "structbert" or "mlm" (see
    module doc).

    Example ("sop", cls 2, sep 3, max_seq_length 16, short_seq_prob 0): a document with
    sentence_ids [[10, 11], [12, 13, 14], [15]] (6 tokens, under the target 13) forms one
    chunk; a_end = 2, say -> A = [10, 11, 12, 13, 14], B = [15]; not swapped ->
    input_ids [2, 10, 11, 12, 13, 14, 3, 15, 3], token_type_ids [0]*7 + [1, 1],
    sentence_order_label 0; swapped -> [2, 15, 3, 10, 11, 12, 13, 14, 3], label 1.
    A document [[10, 11]] is skipped (counted by `count_skipped_pairs`).
    """
    per_document = instances_per_document(
        dataset,
        objective=objective,
        seed=seed,
        max_seq_length=max_seq_length,
        short_seq_prob=short_seq_prob,
        cls_id=cls_id,
        sep_id=sep_id,
        buffer_size=buffer_size,
    )

    def flatten(instances):
        instances = {k: v for k, v in instances.items() if k != "num_skipped"}
        return tf.data.Dataset.from_tensor_slices(instances)

    return per_document.flat_map(flatten)


def count_skipped_pairs(dataset: tf.data.Dataset, **kwargs) -> int:
    """How many chunks `sentence_pairs(dataset, **kwargs)` skips (plus sentence-less documents)."""
    per_document = instances_per_document(dataset, **kwargs)
    total = per_document.reduce(tf.constant(0), lambda acc, f: acc + f["num_skipped"])
    return int(total)


def nsp_pairs(dataset: tf.data.Dataset, **kwargs) -> tf.data.Dataset:
    """BERT next-sentence-prediction pairs; see `sentence_pairs`."""
    return sentence_pairs(dataset, objective="nsp", **kwargs)


def sop_pairs(dataset: tf.data.Dataset, **kwargs) -> tf.data.Dataset:
    """ALBERT sentence-order-prediction pairs; see `sentence_pairs`."""
    return sentence_pairs(dataset, objective="sop", **kwargs)
