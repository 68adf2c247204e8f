"""Oracle tests for ERNIE knowledge masking and Chinese whole-word masking."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import ernie, mlm
from tests.data.ragged import ragged

CLS, SEP, MASK = 2, 3, 4
SPECIALS = (0, 1, 2, 3, 4, 5, 6)
SPEC = mlm.MlmSpec(mask_id=MASK, vocab_size=5000, special_ids=SPECIALS, max_predictions=30)
TAGS = ["nr", "ns", "nt", "v", "n", "a"]


def sentences(num, *, seed):
    """Segmented sentences: words of 1-3 characters, tags with runs of entity words."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        num_words = int(rng.integers(3, 40))
        words = [
            rng.integers(7, 5000, size=int(rng.integers(1, 4))).tolist() for _ in range(num_words)
        ]
        tags, phrase = [], []
        while len(tags) < num_words:
            run = int(rng.integers(1, 4))
            tags += [TAGS[int(rng.integers(0, len(TAGS)))]] * run
            phrase += [1] + [0] * (run - 1)
        out.append((words, tags[:num_words], phrase[:num_words]))
    return out


def dataset(rows):
    features = {
        "word_ids": ragged([w for w, _, _ in rows], np.int32, ragged_rank=2),
        "word_tags": ragged([t for _, t, _ in rows], object, ragged_rank=1),
        "phrase_starts": ragged([p for _, _, p in rows], np.int32, ragged_rank=1),
    }
    return tf.data.Dataset.from_tensor_slices(features)


def expected_units(words, tags, phrase, level):
    """Token positions (after [CLS]) of each unit, from a plain-Python reading of the rule."""
    units, position = [], 1
    for w, (word, tag) in enumerate(zip(words, tags, strict=True)):
        if level == "word":
            new = True
        elif level == "phrase":
            new = phrase[w] == 1
        else:
            new = not (tag in ("nr", "ns", "nt") and w > 0 and tags[w - 1] == tag)
        if new or not units:
            units.append([])
        units[-1] += list(range(position, position + len(word)))
        position += len(word)
    return units


def masked(rows, *, level, spec, seed=5):
    ds = (
        dataset(rows)
        .enumerate()
        .map(
            lambda i, f: ernie.mask_ernie(
                f,
                seed=tf.stack([tf.constant(seed, tf.int64), i]),
                spec=spec,
                level=level,
                cls_id=CLS,
                sep_id=SEP,
                max_seq_length=512,
            ),
            num_parallel_calls=2,
        )
    )
    return list(ds.as_numpy_iterator())


WIDE = mlm.MlmSpec(mask_id=MASK, vocab_size=5000, special_ids=SPECIALS, max_predictions=512)


@pytest.mark.parametrize("level", ["word", "phrase", "entity"])
def test_units_are_masked_whole(level):
    rows = sentences(80, seed={"word": 0, "phrase": 1, "entity": 2}[level])
    multi_token_units_masked = 0
    for (words, tags, phrase), out in zip(rows, masked(rows, level=level, spec=WIDE), strict=True):
        flat = [t for w in words for t in w]
        k = int(out["masked_weights"].sum())
        chosen = set(out["masked_positions"][:k].tolist())
        chosen_tokens = np.array(flat)[np.array(sorted(chosen), int) - 1]
        np.testing.assert_array_equal(out["masked_ids"][:k], chosen_tokens)
        for unit in expected_units(words, tags, phrase, level):
            inside = [p in chosen for p in unit]
            assert all(inside) or not any(inside), (level, unit)
            multi_token_units_masked += all(inside) and len(unit) > 3
    if level != "word":
        assert multi_token_units_masked > 0  # multi-word units really get masked together


def test_units_are_selected_independently_with_probability_0_15():
    # Reference: PaddlePaddle ERNIE 1.0 batching.py mask(): one uniform draw per unit (at its
    # first token) <= 0.15 selects the unit, whatever its length and however many others are
    # selected; then each token of a selected unit is [MASK] / random / kept with 0.8 / 0.1 /
    # 0.1 from its own draw. So: selected units ~ Binomial(units, 0.15), for the long units
    # (> 3 tokens) alone too, and the per-token replacement counts are multinomial.
    rows = sentences(3500, seed=11)
    outs = masked(rows, level="entity", spec=WIDE)
    units = selected = long_units = long_selected = predictions = masks = kept = 0
    for (words, tags, phrase), out in zip(rows, outs, strict=True):
        k = int(out["masked_weights"].sum())
        chosen = set(out["masked_positions"][:k].tolist())
        for unit in expected_units(words, tags, phrase, "entity"):
            hit = unit[0] in chosen
            units, selected = units + 1, selected + hit
            if len(unit) > 3:
                long_units, long_selected = long_units + 1, long_selected + hit
        new = out["input_ids"][out["masked_positions"][:k]]
        predictions += k
        masks += int((new == MASK).sum())
        kept += int((new == out["masked_ids"][:k]).sum())
    assert predictions >= 20_000 and long_units >= 2_000
    for hits, n in ((selected, units), (long_selected, long_units)):
        sigma = np.sqrt(0.15 * 0.85 / n)
        assert abs(hits / n - 0.15) < 5 * sigma, (hits, n)
    for count, p in ((masks, 0.8), (kept, 0.1)):
        sigma = np.sqrt(p * (1 - p) / predictions)
        assert abs(count / predictions - p) < 5 * sigma, (count, predictions, p)


