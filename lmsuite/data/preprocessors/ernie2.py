"""ERNIE 2.0's word-aware and structure-aware pretraining tasks (Sun et al. 2020, §4).

Baidu released ERNIE 2.0's fine-tuning code and weights but not its pretraining code (its
maintainers, PaddlePaddle/ERNIE issues #261 and #404), so these follow the paper's one-paragraph
definitions; every choice the paper leaves open is named here.

Input, one example per document: `sentence_ids`, `sentence_word_starts`, ragged int [S, None]
(`tokenization.tokenize_sentences`); empty sentences are dropped.

Rows: a document's sentences are grouped greedily into passages of whole sentences of at most
`max_tokens` pieces (`tokenization.passage_ids`; a longer sentence is its own passage, cut to
`max_tokens`). A passage is the "segment" of the token-document task and the "paragraph" of the
reordering task (our corpora do not keep sentence-to-paragraph structure).

* Capitalization (`CAPITALIZATION_KEY`, int32 [L] aligned with `input_ids`): 1 on the first
  token of a word whose first character is uppercase, 0 on every other token and the specials.
  Read from the pieces (case is kept by lmsuite's SentencePiece models): a word-start piece
  "▁The" is uppercase; a bare "▁" takes the case of the piece after it.
* Token-document relation (`TOKEN_DOCUMENT_KEY`, int32 [L]): 1 on every token of a word that
  also occurs in another passage of the same document, else 0 (0 on specials). A word is its
  exact piece sequence (case-sensitive); the paper says "token" and leaves "segment" undefined.
* Sentence reordering (`REORDER_KEY`, rank 0): the passage's sentences are split at k - 1
  distinct sentence boundaries drawn uniformly into k segments, k uniform in [1, min(m, S)],
  and the segments are shown in a uniform random order, each followed by [SEP]. The label is
  `permutation_class(shown_order)`: offset sum_{j<k} j! plus the lexicographic rank of the
  order among the k! orders, so the classes are 0 .. sum_{j<=m} j! - 1 (m = 3: 9 classes).
  The paper does not state m.
* Sentence distance (`DISTANCE_KEY`, rank 0): `[CLS] A [SEP] B [SEP]` with A one sentence and
  B the next sentence (label 0), a sentence of the same document not adjacent to A (label 1,
  uniform among those), or a uniform sentence of another document (label 2), drawn with
  `probs`. Only sentences A for which all three are possible (a next sentence, a non-adjacent
  one, another document) make a pair, so the label shares are exactly `probs` in expectation.
"""

from __future__ import annotations

import math

import numpy as np
import seqio
import tensorflow as tf

from lmsuite.data import tokenization
from lmsuite.data.preprocessors import ernie, mlm, sentence_pairs

CAPITALIZATION_KEY = "capitalization_labels"
TOKEN_DOCUMENT_KEY = "token_document_labels"
REORDER_KEY = "sentence_reordering_label"
DISTANCE_KEY = "sentence_distance_label"
MAX_SEGMENTS = 3
DISTANCE_PROBS = (1 / 3, 1 / 3, 1 / 3)
MAX_FACTORIAL = 10  # segments up to 10 (10! fits int32)
_WORD_START = "\u2581"


def num_reordering_classes(max_segments: int) -> int:
    """sum_{k=1..m} k!: 1 -> 1, 2 -> 3, 3 -> 9, 4 -> 33."""
    return sum(math.factorial(k) for k in range(1, max_segments + 1))


def permutation_class(order) -> int:
    """The class of a shown order of k segments (Python reference of the data's labels).

    Example: (0,) -> 0; (0, 1) -> 1, (1, 0) -> 2; (0, 1, 2) -> 3, (0, 2, 1) -> 4, ...,
    (2, 1, 0) -> 8.
    """
    k, rank = len(order), 0
    for i, value in enumerate(order):
        smaller_later = sum(1 for later in order[i + 1 :] if later < value)
        rank += smaller_later * math.factorial(k - 1 - i)
    return num_reordering_classes(k - 1) + rank


