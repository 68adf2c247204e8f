"""Task registry: lazy registration, sentinel checks, every objective yields examples."""

import functools
import os
import subprocess
import sys

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data import corpora, feature_converters, inspect, tasks, tokenization
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import ul2

LENGTHS = {
    tasks.ENCODER: {"input_ids": 64},
    tasks.SEQ2SEQ: {"inputs": 64, "targets": 32},
    tasks.DECODER: {"targets": 64},
    tasks.PERMUTATION: {"input_k": 64},
}


def _lengths(objective: str) -> dict[str, int]:
    """The objective kind's lengths; UL2's denoisers need targets as long as the inputs."""
    if objective in ul2.BY_NAME:
        return ul2.lengths(64)
    return LENGTHS[tasks.OBJECTIVES[objective].kind]


FAST = ["bert_mlm", "wwm", "spanbert", "electra", "t5_span_corruption", "iid_denoising",
        "prefix_lm", "causal_lm", "mass", "unilm", "xlnet_plm", "unilm2", "ernie2_capitalization",
        "ernie2_token_document", "ernie2_sentence_reordering"]  # fmt: skip
SLOW = ["bert_mlm_nsp", "albert_sop", "structbert", "bart_denoising", "ernie2_sentence_distance",
        "ernie"]  # fmt: skip
# 5 corpora x 24 objectives (txl_lm, unilm2 and UL2's 7 denoisers included), ERNIE (Chinese),
# ERNIE 2.0's capitalization (4 English corpora) and its three other tasks (all 5).
PRETRAINING_TASK_COUNT = 5 * 24 + 1 + 4 + 5 * 3


def test_registration_is_offline_and_lazy(tmp_path):
    env = {**os.environ, "LMSUITE_CACHE": str(tmp_path), "PIP_INDEX_URL": "http://127.0.0.1:9/",
           "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PYTHONPATH": os.getcwd()}  # fmt: skip
    code = "import lmsuite.data.tasks as t; print(len(t.TASK_NAMES))"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.split()[0]) == PRETRAINING_TASK_COUNT + 4  # + the probe tasks
    assert list(tmp_path.iterdir()) == []  # nothing downloaded, nothing trained


def test_expected_names_are_registered():
    names = set(inspect.list_tasks())
    for corpus in ("wiki_sample", "shakespeare", "peoples_daily", "wikipedia", "c4"):
        for objective in FAST + SLOW[:-1]:
            english_only = objective == "ernie2_capitalization"
            assert (f"{corpus}_{objective}" in names) != (
                english_only and corpus == "peoples_daily"
            )
    assert "peoples_daily_ernie" in names and "wiki_sample_ernie" not in names
    assert "peoples_daily_albert_sop" in names
    assert {"wiki_sample_probe_vader_sentiment", "shakespeare_probe_trec_questions"} <= names
    assert {"wiki_sample_seq2seq_mixture", "wikipedia_c4_bert_mlm"} <= names


def test_span_corruption_without_sentinels_fails_at_build(tmp_path):
    vocab = vocab_lib.get_vocabulary("wiki_sample", 300, extra_ids=0, out_dir=tmp_path)
    with pytest.raises(ValueError, match=r"missing <extra_id_0>\.\.<extra_id_99>"):
        tasks.build_task("wiki_sample", "t5_span_corruption", vocab=vocab, register=False)
    tasks.build_task("wiki_sample", "bert_mlm", vocab=vocab, register=False)  # no sentinels needed


def test_wrong_language_and_unknown_objective_fail():
    with pytest.raises(ValueError, match="needs a corpus in"):
        tasks.build_task("wiki_sample", "ernie", register=False)
    with pytest.raises(ValueError, match="unknown objective 'bert'"):
        tasks.build_task("wiki_sample", "bert", register=False)


def _first_example(objective, vocab):
    spec = tasks.OBJECTIVES[objective]
    corpus = "peoples_daily" if "zh" in spec.languages else "wiki_sample"
    task = tasks.build_task(corpus, objective, vocab=vocab, name=f"test_tiny_{objective}")
    dataset = task.get_dataset(_lengths(objective), split="validation", shuffle=False, seed=0)
    return spec, next(iter(dataset))