def test_overflowing_selection_keeps_whole_units_within_the_width():
    # A width far below 0.15 * n: the selected units that do not fit are dropped whole.
    spec = mlm.MlmSpec(mask_id=MASK, vocab_size=5000, special_ids=SPECIALS, max_predictions=4)
    rows = sentences(200, seed=3)
    full = 0
    for (words, tags, phrase), out in zip(
        rows, masked(rows, level="phrase", spec=spec), strict=True
    ):
        k = int(out["masked_weights"].sum())
        assert k <= 4
        chosen = set(out["masked_positions"][:k].tolist())
        for unit in expected_units(words, tags, phrase, "phrase"):
            inside = [p in chosen for p in unit]
            assert all(inside) or not any(inside)
        full += k == 4
    assert full > 0


def test_ernie_inputs_example():
    f = {
        "word_ids": tf.ragged.constant([[10, 11], [12], [13, 14]]),
        "word_tags": tf.constant(["nr", "nr", "v"]),
    }
    out = ernie.ernie_inputs(f, level="entity", cls_id=CLS, sep_id=SEP, max_seq_length=16)
    np.testing.assert_array_equal(out["input_ids"], [2, 10, 11, 12, 13, 14, 3])
    np.testing.assert_array_equal(out["word_starts"], [1, 1, 0, 1, 1, 0, 1])
    np.testing.assert_array_equal(out["unit_starts"], [1, 1, 0, 0, 1, 0, 1])
    short = ernie.ernie_inputs(f, level="word", cls_id=CLS, sep_id=SEP, max_seq_length=5)
    np.testing.assert_array_equal(short["input_ids"], [2, 10, 11, 12, 3])


def test_bad_level_and_missing_phrases_fail_loudly():
    f = {"word_ids": tf.ragged.constant([[10]]), "word_tags": tf.constant(["v"])}
    with pytest.raises(ValueError, match="level"):
        ernie.ernie_inputs(f, level="clause", cls_id=CLS, sep_id=SEP, max_seq_length=8)
    with pytest.raises(ValueError, match="phrase_starts"):
        ernie.ernie_inputs(f, level="phrase", cls_id=CLS, sep_id=SEP, max_seq_length=8)


@pytest.mark.parametrize("level", ["word", "phrase", "entity"])
def test_passage_inputs_are_each_examples_ernie_inputs(level):
    # Batches of 8 over 30 examples (the last batch short), a passed-through feature, rows cut
    # at the length, and entity runs that a batch's flattening would carry into the next
    # example's first word.
    rows = sentences(30, seed=31)
    rows[3] = ([], [], [])  # an example without words
    for i in range(5, 30, 2):  # the first word continues the previous example's last tag
        rows[i][1][0] = rows[i - 1][1][-1] = "ns"
    features = dataset(rows).enumerate().map(lambda i, f: {**f, "index": i})
    kwargs = {"level": level, "cls_id": CLS, "sep_id": SEP, "max_seq_length": 24}
    want = [ernie.ernie_inputs(f, **kwargs) for f in features]
    got = list(ernie.passage_inputs(features, batch_size=8, **kwargs).as_numpy_iterator())
    assert len(got) == len(want) == 30
    for (words, tags, phrase), w, g in zip(rows, want, got, strict=True):
        assert sorted(g) == sorted(w) == ["index", "input_ids", "unit_starts", "word_starts"]
        for key in w:
            np.testing.assert_array_equal(g[key], w[key], key)
        # The rule read plainly: the example's pieces, cut to 22, between the specials.
        flat = [t for word in words for t in word]
        firsts = [int(j == 0) for word in words for j in range(len(word))]
        unit_firsts = [0] * (len(flat) + 1)
        for unit in expected_units(words, tags, phrase, level):
            unit_firsts[unit[0]] = 1
        assert g["input_ids"].tolist() == [CLS, *flat[:22], SEP]
        assert g["word_starts"].tolist() == [1, *firsts[:22], 1]
        assert g["unit_starts"].tolist() == [1, *unit_firsts[1:23], 1]
    assert got[3]["input_ids"].tolist() == [CLS, SEP]
    assert sum(len(g["input_ids"]) == 24 for g in got) > 5


@pytest.mark.parametrize("level", ["word", "entity"])
def test_dynamic_masking_of_groups_gives_each_row_its_own_mask(level):
    """`ernie_dynamic_mlm` builds rows in batches, draws row by row and masks groups of rows:
    under the same SeqIO seeds each row is what `mask_ernie` alone makes of it (narrow width:
    some rows take the fit-or-skip path)."""
    rows = sentences(75, seed=21)
    narrow = mlm.MlmSpec(mask_id=MASK, vocab_size=5000, special_ids=SPECIALS, max_predictions=4)
    kwargs = {"level": level, "cls_id": CLS, "sep_id": SEP, "max_seq_length": 40}
    with seqio.map_seed_manager(3):
        alone = mlm.dynamic_masking(dataset(rows), mask_fn=ernie.mask_ernie, spec=narrow, **kwargs)
        alone = list(alone.as_numpy_iterator())
    with seqio.map_seed_manager(3):
        grouped = list(
            ernie.ernie_dynamic_mlm(dataset(rows), spec=narrow, **kwargs).as_numpy_iterator()
        )
    assert len(grouped) == len(alone) == 75
    for a, g in zip(alone, grouped, strict=True):
        assert sorted(a) == sorted(g)
        for key in a:
            np.testing.assert_array_equal(g[key], a[key], key)
    assert sum(int(a["masked_weights"].sum()) for a in alone) > 75
    assert sum(int(a["masked_weights"].sum()) == 4 for a in alone) > 5  # at the width
