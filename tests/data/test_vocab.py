"""Vocabularies: special-id layout, deterministic training, word starts, tokenization."""

import hashlib

import numpy as np
import pytest
import tensorflow as tf

from lmsuite.data import corpora, tokenization
from lmsuite.data import vocab as vocab_lib


def test_special_ids_follow_the_contract(tiny_vocab):
    ids = vocab_lib.special_ids(tiny_vocab)
    assert (ids.pad, ids.unk, ids.cls, ids.sep, ids.mask, ids.bos, ids.eos) == tuple(range(7))
    assert tiny_vocab.vocab_size == 400
    assert ids.sentinels[0] == 399 and ids.sentinels[99] == 300 and len(ids.sentinels) == 100
    pieces = [tiny_vocab.tokenizer.id_to_piece(i) for i in range(7)]
    assert pieces == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]
    # SeqIO agrees: its encoder maps "<extra_id_0>" to the top id, and EOS/UNK/PAD match.
    assert tiny_vocab.encode("<extra_id_0>")[-1] == 399
    assert (tiny_vocab.eos_id, tiny_vocab.unk_id, tiny_vocab.pad_id) == (6, 1, 0)


def test_training_is_byte_identical(tmp_path):
    kwargs = dict(corpus="wiki_sample", size=300, max_sentences=1500)
    first = vocab_lib.train_vocab(out_dir=tmp_path / "a", **kwargs)
    second = vocab_lib.train_vocab(out_dir=tmp_path / "b", **kwargs)
    assert first != second
    assert (
        hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()
    )


def test_vocabulary_is_lazy(tmp_path):
    vocab = vocab_lib.get_vocabulary("wiki_sample", 300, out_dir=tmp_path, max_sentences=10)
    assert vocab.extra_ids == 100 and "wiki_sample" in repr(vocab)
    assert not any(tmp_path.iterdir())  # nothing trained until used


def test_bad_size_and_unknown_default_fail_loudly(tmp_path):
    with pytest.raises(ValueError, match="size=5"):
        vocab_lib.train_vocab(corpus="wiki_sample", size=5, out_dir=tmp_path)
    with pytest.raises(ValueError, match="default vocabulary size for corpus 'c4'"):
        vocab_lib.get_vocabulary("c4")


def test_require_sentinels_names_missing_ids(tmp_path):
    vocab = vocab_lib.get_vocabulary("wiki_sample", 300, extra_ids=0, out_dir=tmp_path)
    with pytest.raises(ValueError, match=r"<extra_id_0>\.\.<extra_id_99>"):
        vocab_lib.require_sentinels(vocab, needed=100, purpose="span corruption")


def test_word_start_table(tiny_vocab):
    table = vocab_lib.word_start_table(tiny_vocab)
    assert table.shape == (400,) and table[:7].all() and table[300:].all()
    for i in range(7, 300):
        assert table[i] == tiny_vocab.tokenizer.id_to_piece(i).startswith("\u2581")
    assert 0 < table[7:300].sum() < 293


def _one(dataset):
    return next(iter(dataset))


def test_tokenize_documents_and_sentences_agree(tiny_vocab):
    dataset = tf.data.Dataset.from_tensors(
        {
            "text": tf.constant("the cat sat. a dog"),
            "sentences": tf.constant(["the cat sat.", "a dog"]),
        }
    )
    doc = _one(tokenization.tokenize_documents(dataset, vocab=tiny_vocab))
    sents = _one(tokenization.tokenize_sentences(dataset, vocab=tiny_vocab))
    ids = doc["targets"].numpy()
    assert tiny_vocab.decode(ids.tolist()) == "the cat sat. a dog"
    pieces = [tiny_vocab.tokenizer.id_to_piece(int(i)) for i in ids]
    assert doc["word_starts"].numpy().tolist() == [int(p.startswith("\u2581")) for p in pieces]
    assert np.concatenate(sents["sentence_ids"].to_list()).tolist() == ids.tolist()
    assert (
        sents["sentence_word_starts"].flat_values.numpy().tolist()
        == doc["word_starts"].numpy().tolist()
    )


def test_chinese_word_starts_follow_segmentation(tiny_zh_vocab):
    documents = corpora.PEOPLES_DAILY.source().get_dataset("validation", shuffle=False).take(1)
    documents = tokenization.tokenize_documents(documents, vocab=tiny_zh_vocab)
    example = _one(tokenization.tokenize_sentences(documents, vocab=tiny_zh_vocab))
    words = example["words"].numpy()
    starts = example["word_starts"].numpy()
    assert starts.sum() == len(words)  # exactly one start per corpus word
    pieces = tiny_zh_vocab.tf_tokenizer.tokenize(words)
    assert example["targets"].numpy().tolist() == pieces.flat_values.numpy().tolist()
    per_sentence = example["sentence_ids"].row_lengths().numpy()
    assert per_sentence.sum() == len(starts)
    assert len(per_sentence) == len(example["sentences"].numpy())


