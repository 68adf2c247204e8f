"""Encoder rows cut as BERT, ELECTRA and SpanBERT cut them (lmsuite.data.preprocessors.instances).

Token ids spell where they come from (document, sentence, position), so every row can be read
back into the sentences it was built from.
"""

import numpy as np
import pytest
import tensorflow as tf

from lmsuite.data.preprocessors import instances
from lmsuite.data.preprocessors import sentence_pairs as sp
from tests.data.ragged import ragged

CLS, SEP = 2, 3
BASE = 100_000


def token(doc, sent, j):
    return BASE + doc * 4096 + sent * 64 + j


def where(t):
    t = int(t) - BASE
    return t // 4096, (t % 4096) // 64, t % 64


def corpus(num_docs, *, seed, min_sents=1, max_sents=12, min_len=1, max_len=12):
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(num_docs):
        lengths = rng.integers(
            min_len, max_len + 1, size=int(rng.integers(min_sents, max_sents + 1))
        )
        docs.append([[token(d, s, j) for j in range(int(n))] for s, n in enumerate(lengths)])
    return docs


def dataset(docs, *, with_word_starts=True):
    features = {sp.IDS_KEY: ragged(docs, np.int32, ragged_rank=2)}
    if with_word_starts:
        features[sp.WORD_STARTS_KEY] = ragged(
            [[[t % 2 for t in s] for s in d] for d in docs], np.int32, ragged_rank=2
        )
    return tf.data.Dataset.from_tensor_slices(features)


def rows(docs, variant, *, max_seq_length, seed=0, short_seq_prob=0.1):
    ds = instances.encoder_instances(
        dataset(docs),
        variant=variant,
        max_seq_length=max_seq_length,
        cls_id=CLS,
        sep_id=SEP,
        seed=seed,
        short_seq_prob=short_seq_prob,
    )
    return list(ds.as_numpy_iterator())


def segments(row, max_seq_length):
    """(A, B) of a `[CLS] A [SEP] (B [SEP])` row; checks specials, types and word starts."""
    ids, types = row["input_ids"], row["token_type_ids"]
    assert len(ids) <= max_seq_length and ids[0] == CLS and ids[-1] == SEP
    seps = np.where(ids == SEP)[0]
    assert len(seps) in (1, 2) and CLS not in ids[1:]
    a = ids[1 : seps[0]]
    b = ids[seps[0] + 1 : -1] if len(seps) == 2 else ids[:0]
    np.testing.assert_array_equal(types, [0] * (len(a) + 2) + [1] * (len(b) + len(b[:1])))
    starts = np.concatenate([[1], a % 2, [1], b % 2, [1] * len(b[:1])])
    np.testing.assert_array_equal(row["word_starts"], starts)
    return a, b


# ------------------------------------------------------------------------------------ BERT
def test_bert_rows_are_sentence_aligned_continuations():
    max_len = 32
    docs = corpus(300, seed=1, max_sents=14)
    two = 0
    for row in rows(docs, "bert", max_seq_length=max_len):
        a, b = segments(row, max_len)
        assert len(a) >= 1 and len(a) + len(b) <= max_len - 3
        pa, pb = [where(t) for t in a], [where(t) for t in b]
        assert len({p[0] for p in pa + pb}) == 1  # one document, B its actual continuation
        order = [p[1] * 64 + p[2] for p in pa + pb]
        assert order == sorted(order) and len(set(order)) == len(order)
        if len(b):
            two += 1
            # The A/B boundary is a sentence boundary: untruncated, A is whole sentences and B
            # opens the next one; truncate_seq_pair may then trim either end of either segment.
            truncated = len(a) + len(b) == max_len - 3
            if truncated:
                assert pb[0][1] >= pa[-1][1] + 1
            else:
                assert pb[0][1] == pa[-1][1] + 1 and pb[0][2] == 0 and pa[0][2] == 0
                assert a[-1] == docs[pa[-1][0]][pa[-1][1]][-1]
        else:
            # One-sentence chunk: no B (BERT would draw a random one for NSP).
            assert len({p[1] for p in pa}) == 1
    assert two > 100


