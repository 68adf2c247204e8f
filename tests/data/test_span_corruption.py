"""Oracle tests for T5 span corruption and i.i.d. denoising."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import span_corruption as sc

VOCAB_SIZE = 32100
SENTINELS = [VOCAB_SIZE - 1 - i for i in range(100)]
IS_SENTINEL = frozenset(SENTINELS)
EOS = 6


def documents(num_docs, doc_length, start=10):
    """Documents of distinct ids, so every chunk can be located in the stream."""
    return [
        np.arange(start + i * doc_length, start + (i + 1) * doc_length) for i in range(num_docs)
    ]


def as_dataset(docs):
    return tf.data.Dataset.from_generator(
        lambda: ({"targets": d} for d in docs),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )


def run(fn, docs, seed=7, **kwargs):
    with seqio.map_seed_manager(seed):
        return list(fn(as_dataset(docs), sentinel_ids=SENTINELS, **kwargs).as_numpy_iterator())


def reconstruct(inputs, targets):
    """Re-inserts each sentinel's target run into the inputs."""
    runs, current = {}, None
    for t in targets.tolist():
        if t in IS_SENTINEL:
            current = t
            runs[current] = []
        else:
            runs[current].append(t)
    out = []
    for t in inputs.tolist():
        out.extend(runs[t] if t in IS_SENTINEL else [t])
    return np.array(out)


@pytest.mark.parametrize(
    "inputs_length, raw, targets",
    [(512, 568, 114), (128, 141, 29), (256, 284, 58), (1024, 1137, 229)],
)
def test_random_spans_helper_matches_t5_table(inputs_length, raw, targets):
    assert sc.random_spans_helper(inputs_length=inputs_length) == (raw, targets)


def test_full_chunks_have_exact_counts_and_sentinel_structure():
    docs = documents(6, 600)
    out = run(sc.span_corruption, docs, sequence_length={"inputs": 512, "targets": 114}, eos_id=EOS)
    stream = np.concatenate(docs)
    assert len(out) == 7  # 6 full chunks of 568 from 3600 tokens, plus a 192-token tail
    for i, ex in enumerate(out[:6]):
        inputs, targets = ex["inputs"], ex["targets"]
        assert (len(inputs), len(targets)) == (512, 114)
        assert inputs[-1] == EOS and targets[-1] == EOS
        body_in, body_tg = inputs[:-1], targets[:-1]
        sentinels_in = [t for t in body_in.tolist() if t in IS_SENTINEL]
        assert sentinels_in == SENTINELS[:28]  # 28 spans, numbered in order
        assert sum(t not in IS_SENTINEL for t in body_tg.tolist()) == 85  # 85 noise tokens
        assert body_in[-1] in SENTINELS  # inputs end with a sentinel, before EOS
        assert body_tg[0] == SENTINELS[0]  # targets start with <extra_id_0>
        chunk = stream[i * 568 : (i + 1) * 568]
        np.testing.assert_array_equal(reconstruct(body_in, body_tg), chunk)
    # The tail: 192 tokens -> round(28.8) = 29 noise tokens in round(29 / 3) = 10 spans.
    tail_in, tail_tg = out[6]["inputs"][:-1], out[6]["targets"][:-1]
    assert (len(tail_in), len(tail_tg)) == (192 - 29 + 10, 29 + 10)
    np.testing.assert_array_equal(reconstruct(tail_in, tail_tg), stream[6 * 568 :])


def test_without_eos_inputs_end_with_sentinel():
    out = run(sc.span_corruption, documents(2, 300), sequence_length={"inputs": 128, "targets": 29})
    assert all(ex["inputs"][-1] in SENTINELS for ex in out)
    assert [len(ex["inputs"]) for ex in out[:4]] == [127] * 4  # 141 - 21 + 7
    assert [len(ex["targets"]) for ex in out[:4]] == [28] * 4


def test_noise_mask_is_uniform_over_span_layouts():
    # length 8, density 0.25, mean 1: 2 single-token noise spans; the 6 other tokens split into
    # 2 non-empty runs in 5 ways, all equally likely; the mask always ends with noise.
    rows = 5000
    mask = sc.random_spans_noise_mask(
        rows=rows, length=8, noise_density=0.25, mean_noise_span_length=1.0, seed=[3, 4]
    ).numpy()
    assert (mask.sum(axis=1) == 2).all() and mask[:, -1].all()
    _, counts = np.unique(mask.astype(int), axis=0, return_counts=True)
    assert len(counts) == 5
    sigma = np.sqrt(rows * 0.2 * 0.8)
    assert np.abs(counts - rows / 5).max() < 5 * sigma


def test_same_seed_same_examples_other_seed_other_masks():
    docs = documents(3, 400)
    kw = dict(sequence_length={"inputs": 128, "targets": 29})
    a, b, c = (
        run(sc.span_corruption, docs, 1, **kw),
        run(sc.span_corruption, docs, 1, **kw),
        run(sc.span_corruption, docs, 2, **kw),
    )
    assert all((x["inputs"] == y["inputs"]).all() for x, y in zip(a, b, strict=True))
    assert any(not np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, c, strict=True))


