"""UniLMv2 PMLM data: the row layout, masking statistics against the paper's Algorithm 1, and
BERT's 80/10/10 on each masked token's [P] (UniLMv2's released code), on its [M] too with
`replace_main`."""

import itertools
import math

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import pmlm

CLS, SEP, MASK, PSEUDO = 2, 3, 4, 999
VOCAB = dict(vocab_size=1000, special_ids=(0, 1, CLS, SEP, MASK))
ALL_MASKED = dict(mask_fraction=1.0, random_fraction=0.0)
# Algorithm 1: a block is one token with probability 0.6, else an n-gram, n uniform in 2..6.
BLOCK_PROBABILITIES = {1: 0.6, **{n: 0.4 / 5 for n in range(2, 7)}}


def _examples(*, chunk, num, length_extra=0, seed=5, **fractions):
    """`num` PMLM rows over chunks of `chunk` tokens of a counting stream, and the chunks."""
    predictions = pmlm.max_masked(chunk) + length_extra
    length = chunk + 2 + 2 * predictions
    stream = (np.arange(num * chunk, dtype=np.int32) % 900) + 50
    ds = tf.data.Dataset.from_tensor_slices({"targets": stream.reshape(num, chunk)})
    with seqio.map_seed_manager(seed):
        out = list(
            pmlm.pmlm(
                ds,
                sequence_length={"input_ids": length, "masked_ids": predictions},
                cls_id=CLS,
                sep_id=SEP,
                mask_id=MASK,
                pseudo_id=PSEUDO,
                **VOCAB,
                **fractions,
            ).as_numpy_iterator()
        )
    assert len(out) == num
    return out, stream.reshape(num, chunk)


def _blocks(x):
    """Per step (1, 2, ...): the sorted main-sequence positions of its block."""
    m = int(x["masked_weights"].sum())
    steps = x["pmlm_step"][x["pseudo_positions"][:m]]
    return [np.sort(x["masked_positions"][:m][steps == k]) for k in range(1, steps.max() + 1)]


def _counts(values) -> dict[int, int]:
    values, counts = np.unique(values, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts, strict=True)}


def _exact(budget, probabilities=BLOCK_PROBABILITIES):
    """Exact law of Algorithm 1's draws for `budget`: P(masked count), P(number of blocks) and
    the expected number of blocks of each length per example."""
    reach = {(0, 0): 1.0}  # (covered so far < budget, blocks so far) -> probability
    masked, blocks, per_length = {}, {}, dict.fromkeys(probabilities, 0.0)
    for covered in range(budget):
        for k in range(budget):
            p = reach.pop((covered, k), 0.0)
            if not p:
                continue
            for length, q in probabilities.items():
                per_length[length] += p * q
                total = covered + length
                if total >= budget:
                    masked[total] = masked.get(total, 0.0) + p * q
                    blocks[k + 1] = blocks.get(k + 1, 0.0) + p * q
                else:
                    reach[(total, k + 1)] = reach.get((total, k + 1), 0.0) + p * q
    return masked, blocks, per_length


def test_budget_and_widths():
    assert pmlm.masked_budget(20) == 3 and pmlm.masked_budget(510) == 77
    assert pmlm.max_masked(20) == 8 and pmlm.max_masked(3) == 3
    assert pmlm.default_predictions(128) == 19
    assert pmlm.chunk_length(128, 19) == 88 and pmlm.max_masked(88) == 19
    # The base run: 512-token [CLS] x [SEP] rows (the paper's length) + 2 x 82 appended slots.
    assert pmlm.default_predictions(676) == 82 and pmlm.chunk_length(676, 82) == 510
    with pytest.raises(ValueError, match="use masked_ids = 19"):
        pmlm.pmlm(
            tf.data.Dataset.from_tensors({"targets": tf.range(5)}),
            sequence_length={"input_ids": 128, "masked_ids": 10},
            cls_id=CLS,
            sep_id=SEP,
            mask_id=MASK,
            pseudo_id=PSEUDO,
            **VOCAB,
        )
    with pytest.raises(ValueError, match="mask_fraction \\+ random_fraction = 1.1 exceeds 1"):
        pmlm.pmlm(
            tf.data.Dataset.from_tensors({"targets": tf.range(5)}),
            sequence_length={"input_ids": 128},
            cls_id=CLS,
            sep_id=SEP,
            mask_id=MASK,
            pseudo_id=PSEUDO,
            **VOCAB,
            mask_fraction=0.9,
            random_fraction=0.2,
        )