# ------------------------------------------------------------------------------ capitalization
def capital_tables(vocab: seqio.SentencePieceVocabulary) -> tuple[np.ndarray, np.ndarray]:
    """Bool [V] tables: pieces whose first letter (after "▁") is uppercase; bare "▁" pieces.

    Example: pieces ["<pad>", "▁The", "▁", "T", "he"] -> upper [F, T, F, T, F],
    bare [F, F, T, F, F].
    """
    tokenizer = vocab.tokenizer
    upper = np.zeros([vocab.vocab_size], bool)
    bare = np.zeros([vocab.vocab_size], bool)
    for i in range(tokenizer.get_piece_size()):
        if tokenizer.is_control(i) or tokenizer.is_unknown(i) or tokenizer.is_byte(i):
            continue
        piece = tokenizer.id_to_piece(i)
        text = piece[1:] if piece.startswith(_WORD_START) else piece
        upper[i] = bool(text) and text[0].isupper()
        bare[i] = piece == _WORD_START
    return upper, bare


def capitalization_labels(
    input_ids: tf.Tensor, word_starts: tf.Tensor, *, upper: tf.Tensor, bare: tf.Tensor
) -> tf.Tensor:
    """Int32 [L]: 1 on the first token of each capitalized word.

    Example (pieces 10 "▁The", 11 "▁cat", 12 "▁", 13 "Paris", 14 "s"; cls 2, sep 3):
    input_ids [2, 10, 11, 12, 13, 14, 3], word_starts [1, 1, 1, 1, 0, 0, 1]
    -> [0, 1, 0, 1, 0, 0, 0].
    """
    ids = tf.cast(input_ids, tf.int32)
    following = tf.concat([ids[1:], [0]], 0)
    starts = tf.cast(word_starts, tf.bool)
    capital = tf.gather(upper, ids) | (tf.gather(bare, ids) & tf.gather(upper, following))
    return tf.cast(starts & capital, tf.int32)


# ------------------------------------------------------------------------------- passages
def _document_tokens(features):
    ids, starts = sentence_pairs._drop_empty(
        sentence_pairs._sentences(features, sentence_pairs.IDS_KEY),
        sentence_pairs._sentences(features, sentence_pairs.WORD_STARTS_KEY),
    )
    # A sentence's first piece starts a word even where the table says otherwise (<unk>).
    first = tf.cast(tf.ragged.range(ids.row_lengths()) == 0, tf.int32)
    return ids, tf.maximum(starts, first)


def token_document_labels(
    ids: tf.RaggedTensor, word_starts: tf.RaggedTensor, passage: tf.Tensor
) -> tf.RaggedTensor:
    """Ragged int32 [S, None]: 1 on the tokens of words that occur in another passage.

    `passage` [S] is each sentence's passage. Example: sentences [[10, 11], [12], [10, 11]]
    (word starts [[1, 0], [1], [1, 0]], one word each), passages [0, 0, 1]
    -> [[1, 1], [0], [1, 1]] (the word "10 11" is in passages 0 and 1).
    """
    flat_ids = ids.flat_values
    word = tf.cumsum(tf.cast(word_starts.flat_values, tf.int32)) - 1
    word_passage = tf.math.segment_max(
        tf.gather(tf.cast(passage, tf.int32), ids.value_rowids()), word
    )
    pieces = tf.RaggedTensor.from_value_rowids(tf.strings.as_string(flat_ids), word)
    keys = tf.strings.reduce_join(pieces, axis=1, separator=" ")
    unique_keys, key_of_word = tf.unique(keys)
    num_passages = tf.reduce_max(word_passage) + 1
    pairs, _ = tf.unique(key_of_word * num_passages + word_passage)
    passages_per_key = tf.math.unsorted_segment_sum(
        tf.ones_like(pairs), pairs // num_passages, tf.size(unique_keys)
    )
    elsewhere = tf.gather(passages_per_key, key_of_word) >= 2
    return ids.with_flat_values(tf.cast(tf.gather(elsewhere, word), tf.int32))