def test_shards_are_disjoint_and_each_reconstructs_its_own_documents():
    docs = documents(8, 300)
    kw = dict(sequence_length={"inputs": 128, "targets": 29})
    seen = []
    for index in range(2):
        shard_docs = docs[index::2]
        with seqio.map_seed_manager(5):
            ds = as_dataset(docs).shard(2, index)
            out = list(sc.span_corruption(ds, sentinel_ids=SENTINELS, **kw).as_numpy_iterator())
        rebuilt = np.concatenate([reconstruct(x["inputs"], x["targets"]) for x in out])
        np.testing.assert_array_equal(rebuilt, np.concatenate(shard_docs))
        seen.append(set(rebuilt.tolist()))
    assert not seen[0] & seen[1]


def test_rejects_short_targets_and_too_few_sentinels():
    with pytest.raises(ValueError, match="targets length 100 < 114"):
        sc.span_corruption(
            as_dataset([]), sequence_length={"inputs": 512, "targets": 100}, sentinel_ids=SENTINELS
        )
    with pytest.raises(ValueError, match="28 spans"):
        sc.span_corruption(
            as_dataset([]), sequence_length={"inputs": 512, "targets": 114}, sentinel_ids=[1, 2]
        )


def test_iid_denoising_density_and_reconstruction():
    docs = documents(10, 500)
    out = run(sc.iid_denoising, docs, sequence_length={"inputs": 256, "targets": 256})
    stream, start, noise = np.concatenate(docs), 0, 0
    for ex in out:
        chunk = reconstruct(ex["inputs"], ex["targets"])
        np.testing.assert_array_equal(chunk, stream[start : start + len(chunk)])
        start += len(chunk)
        noise += sum(t not in IS_SENTINEL for t in ex["targets"].tolist())
        # Sentinels are numbered in order in both features, so they stay aligned; a chunk
        # ending with non-noise closes its targets with the next one.
        in_s = [t for t in ex["inputs"].tolist() if t in IS_SENTINEL]
        tg_s = [t for t in ex["targets"].tolist() if t in IS_SENTINEL]
        closed = ex["inputs"][-1] not in IS_SENTINEL
        assert in_s == SENTINELS[: len(in_s)]
        assert tg_s == SENTINELS[: len(in_s) + closed]
    assert start == len(stream) == 5000 and len(out[0]["inputs"]) < 255
    sigma = np.sqrt(5000 * 0.15 * 0.85)
    assert abs(noise - 0.15 * 5000) < 5 * sigma


def t5_noise_span_to_unique_sentinel(tokens, mask):
    """T5's function, from its definition: the k-th run of mask=True becomes <extra_id_k>."""
    prev = np.concatenate([[False], mask[:-1]])
    first = mask & ~prev
    run = np.cumsum(first) - 1
    out = np.where(first, np.asarray(SENTINELS)[np.maximum(run, 0)], tokens)
    return out[~(mask & prev)]


def t5_nonnoise_span_to_unique_sentinel(tokens, mask):
    return t5_noise_span_to_unique_sentinel(tokens, ~mask)


def iid_chunks_and_masks(chunk_length=9, noise_density=0.3, seed=3):
    """i.i.d. examples with their chunks and noise masks, recovered from the distinct ids."""
    docs = documents(25, 200)
    out = run(
        sc.iid_denoising,
        docs,
        seed=seed,
        sequence_length={"inputs": chunk_length + 1, "targets": chunk_length + 1},
        noise_density=noise_density,
    )
    stream = np.concatenate(docs)
    chunks = [stream[i : i + chunk_length] for i in range(0, len(stream), chunk_length)]
    assert len(out) == len(chunks)
    masks = [~np.isin(chunk, ex["inputs"]) for chunk, ex in zip(chunks, out, strict=True)]
    return out, chunks, masks


def test_iid_equals_t5_where_the_mask_starts_with_non_noise():
    out, chunks, masks = iid_chunks_and_masks()
    cases = {"ends with noise": 0, "ends with non-noise": 0, "no noise": 0}
    for ex, chunk, mask in zip(out, chunks, masks, strict=True):
        if mask[0]:
            continue
        np.testing.assert_array_equal(ex["inputs"], t5_noise_span_to_unique_sentinel(chunk, mask))
        np.testing.assert_array_equal(
            ex["targets"], t5_nonnoise_span_to_unique_sentinel(chunk, mask)
        )
        if not mask.any():
            cases["no noise"] += 1
        else:
            cases["ends with noise" if mask[-1] else "ends with non-noise"] += 1
    # 556 chunks of 9 at density 0.3: the rarest case, no noise at all, is expected 22 times.
    assert min(cases.values()) >= 10, cases


def test_iid_keeps_sentinels_aligned_where_the_mask_starts_with_noise():
    # lmsuite's targets put <k> before noise run k; T5's put <k> after it. So lmsuite's are <0>
    # then T5's with every sentinel renumbered one up; the inputs are T5's.
    out, chunks, masks = iid_chunks_and_masks()
    renumber = {s: SENTINELS[i + 1] for i, s in enumerate(SENTINELS[:-1])}
    seen = {True: 0, False: 0}
    for ex, chunk, mask in zip(out, chunks, masks, strict=True):
        if not mask[0]:
            continue
        t5_targets = t5_nonnoise_span_to_unique_sentinel(chunk, mask)
        np.testing.assert_array_equal(ex["inputs"], t5_noise_span_to_unique_sentinel(chunk, mask))
        shifted = [SENTINELS[0]] + [renumber.get(t, t) for t in t5_targets.tolist()]
        assert ex["targets"].tolist() == shifted
        assert ex["targets"].tolist() != t5_targets.tolist()
        seen[bool(mask[-1])] += 1
    assert min(seen.values()) >= 10, seen
