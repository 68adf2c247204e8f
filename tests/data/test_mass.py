"""MASS examples against the construction of microsoft/MASS's `restricted_mask_sent`."""

import math

import numpy as np
import pytest
import seqio
import tensorflow as tf

import lmsuite.data.tasks  # noqa: F401  (registers wiki_sample_mass)
from lmsuite.data import vocab as vocab_lib
from lmsuite.data.preprocessors import mass

MASK, EOS, VOCAB, LOW = 4, 6, 1000, 7
# k = round(n / 2), half to even, for sources of n tokens (both EOS included).
K_HALF = {3: 2, 4: 2, 5: 2, 6: 3, 7: 4, 8: 4, 9: 4, 10: 5, 11: 6, 12: 6, 13: 6, 14: 7, 15: 8}


def _dataset(docs):
    return tf.data.Dataset.from_generator(
        lambda: ({"targets": np.asarray(d, np.int32)} for d in docs),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )


def _run(docs, inputs_length, *, seed=4, **kwargs):
    kwargs = {"mask_id": MASK, "eos_id": EOS, "vocab_size": VOCAB, "random_low": LOW, **kwargs}
    with seqio.map_seed_manager(seed):
        ds = mass.mass(_dataset(docs), sequence_length={"inputs": inputs_length}, **kwargs)
        return list(ds.as_numpy_iterator())


def _source(chunk):
    return np.concatenate([[EOS], chunk, [EOS]]).astype(np.int32)


def _check_relations(source, x):
    """Checks every feature of `x` against its source; returns the fragment's (start, k)."""
    n, k = len(source), len(x["targets"])
    assert len(x["decoder_input_tokens"]) == len(x["decoder_positions"]) == k >= 1
    start = int(x["decoder_positions"][0]) + 1
    assert 1 <= start <= n - k  # position 0, the leading EOS, is never in the fragment
    np.testing.assert_array_equal(x["targets"], source[start : start + k])
    np.testing.assert_array_equal(x["decoder_input_tokens"], source[start - 1 : start + k - 1])
    np.testing.assert_array_equal(x["decoder_positions"], np.arange(start - 1, start + k - 1))
    assert len(x["inputs"]) == n and x["inputs"][0] == EOS
    outside = np.ones(n, bool)
    outside[start : start + k] = False
    np.testing.assert_array_equal(x["inputs"][outside], source[outside])
    return start, k


def test_fragment_placement_and_corruption_follow_the_reference():
    num, length = 3000, 8  # inputs length 10: n = 10, k = 5, starts 1..5
    docs = (np.arange(num * length) % 900 + 50).reshape(num, length)
    out = _run(docs, 10)
    assert len(out) == num
    starts, fragment, original = [], [], []
    for doc, x in zip(docs, out, strict=True):
        source = _source(doc)
        start, k = _check_relations(source, x)
        assert k == 5
        # The fragment reaches the final EOS exactly when it starts at n - k.
        assert (x["targets"][-1] == EOS) == (start == 5)
        starts.append(start)
        fragment.append(x["inputs"][start : start + k])
        original.append(source[start : start + k])
    fragment, original = np.concatenate(fragment), np.concatenate(original)
    total = len(fragment)

    # 20% first slot, 20% last slot, 60% uniform over the 5 slots.
    counts = np.bincount(starts, minlength=6)[1:]
    expected = np.array([0.2 + 0.6 / 5, 0.6 / 5, 0.6 / 5, 0.6 / 5, 0.2 + 0.6 / 5])
    sigma = np.sqrt(num * expected * (1 - expected))
    assert (np.abs(counts - num * expected) < 5 * sigma).all(), counts

    masked = fragment == MASK
    kept = fragment == original
    replaced = ~masked & ~kept
    # A random draw hits the original id 1 time in VOCAB - LOW.
    rates = {"masked": (masked, 0.8), "kept": (kept, 0.1 + 0.1 / (VOCAB - LOW))}
    rates["replaced"] = (replaced, 0.1 * (1 - 1 / (VOCAB - LOW)))
    for name, (hits, p) in rates.items():
        assert abs(hits.mean() - p) < 5 * math.sqrt(p * (1 - p) / total), (name, hits.mean())
    # Random ids span [LOW, VOCAB) and never hit the specials below LOW.
    random_ids = fragment[replaced]
    assert random_ids.min() >= LOW and random_ids.max() < VOCAB
    assert random_ids.min() < LOW + 20 and random_ids.max() >= VOCAB - 20


def test_fragment_length_per_source_length():
    # Three documents of each length 1..13 -> sources of n = 3..15 tokens.
    docs = [np.arange(size) + 100 * (size + 20 * rep) for rep in range(3) for size in range(1, 14)]
    out = _run(docs, 16)
    assert len(out) == len(docs)
    for doc, x in zip(docs, out, strict=True):
        n = len(doc) + 2
        _, k = _check_relations(_source(doc), x)
        assert k == K_HALF[n] == mass.fragment_length(n, 0.5), (n, k)
    # Other fractions: the tf computation agrees with the Python mirror, clipped to [1, n - 1].
    for fraction in (0.1, 0.3, 0.7, 1.0):
        out = _run(docs, 16, fragment_fraction=fraction)
        for doc, x in zip(docs, out, strict=True):
            n = len(doc) + 2
            _, k = _check_relations(_source(doc), x)
            assert k == mass.fragment_length(n, fraction) == min(max(round(n * fraction), 1), n - 1)
    assert [mass.fragment_length(n, 1.0) for n in (3, 9)] == [2, 8]
    assert [mass.fragment_length(n, 0.1) for n in (3, 15)] == [1, 2]


