"""Oracle tests for NSP / SOP pair construction (lmsuite.data.preprocessors.sentence_pairs)."""

import numpy as np
import pytest
import tensorflow as tf

from lmsuite.data.preprocessors import sentence_pairs as sp
from tests.data.ragged import ragged

CLS, SEP = 2, 3
BASE = 100_000


def token(doc, sent, j):
    """Token ids that spell where they come from: doc, sentence, position in sentence."""
    return BASE + doc * 1000 + sent * 20 + j


def where(t):
    return (t - BASE) // 1000, ((t - BASE) % 1000) // 20, (t - BASE) % 20


def corpus(num_docs, *, seed, min_sents=2, max_sents=12, max_len=8):
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(num_docs):
        num = int(rng.integers(min_sents, max_sents + 1))
        docs.append(
            [[token(d, s, j) for j in range(int(rng.integers(1, max_len + 1)))] for s in range(num)]
        )
    return docs


def dataset(docs, *, with_word_starts=False):
    features = {sp.IDS_KEY: ragged(docs, np.int32, ragged_rank=2)}
    if with_word_starts:
        features[sp.WORD_STARTS_KEY] = ragged(
            [[[1 - t % 2 for t in r] for r in d] for d in docs], np.int32, ragged_rank=2
        )
    return tf.data.Dataset.from_tensor_slices(features)


def pairs(docs, objective, *, seed=0, max_seq_length=64, short_seq_prob=0.0, **kw):
    ds = sp.sentence_pairs(
        dataset(docs, **kw),
        objective=objective,
        seed=seed,
        max_seq_length=max_seq_length,
        cls_id=CLS,
        sep_id=SEP,
        short_seq_prob=short_seq_prob,
        buffer_size=64,
    )
    return list(ds.as_numpy_iterator())


def split(example, max_seq_length):
    ids, types = example["input_ids"], example["token_type_ids"]
    assert len(ids) <= max_seq_length
    assert ids[0] == CLS and ids[-1] == SEP
    first_sep = int(np.where(ids == SEP)[0][0])
    a, b = ids[1:first_sep], ids[first_sep + 1 : -1]
    assert len(a) >= 1 and len(b) >= 1 and SEP not in b
    np.testing.assert_array_equal(types, [0] * (first_sep + 1) + [1] * (len(b) + 1))
    return a, b


def contiguous_in_doc(segment):
    places = [where(t) for t in segment]
    docs = {p[0] for p in places}
    order = [p[1] * 20 + p[2] for p in places]
    return len(docs) == 1 and order == sorted(order), docs.pop(), order


def simulate_truncation(a, b, limit, rng):
    a, b = list(range(a)), list(range(b))
    while len(a) + len(b) > limit:
        longer = a if len(a) > len(b) else b
        del longer[0 if rng.random() < 0.5 else -1]
    return len(a), len(b)


def test_truncated_lengths_match_bert_truncate_seq_pair():
    rng = np.random.default_rng(0)
    for a in range(1, 30, 3):
        for b in range(1, 30, 4):
            for limit in (2, 7, 20, 61):
                want = simulate_truncation(a, b, limit, rng)
                got = sp._truncated_lengths(tf.constant(a), tf.constant(b), tf.constant(limit))
                assert (int(got[0]), int(got[1])) == want, (a, b, limit)


def test_fold_in_base_is_tf_fold_in():
    # The walk seeds each step as [base, step]: TF's own fold-in, drawn once per document.
    for seed in ([0, 0], [7, -3], [2**40, 5]):
        seed = tf.constant(seed, tf.int64)
        base = int(sp._fold_in_base(seed))
        for d in (0, 1, 17, 1 << 20):
            want = tf.random.experimental.stateless_fold_in(seed, tf.constant(d, tf.int32))
            assert want.numpy().tolist() == [base, d]


def test_run_ends_take_sentences_until_the_length_is_reached():
    rng = np.random.default_rng(11)
    for _ in range(40):
        lengths = rng.integers(1, 9, size=int(rng.integers(1, 12)))
        splits = np.concatenate([[0], np.cumsum(lengths)])
        starts = rng.integers(0, len(lengths), size=8)
        needs = rng.integers(-3, 45, size=8)
        got = sp._run_ends(*(tf.constant(x, tf.int32) for x in (splits, starts, needs)))
        for start, need, end in zip(starts, needs, got.numpy(), strict=True):
            # BERT's loop: add the next sentence until the run reaches the length or the
            # document ends.
            want, total = int(start), int(lengths[start])
            while total < need and want < len(lengths) - 1:
                want += 1
                total += int(lengths[want])
            assert end == want, (lengths.tolist(), start, need)