ERNIE2_FEATURES = {"ernie2_capitalization": "capitalization_labels",
                   "ernie2_token_document": "token_document_labels",
                   "ernie2_sentence_reordering": "sentence_reordering_label",
                   "ernie2_sentence_distance": "sentence_distance_label"}  # fmt: skip


def _check(objective, spec, example):
    if objective in ERNIE2_FEATURES:  # per-token labels align with input_ids, else one label
        labels = example[ERNIE2_FEATURES[objective]]
        assert labels.shape in ([], example["input_ids"].shape), labels.shape
    if spec.kind == tasks.ENCODER:
        ids = example["input_ids"].numpy()
        assert ids[0] == vocab_lib.CLS_ID and vocab_lib.SEP_ID in ids and len(ids) <= 64
        weights = example["masked_weights"].numpy()
        # ERNIE selects each unit with p 0.15 and no budget: a short row may get no prediction.
        assert weights.sum() >= 1 or objective.startswith("ernie")
        positions = example["masked_positions"].numpy()[weights > 0]
        assert (positions > 0).all() and (positions < len(ids)).all()
        predicted = set(example["masked_ids"].numpy()[weights > 0].tolist())
        assert not predicted & {
            vocab_lib.PAD_ID,
            vocab_lib.CLS_ID,
            vocab_lib.SEP_ID,
            vocab_lib.MASK_ID,
        }
    elif objective == "mass":  # </s> chunk </s> in; exactly the fragment out, no EOS added
        assert example["inputs"].numpy()[0] == vocab_lib.EOS_ID
        assert len(example["targets"]) == len(example["decoder_positions"]) >= 1
        assert len(example["inputs"]) <= 64
    elif spec.kind == tasks.SEQ2SEQ:
        assert example["targets"].numpy()[-1] == vocab_lib.EOS_ID
        assert len(example["inputs"]) <= 64
    elif spec.kind == tasks.PERMUTATION:
        assert example["input_k"].shape == (64,) and example["perm_mask"].shape == (64, 64)
        assert example["input_k"].numpy()[-1] == vocab_lib.CLS_ID
    else:
        assert example["targets"].numpy()[-1] == vocab_lib.EOS_ID


@pytest.mark.parametrize("objective", FAST)
def test_objective_yields_examples(objective, tiny_vocab):
    spec, example = _first_example(objective, tiny_vocab)
    _check(objective, spec, example)
    sentinel = vocab_lib.special_ids(tiny_vocab).sentinels[0]
    if objective == "unilm2":  # PMLM's pseudo token [P] is the first sentinel
        assert sentinel in example["input_ids"].numpy()
    elif tasks.OBJECTIVES[objective].needs_sentinels:
        assert example["targets"].numpy()[0] == sentinel


@pytest.mark.parametrize("objective", ["wwm", "t5_span_corruption", "ernie2_token_document"])
def test_chinese_objectives_use_segmentation(objective, tiny_zh_vocab):
    task = tasks.build_task("peoples_daily", objective, vocab=tiny_zh_vocab, register=False)
    spec = tasks.OBJECTIVES[objective]
    example = next(iter(task.get_dataset(_lengths(objective), split="validation", shuffle=False)))
    _check(objective, spec, example)


@pytest.mark.slow
@pytest.mark.parametrize("objective", SLOW)
def test_slow_objective_yields_examples(objective, tiny_vocab, tiny_zh_vocab):
    vocab = tiny_zh_vocab if objective == "ernie" else tiny_vocab
    spec, example = _first_example(objective, vocab)
    _check(objective, spec, example)


@pytest.mark.parametrize("probe, labels", [("vader_sentiment", 2), ("trec_questions", 6)])
def test_probe_tasks(probe, labels, tiny_vocab):
    task = tasks.build_probe_task(
        probe, vocab_corpus="wiki_sample", vocab=tiny_vocab, register=False
    )
    examples = list(task.get_dataset({"input_ids": 32}, split="validation", shuffle=False).take(20))
    for ex in examples:
        ids = ex["input_ids"].numpy()
        assert ids[0] == vocab_lib.CLS_ID and ids[-1] == vocab_lib.SEP_ID and len(ids) <= 32
        assert 0 <= int(ex["label"]) < labels