def test_layout_positions_steps_and_targets():
    out, chunks = _examples(chunk=30, num=60, length_extra=2, **ALL_MASKED)
    for x, chunk in zip(out, chunks, strict=True):
        n, ids, m = len(chunk), x["input_ids"], int(x["masked_weights"].sum())
        assert len(ids) == n + 2 + 2 * m and m >= pmlm.masked_budget(n)
        main, positions = ids[: n + 2], x["masked_positions"][:m]
        assert main[0] == CLS and main[-1] == SEP
        np.testing.assert_array_equal(x["masked_ids"][:m], chunk[positions - 1])
        unmasked = np.setdiff1d(np.arange(1, n + 1), positions)
        assert (main[positions] == MASK).all()  # mask_fraction 1: never kept, never random
        np.testing.assert_array_equal(main[unmasked], chunk[unmasked - 1])
        np.testing.assert_array_equal(x["position_ids"][: n + 2], np.arange(n + 2))
        assert not x["pmlm_step"][: n + 2].any() and not x["pmlm_pseudo"][: n + 2].any()
        # Each [P] carries its target's position; so does the copy of that target.
        pseudo = x["pseudo_positions"][:m]
        assert (ids[pseudo] == PSEUDO).all() and x["pmlm_pseudo"][pseudo].all()
        np.testing.assert_array_equal(x["position_ids"][pseudo], positions)
        for i in range(m):
            copy = np.flatnonzero(
                (x["pmlm_step"] == x["pmlm_step"][pseudo[i]])
                & (x["pmlm_pseudo"] == 0)
                & (x["position_ids"] == positions[i])
            )
            assert copy.size == 1 and copy[0] >= n + 2 and ids[copy[0]] == chunk[positions[i] - 1]
        # Steps run 1..K in order: per step its [P]s, then its copies; a block is one span.
        appended_steps = x["pmlm_step"][n + 2 :]
        assert (np.diff(appended_steps) >= 0).all() and appended_steps[0] == 1
        for k, block in enumerate(_blocks(x), start=1):
            assert (np.diff(block) == 1).all()
            roles = x["pmlm_pseudo"][n + 2 :][appended_steps == k]
            np.testing.assert_array_equal(roles, [1] * len(block) + [0] * len(block))


