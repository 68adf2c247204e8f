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

from collections.abc import Mapping

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


def _fold_in_base(seed: tf.Tensor) -> tf.Tensor:
    """The int32 `tf.random.experimental.stateless_fold_in(seed, d)` stacks before `d`.

    TF's fold-in is `[stateless_uniform([], seed, full int32 range), d]`: the first half does
    not depend on `d`, so drawing it once gives the seeds of every step without a fold-in each.
    `test_fold_in_base_is_tf_fold_in` checks the identity on the installed TF.
    """
    return tf.random.stateless_uniform([], seed, minval=None, maxval=None, dtype=tf.int32)


def _run_ends(splits: tf.Tensor, starts: tf.Tensor, lengths: tf.Tensor) -> tf.Tensor:
    """For each start sentence, the last sentence of the run from it that reaches `lengths`.

    A run takes consecutive sentences until its tokens reach the length (else it ends at the
    last sentence), as BERT gathers a chunk. Sentences are never empty, so `splits` rises
    strictly and the run's end is a binary search for the first boundary at or past the start's
    boundary plus the length.
    """
    num = tf.shape(splits)[0] - 1
    boundary = tf.searchsorted(splits, tf.gather(splits, starts) + lengths, side="left")
    return tf.minimum(tf.maximum(boundary - 1, starts), num - 1)


def _first_segment_sentences(u: tf.Tensor, k: tf.Tensor) -> tf.Tensor:
    """a_end: a uniform point in [1, k - 1] (1 when the chunk has one sentence)."""
    a_end = tf.where(k >= 2, 1 + tf.cast(u * tf.cast(k - 1, tf.float32), tf.int32), 1)
    return tf.minimum(a_end, tf.maximum(k - 1, 1))


def _random_next(objective: str, k: tf.Tensor, u: tf.Tensor) -> tf.Tensor:
    """Whether B comes from another document (always for NSP's or StructBERT's one-sentence
    chunk; never for SOP or the MLM instances)."""
    if objective == "nsp":
        return (k == 1) | (u < 0.5)
    if objective == "structbert":
        return (k == 1) | (u >= 2.0 / 3.0)
    return tf.zeros_like(k, tf.bool)


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
    """All instances of one document, stacked as ragged [N, None], plus `num_skipped`.

    Step t draws four uniforms under `fold_in(loop_seed, t)` and, when its pair is truncated,
    the front removals under `fold_in(loop_seed, t + 2**20)`. Only the walk from chunk to chunk
    is a loop (where the next chunk starts depends on the step's draws: a random B gives the
    chunk's unused sentences back); every instance's segments, labels and truncation are then
    computed for all steps at once.
    """
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
    ends = _run_ends(splits, tf.range(num_own), target)
    fold_base = _fold_in_base(loop_seed)
    has_other = num_other > 0

    def walk(step, start, start_ta, draw_ta):
        u = tf.random.stateless_uniform([4], tf.stack([fold_base, step]))
        end = ends[start]
        next_start = end + 1
        if objective not in _NO_OTHER_DOCUMENT:
            k = end - start + 1
            gives_back = _random_next(objective, k, u[1]) & has_other
            next_start = tf.where(gives_back, start + _first_segment_sentences(u[0], k), end + 1)
        return step + 1, next_start, start_ta.write(step, start), draw_ta.write(step, u)

    _, _, start_ta, draw_ta = tf.while_loop(
        lambda step, start, start_ta, draw_ta: start < num_own,
        walk,
        (
            tf.constant(0),
            tf.constant(0),
            tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[]),
            tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[4]),
        ),
    )
    # Every step at once from here. A step that cannot make its pair is skipped and counted;
    # the others' segments are never empty (sentences are not; a chunk of one sentence takes a
    # random B, is skipped, or is "mlm"'s lone A; truncation leaves each segment a token).
    start = tf.reshape(start_ta.stack(), [-1])
    u = tf.reshape(draw_ta.stack(), [-1, 4])
    k = tf.gather(ends, start) - start + 1
    random_next = _random_next(objective, k, u[:, 1])
    invalid = (objective == "sop") & (k == 1)
    invalid |= random_next & ~has_other
    kept = tf.where(~invalid)[:, 0]
    step = tf.gather(tf.range(tf.shape(start)[0]), kept)
    start, u, k, random_next = (tf.gather(x, kept) for x in (start, u, k, random_next))
    if objective == "sop":
        swap, label = u[:, 1] < 0.5, tf.cast(u[:, 1] < 0.5, tf.int32)
    elif objective == "structbert":
        swap = ~random_next & (u[:, 1] >= 1.0 / 3.0)
        label = tf.where(random_next, 2, tf.cast(swap, tf.int32))
    else:
        swap, label = tf.zeros_like(random_next), tf.cast(random_next, tf.int32)
    a_lo = tf.gather(splits, start)
    a_hi = tf.gather(splits, start + _first_segment_sentences(u[:, 0], k))
    # The random document's run starts at a uniform sentence and reaches the target.
    safe_other = tf.maximum(num_other, 1)
    r = tf.minimum(tf.cast(u[:, 2] * tf.cast(num_other, tf.float32), tf.int32), safe_other - 1)
    r_end = _run_ends(other_splits, r, target - (a_hi - a_lo))
    b_lo = tf.where(random_next, offset + tf.gather(other_splits, r), a_hi)
    b_hi = tf.where(
        random_next,
        offset + tf.gather(other_splits, tf.minimum(r_end + 1, num_other)),
        tf.gather(splits, start + k),
    )
    first = (tf.where(swap, b_lo, a_lo), tf.where(swap, b_hi, a_hi))
    second = (tf.where(swap, a_lo, b_lo), tf.where(swap, a_hi, b_hi))
    len1, len2 = first[1] - first[0], second[1] - second[0]
    fin1, fin2 = _truncated_lengths(len1, len2, max_tokens)
    fronts = _front_removals(
        tf.stack([len1 - fin1, len2 - fin2], axis=1), steps=step + (1 << 20), fold_base=fold_base
    )
    word_starts = None
    if has_starts:
        word_starts = tf.concat([own_starts.flat_values, other_starts.flat_values], 0)
    out = _framed(
        tokens,
        word_starts,
        first=first[0] + fronts[:, 0],
        first_length=fin1,
        second=second[0] + fronts[:, 1],
        second_length=fin2,
        cls_id=cls_id,
        sep_id=sep_id,
    )
    out["num_skipped"] = tf.reduce_sum(tf.cast(invalid, tf.int32))
    out["num_skipped"] += tf.cast(num_own == 0, tf.int32)
    if LABEL_KEYS[objective] is not None:
        out[LABEL_KEYS[objective]] = label
    return out