def test_show_task_renders_masks_and_sentinels(tiny_vocab):
    tasks.build_task("wiki_sample", "t5_span_corruption", vocab=tiny_vocab, name="test_show_t5")
    tasks.build_task("wiki_sample", "bert_mlm", vocab=tiny_vocab, name="test_show_mlm")
    shown = inspect.show_task("test_show_t5", n=2, sequence_length={"inputs": 48, "targets": 16})
    assert shown.count("--- example") == 2 and "<X0>" in shown and "</s>" in shown
    shown = inspect.show_task("test_show_mlm", n=1, sequence_length={"input_ids": 48})
    assert "[CLS]" in shown and "[MASK]" in shown and "masked_positions:" in shown
    with pytest.raises(ValueError, match="unknown task"):
        inspect.show_task("nope")


def test_render_ids(tiny_vocab):
    piece = tiny_vocab.tokenizer.piece_to_id("\u2581the")
    text = inspect.render_ids([2, piece, 4, 399, 300, 3, 0, 0], tiny_vocab)
    assert text == "[CLS] the[MASK]<X0><X99>[SEP]"


def test_encoder_mlm_feature_converter():
    dataset = tf.data.Dataset.from_tensors({
        "input_ids": tf.constant([2, 4, 9, 3]), "masked_positions": tf.constant([1, 0]),
        "masked_ids": tf.constant([7, 0]), "masked_weights": tf.constant([1.0, 0.0]),
        "next_sentence_label": tf.constant(1),
    })  # fmt: skip
    converter = feature_converters.EncoderMlmFeatureConverter(labels=("next_sentence_label",))
    out = next(iter(converter(dataset, {"input_ids": 6, "masked_ids": 2})))
    assert out["input_ids"].numpy().tolist() == [2, 4, 9, 3, 0, 0]
    assert out["input_mask"].numpy().tolist() == [1, 1, 1, 1, 0, 0]
    assert int(out["next_sentence_label"]) == 1
    with pytest.raises(ValueError, match="pack=True"):
        feature_converters.EncoderMlmFeatureConverter(labels=("next_sentence_label",), pack=True)


def test_classification_and_permutation_converters(tiny_vocab):
    probe = tasks.build_probe_task(
        "trec_questions", vocab_corpus="wiki_sample", vocab=tiny_vocab, register=False
    )
    dataset = probe.get_dataset({"input_ids": 32}, split="validation", shuffle=False)
    out = next(
        iter(feature_converters.ClassificationFeatureConverter()(dataset, {"input_ids": 40}))
    )
    assert out["input_ids"].shape == (40,) and out["input_mask"].numpy().sum() <= 32
    assert out["label"].shape == ()
    plm = tasks.build_task("wiki_sample", "xlnet_plm", vocab=tiny_vocab, register=False)
    dataset = plm.get_dataset({"input_k": 64}, split="validation", shuffle=False)
    predictions = next(iter(dataset))["target"].shape[0]
    converter = feature_converters.PermutationLmFeatureConverter()
    out = next(iter(converter(dataset, {"input_k": 64, "target": predictions})))
    assert out["perm_mask"].dtype == tf.float32 and out["target_mapping"].shape == (predictions, 64)


def test_seqio_converters_fit_seq2seq_tasks(tiny_vocab):
    task = tasks.build_task("wiki_sample", "t5_span_corruption", vocab=tiny_vocab, register=False)
    dataset = task.get_dataset({"inputs": 64, "targets": 32}, split="validation", shuffle=False)
    packed = seqio.EncDecFeatureConverter(pack=True)(dataset, {"inputs": 64, "targets": 32})
    example = next(iter(packed))
    assert example["encoder_input_tokens"].shape == (64,)
    assert example["encoder_segment_ids"].numpy().max() >= 1


@pytest.mark.slow
def test_mixture_yields_examples_with_default_vocabulary():
    mixture = seqio.get_mixture_or_task("wiki_sample_seq2seq_mixture")
    dataset = mixture.get_dataset(
        {"inputs": 64, "targets": 32}, split="validation", shuffle=False, seed=0
    )
    examples = list(dataset.take(6))
    assert all(ex["targets"].numpy()[-1] == vocab_lib.EOS_ID for ex in examples)
    assert mixture.output_features["targets"].vocabulary.vocab_size == 8100