def document_passages(dataset: tf.data.Dataset, *, max_tokens: int) -> tf.data.Dataset:
    """Documents -> one example per passage: `sentence_ids`, `sentence_word_starts` and
    `sentence_token_document` (`token_document_labels`), ragged [S_p, None], <= `max_tokens`.

    Example (max_tokens 4): sentences [[10, 11], [12], [10, 11, 13]] -> passages
    [[10, 11], [12]] (labels [[1, 1], [0]]) and [[10, 11, 13]] (labels [[1, 1, 0]]).
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens}, expected >= 1")

    @tf.autograph.experimental.do_not_convert
    def split(features):
        ids, starts = _document_tokens(features)
        passage = tokenization.passage_ids(ids.row_lengths(), max_tokens=max_tokens)
        labels = token_document_labels(ids, starts, passage)

        def by_passage(sentences):
            return tf.RaggedTensor.from_value_rowids(sentences[:, :max_tokens], passage)

        return tf.data.Dataset.from_tensor_slices(
            {
                "sentence_ids": by_passage(ids),
                "sentence_word_starts": by_passage(starts),
                "sentence_token_document": by_passage(labels),
            }
        )

    return dataset.flat_map(split)


def _wrap(values, left, right):
    return tf.concat([[left], values, [right]], 0)


def single_segment_row(features, *, cls_id: int, sep_id: int) -> mlm.Features:
    """A passage -> `[CLS] tokens [SEP]` with `word_starts` (1 on specials), zero
    `token_type_ids` and `TOKEN_DOCUMENT_KEY` (0 on specials).

    Example (cls 2, sep 3): sentence_ids [[10, 11], [12]], labels [[1, 1], [0]]
    -> input_ids [2, 10, 11, 12, 3], token_document_labels [0, 1, 1, 0, 0].
    """
    ids = tf.cast(features["sentence_ids"].flat_values, tf.int32)
    return {
        "input_ids": _wrap(ids, cls_id, sep_id),
        "token_type_ids": tf.zeros([tf.size(ids) + 2], tf.int32),
        "word_starts": _wrap(tf.cast(features["sentence_word_starts"].flat_values, tf.int32), 1, 1),
        TOKEN_DOCUMENT_KEY: _wrap(
            tf.cast(features["sentence_token_document"].flat_values, tf.int32), 0, 0
        ),
    }


# ------------------------------------------------------------------------------ reordering
def _lexicographic_rank(order: tf.Tensor) -> tf.Tensor:
    k = tf.size(order)
    later = tf.range(k)[None, :] > tf.range(k)[:, None]
    smaller = order[None, :] < order[:, None]
    counts = tf.reduce_sum(tf.cast(later & smaller, tf.int32), axis=1)
    factorials = tf.constant([math.factorial(i) for i in range(MAX_FACTORIAL)], tf.int32)
    return tf.reduce_sum(counts * tf.gather(factorials, k - 1 - tf.range(k)))


def reorder_segments(
    features: mlm.Features,
    *,
    seed: tf.Tensor,
    cls_id: int,
    sep_id: int,
    max_segments: int = MAX_SEGMENTS,
) -> mlm.Features:
    """A passage -> its sentences cut into k segments, shown shuffled, and `REORDER_KEY`.

    Output: input_ids `[CLS] seg_{o_0} [SEP] seg_{o_1} [SEP] ...` (o the shown order: position
    p holds original segment o_p), word_starts (1 on specials), zero token_type_ids, and the
    label `permutation_class(o)`. Example (cls 2, sep 3, m 3): sentence_ids [[10], [11, 12],
    [13]], k = 2 with the cut after the first sentence, o = (1, 0)
    -> input_ids [2, 11, 12, 13, 3, 10, 3], sentence_reordering_label 2.
    """
    if not 1 <= max_segments <= MAX_FACTORIAL:
        raise ValueError(f"max_segments={max_segments}, expected in [1, {MAX_FACTORIAL}]")
    ids = tf.cast(features["sentence_ids"], tf.int32)
    starts = tf.cast(features["sentence_word_starts"], tf.int32)
    num_sentences = ids.nrows(out_type=tf.int32)
    k_seed, cut_seed, order_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 3))
    most = tf.maximum(tf.minimum(max_segments, num_sentences), 1)
    k = tf.random.stateless_uniform([], k_seed, minval=1, maxval=most + 1, dtype=tf.int32)
    # k - 1 distinct boundaries among the S - 1 between sentences, uniformly.
    boundary_draws = tf.random.stateless_uniform([tf.maximum(num_sentences - 1, 0)], cut_seed)
    cuts = tf.sort(tf.argsort(boundary_draws)[: k - 1] + 1)
    splits = tf.cast(ids.row_splits, tf.int32)
    segment_splits = tf.gather(splits, tf.concat([[0], cuts, [num_sentences]], 0))
    order = tf.argsort(tf.random.stateless_uniform([k], order_seed))
    lo, hi = tf.gather(segment_splits, order), tf.gather(segment_splits, order + 1)
    token_index = tf.ragged.range(lo, hi)
    sep = tf.RaggedTensor.from_tensor(tf.fill([k, 1], -1))  # each segment's [SEP]
    shown = tf.concat([token_index, sep], axis=1).flat_values
    is_sep = shown < 0
    safe = tf.maximum(shown, 0)
    body_ids = tf.where(is_sep, sep_id, tf.gather(ids.flat_values, safe))
    body_starts = tf.where(is_sep, 1, tf.gather(starts.flat_values, safe))
    label = num_reordering_classes_tf(k - 1) + _lexicographic_rank(order)
    out = {key: v for key, v in features.items() if not key.startswith("sentence_")}
    out["input_ids"] = tf.concat([[cls_id], body_ids], 0)
    out["word_starts"] = tf.concat([[1], body_starts], 0)
    out["token_type_ids"] = tf.zeros_like(out["input_ids"])
    out[REORDER_KEY] = label
    return out


def num_reordering_classes_tf(k: tf.Tensor) -> tf.Tensor:
    """`num_reordering_classes(k)` for a scalar tensor k in [0, MAX_FACTORIAL]."""
    table = [num_reordering_classes(i) for i in range(MAX_FACTORIAL + 1)]
    return tf.gather(tf.constant(table, tf.int32), k)


# -------------------------------------------------------------------------------- distance
def _distance_pairs(features, *, seed, probs, max_seq_length, cls_id, sep_id):
    """All sentence-distance pairs of one document, ragged [N, None], and their labels."""
    own, own_starts = _document_tokens(features)
    other, other_starts = _document_tokens(
        {
            sentence_pairs.IDS_KEY: features["other_" + sentence_pairs.IDS_KEY],
            sentence_pairs.WORD_STARTS_KEY: features["other_" + sentence_pairs.WORD_STARTS_KEY],
        }
    )
    num = own.nrows(out_type=tf.int32)
    num_other = tf.where(features["_other_is_self"], 0, other.nrows(out_type=tf.int32))
    first = tf.range(tf.maximum(num - 1, 0))  # A = sentence i needs a next sentence
    before = tf.maximum(first - 1, 0)  # non-adjacent sentences before i: 0 .. i-2
    after = tf.maximum(num - first - 2, 0)  # and after: i+2 .. S-1
    valid = (before + after > 0) & (num_other > 0)
    first, before, after = (tf.boolean_mask(x, valid) for x in (first, before, after))
    n = tf.size(first)
    draws = tf.random.stateless_uniform([3, n], seed)
    cumulative = tf.constant(np.cumsum(probs)[:-1], tf.float32)
    label = tf.reduce_sum(tf.cast(draws[0][:, None] >= cumulative[None, :], tf.int32), axis=1)
    count = before + after
    r = tf.minimum(tf.cast(draws[1] * tf.cast(count, tf.float32), tf.int32), count - 1)
    far = tf.where(r < before, r, r - before + first + 2)
    other_index = tf.minimum(
        tf.cast(draws[2] * tf.cast(num_other, tf.float32), tf.int32), num_other - 1
    )
    # B indexes the concatenation own ++ other sentences.
    second = tf.where(label == 0, first + 1, tf.where(label == 1, far, num + other_index))
    sentences = tf.concat([own, other], 0)
    sentence_starts = tf.concat([own_starts, other_starts], 0)
    a, b = tf.gather(sentences, first), tf.gather(sentences, second)
    a_starts, b_starts = tf.gather(sentence_starts, first), tf.gather(sentence_starts, second)
    fin_a, fin_b = sentence_pairs._truncated_lengths(
        tf.cast(a.row_lengths(), tf.int32), tf.cast(b.row_lengths(), tf.int32), max_seq_length - 3
    )

    def cut(x, lengths):
        return tf.ragged.boolean_mask(
            x, tf.ragged.range(tf.cast(x.row_lengths(), tf.int32)) < lengths[:, None]
        )

    column = tf.ones([n, 1], tf.int32)

    def join(left, x, middle, y, right):
        return tf.concat([left, x, middle, y, right], axis=1)

    a, b, a_starts, b_starts = (
        cut(a, fin_a),
        cut(b, fin_b),
        cut(a_starts, fin_a),
        cut(b_starts, fin_b),
    )
    return {
        "input_ids": join(column * cls_id, a, column * sep_id, b, column * sep_id),
        "token_type_ids": join(0 * column, 0 * a, 0 * column, tf.ones_like(b), column),
        "word_starts": join(column, a_starts, column, b_starts, column),
        DISTANCE_KEY: label,
    }


def sentence_distance_pairs(
    dataset: tf.data.Dataset,
    *,
    seed: int,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
    probs: tuple[float, float, float] = DISTANCE_PROBS,
    buffer_size: int = 1000,
) -> tf.data.Dataset:
    """Documents -> sentence-distance pairs (see the module doc).

    One pass over a finite `dataset` gives the same pairs for the same `seed`; each document's
    draws are seeded by its running index, so a repeated stream (training: SeqIO repeats
    before every lmsuite preprocessor) draws new pairs on each pass.

    Example (cls 2, sep 3): a document [[10], [11], [12], [13]]: A = [10] (i = 0) may pair
    with [11] (label 0), [12] or [13] (label 1) or another document's sentence (label 2);
    label 1 -> input_ids [2, 10, 3, 13, 3], token_type_ids [0, 0, 0, 1, 1]. A = [13] has no
    next sentence and makes no pair.
    """
    if len(probs) != 3 or min(probs) < 0 or not math.isclose(sum(probs), 1.0):
        raise ValueError(f"probs={probs}, expected 3 non-negative numbers summing to 1")
    if max_seq_length < 5:
        raise ValueError(f"max_seq_length={max_seq_length}, expected >= 5")
    with_other = sentence_pairs._with_other_documents(
        dataset.map(
            lambda ex: {k: ex[k] for k in (sentence_pairs.IDS_KEY, sentence_pairs.WORD_STARTS_KEY)}
        ),
        seed=seed,
        buffer_size=buffer_size,
    )
    base_seed = tf.constant([seed, 1], tf.int64)

    @tf.autograph.experimental.do_not_convert
    def build(features):
        doc_seed = tf.random.experimental.stateless_fold_in(base_seed, features["_doc_index"])
        return tf.data.Dataset.from_tensor_slices(
            _distance_pairs(
                features,
                seed=doc_seed,
                probs=probs,
                max_seq_length=max_seq_length,
                cls_id=cls_id,
                sep_id=sep_id,
            )
        )

    return with_other.flat_map(build)


# --------------------------------------------------------------------------------- masking
def mask_words(features: mlm.Features, *, seed: tf.Tensor, spec: mlm.MlmSpec) -> mlm.Features:
    """ERNIE's per-unit selection (`ernie.choose_drawn_units`, each unit 0.15, taken
    whole) with whole words as the units, then 80/10/10 per token. One row; the tasks draw
    row by row and mask groups (`ernie.unit_mask_draws`, `mask_drawn_words`), the same masks.

    Example: input_ids [2, 10, 11, 12, 3], word_starts [1, 1, 0, 1, 1] (words "10 11", "12"),
    "10 11" selected -> masked_positions [1, 2, 0...], masked_ids [10, 11, 0...].
    """
    return ernie.mask_units(features, seed=seed, spec=spec, units_key="word_starts")


def mask_drawn_words(rows: mlm.Features, *, lengths: tf.Tensor, spec: mlm.MlmSpec) -> mlm.Features:
    """`mask_words` on a group of rows carrying their `ernie.unit_mask_draws`."""
    return ernie.mask_drawn_units(rows, lengths=lengths, spec=spec, units_key="word_starts")


def reorder_and_draw(features, *, seed, spec, cls_id, sep_id, max_segments=MAX_SEGMENTS):
    """`reorder_segments` then `ernie.unit_mask_draws`, fresh draws each time a passage is
    seen: `reorder_and_mask` up to the masking, which `mask_drawn_words` does for a group."""
    reorder_seed, mask_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shown = reorder_segments(
        features, seed=reorder_seed, cls_id=cls_id, sep_id=sep_id, max_segments=max_segments
    )
    return ernie.unit_mask_draws(shown, seed=mask_seed, spec=spec)


def reorder_and_mask(features, *, seed, spec, cls_id, sep_id, max_segments=MAX_SEGMENTS):
    """`reorder_segments` then `mask_words`, with fresh draws each time a passage is seen."""
    reorder_seed, mask_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shown = reorder_segments(
        features, seed=reorder_seed, cls_id=cls_id, sep_id=sep_id, max_segments=max_segments
    )
    return mask_words(shown, seed=mask_seed, spec=spec)
