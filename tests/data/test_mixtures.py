"""Mixtures: examples sampled at SeqIO's rates, every shared feature kept, per-token task ids
that stay on their task's tokens through padding and packing."""

import math

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data import feature_converters as fc
from lmsuite.data import inspect, mixtures, tasks

SEQ2SEQ = ("t5_span_corruption", "iid_denoising", "prefix_lm")
LENGTHS = {"inputs": 64, "targets": 32}


def _register(tiny_vocab, name, objectives, rates):
    names = []
    for objective in objectives:
        task = tasks.build_task(
            "wiki_sample", objective, vocab=tiny_vocab, name=f"{name}_{objective}"
        )
        names.append(task.name)
    seqio.MixtureRegistry.remove(name)
    seqio.MixtureRegistry.add(name, list(zip(names, rates, strict=True)))
    return names


@pytest.fixture(scope="module")
def seq2seq_mixture(tiny_vocab):
    """span corruption, iid denoising and prefix LM at rates 1 : 2 : 5."""
    names = _register(tiny_vocab, "test_seq2seq_mix", SEQ2SEQ, (1.0, 2.0, 5.0))
    yield "test_seq2seq_mix", names
    seqio.MixtureRegistry.remove("test_seq2seq_mix")
    for task in names:
        seqio.TaskRegistry.remove(task)


@pytest.fixture(scope="module")
def mlm_mixture(tiny_vocab):
    names = _register(tiny_vocab, "test_mlm_mix", ("bert_mlm", "wwm"), (1.0, 1.0))
    yield "test_mlm_mix", names
    seqio.MixtureRegistry.remove("test_mlm_mix")
    for task in names:
        seqio.TaskRegistry.remove(task)


def test_task_names_and_rates_follow_seqio(seq2seq_mixture):
    name, names = seq2seq_mixture
    assert mixtures.task_names(name) == tuple(sorted(names))
    assert mixtures.task_names(names[0]) == ()
    shares = mixtures.rates(name)
    assert shares == pytest.approx(
        {
            f"{name}_t5_span_corruption": 1 / 8,
            f"{name}_iid_denoising": 2 / 8,
            f"{name}_prefix_lm": 5 / 8,
        }  # fmt: skip
    )


def test_observed_task_shares_match_the_rates(seq2seq_mixture):
    """2,000 examples: each task's count within 4 binomial standard deviations of its rate."""
    name, _ = seq2seq_mixture
    n = 2000
    dataset = mixtures.mixed_examples(
        name, sequence_length=LENGTHS, split="train", shuffle=False, seed=3, example_task=True
    )
    counts = np.bincount(
        [int(ex[mixtures.TASK_INDEX]) for ex in dataset.take(n).as_numpy_iterator()],
        minlength=3,
    )
    for task, count in zip(mixtures.task_names(name), counts, strict=True):
        p = mixtures.rates(name)[task]
        z = (count - n * p) / math.sqrt(n * p * (1 - p))
        assert abs(z) < 4, (task, count, n * p, z)


def test_task_ids_run_along_the_targets(seq2seq_mixture):
    name, _ = seq2seq_mixture
    dataset = mixtures.mixed_examples(
        name, sequence_length=LENGTHS, split="validation", shuffle=False, along=("targets",),
        example_task=True,
    )  # fmt: skip
    seen = set()
    for ex in dataset.take(60).as_numpy_iterator():
        assert ex[mixtures.TASK_IDS].shape == ex["targets"].shape
        assert set(ex[mixtures.TASK_IDS]) == {ex[mixtures.TASK_INDEX] + 1}
        seen.add(int(ex[mixtures.TASK_INDEX]))
    assert seen == {0, 1, 2}


@pytest.mark.parametrize("pack", [True, False])
def test_packed_task_ids_stay_on_their_examples_targets(seq2seq_mixture, pack):
    """After the converter, task ids are nonzero exactly on the real target tokens and one
    value per packed example (decoder segment)."""
    name, _ = seq2seq_mixture
    converter = fc.with_task_ids(seqio.EncDecFeatureConverter(pack=pack))
    dataset = mixtures.get_dataset(
        name, task_feature_lengths=LENGTHS, feature_converter=converter, along=("targets",),
        dataset_split="validation", shuffle=False,
    )  # fmt: skip
    for row in dataset.take(30).as_numpy_iterator():
        ids, weights = row[mixtures.TASK_IDS], row["decoder_loss_weights"]
        assert ids.shape == weights.shape == (LENGTHS["targets"],)
        np.testing.assert_array_equal(ids > 0, weights > 0)
        segments = row["decoder_segment_ids"] if pack else (weights > 0).astype(int)
        for segment in set(segments[segments > 0]):
            assert len(set(ids[segments == segment])) == 1


@pytest.fixture(scope="module")
def short_mixture():
    """Two in-memory tasks of short examples (3-9 tokens), so packed rows hold several."""
    vocabulary = seqio.PassThroughVocabulary(size=50)
    features = {k: seqio.Feature(vocabulary, add_eos=False) for k in ("inputs", "targets")}

    def source(seed):
        rng = np.random.default_rng(seed)
        lengths = rng.integers(3, 10, size=(200, 2))
        examples = {
            "inputs": [rng.integers(1, 50, n).tolist() for n, _ in lengths],
            "targets": [rng.integers(1, 50, m).tolist() for _, m in lengths],
        }
        return seqio.FunctionDataSource(
            lambda split, shuffle_files, seed=None: tf.data.Dataset.from_generator(
                lambda: ({k: examples[k][i] for k in examples} for i in range(200)),
                output_signature={k: tf.TensorSpec([None], tf.int32) for k in examples},
            ),
            splits=("train",),
        )

    names = []
    for seed in (1, 2):
        names.append(f"test_short_{seed}")
        seqio.TaskRegistry.remove(names[-1])
        seqio.TaskRegistry.add(names[-1], source=source(seed), output_features=features)
    seqio.MixtureRegistry.remove("test_short_mix")
    seqio.MixtureRegistry.add("test_short_mix", [(n, 1.0) for n in names])
    yield "test_short_mix"
    seqio.MixtureRegistry.remove("test_short_mix")
    for name in names:
        seqio.TaskRegistry.remove(name)


