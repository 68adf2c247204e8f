"""position_type="learned_relative" (UniLMv2's positions): BERT's learned table in the
embeddings plus one bucketed relative bias over the position ids' distances, shared by the
layers. Checked against a restatement of microsoft/unilm's s2s-ft `BertModel` (the bias is a
bias-free linear map of the one-hot bucket of pos_j - pos_i, added to every layer's scores), with
HF torch's T5 bucketing as the independent bucket function."""

import math

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from lmsuite import convert
from lmsuite.layers.positions import RelativePositionBias
from lmsuite.models import ModelConfig, Transformer

TINY = dict(
    vocab_size=50,
    d_model=12,
    num_heads=2,
    d_ff=20,
    num_layers=2,
    max_length=40,
    position_type="learned_relative",
    relative_buckets=8,  # exact for 0 and 1, log buckets from 2 up to distance 20
    relative_max_distance=20,
    type_vocab_size=2,
    heads=("mlm",),
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    init_stddev=0.3,
)
# A PMLM-like row: [CLS] 0..9 [SEP] 10, then pseudo and copied tokens at their targets'
# positions 3, 4 and 7, 3, 4 and 7: distances of 0 between different slots, and beyond 20.
POSITIONS = np.array([list(range(11)) + [3, 4, 7, 3, 4, 7] + list(range(11, 31))])


def _s2s_ft_bias(table_RH, position_ids_BL, *, num_buckets, max_distance):
    """s2s-ft's rel_pos: bucket(pos_j - pos_i) one-hot over the buckets, times the (R, H) map,
    as (B, H, L, L), in torch with HF's T5 bucket function."""
    pos = torch.from_numpy(np.asarray(position_ids_BL))
    rel = pos[:, None, :] - pos[:, :, None]
    bucket = T5Attention._relative_position_bucket(
        rel, bidirectional=True, num_buckets=num_buckets, max_distance=max_distance
    )
    one_hot = torch.nn.functional.one_hot(bucket, num_classes=num_buckets).double()
    return (one_hot @ torch.from_numpy(np.asarray(table_RH, np.float64))).permute(0, 3, 1, 2)


def test_bias_over_position_ids_is_s2s_fts():
    module = RelativePositionBias(
        num_heads=3, num_buckets=8, max_distance=20, bidirectional=True, max_positions=40
    )
    length = POSITIONS.shape[1]
    table = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    got = module.apply(
        {"params": {"rel_embedding": table}}, length, length, position_ids_BL=POSITIONS
    )
    want = _s2s_ft_bias(table, POSITIONS, num_buckets=8, max_distance=20).numpy()
    assert got.shape == (1, 3, length, length)
    np.testing.assert_allclose(got, want, atol=1e-6)
    # Tokens that share a position are at distance 0: the same bias as a token with itself.
    np.testing.assert_array_equal(got[0, :, 3, 11], got[0, :, 3, 3])
    # Without ids, the slots' distances: the same as ids 0..L-1.
    slots = module.apply({"params": {"rel_embedding": table}}, 9, 9)
    ids = module.apply(
        {"params": {"rel_embedding": table}}, 9, 9, position_ids_BL=np.arange(9)[None]
    )
    np.testing.assert_array_equal(slots, ids)
    with pytest.raises(ValueError, match="bidirectional self-attention with max_positions >= 1"):
        RelativePositionBias(num_heads=3, num_buckets=8, max_distance=20, bidirectional=True).apply(
            {"params": {"rel_embedding": table}}, 4, 4, position_ids_BL=np.arange(4)[None]
        )


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _dense(x, p):
    return np.einsum("...d,dhk->...hk", x, p["kernel"]) + p["bias"]