def test_masking_statistics_match_algorithm_1():
    num, n = 1500, 20  # budget ceil(0.15 * 20) = 3: blocks until they cover >= 3 tokens
    out, _ = _examples(chunk=n, num=num)
    masked_law, blocks_law, per_length = _exact(pmlm.masked_budget(n))
    assert abs(sum(masked_law.values()) - 1) < 1e-12 and abs(sum(blocks_law.values()) - 1) < 1e-12

    # Share of masked tokens: the exact mean (15% plus the last block's overshoot) within
    # 5 standard errors; the overshoot is what Algorithm 1's "until |M| >= 0.15 |x|" gives.
    m = np.array([x["masked_weights"].sum() for x in out])
    mean = sum(k * p for k, p in masked_law.items())
    sd = math.sqrt(sum(k * k * p for k, p in masked_law.items()) - mean**2)
    assert abs(m.mean() - mean) < 5 * sd / math.sqrt(num), (m.mean(), mean)
    assert 0.15 <= mean / n <= 0.15 + 5 / n

    def chi_square(counts, law):
        return sum((counts.get(k, 0) - num * p) ** 2 / (num * p) for k, p in law.items())

    # Number of masked tokens and of blocks: Pearson chi-square against the exact laws
    # (critical values at p = 0.001: 6 dof 22.5, 2 dof 13.8).
    assert set(m.astype(int)) <= set(masked_law)
    assert chi_square(_counts(m.astype(int)), masked_law) < 22.5
    blocks = [_blocks(x) for x in out]
    assert chi_square(_counts([len(b) for b in blocks]), blocks_law) < 13.8

    # Block lengths: the mean number of blocks of each length per example (exact) within 5
    # Poisson standard errors. Adjacent blocks are separate steps, so lengths are exact.
    lengths = np.bincount([len(s) for b in blocks for s in b], minlength=7)
    for length, expected in per_length.items():
        assert abs(lengths[length] - num * expected) < 5 * math.sqrt(num * expected) + 1, length

    # Where blocks land: position i and position n + 1 - i are masked equally often (Algorithm 1
    # draws each start uniformly; the last block drawn, likelier long, may land anywhere). Over
    # the 10 mirrored pairs, sum (c_i - c_mirror)^2 / (c_i + c_mirror) is chi-square, 10 dof
    # (p = 0.001: 29.6); always placing the last block rightmost gave 135.
    covered = np.zeros(n + 2)
    for x in out:
        np.add.at(covered, x["masked_positions"][: int(x["masked_weights"].sum())], 1)
    left, right = covered[1 : n // 2 + 1], covered[n : n // 2 : -1]
    assert ((left - right) ** 2 / (left + right)).sum() < 29.6, covered

    # Factorization order: over 3-block examples, which left-to-right block goes first,
    # second, third is uniform over the 6 permutations (chi-square, 5 dof, p = 0.001: 20.5).
    orders = []
    for b in blocks:
        if len(b) == 3:
            starts = [int(s[0]) for s in b]  # per step
            orders.append(tuple(np.argsort(np.argsort(starts))))
    perms = list(itertools.permutations(range(3)))
    counts = np.array([orders.count(p) for p in perms])
    expected = len(orders) / 6
    assert len(orders) > 200 and ((counts - expected) ** 2 / expected).sum() < 20.5, counts


@pytest.mark.parametrize("replace_main", [False, True])
def test_pseudo_tokens_follow_80_10_10(replace_main):
    out, _ = _examples(chunk=40, num=400, seed=11, replace_main=replace_main)
    shown, pseudo, originals = [], [], []
    for x in out:
        m = int(x["masked_weights"].sum())
        shown.append(x["input_ids"][x["masked_positions"][:m]])
        pseudo.append(x["input_ids"][x["pseudo_positions"][:m]])
        originals.append(x["masked_ids"][:m])
    shown, pseudo, originals = map(np.concatenate, (shown, pseudo, originals))
    masked = pseudo == PSEUDO
    if replace_main:  # one draw decides both: [M] goes with [P], else the same value
        np.testing.assert_array_equal(shown == MASK, masked)
        np.testing.assert_array_equal(shown[~masked], pseudo[~masked])
    else:  # the main sequence never shows a masked token's original (nor a random piece)
        assert (shown == MASK).all()
    replaced = ~masked & (pseudo != originals)
    pool = np.setdiff1d(np.arange(1000), [*VOCAB["special_ids"], PSEUDO])
    assert np.isin(pseudo[replaced], pool).all()  # never a special id, [M] or [P]
    # Shares against 0.8 / 0.1 / 0.1 (a random draw equal to the original counts as kept),
    # each within 5 binomial standard errors.
    n = len(pseudo)
    same = 0.1 / len(pool)
    for share, p in [(masked, 0.8), (replaced, 0.1 - same), (pseudo == originals, 0.1 + same)]:
        assert abs(share.sum() - n * p) < 5 * math.sqrt(n * p * (1 - p)), (share.mean(), p)
    assert n > 2000
