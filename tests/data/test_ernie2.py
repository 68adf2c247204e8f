"""Oracle and statistics tests for ERNIE 2.0's word- and structure-aware tasks."""

import collections
import functools
import itertools
import unicodedata

import numpy as np
import pytest
import seqio
import tensorflow as tf
from scipy import stats

from lmsuite.data import corpora, feature_converters, tokenization
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import ernie, ernie2, mlm
from tests.data.ragged import ragged

CLS, SEP, MASK = 2, 3, 4
SPEC = mlm.MlmSpec(mask_id=MASK, vocab_size=1000, special_ids=(0, 1, 2, 3, 4), max_predictions=20)


def _documents(docs):
    """Hand-built documents: each a list of sentences of token ids, every token a word start
    unless a sentence is given as (ids, starts)."""
    ids, starts = [], []
    for doc in docs:
        pairs = [s if isinstance(s, tuple) else (s, [1] * len(s)) for s in doc]
        ids.append([p[0] for p in pairs])
        starts.append([p[1] for p in pairs])
    return tf.data.Dataset.from_tensor_slices(
        {
            "sentence_ids": ragged(ids, np.int32, ragged_rank=2),
            "sentence_word_starts": ragged(starts, np.int32, ragged_rank=2),
        }
    )


@pytest.fixture(scope="module")
def wiki_vocab():
    return vocab_lib.get_vocabulary("wiki_sample")


@pytest.fixture(scope="module")
def wiki_documents():
    return corpora.get_corpus("wiki_sample").documents("validation")


# ---------------------------------------------------------------------------- capitalization
def test_capitalization_worked_example():
    upper = tf.constant([False] * 10 + [True, False, False, True, False])
    bare = tf.constant([False] * 12 + [True, False, False])
    labels = ernie2.capitalization_labels(
        tf.constant([2, 10, 11, 12, 13, 14, 3]),
        tf.constant([1, 1, 1, 1, 0, 0, 1]),
        upper=upper,
        bare=bare,
    )
    assert labels.numpy().tolist() == [0, 1, 0, 1, 0, 0, 0]


def test_capitalization_share_is_the_raw_words_share(wiki_vocab, wiki_documents):
    """Over wiki_sample's validation sentences, labels / word starts equals the share of
    whitespace words (NFKC, as the vocabulary normalizes) whose first character is uppercase."""
    upper, bare = (tf.constant(t) for t in ernie2.capital_tables(wiki_vocab))
    sentences = [s for d in wiki_documents for s in d.sentences]
    dataset = tokenization.tokenize_sentences(
        tf.data.Dataset.from_tensors({"sentences": tf.constant(sentences)}), vocab=wiki_vocab
    )
    tokens = next(iter(dataset))
    # One call over all sentences, a padding id between them (a bare "▁" never sees the next).
    separated = tf.concat([tokens["sentence_ids"], tf.zeros_like(tokens["sentence_ids"][:, :1])], 1)
    starts = tf.concat([tokens["sentence_word_starts"], tf.zeros_like(separated[:, :1])], 1)
    labels = ernie2.capitalization_labels(
        separated.flat_values, starts.flat_values, upper=upper, bare=bare
    )
    capital = int(tf.reduce_sum(labels))
    words = [w for s in sentences for w in unicodedata.normalize("NFKC", s).split()]
    processor = wiki_vocab.tokenizer
    # A word opening with a character the vocabulary lacks starts with <unk>: its case is lost.
    lost = [w for w in words if processor.unk_id() in processor.encode(w[0])]
    raw_capital = sum(w[0].isupper() for w in words) - sum(w[0].isupper() for w in lost)
    assert capital == raw_capital
    assert len(lost) < 0.005 * len(words) and 0.05 < capital / len(words) < 0.5


# ---------------------------------------------------------------------------- token-document
def test_token_document_on_a_hand_built_document():
    doc = [
        ([10, 11], [1, 0]),  # the word "10 11"
        [12, 12],  # "12" twice, only in this passage
        ([10, 11, 13], [1, 0, 1]),  # "10 11" again (another passage), "13"
        [10, 14],  # "10" alone is another word than "10 11"; "14" is only here
    ]
    passages = list(ernie2.document_passages(_documents([doc]), max_tokens=4))
    got = [(p["sentence_ids"].to_list(), p["sentence_token_document"].to_list()) for p in passages]
    assert got == [
        ([[10, 11], [12, 12]], [[1, 1], [0, 0]]),
        ([[10, 11, 13]], [[1, 1, 0]]),
        ([[10, 14]], [[0, 0]]),
    ]
    row = ernie2.single_segment_row(passages[0], cls_id=CLS, sep_id=SEP)
    assert row["input_ids"].numpy().tolist() == [2, 10, 11, 12, 12, 3]
    assert row[ernie2.TOKEN_DOCUMENT_KEY].numpy().tolist() == [0, 1, 1, 0, 0, 0]


