"""Transformer-XL's LM (`architecture="transformer_xl"`, `two_stream.TransformerXL`) on tiny
configs: causality through gradients (memory included), the recurrence, stop-gradient into the
memory, and the relative attention against a numpy restatement of the paper's A_{i,j}.

Dependencies are read as in test_two_stream.py: the Jacobian of the logits with respect to the
token embeddings (`_token_jacobian`).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.models import ModelConfig, Transformer
from lmsuite.models.option_groups import XLNetOptions
from lmsuite.models.two_stream import TransformerXL, TwoStreamAttention
from tests.models.test_two_stream import VOCAB, D, _assert_dependencies, _ids, _token_jacobian

L = 6


def _config(**options) -> ModelConfig:
    return ModelConfig(
        architecture="transformer_xl",
        vocab_size=VOCAB,
        d_model=D,
        num_heads=2,
        d_ff=24,
        num_layers=2,
        heads=("lm",),
        activation="relu",
        scale_embeddings=True,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        init_stddev=0.3,
        xlnet=XLNetOptions(**{"attn_type": "uni", "untie_r": False, "mem_len": 4, **options}),
    )


def _init(config):
    model = Transformer(config)
    assert isinstance(model, TransformerXL)
    return model, nn.unbox(model.init(jax.random.PRNGKey(0), _ids(length=L))["params"])


def test_no_position_sees_a_later_token_and_memory_is_seen_by_all():
    model, params = _init(_config())
    ids = _ids(length=L)
    _assert_dependencies(_token_jacobian(model, params, ids), np.tril(np.ones((L, L), bool)))
    mems = model.apply({"params": params}, _ids(length=L, seed=5))["new_mems"]
    # With memory: still causal inside the segment, and every position reads the memory.
    jac = _token_jacobian(model, params, ids, mems=tuple(m[:1] for m in mems))
    _assert_dependencies(jac, np.tril(np.ones((L, L), bool)))
    read = jax.grad(
        lambda m: model.apply({"params": params}, ids[:1], mems=m)["lm_logits"][0, 0].sum()
    )(tuple(m[:1] for m in mems))
    assert np.abs(np.asarray(read[0])).max() > 1e-4  # position 0 reads the memory


def test_segment_with_memory_equals_the_tail_of_one_long_segment():
    """The defining property of the recurrence: segment 2 given segment 1's memory has the
    logits of its positions inside segments 1 + 2 run as one sequence (mem_len covers 1)."""
    model, params = _init(_config(mem_len=4))
    ids = _ids(length=8, seed=3)
    apply = lambda x, **kw: model.apply({"params": params}, x, **kw)
    first = apply(ids[:, :4])
    second = apply(ids[:, 4:], mems=first["new_mems"])["lm_logits"]
    np.testing.assert_allclose(
        np.asarray(second), np.asarray(apply(ids)["lm_logits"][:, 4:]), atol=2e-5
    )


def test_memory_is_a_stop_gradient():
    model, params = _init(_config())
    first = model.apply({"params": params}, _ids(length=L, seed=1))["new_mems"]

    def memory_sum(p, mems):
        new = model.apply({"params": p}, _ids(length=L, seed=2), mems=mems)["new_mems"]
        return sum(jnp.sum(m * m) for m in new)

    grads = jax.grad(memory_sum, argnums=(0, 1))(params, first)
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grads))


def _sinusoid(distance, d):
    inv_freq = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    angles = distance * inv_freq
    return np.concatenate([np.sin(angles), np.cos(angles)])


def test_attention_is_the_papers_four_terms():
    """Dai et al. (2019) section 3.3: A_ij = q_i.k_j (a) + q_i.W_kR R_{i-j} (b) + u.k_j (c)
    + v.W_kR R_{i-j} (d), scaled by 1/sqrt(K), causal over [memory, segment], restated in
    numpy for the first layer's attention with a memory of 2."""
    config = _config(mem_len=2)
    model, params = _init(config)
    ids = _ids(batch=1, length=3, seed=4)
    mem = np.random.default_rng(0).normal(size=(1, 2, D)).astype(np.float32)
    mems = (jnp.asarray(mem), jnp.asarray(mem))
    seen = {}

    def keep(next_fun, args, kw, context):
        out = next_fun(*args, **kw)
        if isinstance(context.module, TwoStreamAttention) and context.module.name == "attention":
            seen.setdefault("out", out[0])
        return out

    with nn.intercept_methods(keep):
        model.apply({"params": params}, ids, mems=mems)
    p = jax.tree.map(np.asarray, params)
    att, biases = p["layers_0"]["attention"], p["relative_biases"]
    h = p["token_embedder"]["embedding"][ids[0]] * np.sqrt(D)  # (3, D)
    kv = np.concatenate([mem[0], h])  # (5, D)
    q = np.einsum("ld,dhk->lhk", h, att["query"]["kernel"])
    k = np.einsum("md,dhk->mhk", kv, att["key"]["kernel"])
    v = np.einsum("md,dhk->mhk", kv, att["value"]["kernel"])
    u, w = biases["content_bias"], biases["position_bias"]
    num_heads, width = u.shape
    out = np.zeros((3, num_heads, width))
    for i in range(3):
        for head in range(num_heads):
            scores = []
            for j in range(5):
                r = _sinusoid(2 + i - j, D) @ att["position"]["kernel"][:, head]  # W_kR R_{i-j}
                a = q[i, head] @ k[j, head]
                b = q[i, head] @ r
                c = u[head] @ k[j, head]
                d = w[head] @ r
                scores.append((a + b + c + d) / np.sqrt(width) if j <= 2 + i else -np.inf)
            probs = np.exp(np.array(scores) - max(scores))
            out[i, head] = (probs / probs.sum()) @ v[:, head]
    expected = np.einsum("lhk,hkd->ld", out, att["out"]["kernel"])
    np.testing.assert_allclose(np.asarray(seen["out"][0]), expected, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(attn_type="bi"), "attn_type='uni'"),
        (dict(reuse_len=2), "reuse_len=None"),
        (dict(bi_data=True), "bi_data=False"),
    ],
)
def test_bad_config_is_named(options, match):
    with pytest.raises(ValueError, match=match):
        _config(**options)


def test_refuses_xlnet_inputs():
    model, params = _init(_config())
    ids = _ids(length=L)
    with pytest.raises(ValueError, match="token_type_ids"):
        model.apply({"params": params}, ids, token_type_ids=np.zeros_like(ids))