def test_task_ids_stay_aligned_in_rows_that_pack_examples_of_both_tasks(short_mixture):
    converter = fc.with_task_ids(seqio.EncDecFeatureConverter(pack=True))
    dataset = mixtures.get_dataset(
        short_mixture, task_feature_lengths={"inputs": 32, "targets": 32},
        feature_converter=converter, along=("targets",), shuffle=False,
    )  # fmt: skip
    rows_of_both = 0
    for row in dataset.take(40).as_numpy_iterator():
        ids, segments = row[mixtures.TASK_IDS], row["decoder_segment_ids"]
        np.testing.assert_array_equal(ids > 0, row["decoder_loss_weights"] > 0)
        for segment in set(segments[segments > 0]):
            assert len(set(ids[segments == segment])) == 1
        rows_of_both += set(ids[ids > 0]) == {1, 2}
    assert rows_of_both > 10


def test_mlm_mixture_keeps_the_mlm_features_seqio_would_drop(mlm_mixture):
    """seqio.Mixture keeps only `input_ids` (the output feature); the mixture's examples keep the
    masked features, and task ids run along the packed predictions."""
    name, _ = mlm_mixture
    lengths = {"input_ids": 64, "masked_ids": 10}
    dropped = seqio.get_mixture_or_task(name).get_dataset(lengths, split="validation")
    assert "masked_ids" not in dropped.element_spec
    converter = fc.with_task_ids(fc.EncoderMlmFeatureConverter(pack=True))
    dataset = mixtures.get_dataset(
        name, task_feature_lengths=lengths, feature_converter=converter, along=("masked_ids",),
        dataset_split="validation", shuffle=False,
    )  # fmt: skip
    for row in dataset.take(20).as_numpy_iterator():
        ids = row[mixtures.TASK_IDS]
        np.testing.assert_array_equal(ids > 0, row["masked_weights"] > 0)
        position_segment = row["segment_ids"][row["masked_positions"]]
        for segment in set(position_segment[ids > 0]):
            assert len(set(ids[(position_segment == segment) & (ids > 0)])) == 1


def test_converters_without_a_place_for_task_ids_are_refused():
    with pytest.raises(ValueError, match="MassFeatureConverter cannot carry a mixture's task ids"):
        fc.with_task_ids(fc.MassFeatureConverter(pack=False))


def test_a_missing_feature_to_run_along_is_named(seq2seq_mixture):
    name, _ = seq2seq_mixture
    with pytest.raises(ValueError, match=r"has no feature \['masked_ids'\]"):
        mixtures.mixed_examples(name, sequence_length=LENGTHS, along=("masked_ids",))


def test_tasks_show_heads_each_mixture_example_with_its_task(seq2seq_mixture):
    name, names = seq2seq_mixture
    text = inspect.show_task(name, n=6, sequence_length=LENGTHS)
    assert text.startswith(f"mixture {name} (validation")
    shown = [line.removeprefix("task: ") for line in text.splitlines() if line.startswith("task:")]
    assert len(shown) == 6 and set(shown) <= set(names)


def test_label_fill_gives_each_example_only_its_own_tasks_labels(tiny_vocab):
    """A multi-task row's labels: the NSP task's examples carry next_sentence_label and -1 for
    the SOP label, and the other way round; token labels are -1 on every token."""
    names = _register(tiny_vocab, "test_labels_mix", ("bert_mlm_nsp", "albert_sop"), (1.0, 1.0))
    try:
        dataset = mixtures.mixed_examples(
            "test_labels_mix", sequence_length={"input_ids": 64, "masked_ids": 10},
            split="validation", shuffle=False, example_task=True,
            label_fill={"next_sentence_label": False, "sentence_order_label": False,
                        "capital": True},
        )  # fmt: skip
        seen = set()
        for ex in dataset.take(40).as_numpy_iterator():
            task = mixtures.task_names("test_labels_mix")[ex[mixtures.TASK_INDEX]]
            own, other = ("next_sentence_label", "sentence_order_label")[
                :: 1 if "nsp" in task else -1
            ]
            assert ex[own] in (0, 1) and ex[other] == -1, (task, ex[own], ex[other])
            assert ex["capital"].shape == ex["input_ids"].shape and set(ex["capital"]) == {-1}
            seen.add(task)
        assert seen == set(names)
        own = mixtures.task_features(
            "test_labels_mix", sequence_length={"input_ids": 64, "masked_ids": 10}
        )
        labels = {t: f & {"next_sentence_label", "sentence_order_label"} for t, f in own.items()}
        assert labels == {
            t: {"next_sentence_label" if "nsp" in t else "sentence_order_label"} for t in names
        }
    finally:
        seqio.MixtureRegistry.remove("test_labels_mix")
        for task in names:
            seqio.TaskRegistry.remove(task)