def test_every_layers_attention_is_s2s_fts():
    """Each layer's attention probabilities: softmax((x W^Q)(x W^K)^T / sqrt(K) + rel_pos), one
    rel_pos for all layers; and the embeddings add the learned rows at the given position ids."""
    cfg = ModelConfig(**TINY)
    model = Transformer(cfg)
    length = POSITIONS.shape[1]
    ids = np.random.default_rng(0).integers(1, 50, (1, length))
    params = nn.unbox(model.init(jax.random.key(0), input_ids=ids)["params"])
    params = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    assert set(params["encoder"]) == {"relative_bias", "layers_0", "layers_1"}
    assert params["encoder"]["relative_bias"]["rel_embedding"].shape == (8, 2)
    assert "position_embedder" in params["embedder"]
    _, state = model.apply(
        {"params": params},
        input_ids=ids,
        position_ids=POSITIONS,
        mutable=["intermediates"],
        capture_intermediates=True,
    )
    inter = state["intermediates"]
    emb = params["embedder"]
    x = (
        params["token_embedder"]["embedding"][ids[0]]
        + emb["position_embedder"]["embedding"][POSITIONS[0]]
        + emb["type_embedder"]["embedding"][0]
    )
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    norm = emb["embedding_norm"]
    x = (x - mean) / np.sqrt(var + cfg.norm_eps) * norm["scale"] + norm["bias"]
    np.testing.assert_allclose(inter["embedder"]["__call__"][0][0], x, atol=1e-5)
    bias = _s2s_ft_bias(
        params["encoder"]["relative_bias"]["rel_embedding"],
        POSITIONS,
        num_buckets=8,
        max_distance=20,
    ).numpy()[0]
    inputs = {
        "layers_0": inter["embedder"]["__call__"][0][0],
        "layers_1": inter["encoder"]["layers_0"]["__call__"][0][0],
    }
    for layer, x_LD in inputs.items():
        att = params["encoder"][layer]["attention"]
        x_LD = np.asarray(x_LD, np.float64)
        q, k = _dense(x_LD, att["query"]), _dense(x_LD, att["key"])
        logits = np.einsum("ihk,jhk->hij", q, k) / math.sqrt(cfg.head_width) + bias
        got = inter["encoder"][layer]["attention"]["attention_weights"][0][0]
        np.testing.assert_allclose(got, _softmax(logits), atol=2e-5)


def test_with_the_bias_zeroed_it_is_bert():
    cfg = ModelConfig(**TINY)
    ids = np.random.default_rng(1).integers(1, 50, (2, 16))
    params = nn.unbox(Transformer(cfg).init(jax.random.key(0), input_ids=ids)["params"])
    bias = params["encoder"].pop("relative_bias")
    bert = Transformer(cfg.replace(position_type="learned"))
    want = bert.apply({"params": params}, input_ids=ids)["mlm_logits"]
    params["encoder"]["relative_bias"] = jax.tree.map(np.zeros_like, bias)
    got = Transformer(cfg).apply({"params": params}, input_ids=ids)["mlm_logits"]
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_config_refuses_and_export_is_refused(tmp_path):
    cfg = ModelConfig(**TINY)
    assert ModelConfig.from_json(cfg.to_json()) == cfg
    assert cfg.max_positions == 40
    with pytest.raises(ValueError, match="architecture='encoder' only, got architecture='decoder'"):
        ModelConfig(**{**TINY, "architecture": "decoder", "heads": ("lm",)})
    with pytest.raises(ValueError, match="relative_buckets must be an even int >= 4, got 7"):
        ModelConfig(**{**TINY, "relative_buckets": 7})
    with pytest.raises(ValueError, match="relative_max_distance must be an int > .* = 2 .*got 2"):
        ModelConfig(**{**TINY, "relative_max_distance": 2})
    with pytest.raises(ValueError, match="longer than the position table"):
        Transformer(cfg).init(jax.random.key(0), input_ids=np.ones((1, 41), np.int32))
    params = Transformer(cfg).init(jax.random.key(0), input_ids=np.ones((1, 4), np.int32))
    for hf_class in (None, "BertForMaskedLM"):
        with pytest.raises(ValueError, match="no class for BERT's learned positions plus"):
            convert.to_hf(cfg, params["params"], str(tmp_path / "out"), hf_class=hf_class)
    assert not (tmp_path / "out").exists()