def test_front_removals_draw_per_step_and_only_where_tokens_go():
    removed = np.array(
        [[0, 0], [3, 0], [0, 5], [4, 7], [0, 0], [9, 9], [1, 0], [0, 1], [1, 1], [1, 0]], np.int32
    )
    steps = np.arange(10, 20, dtype=np.int32)
    got = sp._front_removals(
        tf.constant(removed), steps=tf.constant(steps), fold_base=tf.constant(99)
    ).numpy()
    assert got[[0, 4]].tolist() == [[0, 0], [0, 0]]
    for row in (1, 2, 3, 5, 6, 7, 8, 9):
        want = tf.random.stateless_binomial(
            [2], tf.constant([99, steps[row]]), counts=removed[row].astype(np.float32), probs=0.5
        )
        assert got[row].tolist() == want.numpy().tolist()
    assert (got >= 0).all() and (got <= removed).all()


def test_framed_rows_take_their_segments_and_specials():
    c = lambda x: tf.constant(x, tf.int32)  # noqa: E731
    out = sp._framed(
        c([10, 11, 12, 13, 14]),
        c([1, 0, 1, 1, 0]),
        first=c([0, 4, 1]),
        first_length=c([2, 1, 3]),
        second=c([3, 0, 0]),
        second_length=c([1, 0, 2]),
        cls_id=CLS,
        sep_id=SEP,
    )
    assert {k: v.to_list() for k, v in out.items()} == {
        "input_ids": [[2, 10, 11, 3, 13, 3], [2, 14, 3], [2, 11, 12, 13, 3, 10, 11, 3]],
        "token_type_ids": [[0, 0, 0, 0, 1, 1], [0, 0, 0], [0] * 5 + [1] * 3],
        "word_starts": [[1, 1, 0, 1, 1, 1], [1, 0, 1], [1, 0, 1, 1, 1, 1, 0, 1]],
    }


def check_balance(labels, probabilities):
    labels = np.asarray(labels)
    n = len(labels)
    for value, p in probabilities.items():
        observed = np.mean(labels == value)
        assert abs(observed - p) < 5 * np.sqrt(p * (1 - p) / n), (value, observed, p, n)


def test_nsp_actual_next_is_consecutive_and_random_next_is_another_document():
    docs = corpus(40, seed=1, min_sents=8, max_sents=20, max_len=4)
    labels = []
    for ex in pairs(docs, "nsp", max_seq_length=24):
        a, b = split(ex, 24)
        ok_a, doc_a, order_a = contiguous_in_doc(a)
        ok_b, doc_b, order_b = contiguous_in_doc(b)
        assert ok_a and ok_b
        label = int(ex["next_sentence_label"])
        if label == 0:
            assert doc_a == doc_b and order_b[0] > order_a[-1]
            assert where(b[0])[1] == where(a[-1])[1] + 1 or len(a) + len(b) == 21
        else:
            assert doc_a != doc_b
        labels.append(label)
    assert set(labels) == {0, 1}


def primary_labels(out, label_key):
    """Per document, the label of the instance built from its first chunk (two-sentence docs)."""
    primary = {}
    for ex in out:
        a, b = split(ex, 64)
        (da, sa, _), (db, sb, _) = where(a[0]), where(b[0])
        label = int(ex[label_key])
        if sa == 0 and not (label == 1 and label_key == "sentence_relation_label"):
            key = da
        elif da == db and sb == 0:  # StructBERT "previous": the chunk's sentences swapped
            key = db
        else:
            continue
        assert key not in primary
        primary[key] = label
    return primary


def test_nsp_decision_is_fair_and_unused_sentences_go_back():
    # Two short sentences per document: one chunk of k = 2. Actual next -> one pair (label 0);
    # random next -> sentence 1 goes back and becomes a one-sentence chunk, forced random:
    # two pairs, both label 1 (BERT's behaviour).
    docs = corpus(400, seed=7, min_sents=2, max_sents=2, max_len=4)
    out = pairs(docs, "nsp")
    primary = primary_labels(out, "next_sentence_label")
    assert len(primary) == len(docs)
    check_balance(list(primary.values()), {0: 0.5, 1: 0.5})
    num_random = sum(primary.values())
    assert len(out) == len(docs) + num_random
    assert sum(int(e["next_sentence_label"]) for e in out) == 2 * num_random