def _fake_tfds_source(self):
    """TFDS-shaped records with several paragraphs (random mock text has a single line)."""
    del self
    return seqio.FunctionDataSource(
        dataset_fn=lambda split, shuffle_files, seed=None: _tfds_records(),
        splits=("train", "validation"),
    )


def _tfds_records():
    paragraphs = [
        "The first line of a page is here. It goes on for a while.",
        "A second paragraph follows with more words in it.",
        "A third one closes the page with a final sentence.",
    ]
    text = "\n\n".join(paragraphs * 4)
    return tf.data.Dataset.from_tensor_slices(
        {
            "text": [text] * 4,
            "title": [f"t{i}" for i in range(4)],
            "url": [f"u{i}" for i in range(4)],
        }
    )


@pytest.mark.slow
def test_every_registered_pretraining_task_yields_an_example(
    tiny_vocab, tiny_zh_vocab, monkeypatch
):
    from lmsuite.data.corpora import production

    assert len(tasks.PRETRAINING_TASKS) == PRETRAINING_TASK_COUNT
    monkeypatch.setattr(production.TfdsCorpus, "source", _fake_tfds_source)
    for name, (corpus, objective) in sorted(tasks.PRETRAINING_TASKS.items()):
        vocab = tiny_zh_vocab if corpus == "peoples_daily" else tiny_vocab
        task = tasks.build_task(corpus, objective, vocab=vocab, register=False)
        spec = tasks.OBJECTIVES[objective]
        dataset = task.get_dataset(_lengths(objective), split="validation", shuffle=False)
        example = next(iter(dataset), None)
        assert example is not None, name
        _check(objective, spec, example)


def test_masked_ids_length_sets_the_prediction_cap(tiny_vocab):
    task = tasks.build_task("wiki_sample", "bert_mlm", vocab=tiny_vocab, register=False)
    lengths = {"input_ids": 64, "masked_ids": 12}
    example = next(iter(task.get_dataset(lengths, split="validation", shuffle=False)))
    assert example["masked_ids"].shape == (12,)
    dataset = task.get_dataset(lengths, split="validation", shuffle=False)
    converted = feature_converters.EncoderMlmFeatureConverter()(dataset, lengths)
    assert next(iter(converted))["masked_positions"].shape == (12,)