def _python_token_document(documents, vocab, max_tokens):
    """Recomputes the labels with Python's SentencePiece and sets: (labels, tokens)."""
    processor = vocab.tokenizer
    ones = tokens = 0
    for document in documents:
        sentences = [processor.encode(s) for s in document.sentences]
        sentences = [s for s in sentences if s]
        passages, used = [], 0
        for sentence in sentences:  # greedy whole-sentence passages
            if not passages or (used > 0 and used + len(sentence) > max_tokens):
                passages.append([])
                used = 0
            passages[-1].append(sentence)
            used += len(sentence)
        words_per_passage = []
        for passage in passages:
            words = []
            for sentence in passage:
                for position, piece in enumerate(sentence):
                    text = processor.id_to_piece(piece)
                    if position == 0 or text.startswith("\u2581") or processor.is_unknown(piece):
                        words.append([piece])
                    else:
                        words[-1].append(piece)
            words_per_passage.append([tuple(w) for w in words])
        for index, (passage, words) in enumerate(zip(passages, words_per_passage, strict=True)):
            elsewhere = set().union(
                *(set(w) for j, w in enumerate(words_per_passage) if j != index)
            )
            kept = max_tokens if len(passage) == 1 else None  # a long sentence is cut
            labels = [t for w in words for t in [int(w in elsewhere)] * len(w)][:kept]
            ones += sum(labels)
            tokens += len(labels)
    return ones, tokens


def test_token_document_share_matches_a_python_recount(wiki_vocab, wiki_documents):
    corpus = corpora.get_corpus("wiki_sample")
    dataset = tokenization.tokenize_sentences(corpus.dataset("validation"), vocab=wiki_vocab)
    passages = ernie2.document_passages(dataset, max_tokens=126)
    ones = tokens = 0
    for passage in passages:
        labels = passage["sentence_token_document"].flat_values
        ones, tokens = ones + int(tf.reduce_sum(labels)), tokens + int(tf.size(labels))
    assert (ones, tokens) == _python_token_document(wiki_documents, wiki_vocab, 126)
    assert 0.2 < ones / tokens < 0.9
    # One passage per document: no other segment, no positive label.
    whole = ernie2.document_passages(_documents([[[10, 11], [10, 11]]]), max_tokens=100)
    assert next(iter(whole))["sentence_token_document"].to_list() == [[0, 0], [0, 0]]


# ------------------------------------------------------------------------------ reordering
def test_classes_cover_sum_of_factorials():
    for m in (1, 2, 3, 4):
        classes = [
            ernie2.permutation_class(order)
            for k in range(1, m + 1)
            for order in itertools.permutations(range(k))
        ]
        assert sorted(classes) == list(range(ernie2.num_reordering_classes(m)))
    assert ernie2.num_reordering_classes(3) == 9
    assert ernie2.permutation_class((1, 0)) == 2 and ernie2.permutation_class((2, 1, 0)) == 8


def _reordered(passage, n, *, max_segments=ernie2.MAX_SEGMENTS):
    features = {
        "sentence_ids": tf.ragged.constant(passage, tf.int32),
        "sentence_word_starts": tf.ragged.constant([[1] * len(s) for s in passage], tf.int32),
    }
    seeds = tf.data.Dataset.range(n).map(lambda i: tf.stack([i, tf.constant(5, tf.int64)]))
    return list(
        seeds.map(
            lambda seed: ernie2.reorder_segments(
                features, seed=seed, cls_id=CLS, sep_id=SEP, max_segments=max_segments
            )
        ).as_numpy_iterator()
    )


def _decode_label(label):
    """label -> (k, shown order), enumerating the orders apart from the data code."""
    offset = 0
    for k in itertools.count(1):
        orders = list(itertools.permutations(range(k)))  # lexicographic
        if label < offset + len(orders):
            return k, orders[label - offset]
        offset += len(orders)


