"""TUPE (position_type="tupe"): the attention probabilities of every layer against a numpy
restatement of the paper's formula (Ke, He, Liu 2021, eq. (5)-(7) with the [CLS] reset of §3.2)
and of T5's buckets, one positional term shared by the layers, positions as the only source of
order, packed examples, jit, and the config's checks."""

import dataclasses
import math

import flax.linen as nn
import jax
import numpy as np
import pytest

from lmsuite.layers.positions import relative_buckets, t5_relative_bucket
from lmsuite.models import ModelConfig, Transformer, TupeOptions

TINY = dict(
    vocab_size=50,
    d_model=12,
    num_heads=2,
    d_ff=20,
    num_layers=2,
    max_length=40,
    position_type="tupe",
    type_vocab_size=0,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    init_stddev=0.3,
    norm_eps=1e-5,
    # 8 buckets up to distance 20: exact for 0 and 1, log buckets from 2, the last one shared.
    tupe=TupeOptions(relative_buckets=8, relative_max_distance=20),
)
L = 24  # distances up to 23 > relative_max_distance


def _t5_bucket_numpy(relative, *, num_buckets, max_distance):
    """T5's _relative_position_bucket (mesh_tensorflow, bidirectional), restated: relative is
    key - query; float32 logs as TF's."""
    n = -np.asarray(relative)
    half = num_buckets // 2
    ret = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    max_exact = half // 2
    log_ratio = np.log(np.maximum(n, 1).astype(np.float32) / np.float32(max_exact))
    large = max_exact + (
        log_ratio / np.float32(math.log(max_distance / max_exact)) * np.float32(half - max_exact)
    ).astype(np.int64)
    large = np.minimum(large, half - 1)
    return ret + np.where(n < max_exact, n, large)


def _layer_norm(x, p, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _dense(x, p):
    return np.einsum("...d,dhk->...hk", x, p["kernel"]) + p["bias"]


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _paper_logits(cfg, params, x_LD, layer):
    """alpha_ij = (x_i W^Q)(x_j W^K)^T / sqrt(2d) + (p_i U^Q)(p_j U^K)^T / sqrt(2d) + b_{j-i},
    per head, with [CLS]'s row and column reset (H, L, L)."""
    pos, att = params["encoder"]["untied_positions"], params["encoder"][layer]["attention"]
    k = cfg.head_width
    length = x_LD.shape[0]
    q, kk = _dense(x_LD, att["query"]), _dense(x_LD, att["key"])
    content = np.einsum("ihk,jhk->hij", q, kk) / math.sqrt(2 * k)
    # p_i: row i + 1 of the table (rows 0 and 1 parametrise the [CLS] thetas, as the reference)
    p = _layer_norm(pos["embedding"], pos["norm"], cfg.norm_eps)
    pq, pk = _dense(p, pos["query"]), _dense(p, pos["key"])
    absolute = np.einsum("ihk,jhk->hij", pq[1 : length + 1], pk[1 : length + 1]) / math.sqrt(2 * k)
    cls_to_others = np.einsum("hk,hk->h", pq[0], pk[0]) / math.sqrt(2 * k)
    others_to_cls = np.einsum("hk,hk->h", pq[1], pk[1]) / math.sqrt(2 * k)
    absolute[:, :, 0] = others_to_cls[:, None]
    absolute[:, 0, :] = cls_to_others[:, None]
    r = cfg.tupe.relative_buckets
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    bucket = _t5_bucket_numpy(j - i, num_buckets=r, max_distance=cfg.tupe.relative_max_distance)
    bucket[:, 0] = r  # others -> [CLS]: the extra bucket
    bucket[0, :] = r // 2  # [CLS] -> others: the bucket no distance uses
    relative = np.transpose(pos["rel_embedding"][bucket], (2, 0, 1))
    return content + absolute + relative


def _random_params(model, ids, seed=1):
    """Initialised params with every untied-positions leaf (biases, norm) made non-trivial."""
    params = nn.unbox(model.init(jax.random.key(0), input_ids=ids)["params"])
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    rng = np.random.default_rng(seed)
    pos = params["encoder"]["untied_positions"]
    params["encoder"]["untied_positions"] = jax.tree.map(
        lambda x: x + rng.normal(0, 0.3, x.shape), pos
    )
    return params


def test_buckets_are_t5s():
    """`relative_buckets` reuses `t5_relative_bucket`; both against the numpy restatement."""
    rel = np.arange(-150, 151)
    np.testing.assert_array_equal(
        t5_relative_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128),
        _t5_bucket_numpy(rel, num_buckets=32, max_distance=128),
    )
    lookup = relative_buckets(40, num_buckets=8, max_distance=20)
    np.testing.assert_array_equal(
        lookup, _t5_bucket_numpy(np.arange(-39, 40), num_buckets=8, max_distance=20)
    )
    assert 4 not in lookup  # R // 2 is free for the [CLS] row