def _framed(
    tokens: tf.Tensor,
    word_starts: tf.Tensor | None,
    *,
    first: tf.Tensor,
    first_length: tf.Tensor,
    second: tf.Tensor,
    second_length: tf.Tensor,
    cls_id: int,
    sep_id: int,
    flags: Mapping[str, tf.Tensor] | None = None,
) -> mlm.Features:
    """Rows `[CLS] tokens[first:][:first_length] [SEP] tokens[second:][:second_length] [SEP]`.

    A row with an empty second segment ends at the first [SEP] ("mlm"'s lone A).
    `token_type_ids` are 0 up to the first [SEP] and 1 after; `word_starts` (when given) and
    the `flags` (more per-token features by name, such as ERNIE's unit starts) follow the
    tokens, 1 on the specials. Built on the flat positions of all rows at once: one row
    partition, no ragged concatenation.

    Example (cls 2, sep 3): tokens [10, 11, 12, 13, 14], first [0, 4], first_length [2, 1],
    second [3, 0], second_length [1, 0] -> input_ids [[2, 10, 11, 3, 13, 3], [2, 14, 3]],
    token_type_ids [[0, 0, 0, 0, 1, 1], [0, 0, 0]].
    """
    tail = tf.cast(second_length > 0, tf.int32)
    positions = tf.ragged.range(first_length + second_length + 2 + tail)
    offset, row = positions.flat_values, positions.value_rowids()
    into_second = offset - tf.gather(first_length, row) - 2
    in_first = (offset >= 1) & (offset <= tf.gather(first_length, row))
    in_second = (into_second >= 0) & (into_second < tf.gather(second_length, row))
    in_segment = in_first | in_second
    # A special reads one more value past the tokens (there may be no tokens at all).
    source = tf.where(
        in_first,
        tf.gather(first, row) + offset - 1,
        tf.where(in_second, tf.gather(second, row) + into_second, tf.size(tokens)),
    )
    specials = tf.where(offset == 0, cls_id, sep_id)
    read = lambda values, past: tf.gather(tf.concat([tf.cast(values, tf.int32), [past]], 0), source)
    out = {
        "input_ids": tf.where(in_segment, read(tokens, 0), specials),
        "token_type_ids": tf.cast(into_second >= 0, tf.int32),
    }
    flags = dict(flags or {})
    if word_starts is not None:
        flags["word_starts"] = word_starts
    for key, values in flags.items():
        out[key] = read(values, 1)
    return {key: positions.with_flat_values(values) for key, values in out.items()}


def _front_removals(removed: tf.Tensor, *, steps: tf.Tensor, fold_base: tf.Tensor) -> tf.Tensor:
    """Tokens truncate_seq_pair removes at each segment's front: Binomial(removed, 1/2) each.

    removed: [N, 2] tokens removed from each segment; step n draws under the seed
    `[fold_base, steps[n]]`. Only the pairs that lose tokens draw (a draw over zero removals is
    zero), one small loop turn each.
    """
    truncated = tf.cast(tf.where(tf.reduce_any(removed > 0, axis=1))[:, 0], tf.int32)
    counts = tf.cast(tf.gather(removed, truncated), tf.float32)
    seeds = tf.stack([tf.fill(tf.shape(truncated), fold_base), tf.gather(steps, truncated)], 1)
    draws = tf.map_fn(
        lambda args: tf.random.stateless_binomial([2], args[0], counts=args[1], probs=0.5),
        (seeds, counts),
        fn_output_signature=tf.int32,
    )
    return tf.scatter_nd(truncated[:, None], tf.reshape(draws, [-1, 2]), tf.shape(removed))


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

    instances = per_document.map(lambda f: {k: v for k, v in f.items() if k != "num_skipped"})
    return instances.unbatch()


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