@pytest.mark.parametrize(
    "corpus, objective",
    [
        ("wiki_sample", "bert_mlm"),
        ("shakespeare", "t5_span_corruption"),
        ("peoples_daily", "wwm"),
        ("wiki_sample", "xlnet_plm"),
        ("wiki_sample", "ernie2_sentence_reordering"),
    ],
)
def test_memoized_tokens_give_the_same_examples(corpus, objective):
    # Tokenizing each document once and looking it up by doc_id must not change a single
    # example (peoples_daily: the segmented path, words tokenized one by one). Sentence
    # objectives read `tokenize_corpus_sentences`, the others `tokenize_corpus_documents`.
    def examples(memoize):
        task = tasks.build_task(corpus, objective, register=False, memoize_tokens=memoize)
        memo = tokenization.tokenize_corpus_sentences.__name__
        names = [getattr(s, "func", s).__name__ for s in task.preprocessors]
        assert (memo in names) == (memoize and objective != "t5_span_corruption")
        shuffle = objective != "xlnet_plm"  # its stream refuses an example shuffle
        ds = task.get_dataset(_lengths(objective), split="train", shuffle=shuffle, seed=4)
        return list(ds.take(150).as_numpy_iterator())

    plain, memoized = examples(False), examples(True)
    assert len(plain) == len(memoized) == 150
    for a, b in zip(plain, memoized, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize(
    "corpus, max_seq_length, min_tokens",
    [("wiki_sample", 64, 1), ("wiki_sample", 128, 40), ("peoples_daily", 48, 1)],
)
def test_memoized_chunks_are_encoder_chunks(corpus, max_seq_length, min_tokens):
    # Every chunk of every document, in order, including dropped short tails (min_tokens 40)
    # and the segmented path: the memo must be exactly tokenize_documents + encoder_chunks.
    vocab = tasks.default_vocabulary(corpus)
    docs = corpora.get_corpus(corpus).dataset("validation")
    ids = vocab_lib.special_ids(vocab)
    chunking = dict(
        max_seq_length=max_seq_length, cls_id=ids.cls, sep_id=ids.sep, min_tokens=min_tokens
    )
    plain = tokenization.encoder_chunks(
        tokenization.tokenize_documents(docs, vocab=vocab), **chunking
    )
    memoized = tokenization.corpus_encoder_chunks(
        docs, vocab=vocab, corpus=corpora.get_corpus(corpus), **chunking
    )
    # Same dtypes and shapes; the memo's are dense tensors (encoder_chunks slices a ragged
    # batch, so its elements are ragged-rank-0 RaggedTensors).
    assert {k: (v.dtype, v.shape) for k, v in plain.element_spec.items()} == {
        k: (v.dtype, v.shape) for k, v in memoized.element_spec.items()
    }
    assert all(isinstance(v, tf.TensorSpec) for v in memoized.element_spec.values())
    plain, memoized = list(plain.as_numpy_iterator()), list(memoized.as_numpy_iterator())
    assert len(plain) == len(memoized) > 50
    for a, b in zip(plain, memoized, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_fixed_stride_steps_chunk_through_the_memo():
    # The equality tests above only matter if build_task really swaps the memo in. No
    # registered encoder task chunks at a fixed stride any more (they cut sentence-aligned
    # rows, `preprocessors/instances.py`), but the memo still fuses such a step list.
    vocab = tasks.default_vocabulary("wiki_sample")
    corpus = corpora.get_corpus("wiki_sample")
    steps = [
        functools.partial(tokenization.tokenize_documents, vocab=vocab),
        functools.partial(tasks.chunks, vocab=vocab),
    ]
    memoized = tasks._memoized(steps, corpus)
    assert [s.func.__name__ for s in memoized] == ["_memoized_chunks"]
    steps = tasks.build_task("wiki_sample", "bert_mlm", register=False).preprocessors
    names = [s.func.__name__ for s in steps]
    assert names == ["tokenize_corpus_sentences", "_instances", "_masked"]


@pytest.mark.parametrize("corpus", ["wiki_sample", "peoples_daily"])
def test_memoized_sentences_are_tokenize_sentences(corpus):
    # Every document of a split, in order; peoples_daily takes the segmented path.
    vocab = tasks.default_vocabulary(corpus)
    docs = corpora.get_corpus(corpus).dataset("validation")
    plain = tokenization.tokenize_sentences(docs, vocab=vocab)
    memoized = tokenization.tokenize_corpus_sentences(
        docs, vocab=vocab, corpus=corpora.get_corpus(corpus)
    )
    assert plain.element_spec == memoized.element_spec

    def parts(ex):  # ragged features as their row splits and values
        out = {k: v for k, v in ex.items() if k not in ("sentence_ids", "sentence_word_starts")}
        for key in ("sentence_ids", "sentence_word_starts"):
            out[f"{key}/splits"], out[f"{key}/values"] = ex[key].row_splits, ex[key].flat_values
        return out

    plain = list(plain.map(parts).as_numpy_iterator())
    memoized = list(memoized.map(parts).as_numpy_iterator())
    assert len(plain) == len(memoized) > 5
    for a, b in zip(plain, memoized, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize(
    "memo",
    [
        tokenization.tokenize_corpus_documents,
        tokenization.tokenize_corpus_sentences,
        tokenization.corpus_encoder_chunks,
    ],
)
def test_memoized_tokens_name_an_unknown_document(memo):
    vocab = tasks.default_vocabulary("wiki_sample")
    stranger = tf.data.Dataset.from_tensors({"doc_id": tf.constant("no such page")})
    chunking = {"max_seq_length": 16, "cls_id": 2, "sep_id": 3}
    kwargs = chunking if memo is tokenization.corpus_encoder_chunks else {}
    ds = memo(stranger, vocab=vocab, corpus=corpora.get_corpus("wiki_sample"), **kwargs)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"wiki_sample.* does not have a document\] \[no such page",
    ):
        next(iter(ds))