def test_attention_probabilities_match_the_papers_formula():
    cfg = ModelConfig(**TINY)
    model = Transformer(cfg)
    ids = np.random.default_rng(0).integers(1, 50, (2, L))
    params = _random_params(model, ids)
    _, state = model.apply(
        {"params": params},
        input_ids=ids,
        mutable=["intermediates"],
        capture_intermediates=True,
    )
    inter = state["intermediates"]
    inputs = {
        "layers_0": inter["embedder"]["__call__"][0],
        "layers_1": inter["encoder"]["layers_0"]["__call__"][0],
    }
    for layer, x_BLD in inputs.items():
        got = inter["encoder"][layer]["attention"]["attention_weights"][0]
        for b in range(2):
            want = _softmax(_paper_logits(cfg, params, np.asarray(x_BLD[b], np.float64), layer))
            np.testing.assert_allclose(got[b], want, atol=2e-5)


def test_one_positional_term_for_all_layers():
    cfg = ModelConfig(**TINY)
    params = Transformer(cfg).init(jax.random.key(0), input_ids=np.ones((1, 6), np.int32))
    params = params["params"]
    assert set(params["encoder"]) == {"untied_positions", "layers_0", "layers_1"}
    assert set(params["encoder"]["untied_positions"]) == {
        "embedding",
        "norm",
        "query",
        "key",
        "rel_embedding",
    }
    for layer in ("layers_0", "layers_1"):
        assert set(params["encoder"][layer]["attention"]) == {"query", "key", "value", "out"}
    assert "position_embedder" not in params["embedder"]  # no positions added to the words
    tupe_a = ModelConfig(**TINY).replace(tupe=TupeOptions(relative_bias=False))
    params = Transformer(tupe_a).init(jax.random.key(0), input_ids=np.ones((1, 6), np.int32))
    assert "rel_embedding" not in params["params"]["encoder"]["untied_positions"]


@pytest.mark.parametrize("zero_positions", [True, False])
def test_order_enters_through_the_positional_term_only(zero_positions):
    """With the positional parameters zeroed (TUPE-A), permuting the tokens after [CLS] permutes
    the outputs; with them, it does not."""
    cfg = ModelConfig(**TINY).replace(tupe=TupeOptions(relative_bias=False))
    model = Transformer(cfg)
    ids = np.random.default_rng(0).integers(1, 50, (1, 10))
    params = _random_params(model, ids)
    if zero_positions:
        pos = params["encoder"]["untied_positions"]
        params["encoder"]["untied_positions"] = jax.tree.map(np.zeros_like, pos)
    perm = np.concatenate([[0], 1 + np.random.default_rng(1).permutation(9)])
    out = model.apply({"params": params}, input_ids=ids)["hidden"]
    permuted = model.apply({"params": params}, input_ids=ids[:, perm])["hidden"]
    gap = np.abs(np.asarray(out)[:, perm] - np.asarray(permuted)).max()
    if zero_positions:
        assert gap < 1e-5
    else:
        assert gap > 1e-2


def test_packed_examples_each_untie_their_own_cls():
    """Two examples packed in one row (positions restarting at 0) give each one's own output."""
    cfg = ModelConfig(**TINY)
    model = Transformer(cfg)
    rng = np.random.default_rng(0)
    a, b = rng.integers(1, 50, (1, 7)), rng.integers(1, 50, (1, 5))
    params = _random_params(model, a)
    packed = model.apply(
        {"params": params},
        input_ids=np.concatenate([a, b], 1),
        position_ids=np.concatenate([np.arange(7), np.arange(5)])[None],
        segment_ids=np.array([[1] * 7 + [2] * 5]),
    )["hidden"]
    alone = [model.apply({"params": params}, input_ids=x)["hidden"] for x in (a, b)]
    np.testing.assert_allclose(packed[:, :7], alone[0], atol=1e-5)
    np.testing.assert_allclose(packed[:, 7:], alone[1], atol=1e-5)


def test_jit_and_no_jit_agree():
    cfg = ModelConfig(**TINY)
    model = Transformer(cfg)
    ids = np.random.default_rng(0).integers(1, 50, (2, 12))
    params = _random_params(model, ids)
    apply = lambda p, x: model.apply({"params": p}, input_ids=x)["mlm_logits"]
    np.testing.assert_allclose(jax.jit(apply)(params, ids), apply(params, ids), atol=1e-5)


def test_config_round_trips_and_refuses():
    cfg = ModelConfig(**TINY)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert ModelConfig(position_type="tupe").tupe == TupeOptions()
    with pytest.raises(ValueError, match="architecture='encoder' only, got architecture='decoder'"):
        ModelConfig(**{**TINY, "architecture": "decoder", "heads": ("lm",)})
    with pytest.raises(ValueError, match="ModelConfig.tupe is for position_type='tupe'"):
        ModelConfig(position_type="learned", tupe=TupeOptions())
    with pytest.raises(ValueError, match="relative_buckets must be an even int >= 4, got 7"):
        TupeOptions(relative_buckets=7)
    with pytest.raises(ValueError, match="relative_max_distance must be an int > "):
        TupeOptions(relative_buckets=8, relative_max_distance=2)
    with pytest.raises(ValueError, match="longer than the position table"):
        Transformer(cfg).init(jax.random.key(0), input_ids=np.ones((1, 41), np.int32))
    assert dataclasses.asdict(cfg)["tupe"]["relative_buckets"] == 8