def test_reordering_is_uniform_and_undoes_with_its_label():
    passage = [[10], [11, 12], [13], [14, 15, 16], [17]]
    original = [t for s in passage for t in s]
    examples = _reordered(passage, 3000)
    by_k = collections.defaultdict(collections.Counter)
    for ex in examples:
        ids = ex["input_ids"].tolist()
        assert ids[0] == CLS and ids[-1] == SEP and len(ids) == len(original) + 1 + ids.count(SEP)
        label = int(ex[ernie2.REORDER_KEY])
        assert 0 <= label < 9
        k, order = _decode_label(label)
        shown, segment = [], []
        for token in ids[1:]:
            if token == SEP:
                shown.append(segment)
                segment = []
            else:
                segment.append(token)
        assert len(shown) == k
        restored = [t for q in range(k) for t in shown[order.index(q)]]
        assert restored == original
        by_k[k][order] += 1
    counts = [sum(by_k[k].values()) for k in (1, 2, 3)]
    assert stats.chisquare(counts).pvalue > 1e-3, counts  # k uniform in 1..3
    for k in (2, 3):
        observed = [by_k[k][order] for order in itertools.permutations(range(k))]
        result = stats.chisquare(observed)
        assert result.pvalue > 1e-3, (k, observed, result.statistic)


def test_reordering_uses_at_most_the_passages_sentences():
    labels = {int(ex[ernie2.REORDER_KEY]) for ex in _reordered([[10, 11], [12]], 200)}
    assert labels == {0, 1, 2}  # k <= 2 sentences: classes of k = 1 and k = 2 only
    assert {int(ex[ernie2.REORDER_KEY]) for ex in _reordered([[10, 11, 12]], 20)} == {0}


# -------------------------------------------------------------------------------- distance
def test_sentence_distance_labels_follow_the_source_and_the_set_shares():
    """Sentence i of document d is the token 100 * (d + 1) + i repeated 1..12 times, so every
    pair names its sources; max_seq_length 16 truncates many pairs."""
    probs = (0.5, 0.3, 0.2)
    sizes = [3 + (d % 9) for d in range(60)]  # 3..11 sentences
    docs = [
        [[100 * (d + 1) + i] * (1 + (7 * i + d) % 12) for i in range(n)]
        for d, n in enumerate(sizes)
    ]
    dataset = ernie2.sentence_distance_pairs(
        _documents(docs), seed=0, max_seq_length=16, cls_id=CLS, sep_id=SEP, probs=probs,
        buffer_size=8,
    )  # fmt: skip
    examples = list(dataset.as_numpy_iterator())
    # Every sentence with a next one and a non-adjacent one is an A: S - 1 pairs for S >= 4,
    # one (the first sentence) for S = 3.
    assert len(examples) == sum(s - 1 if s >= 4 else 1 for s in sizes)
    labels = np.array([int(ex[ernie2.DISTANCE_KEY]) for ex in examples])
    for ex, label in zip(examples, labels, strict=True):
        ids = ex["input_ids"].tolist()
        middle = ids.index(SEP)
        a, b = ids[1:middle], ids[middle + 1 : -1]
        assert ids[0] == CLS and ids[-1] == SEP and len(ids) <= 16 and a and b
        assert len(set(a)) == len(set(b)) == 1  # one sentence each, cut but not mixed
        assert ex["token_type_ids"].tolist() == [0] * (middle + 1) + [1] * (len(b) + 1)
        (doc_a, i), (doc_b, j) = divmod(a[0], 100), divmod(b[0], 100)
        if label == 0:
            assert doc_a == doc_b and j == i + 1
        elif label == 1:
            assert doc_a == doc_b and abs(j - i) >= 2
        else:
            assert label == 2 and doc_a != doc_b
    assert any(len(ex["input_ids"]) == 16 for ex in examples)  # some pairs were truncated
    n = len(labels)
    for label, p in enumerate(probs):
        share = np.mean(labels == label)
        assert abs(share - p) < 4 * np.sqrt(p * (1 - p) / n), (label, share, p)


# ---------------------------------------------------------------------- masking, converter
def test_masking_takes_whole_words_and_keeps_the_task_features():
    row = {
        "input_ids": tf.constant([2, 10, 11, 12, 13, 14, 3]),
        "word_starts": tf.constant([1, 1, 0, 1, 1, 0, 1]),
        ernie2.CAPITALIZATION_KEY: tf.constant([0, 1, 0, 0, 1, 0, 0]),
    }
    words = {1: (1, 2), 2: (1, 2), 3: (3,), 4: (4, 5), 5: (4, 5)}
    seen = 0
    for s in range(40):
        out = ernie2.mask_words(row, seed=tf.constant([s, 0]), spec=SPEC)
        assert out[ernie2.CAPITALIZATION_KEY].numpy().tolist() == [0, 1, 0, 0, 1, 0, 0]
        k = int(tf.reduce_sum(out["masked_weights"]))
        positions = set(out["masked_positions"][:k].numpy().tolist())
        assert all(set(words[p]) <= positions for p in positions)
        seen += k
    assert seen > 0