def test_one_token_chunk_predicts_it_and_the_final_eos():
    # n = 3, k = round(1.5) = 2: the only start is 1.
    for seed in range(5):
        (x,) = _run([[70]], 10, seed=seed)
        assert x["targets"].tolist() == [70, EOS]
        assert x["decoder_input_tokens"].tolist() == [EOS, 70]
        assert x["decoder_positions"].tolist() == [0, 1]
        assert x["inputs"][0] == EOS and len(x["inputs"]) == 3


def test_long_documents_become_chunks_each_framed_by_two_eos():
    doc = np.arange(100, 125)  # 25 tokens, inputs length 10 -> chunks of 8, 8, 8, 1
    out = _run([doc], 10)
    assert [len(x["inputs"]) for x in out] == [10, 10, 10, 3]
    for i, x in enumerate(out):
        source = _source(doc[8 * i : 8 * (i + 1)])
        _check_relations(source, x)
        start = int(x["decoder_positions"][0]) + 1
        rebuilt = x["inputs"].copy()
        rebuilt[start : start + len(x["targets"])] = x["targets"]
        np.testing.assert_array_equal(rebuilt, source)


def test_same_seed_same_examples_other_seed_other_fragments():
    docs = (np.arange(200 * 8) % 900 + 50).reshape(200, 8)
    a, b, c = _run(docs, 10, seed=1), _run(docs, 10, seed=1), _run(docs, 10, seed=2)
    for key in a[0]:
        assert all(np.array_equal(x[key], y[key]) for x, y in zip(a, b, strict=True))
    assert any(
        x["decoder_positions"][0] != y["decoder_positions"][0] for x, y in zip(a, c, strict=True)
    )


@pytest.mark.parametrize(
    "kwargs, lengths, message",
    [
        (
            {"fragment_fraction": 0.0},
            {"inputs": 10},
            r"fragment_fraction=0.0, expected in \(0, 1\]",
        ),
        (
            {"random_low": 1000},
            {"inputs": 10},
            r"random_low=1000, expected in \[0, vocab_size=1000",
        ),
        ({"eos_id": -1}, {"inputs": 10}, r"eos_id=-1, expected a token id >= 0"),
        ({"eos_id": MASK}, {"inputs": 10}, r"mask_id=4 equals eos_id=4"),
        ({}, {"inputs": 2}, r"inputs length 2, expected >= 3"),
        ({}, {"inputs": 64, "targets": 31}, r"targets length 31 < 32"),
        ({}, {"targets": 32}, r"lacks lengths for \['inputs'\]"),
    ],
)
def test_rejects_bad_arguments_naming_them(kwargs, lengths, message):
    kwargs = {"mask_id": MASK, "eos_id": EOS, "vocab_size": VOCAB, **kwargs}
    with pytest.raises(ValueError, match=message):
        mass.mass(_dataset([]), sequence_length=lengths, **kwargs)


def test_task_places_both_eos_itself_and_appends_none():
    task = seqio.get_mixture_or_task("wiki_sample_mass")
    assert not task.output_features["inputs"].add_eos
    assert not task.output_features["targets"].add_eos
    steps = [getattr(step, "func", step) for step in task.preprocessors]
    assert seqio.preprocessors.append_eos_after_trim not in steps
    ds = task.get_dataset({"inputs": 64, "targets": 32}, split="validation", shuffle=False, seed=0)
    examples = list(ds.take(40).as_numpy_iterator())
    assert len(examples) == 40
    at_end = 0
    for x in examples:
        assert {"inputs", "targets", "decoder_input_tokens", "decoder_positions"} <= set(x)
        n, k = len(x["inputs"]), len(x["targets"])
        assert 3 <= n <= 64 and x["inputs"][0] == vocab_lib.EOS_ID
        assert k == mass.fragment_length(n, 0.5) <= 32  # exactly k: nothing appended
        positions = x["decoder_positions"]
        np.testing.assert_array_equal(positions, np.arange(positions[0], positions[0] + k))
        # The decoder sees the original tokens: the one before the fragment, then targets[:-1].
        np.testing.assert_array_equal(x["decoder_input_tokens"][1:], x["targets"][:-1])
        assert x["decoder_input_tokens"][0] == x["inputs"][positions[0]]  # left of the fragment
        # EOS only where the source has it: the last target iff the fragment ends the source.
        ends_source = positions[-1] + 1 == n - 1
        assert list(x["targets"][:-1]).count(vocab_lib.EOS_ID) == 0
        assert (x["targets"][-1] == vocab_lib.EOS_ID) == ends_source
        if not ends_source:
            assert x["inputs"][-1] == vocab_lib.EOS_ID
        at_end += ends_source
    assert 0 < at_end < len(examples)  # both placements occur in 40 examples
