"""DeBERTa's disentangled attention: buckets, the relative index, the scores against an explicit
loop over (query, key) pairs, padding semantics, and the model built around it."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.layers.disentangled import (
    DisentangledAttention,
    RelativeEmbeddings,
    fill_softmax,
    log_bucket_position,
    relative_index,
)
from lmsuite.models import DebertaOptions, ModelConfig, Transformer

TINY = dict(
    vocab_size=50,
    d_model=12,
    num_heads=2,
    d_ff=20,
    num_layers=2,
    max_length=40,
    position_type="deberta",
    type_vocab_size=0,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    init_stddev=0.3,
    mask_padded_queries=True,
    mask_padded_embeddings=True,
)


def test_log_buckets_hand_worked_table():
    # mid = 4; beyond it 4 + ceil(log(d / 4) / log(39 / 4) * 3), e.g. d=9: ceil(1.068) = 2 -> 6,
    # d=19: ceil(2.053) = 3 -> 7, d=39: exactly 3 -> 7, d=40: ceil(3.033) = 4 -> 8.
    table = {0: 0, 1: 1, 3: 3, 4: 4, 5: 5, 8: 5, 9: 6, 18: 6, 19: 7, 39: 7, 40: 8, 100: 9}
    d = np.array(list(table))
    got = log_bucket_position(d, num_buckets=8, max_position=40)
    np.testing.assert_array_equal(got, list(table.values()))
    np.testing.assert_array_equal(log_bucket_position(-d, num_buckets=8, max_position=40), -got)


def test_log_buckets_refuse_an_undefined_scale():
    with pytest.raises(ValueError, match="max_position=5"):
        log_bucket_position(np.array([7]), num_buckets=8, max_position=5)


def test_relative_index_clamps_to_k_worked_example():
    # k=2: rows clip(i - j + 2, 0, 3) of the 4-row table; distances >= 2 share row 3, <= -2 row 0.
    lo, hi, index = relative_index(4, max_relative_positions=2, position_buckets=-1)
    assert (lo, hi) == (0, 4)
    expected = [[2, 1, 0, 0], [3, 2, 1, 0], [3, 3, 2, 1], [3, 3, 3, 2]]
    np.testing.assert_array_equal(index, expected)


@pytest.mark.parametrize("buckets", [-1, 8])
def test_relative_index_shape_toeplitz_and_symmetry(buckets):
    length = 30
    lo, hi, index = relative_index(length, max_relative_positions=40, position_buckets=buckets)
    assert index.shape == (length, length)
    assert index.min() == 0 and index.max() == hi - lo - 1
    i, j = np.meshgrid(np.arange(length), np.arange(length), indexing="ij")
    for d in range(-length + 1, length):  # one row per distance: constant along diagonals
        assert len(np.unique(index[i - j == d])) == 1
    # Distances +d and -d sit symmetrically about the row of distance 0 (no clipping here).
    np.testing.assert_array_equal(index + index.T, 2 * index[0, 0])
    if buckets == -1:
        assert hi - lo == 2 * length - 1
    else:
        assert hi - lo == 2 * 7 + 1  # log buckets reach 7 at distance 29 <= 39


def test_fill_softmax_rows():
    logits = jnp.array([[[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]]])
    mask = jnp.array([[[[True, True, False], [False, False, False]]]])
    probs = fill_softmax(logits, mask)[0, 0]
    np.testing.assert_allclose(probs[0], [1 / (1 + np.e), np.e / (1 + np.e), 0.0], rtol=1e-6)
    np.testing.assert_allclose(probs[1], [1 / 3] * 3, rtol=1e-6)


def _explicit_attention(params, x, table, index, mask, cfg):
    """Loops over (b, h, i, j) with the paper's formula; projections from the module's params."""
    p = jax.tree_util.tree_map(np.asarray, params)

    def project(name, v):
        out = np.einsum("...D,DHK->...HK", v, p[name]["kernel"])
        return out + p[name]["bias"] if "bias" in p[name] else out

    share = cfg.deberta.share_att_key
    q, k, v = project("query", x), project("key", x), project("value", x)
    pk = project("key" if share else "pos_key", table)
    pq = project("query" if share else "pos_query", table)
    b_, length, h_, k_dim = q.shape
    scale = np.sqrt(k_dim * 3)
    scores = np.zeros((b_, h_, length, length))
    for b in range(b_):
        for h in range(h_):
            for i in range(length):
                for j in range(length):
                    r = index[i, j]
                    s = q[b, i, h] @ k[b, j, h] + q[b, i, h] @ pk[r, h] + k[b, j, h] @ pq[r, h]
                    scores[b, h, i, j] = s / scale if mask[b, i, j] else -np.inf
    scores -= scores.max(-1, keepdims=True)
    probs = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
    ctx = np.einsum("BHLM,BMHK->BLHK", probs, v)
    return np.einsum("BLHK,HKD->BLD", ctx, p["out"]["kernel"]) + p["out"]["bias"]


@pytest.mark.parametrize(
    "variant",
    [
        dict(use_key_bias=False),  # v1: no key biases, separate position projections
        dict(deberta=DebertaOptions(share_att_key=True, position_buckets=8)),  # v3
    ],
)
def test_attention_equals_explicit_formula(variant):
    cfg = ModelConfig(**TINY, **variant)
    length = 13
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, length, cfg.d_model)).astype(np.float32)
    valid = np.ones((2, length), bool)
    valid[1, 9:] = False
    # Keys padded; every query keeps some key (fully masked rows: test_fill_softmax_rows).
    mask_B1LM = np.broadcast_to(valid[:, None, None, :], (2, 1, length, length))
    rel = RelativeEmbeddings(config=cfg)
    rel_params = rel.init(jax.random.PRNGKey(1), length)
    kwargs = rel.apply(rel_params, length)
    attention = DisentangledAttention(config=cfg)
    params = nn.unbox(
        attention.init(jax.random.PRNGKey(2), x, x, mask=mask_B1LM, **kwargs)["params"]
    )
    assert ("pos_key" in params) == (not cfg.deberta.share_att_key)
    assert ("bias" in params["key"]) == cfg.use_key_bias
    got = attention.apply({"params": params}, x, x, mask=mask_B1LM, **kwargs)
    want = _explicit_attention(
        params,
        x,
        np.asarray(kwargs["relative_RD"]),
        np.asarray(kwargs["relative_index_LM"]),
        mask_B1LM[:, 0],
        cfg,
    )
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=1e-4)


def _mlm(cfg, ids, mask):
    """Initialises on (ids, mask); returns params and a jitted ids, mask -> mlm_logits."""
    model = Transformer(cfg)
    init = jax.jit(lambda rng: model.init(rng, ids, attention_mask=mask))
    params = nn.unbox(init(jax.random.PRNGKey(0))["params"])
    apply = jax.jit(lambda p, i, m: model.apply({"params": p}, i, attention_mask=m)["mlm_logits"])
    return params, lambda i, m: np.asarray(apply(params, i, m))


def test_appended_padding_changes_nothing_and_padded_rows_are_defined():
    """Relative distances among real tokens do not move when padding is appended."""
    cfg = ModelConfig(
        **TINY,
        deberta=DebertaOptions(position_buckets=8, norm_rel_embeddings=True),
        embedding_dim=8,
        embedding_projection_first=True,
        embedding_projection_bias=False,
    )
    ids = np.array([[5, 9, 13, 2, 7, 31]], np.int32)
    params, run = _mlm(cfg, ids, np.ones_like(ids))
    assert "norm" in params["encoder"]["relative_embeddings"]
    assert params["encoder"]["relative_embeddings"]["embedding"].shape == (16, cfg.d_model)
    assert "bias" not in params["embedder"]["embedding_projection"]
    short = run(ids, np.ones_like(ids))
    padded = np.concatenate([ids, np.zeros((1, 5), np.int32)], axis=1)
    mask = (padded > 0).astype(np.int32)
    long = run(padded, mask)
    np.testing.assert_allclose(long[:, :6], short, atol=1e-5)
    assert np.all(np.isfinite(long))
    # Padded rows of the embeddings are zeroed: padding ids make no difference there either.
    np.testing.assert_allclose(run(np.where(mask == 1, padded, 3), mask), long, atol=1e-5)


def test_without_relative_attention_there_is_no_table():
    cfg = ModelConfig(**TINY, deberta=DebertaOptions(relative_attention=False))
    ids = np.array([[5, 9, 13]], np.int32)
    params, run = _mlm(cfg, ids, None)
    logits = run(ids, None)
    assert "relative_embeddings" not in params["encoder"]
    assert "pos_key" not in params["encoder"]["layers_0"]["attention"]
    assert logits.shape == (1, 3, cfg.vocab_size)


def test_config_rejects_unknown_position_terms():
    with pytest.raises(ValueError, match="'p2p'"):
        DebertaOptions(pos_att_type=("c2p", "p2p"))
    with pytest.raises(ValueError, match="position_buckets must be -1"):
        DebertaOptions(position_buckets=1)