def test_sop_labels_balanced_segments_consecutive_never_other_document():
    docs = corpus(150, seed=2, min_sents=8, max_sents=20, max_len=4)
    labels = []
    for ex in pairs(docs, "sop", max_seq_length=16):
        a, b = split(ex, 16)
        ok_a, doc_a, order_a = contiguous_in_doc(a)
        ok_b, doc_b, order_b = contiguous_in_doc(b)
        assert ok_a and ok_b and doc_a == doc_b
        label = int(ex["sentence_order_label"])
        first, second = (a, b) if label == 0 else (b, a)
        sent_first, sent_second = where(first[-1])[1], where(second[0])[1]
        # consecutive: the second segment starts at the sentence after the first one ends,
        # unless truncation trimmed the inner ends
        assert sent_second == sent_first + 1 or len(a) + len(b) == 13
        assert max(p[1] * 20 + p[2] for p in map(where, first)) < min(
            p[1] * 20 + p[2] for p in map(where, second)
        )
        labels.append(label)
    assert len(labels) > 300
    check_balance(labels, {0: 0.5, 1: 0.5})


def test_sop_skips_and_counts_single_segment_documents():
    long_docs = corpus(10, seed=3, min_sents=2, max_sents=4, max_len=3)  # fit one chunk each
    short_docs = [[[token(50 + i, 0, j) for j in range(3)]] for i in range(4)]
    empty_docs = [[], [[]]]
    docs = long_docs[:5] + short_docs + long_docs[5:] + empty_docs
    kwargs = dict(objective="sop", seed=0, max_seq_length=64, cls_id=CLS, sep_id=SEP)
    per_doc = list(sp.instances_per_document(dataset(docs), short_seq_prob=0.0, **kwargs))
    skipped = [int(d["num_skipped"]) for d in per_doc]
    made = [int(d["sentence_order_label"].shape[0]) for d in per_doc]
    assert skipped == [0] * 5 + [1] * 4 + [0] * 5 + [1, 1]
    assert made == [1] * 5 + [0] * 4 + [1] * 5 + [0, 0]
    assert sp.count_skipped_pairs(dataset(docs), short_seq_prob=0.0, **kwargs) == 6
    assert len(pairs(docs, "sop")) == len(long_docs)


def test_nsp_single_document_corpus_has_no_random_pairs():
    docs = corpus(1, seed=4, min_sents=6, max_sents=6, max_len=3)
    outcomes = set()
    for seed in range(5):
        kwargs = dict(objective="nsp", seed=seed, max_seq_length=64, cls_id=CLS, sep_id=SEP)
        per_doc = sp.instances_per_document(
            dataset(docs), short_seq_prob=0.0, buffer_size=4, **kwargs
        )
        (doc,) = list(per_doc)
        labels = doc["next_sentence_label"].numpy().tolist()
        assert set(labels) <= {0}
        # one chunk: an actual-next pair, or a random draw with no other document, counted
        assert len(labels) + int(doc["num_skipped"]) == 1
        outcomes.add(int(doc["num_skipped"]))
    assert outcomes == {0, 1}


def test_short_seq_prob_shortens_instances_and_word_starts_follow_tokens():
    docs = corpus(30, seed=5, min_sents=20, max_sents=30, max_len=6)
    long = pairs(docs, "nsp", max_seq_length=48, short_seq_prob=0.0, with_word_starts=True)
    short = pairs(docs, "nsp", max_seq_length=48, short_seq_prob=1.0, with_word_starts=True)
    assert np.mean([len(e["input_ids"]) for e in short]) < 0.8 * np.mean(
        [len(e["input_ids"]) for e in long]
    )
    for ex in long:
        ids, starts = ex["input_ids"], ex["word_starts"]
        special = (ids == CLS) | (ids == SEP)
        np.testing.assert_array_equal(starts[special], 1)
        np.testing.assert_array_equal(starts[~special], 1 - ids[~special] % 2)


def test_deterministic_per_seed():
    docs = corpus(10, seed=6)
    a = pairs(docs, "nsp", seed=1, short_seq_prob=0.1)
    b = pairs(docs, "nsp", seed=1, short_seq_prob=0.1)
    c = pairs(docs, "nsp", seed=2, short_seq_prob=0.1)
    assert [e["input_ids"].tolist() for e in a] == [e["input_ids"].tolist() for e in b]
    assert [e["input_ids"].tolist() for e in a] != [e["input_ids"].tolist() for e in c]


@pytest.mark.parametrize(
    "kw, message",
    [(dict(objective="rtd"), "objective"), (dict(max_seq_length=4), "max_seq_length")],
)
def test_bad_arguments_fail_loudly(kw, message):
    args = {**dict(objective="nsp", seed=0, max_seq_length=32, cls_id=CLS, sep_id=SEP), **kw}
    with pytest.raises(ValueError, match=message):
        sp.sentence_pairs(dataset(corpus(2, seed=0)), **args)