def test_bert_short_targets_one_document_in_ten():
    # Reference: create_instances_from_document draws, per document, target = max_num_tokens,
    # or with probability short_seq_prob = 0.1 randint(2, max_num_tokens) (which may again be
    # max_num_tokens, probability 1/(max_num_tokens - 1)). One-token sentences reach the target
    # exactly, so a document's first row holds target + 3 tokens: P(first row < max_seq_length)
    # = 0.1 * (1 - 1 / (max_num_tokens - 1)).
    max_len, num_docs = 24, 5000
    max_tokens = max_len - 3
    docs = [[[token(d, s, 0)] for s in range(45)] for d in range(num_docs)]
    per_doc = sp.instances_per_document(
        dataset(docs), objective="mlm", seed=3, max_seq_length=max_len, cls_id=CLS, sep_id=SEP
    )
    short = a_lengths = 0
    a_sum = a_count = 0.0
    for doc in per_doc.as_numpy_iterator():
        first = doc["input_ids"][0]
        short += len(first) < max_len
        if len(first) == max_len:  # k = max_tokens sentences: A has uniform 1..k-1 sentences
            a = int(np.where(first == SEP)[0][0]) - 1
            a_sum, a_count = a_sum + a, a_count + 1
            a_lengths += 1
    p = 0.1 * (1 - 1 / (max_tokens - 1))
    sigma = np.sqrt(p * (1 - p) / num_docs)
    assert abs(short / num_docs - p) < 5 * sigma, (short / num_docs, p, sigma)
    k = max_tokens
    mean, var = k / 2, ((k - 1) ** 2 - 1) / 12  # uniform on 1..k-1
    assert abs(a_sum / a_count - mean) < 5 * np.sqrt(var / a_count)


# --------------------------------------------------------------------------------- ELECTRA
def electra_reference(docs, *, max_length, rng):
    """ELECTRA's ExampleBuilder (build_pretraining_dataset.py) re-implemented in numpy from its
    logic, one document at a time (the first target of each document drawn afresh)."""

    def next_target():
        return int(rng.integers(5, max_length + 1)) if rng.random() < 0.05 else max_length

    def example(current, target):
        first_target = 100_000 if rng.random() < 0.1 else (target - 3) // 2
        first, second = [], []
        for sentence in current:
            if (
                not first
                or len(first) + len(sentence) < first_target
                or (not second and len(first) < first_target and rng.random() < 0.5)
            ):
                first += sentence
            else:
                second += sentence
        first = first[: max_length - 2]
        return first, second[: max(0, max_length - len(first) - 3)]

    out = []
    for doc in docs:
        target, current, used = next_target(), [], 0
        for sentence in doc:
            current.append(sentence)
            used += len(sentence)
            if used >= target:
                out.append(example(current, target))
                current, used, target = [], 0, next_target()
        if used:
            out.append(example(current, target))
    return out


def test_electra_rows_match_the_example_builder_statistics():
    # Same documents through lmsuite and through the numpy reference (independent draws):
    # one-segment rate, segment lengths and row count agree within 5 standard errors.
    max_len = 64
    docs = corpus(1500, seed=4, min_sents=2, max_sents=30, max_len=20)
    ours = []
    for row in rows(docs, "electra", max_seq_length=max_len):
        a, b = segments(row, max_len)
        ours.append((a, b))
    ref = electra_reference(docs, max_length=max_len, rng=np.random.default_rng(0))

    def stats(pairs):
        return {
            "one_segment": np.array([len(b) == 0 for _, b in pairs], float),
            "first": np.array([len(a) for a, _ in pairs], float),
            "second": np.array([len(b) for _, b in pairs], float),
            "full": np.array([len(a) + len(b) + 2 + (len(b) > 0) == max_len for a, b in pairs]),
        }

    mine, theirs = stats(ours), stats(ref)
    for key in mine:
        x, y = mine[key].astype(float), theirs[key].astype(float)
        se = np.sqrt(x.var() / len(x) + y.var() / len(y))
        assert abs(x.mean() - y.mean()) < 5 * se, (key, x.mean(), y.mean(), se)
    assert abs(len(ours) - len(ref)) < 5 * np.sqrt(len(ref)) and len(ours) > 4000
    assert 0.1 < mine["one_segment"].mean() < 0.5


