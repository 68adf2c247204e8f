"""Oracle tests for XLNet's permutation-LM features."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from lmsuite.data.preprocessors import xlnet

CLS, SEP = 2, 3


def examples(length, num_chunks, seed=8, **kwargs):
    n = length - 3
    stream = np.arange(num_chunks * n + 5, dtype=np.int32) % 900 + 50  # + a dropped tail
    ds = tf.data.Dataset.from_tensor_slices({"targets": stream[None]})
    with seqio.map_seed_manager(seed):
        out = xlnet.permutation_lm(
            ds, sequence_length={"targets": length}, cls_id=CLS, sep_id=SEP, **kwargs
        )
        return stream, list(out.as_numpy_iterator())


def test_predicted_count_and_two_stream_features():
    length, num = 64, 60
    stream, out = examples(length, num)
    assert len(out) == num
    goal = round(61 / 6)  # 10 predicted tokens, the last 1/6 of the order
    runs = []
    for i, x in enumerate(out):
        ids = x["input_k"]
        split = int(np.flatnonzero(ids[:-2] == SEP)[0])
        chunk = np.concatenate([ids[:split], ids[split + 1 : -2]])
        np.testing.assert_array_equal(chunk, stream[i * 61 : (i + 1) * 61])
        assert ids[-2:].tolist() == [SEP, CLS]
        assert x["seg_id"].tolist() == [0] * (split + 1) + [1] * (length - split - 2) + [2]
        assert x["target_mask"].sum() == goal == x["input_q"].sum()
        predicted = np.flatnonzero(x["input_q"])
        np.testing.assert_array_equal(x["target_mapping"].argmax(axis=1), predicted)
        np.testing.assert_array_equal(x["target"], ids[predicted])
        assert not np.isin(predicted, [split, length - 2, length - 1]).any()
        pm = x["perm_mask"].astype(bool)
        seen_by_all = np.ones(length, bool)
        seen_by_all[predicted] = False
        seen_by_all[[split, length - 2, length - 1]] = False
        assert not pm[:, seen_by_all].any()  # everyone sees the unpredicted tokens
        assert pm[np.ix_(seen_by_all, ~seen_by_all)].all()  # which see nothing else
        sub = pm[np.ix_(predicted, predicted)]
        assert sub.diagonal().all()  # a predicted token never sees itself
        off = ~np.eye(goal, dtype=bool)
        assert (sub ^ sub.T)[off].all()  # among predicted tokens, one order
        runs.extend(np.diff(np.flatnonzero(np.diff(np.r_[0, x["input_q"], 0]))).tolist()[::2])
    # Spans: n-grams with p(n) ~ 1/n have mean 5 / H_5 = 2.19 tokens; trimming shortens some.
    assert 1.5 < np.mean(runs) < 2.3


def test_default_num_predict_for_512_and_determinism():
    _, (a,) = examples(512, 1)
    _, (b,) = examples(512, 1)
    _, (c,) = examples(512, 1, seed=9)
    assert a["target_mask"].sum() == 85 and a["target_mapping"].shape == (85, 512)
    assert a["perm_mask"].shape == (512, 512)
    assert all((a[k] == b[k]).all() for k in a)
    assert not (a["perm_mask"] == c["perm_mask"]).all()


def test_rejects_bad_perm_size():
    with pytest.raises(ValueError, match="perm_size=5 must divide"):
        examples(64, 1, perm_size=5)