def _word_rows(count, *, seed):
    """Rows [CLS] words [SEP] of 4-60 tokens, words of 1-3 pieces, a special inside some."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        n = int(rng.integers(2, 59))
        starts = (rng.random(n) < 0.6).astype(np.int32)
        starts[0] = 1
        ids = rng.integers(10, 1000, n).astype(np.int32)
        if n > 5 and rng.random() < 0.3:
            ids[n // 2], starts[n // 2] = SEP, 1
        rows.append(
            {
                "input_ids": np.concatenate([[CLS], ids, [SEP]]).astype(np.int32),
                "word_starts": np.concatenate([[1], starts, [1]]).astype(np.int32),
                ernie2.CAPITALIZATION_KEY: rng.integers(0, 2, n + 2).astype(np.int32),
                ernie2.REORDER_KEY: np.int32(rng.integers(0, 9)),
            }
        )
    return rows


def _masked_by_a_loop(row, drawn, spec):
    """ERNIE's word masking restated from one row's draws: units chosen at < 0.15, visited in
    the order of their order draws and kept while they fit, then 80/10/10 per token. Also
    returns how many chosen units did not fit."""
    ids, starts = row["input_ids"], row["word_starts"]
    maskable = ~np.isin(ids, spec.special_ids)
    units = []
    for i in range(ids.size):
        if maskable[i] and (starts[i] or not maskable[i - 1]):
            units.append([i])
        elif maskable[i]:
            units[-1].append(i)
    assert len(units) <= drawn["select"].size == drawn["order"].size == ids.size
    select, order = drawn["select"][: len(units)], drawn["order"][: len(units)]
    remaining, selected, skipped = spec.budget_limit, [], 0
    for u in np.argsort(order, kind="stable"):
        if select[u] < ernie.UNIT_RATE and len(units[u]) <= remaining:
            remaining -= len(units[u])
            selected += units[u]
        else:
            skipped += select[u] < ernie.UNIT_RATE
    selected = sorted(selected)
    corrupted = ids.copy()
    for i in selected:
        if drawn["decisions"][i] < 0.8:
            corrupted[i] = spec.mask_id
        elif drawn["decisions"][i] < 0.9:
            corrupted[i] = drawn["random_ids"][i]
    pad = spec.max_predictions - len(selected)
    return {
        "input_ids": corrupted,
        "masked_positions": np.array(selected + [0] * pad),
        "masked_ids": np.array([ids[i] for i in selected] + [0] * pad),
        "masked_weights": np.array([1.0] * len(selected) + [0.0] * pad),
    }, skipped


def test_unit_draws_per_token_are_the_draws_per_unit():
    """Unit u uses the row's draw u: the number a draw of one per unit gives it (what the
    maskers drew before; a stateless draw of n numbers is the first n of a longer one)."""
    for s in range(60):
        seed = tf.constant([s, 5])
        select, order = ernie.unit_draws(tf.constant([130]), seed=seed)
        select_seed, order_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        for units in (0, 1, 3, 4, 5, 64, 129, 130):
            np.testing.assert_array_equal(
                select[:units], tf.random.stateless_uniform([units], select_seed)
            )
            np.testing.assert_array_equal(
                order[:units], tf.random.stateless_uniform([units], order_seed)
            )


def test_grouped_word_masking_follows_a_loop_over_each_rows_draws():
    spec = mlm.MlmSpec(
        mask_id=MASK, vocab_size=1000, special_ids=(0, 1, 2, 3, 4), max_predictions=6
    )
    rows = _word_rows(48, seed=0)
    drawn = [
        {
            k.split("/")[-1]: v.numpy()
            for k, v in ernie.unit_mask_draws(
                {k: tf.constant(v) for k, v in row.items()}, seed=tf.constant([i, 7]), spec=spec
            ).items()
            if k.startswith(ernie.DRAWS_PREFIX)
        }
        for i, row in enumerate(rows)
    ]
    with_draws = [
        {**row, **{ernie.DRAWS_PREFIX + k: v for k, v in d.items()}}
        for row, d in zip(rows, drawn, strict=True)
    ]
    lengths = [row["input_ids"].size for row in rows]
    group = next(
        iter(
            tf.data.Dataset.from_generator(
                lambda: iter(with_draws),
                output_signature={
                    k: tf.TensorSpec(np.shape(v) and [None], tf.as_dtype(np.asarray(v).dtype))
                    for k, v in with_draws[0].items()
                },
            ).padded_batch(len(rows))
        )
    )
    out = ernie2.mask_drawn_words(group, lengths=tf.constant(lengths), spec=spec)
    overflowed = 0
    for i, (row, d) in enumerate(zip(rows, drawn, strict=True)):
        expected, skipped = _masked_by_a_loop(row, d, spec)
        n = lengths[i]
        for key, value in expected.items():
            got = out[key][i].numpy()
            np.testing.assert_array_equal(got[:n] if key == "input_ids" else got, value, key)
        assert out[ernie2.CAPITALIZATION_KEY][i, :n].numpy().tolist() == list(
            row[ernie2.CAPITALIZATION_KEY]
        )
        assert not any(k.startswith(ernie.DRAWS_PREFIX) for k in out)
        overflowed += skipped > 0
    assert overflowed >= 5  # the fit-or-skip path, not only rows whose chosen words all fit


@pytest.mark.parametrize("reordering", [False, True])
def test_tasks_mask_groups_of_rows_as_each_row_alone(reordering):
    """The tasks' grouped masking (per-row seeds, padded groups, rows cut back) gives each row
    what the one-row masker gives it under the same SeqIO seeds."""
    if reordering:
        passages = [
            {
                "sentence_ids": tf.RaggedTensor.from_row_lengths(
                    r["input_ids"][1:-1], [n, len(r["input_ids"]) - 2 - n]
                ),
                "sentence_word_starts": tf.RaggedTensor.from_row_lengths(
                    r["word_starts"][1:-1], [n, len(r["input_ids"]) - 2 - n]
                ),
            }
            for r, n in zip(_word_rows(70, seed=1), itertools.cycle([1, 2]), strict=False)
        ]
        dataset = tf.data.Dataset.from_generator(
            lambda: iter(passages),
            output_signature={
                k: tf.RaggedTensorSpec([None, None], tf.int32, 1) for k in passages[0]
            },
        )
        kwargs = {"spec": SPEC, "cls_id": CLS, "sep_id": SEP}
        one = functools.partial(ernie2.reorder_and_mask, **kwargs)
        draw = functools.partial(ernie2.reorder_and_draw, **kwargs)
    else:
        rows = _word_rows(70, seed=1)
        dataset = tf.data.Dataset.from_tensor_slices(
            {
                k: tf.ragged.constant([r[k] for r in rows])
                if np.ndim(rows[0][k])
                else [r[k] for r in rows]
                for k in rows[0]
            }
        ).map(
            lambda x: {
                k: v.flat_values if isinstance(v, tf.RaggedTensor) else v for k, v in x.items()
            }
        )
        one = functools.partial(ernie2.mask_words, spec=SPEC)
        draw = functools.partial(ernie.unit_mask_draws, spec=SPEC)
    with seqio.map_seed_manager(11):
        alone = list(mlm.dynamic_masking(dataset, mask_fn=one).as_numpy_iterator())
    with seqio.map_seed_manager(11):
        grouped = mlm.grouped_dynamic_masking(
            dataset,
            draw_fn=draw,
            mask_fn=functools.partial(ernie2.mask_drawn_words, spec=SPEC),
            group_size=16,
        )
        grouped = list(grouped.as_numpy_iterator())
    assert len(grouped) == len(alone) == 70
    for a, g in zip(alone, grouped, strict=True):
        assert sorted(a) == sorted(g)
        for key in a:
            np.testing.assert_array_equal(g[key], a[key], key)
    assert sum(int(a["masked_weights"].sum()) for a in alone) > 100


def test_converter_pads_token_labels_to_the_length():
    converter = feature_converters.EncoderMlmFeatureConverter(
        token_labels=(ernie2.CAPITALIZATION_KEY,)
    )
    dataset = tf.data.Dataset.from_tensors(
        {
            "input_ids": tf.constant([2, 4, 9, 3]),
            ernie2.CAPITALIZATION_KEY: tf.constant([0, 1, 1, 0]),
            "masked_positions": tf.constant([1]),
            "masked_ids": tf.constant([7]),
            "masked_weights": tf.constant([1.0]),
        }
    )
    out = next(iter(converter(dataset, {"input_ids": 6, "masked_ids": 2})))
    assert out[ernie2.CAPITALIZATION_KEY].numpy().tolist() == [0, 1, 1, 0, -1, -1]
    with pytest.raises(ValueError, match="cannot pack"):
        feature_converters.EncoderMlmFeatureConverter(
            token_labels=(ernie2.CAPITALIZATION_KEY,), pack=True
        )