def test_electra_segments_follow_the_builder_rule():
    # Each segment is whole sentences of one document in order (before its cut), the first
    # sentence of a row always opens the first segment.
    max_len = 40
    docs = corpus(200, seed=5, min_sents=2, max_sents=20, max_len=15)
    for a, b in (segments(r, max_len) for r in rows(docs, "electra", max_seq_length=max_len)):
        pa = [where(t) for t in a]
        assert pa[0][2] == 0 and len({p[0] for p in pa}) == 1
        assert len(a) <= max_len - 2 and len(a) + len(b) <= max_len - 3 + (len(b) == 0)
        if len(b):
            pb = [where(t) for t in b]
            assert pb[0][2] == 0 and {p[0] for p in pb} == {pa[0][0]}
            assert pb[0][1] > pa[0][1]


# ------------------------------------------------------------------------ SpanBERT / RoBERTa
def block_dataset_doc_mode(docs, *, block_size):
    """SpanBERT's BlockDataset(break_mode="doc") chunking, re-implemented from its logic."""
    limit, out = block_size - 2, []
    for doc in docs:
        chunk, used = [], 0
        for sentence in doc:
            if len(sentence) > limit:  # skipped; the next kept sentence cannot join the chunk
                if chunk:
                    out.append(chunk)
                chunk, used = [], 0
                continue
            if chunk and used + len(sentence) > limit:
                out.append(chunk)
                chunk, used = [], 0
            chunk, used = chunk + sentence, used + len(sentence)
        if chunk:
            out.append(chunk)
    return out


def test_full_sentence_rows_equal_spanbert_block_dataset():
    max_len = 24
    # Documents that do not end on an over-long sentence (where BlockDataset loses the chunk).
    docs = [d for d in corpus(400, seed=6, max_sents=16, max_len=26) if len(d[-1]) <= max_len - 2]
    got = rows(docs, "full_sentences", max_seq_length=max_len)
    want = block_dataset_doc_mode(docs, block_size=max_len)
    assert len(got) == len(want) > 300
    for row, chunk in zip(got, want, strict=True):
        a, b = segments(row, max_len)
        assert len(b) == 0
        np.testing.assert_array_equal(a, chunk)


def test_full_sentence_rows_drop_over_long_sentences_anywhere():
    # The module's example, then over-long sentences first, twice in a row and last, and a
    # document with nothing that fits (no rows). max_seq_length 8: at most 6 tokens a row.
    docs = [
        [[10, 11], [12, 13, 14], [15, 16], [17] * 7, [18]],
        [[20] * 7, [21], [22] * 9, [23] * 7, [24, 25], [26] * 8],
        [[30] * 7],
        [[40], [41] * 6, [42] * 3, [43] * 3, [44]],
    ]
    got = rows(docs, "full_sentences", max_seq_length=8)
    want = [
        [10, 11, 12, 13, 14],
        [15, 16],
        [18],
        [21],
        [24, 25],
        [40],
        [41] * 6,
        [42] * 3 + [43] * 3,
        [44],
    ]
    assert [r["input_ids"].tolist() for r in got] == [[CLS, *w, SEP] for w in want]
    for r in got:
        assert r["token_type_ids"].tolist() == [0] * len(r["input_ids"])
        assert r["word_starts"].tolist() == [1, *(r["input_ids"][1:-1] % 2), 1]


def test_stride_variant_is_fixed_stride_chunking():
    ds = tf.data.Dataset.from_tensors(
        {"targets": tf.range(10, 17), "word_starts": tf.ones([7], tf.int32)}
    )
    out = list(
        instances.encoder_instances(
            ds, variant="stride", max_seq_length=5, cls_id=CLS, sep_id=SEP
        ).as_numpy_iterator()
    )
    assert [r["input_ids"].tolist() for r in out] == [
        [2, 10, 11, 12, 3],
        [2, 13, 14, 15, 3],
        [2, 16, 3],
    ]


def test_unknown_variant_fails_naming_it():
    with pytest.raises(ValueError, match="variant='roberta'"):
        instances.encoder_instances(
            dataset([[[BASE]]]), variant="roberta", max_seq_length=16, cls_id=CLS, sep_id=SEP
        )