def test_segmented_passages_group_whole_sentences(tiny_zh_vocab):
    documents = corpora.PEOPLES_DAILY.source().get_dataset("validation", shuffle=False).take(1)
    passages = list(tokenization.segmented_passages(documents, vocab=tiny_zh_vocab, max_tokens=20))
    first = corpora.PEOPLES_DAILY.documents("validation")[0]
    assert sum(int(p["word_tags"].shape[0]) for p in passages) == len(first.features["words"])
    tags = [t.decode() for p in passages for t in p["word_tags"].numpy()]
    assert tags == list(first.features["entity_tags"])
    sizes = [int(p["word_ids"].flat_values.shape[0]) for p in passages]
    assert len(passages) > 2 and sum(n <= 20 for n in sizes) >= 0.5 * len(sizes)
    # Greedy: no two neighbouring passages would have fitted together.
    assert all(a + b > 20 for a, b in zip(sizes[:-1], sizes[1:], strict=True))


def test_passage_ids_are_greedy():
    ids = tokenization.passage_ids(tf.constant([2, 3, 1, 6, 2]), max_tokens=5)
    assert ids.numpy().tolist() == [0, 0, 1, 2, 3]


def _greedy_passages(lengths, max_tokens):
    """The rule as a loop (what passage_ids replaced its scan of)."""
    out, passage, used = [], 0, 0
    for n in lengths:
        if used > 0 and used + n > max_tokens:
            passage, used = passage + 1, 0
        used += n
        out.append(passage)
    return out


@pytest.mark.parametrize(
    "lengths, max_tokens",
    [
        ([], 5),
        ([7], 5),
        ([0, 0, 0], 5),
        ([0, 7, 2], 5),  # an empty item opens a passage that a long one still joins
        ([7, 0, 2], 5),  # an empty item after a long one opens the next
        ([5, 5, 5], 5),
        ([1] * 40, 1),
        ([1] * 40, 3),
    ],
)
def test_passage_ids_follow_the_loop_on_edge_cases(lengths, max_tokens):
    got = tokenization.passage_ids(tf.constant(lengths, tf.int32), max_tokens=max_tokens)
    assert got.dtype == tf.int64
    assert got.numpy().tolist() == _greedy_passages(lengths, max_tokens)


def test_passage_ids_follow_the_loop_on_random_lengths():
    rng = np.random.default_rng(0)
    traced = tf.function(tokenization.passage_ids, reduce_retracing=True)
    for case in range(150):
        max_tokens = int(rng.integers(1, 12))
        lengths = rng.integers(0, 3 * max_tokens, int(rng.integers(0, 70)))
        lengths[rng.random(lengths.size) < 0.3 * (case % 3)] = 0
        expected = _greedy_passages(lengths.tolist(), max_tokens)
        fn = traced if case % 2 else tokenization.passage_ids
        assert fn(tf.constant(lengths), max_tokens=max_tokens).numpy().tolist() == expected


def test_reached_from_first_follows_the_links():
    got = tokenization.reached_from_first(tf.constant([2, 2, 4, 4, 4], tf.int64))
    assert got.numpy().tolist() == [True, False, True, False]
    rng = np.random.default_rng(1)
    for size in [0, 1, 2, 3, 7, 8, 9, 64, 65, 200]:
        successor = [int(rng.integers(i + 1, min(i + 5, size) + 1)) for i in range(size)]
        successor.append(size)
        want, item = [False] * size, 0
        while item < size:
            want[item], item = True, successor[item]
        got = tokenization.reached_from_first(tf.constant(successor, tf.int64))
        assert got.numpy().tolist() == want, size


def test_encoder_chunks():
    dataset = tf.data.Dataset.from_tensors(
        {"targets": tf.constant([10, 11, 12, 13]), "word_starts": tf.constant([1, 0, 1, 1])}
    )
    chunks = list(tokenization.encoder_chunks(dataset, max_seq_length=5, cls_id=2, sep_id=3))
    assert [c["input_ids"].numpy().tolist() for c in chunks] == [[2, 10, 11, 12, 3], [2, 13, 3]]
    assert [c["word_starts"].numpy().tolist() for c in chunks] == [[1, 1, 0, 1, 1], [1, 1, 1]]
    assert (
        len(
            list(
                tokenization.encoder_chunks(
                    dataset, max_seq_length=5, cls_id=2, sep_id=3, min_tokens=2
                )
            )
        )
        == 1
    )
    with pytest.raises(ValueError, match="max_seq_length"):
        tokenization.encoder_chunks(dataset, max_seq_length=2, cls_id=2, sep_id=3)
