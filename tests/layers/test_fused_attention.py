"""attention_impl "fused" against the plain path on CPU: XLA's reference program and the TPU
splash kernel in Pallas' interpret mode, for padding, packing, causal order and
cross-attention, forward and gradients; the fallbacks and their one log line; tiny models."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.layers import fused_attention, masks
from lmsuite.layers.attention import MultiHeadAttention
from lmsuite.models import ModelConfig, Transformer

H, K, D = 2, 8, 16
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 2e-2}  # bf16: 8 mantissa bits through softmax


def _case(kind: str, length: int, memory: int, seed: int = 0):
    """Dense mask, its layout, and (B, L) weights that are 0 on queries whose plain output is
    not defined the same way (packing's padded queries)."""
    rng = np.random.default_rng(seed)
    valid_BM = np.ones((2, memory), np.int32)
    valid_BM[1, memory - memory // 4 :] = 0
    weights_BL = np.ones((2, length), np.float32)
    if kind == "padding":
        mask = masks.padding_mask(valid_BM)
        layout = masks.segment_layout(key_valid_BM=valid_BM, length=length)
    elif kind == "causal":
        mask = masks.combine(masks.padding_mask(valid_BM), masks.causal_mask(length))
        layout = masks.segment_layout(key_valid_BM=valid_BM, length=length, causal=True)
    elif kind == "packed":
        cut = int(rng.integers(1, length - 2))
        seg_BL = np.ones((2, length), np.int32)
        seg_BL[:, cut:] = 2
        seg_BL[1, length - 2 :] = 0  # packing's padding
        weights_BL = (seg_BL > 0).astype(np.float32)
        mask = masks.segment_mask(seg_BL, seg_BL)
        layout = masks.segment_layout(q_segment_ids_BL=seg_BL, kv_segment_ids_BM=seg_BL)
    elif kind == "cross":
        mask = masks.padding_mask(valid_BM)
        layout = masks.segment_layout(key_valid_BM=valid_BM, length=length)
    else:
        raise ValueError(kind)
    return mask, layout, jnp.asarray(weights_BL)


def _module(impl: str, dtype, dropout_rate: float = 0.0) -> MultiHeadAttention:
    return MultiHeadAttention(
        num_heads=H, head_dim=K, dtype=dtype, dropout_rate=dropout_rate, attention_impl=impl
    )


def _inputs(length: int, memory: int):
    key_x, key_kv, key_w = jax.random.split(jax.random.PRNGKey(1), 3)
    x_BLD = jax.random.normal(key_x, (2, length, D))
    kv_BMD = jax.random.normal(key_kv, (2, memory, D))
    return x_BLD, kv_BMD, jax.random.normal(key_w, (2, length, D))


def _compare(impl: str, kind: str, dtype, length: int, memory: int):
    mask, layout, weights_BL = _case(kind, length, memory)
    x_BLD, kv_BMD, probe_BLD = _inputs(length, memory)
    if kind != "cross":
        kv_BMD = x_BLD
    params = _module("plain", dtype).init(jax.random.PRNGKey(0), x_BLD, kv_BMD)

    def loss(impl, params):
        out_BLD = _module(impl, dtype).apply(params, x_BLD, kv_BMD, mask=mask, mask_layout=layout)
        weighted_BLD = out_BLD.astype(jnp.float32) * probe_BLD * weights_BL[:, :, None]
        return jnp.sum(weighted_BLD), out_BLD

    (plain_loss, plain_out), plain_grads = jax.value_and_grad(
        lambda p: loss("plain", p), has_aux=True
    )(params)
    (fused_loss, fused_out), fused_grads = jax.jit(
        jax.value_and_grad(lambda p: loss(impl, p), has_aux=True)
    )(params)
    tol = TOLERANCE[dtype]
    real_BL1 = np.asarray(weights_BL)[:, :, None] > 0
    scale = float(jnp.max(jnp.abs(plain_out.astype(jnp.float32))))
    np.testing.assert_allclose(
        np.where(real_BL1, fused_out.astype(jnp.float32), 0),
        np.where(real_BL1, plain_out.astype(jnp.float32), 0),
        atol=tol * scale,
    )
    np.testing.assert_allclose(fused_loss, plain_loss, rtol=tol, atol=tol)
    for name in ("query", "key", "value", "out"):
        got = fused_grads["params"][name]["kernel"].value.astype(jnp.float32)
        want = plain_grads["params"][name]["kernel"].value.astype(jnp.float32)
        assert float(jnp.max(jnp.abs(want))) > 0, name  # a gradient that could be wrong
        np.testing.assert_allclose(got, want, atol=tol * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("kind", ["padding", "packed", "causal", "cross"])
def test_reference_path_equals_plain(kind, dtype):
    _compare("fused", kind, dtype, length=12, memory=20 if kind == "cross" else 12)


@pytest.mark.parametrize(
    "kind,dtype",
    [
        ("padding", jnp.float32),
        ("packed", jnp.float32),
        ("causal", jnp.float32),
        ("cross", jnp.float32),
        ("packed", jnp.bfloat16),
    ],
)
def test_splash_kernel_interpreted_equals_plain(kind, dtype):
    _compare("fused_interpret", kind, dtype, length=128, memory=256 if kind == "cross" else 128)


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (a forced host mesh)")
def test_splash_under_a_mesh_runs_per_batch_and_head_shard(monkeypatch):
    from flax import linen as nn

    from lmsuite import partitioning

    shapes = []
    local = fused_attention._splash_local
    monkeypatch.setattr(
        fused_attention,
        "_splash_local",
        lambda q, *a, **k: shapes.append(q.shape) or local(q, *a, **k),
    )
    mesh = partitioning.make_mesh(data=2, fsdp=1, tensor=2, devices=jax.devices()[:4])
    with jax.set_mesh(mesh), nn.logical_axis_rules(partitioning.DEFAULT_RULES):
        _compare("fused_interpret", "packed", jnp.float32, length=128, memory=128)
    assert shapes and set(shapes) == {(1, 128, 1, K)}  # a batch row and a head per device


def test_the_layout_describes_the_dense_mask():
    seg_BL = np.array([[1, 1, 2, 2, 0], [3, 3, 3, 0, 0]], np.int32)
    valid_BL = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    layout = masks.segment_layout(
        key_valid_BM=valid_BL, q_segment_ids_BL=seg_BL, kv_segment_ids_BM=seg_BL, causal=True
    )
    want = masks.combine(
        masks.padding_mask(valid_BL), masks.segment_mask(seg_BL, seg_BL), masks.causal_mask(5)
    )
    real_B1L1 = (seg_BL > 0)[:, None, :, None]
    np.testing.assert_array_equal(layout.dense(5, 5) & real_B1L1, want)
    # Padded queries see padded keys, never a real one: no row of the kernel is empty.
    assert bool(jnp.all(jnp.any(layout.dense(5, 5), axis=-1)))


def _spy(monkeypatch) -> list:
    calls = []
    real = fused_attention.fused_attention
    monkeypatch.setattr(
        fused_attention, "fused_attention", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    return calls


def _plain_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "plain attention path" in r.getMessage()]


@pytest.fixture
def fresh_log(monkeypatch, caplog):
    monkeypatch.setattr(fused_attention, "_logged_reasons", set())
    caplog.set_level(logging.WARNING, logger=fused_attention.__name__)
    return caplog


def test_dropout_and_bias_fall_back_and_log_each_reason_once(monkeypatch, fresh_log):
    calls = _spy(monkeypatch)
    x_BLD, _, _ = _inputs(8, 8)
    module = _module("fused", jnp.float32, dropout_rate=0.1)
    params = module.init(jax.random.PRNGKey(0), x_BLD, x_BLD)
    calls.clear()
    fused = module.apply(params, x_BLD, x_BLD)  # deterministic: no dropout, so fused
    assert len(calls) == 1 and not _plain_messages(fresh_log)
    rngs = {"dropout": jax.random.PRNGKey(2)}
    for _ in range(3):
        dropped = module.apply(params, x_BLD, x_BLD, deterministic=False, rngs=rngs)
    want = _module("plain", jnp.float32, 0.1).apply(
        params, x_BLD, x_BLD, deterministic=False, rngs=rngs
    )
    np.testing.assert_allclose(dropped, want, atol=1e-6)
    assert not np.allclose(dropped, fused, atol=1e-3)  # dropout did act
    bias_1HLM = jax.random.normal(jax.random.PRNGKey(3), (1, H, 8, 8))
    for _ in range(2):
        biased = module.apply(params, x_BLD, x_BLD, bias_BHLM=bias_1HLM)
    want = _module("plain", jnp.float32).apply(params, x_BLD, x_BLD, bias_BHLM=bias_1HLM)
    np.testing.assert_allclose(biased, want, atol=1e-6)
    assert len(calls) == 1
    messages = _plain_messages(fresh_log)
    assert len(messages) == 2, messages
    assert "dropout" in messages[0] and "bias" in messages[1]


def test_a_dense_mask_without_its_layout_falls_back(monkeypatch, fresh_log):
    calls = _spy(monkeypatch)
    x_BLD, _, _ = _inputs(8, 8)
    mask, _, _ = _case("padding", 8, 8)
    module = _module("fused", jnp.float32)
    params = module.init(jax.random.PRNGKey(0), x_BLD, x_BLD)
    calls.clear()
    got = module.apply(params, x_BLD, x_BLD, mask=mask)
    np.testing.assert_allclose(
        got, _module("plain", jnp.float32).apply(params, x_BLD, x_BLD, mask=mask), atol=1e-6
    )
    assert not calls and "MaskLayout" in _plain_messages(fresh_log)[0]


def _model_config(architecture: str, impl: str, **overrides) -> ModelConfig:
    return ModelConfig(
        architecture=architecture,
        vocab_size=41,
        d_model=16,
        num_heads=2,
        d_ff=24,
        num_layers=2,
        max_length=16,
        type_vocab_size=0,
        heads=("mlm",) if architecture == "encoder" else ("lm",),
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        attention_impl=impl,
        **overrides,
    )


@pytest.mark.parametrize(
    "architecture,inputs",
    [
        ("encoder", ("attention_mask",)),
        ("encoder", ("segment_ids",)),
        ("decoder", ("attention_mask",)),
        ("decoder", ("segment_ids",)),
    ],
)
def test_a_tiny_model_has_the_plain_loss_and_gradients(architecture, inputs, monkeypatch):
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(0)
    ids_BL = jnp.asarray(rng.integers(1, 41, size=(2, 12)), jnp.int32)
    kwargs = {}
    weights_BL = np.ones((2, 12), np.float32)
    if "attention_mask" in inputs:
        kwargs["attention_mask"] = jnp.asarray(np.arange(12)[None, :] < np.array([[12], [7]]))
        weights_BL = np.asarray(kwargs["attention_mask"], np.float32)
    if "segment_ids" in inputs:
        seg_BL = np.array([[1] * 5 + [2] * 7, [1] * 9 + [0] * 3], np.int32)
        kwargs["segment_ids"] = jnp.asarray(seg_BL)
        weights_BL = (seg_BL > 0).astype(np.float32)
    logits_key = "mlm_logits" if architecture == "encoder" else "lm_logits"
    plain = Transformer(_model_config(architecture, "plain"))
    params = plain.init(jax.random.PRNGKey(0), ids_BL, **kwargs)["params"]

    def loss(config, params):
        logits_BLV = Transformer(config).apply({"params": params}, ids_BL, **kwargs)[logits_key]
        nll_BL = -jnp.take_along_axis(jax.nn.log_softmax(logits_BLV), ids_BL[:, :, None], axis=-1)[
            :, :, 0
        ]
        return jnp.sum(nll_BL * weights_BL) / jnp.sum(weights_BL)

    want, want_grads = jax.value_and_grad(lambda p: loss(plain.config, p))(params)
    got, got_grads = jax.value_and_grad(lambda p: loss(_model_config(architecture, "fused"), p))(
        params
    )
    assert calls, "the fused path never ran"
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)


def test_an_unknown_impl_is_named():
    with pytest.raises(ValueError, match="attention_impl must be one of .* got 'flash'"):
        _module("flash", jnp.float32).init(jax.random.PRNGKey(0), jnp.zeros((1, 4, D)), None)
    with pytest.raises(ValueError, match=r"ModelConfig.attention_impl must be one of"):
        _model_config("encoder", "splash")


@pytest.mark.parametrize(
    "architecture,overrides,reason",
    [
        ("prefix_lm", {}, "prefix-LM mask"),
        ("decoder", dict(position_type="t5_relative", scale_attention=False), "bias"),
        ("encoder", dict(position_type="deberta"), "DeBERTa"),
    ],
)
def test_models_that_cannot_fuse_keep_the_plain_loss_and_log_once(
    architecture, overrides, reason, monkeypatch, fresh_log
):
    calls = _spy(monkeypatch)
    ids_BL = jnp.asarray(np.random.default_rng(1).integers(1, 41, size=(2, 8)), jnp.int32)
    kwargs = {}
    if architecture == "prefix_lm":
        kwargs["prefix_mask"] = jnp.asarray(np.arange(8)[None, :] < np.array([[3], [5]]))
    plain = Transformer(_model_config(architecture, "plain", **overrides))
    params = plain.init(jax.random.PRNGKey(0), ids_BL, **kwargs)
    fused = Transformer(_model_config(architecture, "fused", **overrides))
    for _ in range(2):
        got = fused.apply(params, ids_BL, **kwargs)
    want = plain.apply(params, ids_BL, **kwargs)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=1e-6)
    assert not calls
    messages = _plain_messages(fresh_log)
    assert len(messages) == 1 and reason in messages[0], messages


@pytest.mark.parametrize(
    "dtype,head_dim,length,memory,dense_mask,want",
    [
        (jnp.bfloat16, 64, 512, 512, True, "cudnn"),
        (jnp.float16, 128, 114, 512, True, "cudnn"),
        (jnp.bfloat16, 64, 29, 128, False, "cudnn"),  # no bias: odd lengths are fine
        (jnp.bfloat16, 64, 29, 128, True, None),  # t5_1_1_tiny's cross-attention on an H200
        (jnp.bfloat16, 12, 16, 16, False, None),
        (jnp.bfloat16, 256, 16, 16, False, None),
        (jnp.float32, 64, 512, 512, True, None),
    ],
)
def test_the_gpu_path_asks_cudnn_only_for_what_it_accepts(
    dtype, head_dim, length, memory, dense_mask, want, fresh_log
):
    q_BLHK = jax.ShapeDtypeStruct((2, length, 4, head_dim), dtype)
    k_BMHK = jax.ShapeDtypeStruct((2, memory, 4, head_dim), dtype)
    got = fused_attention.gpu_implementation(q_BLHK, k_BMHK, dense_mask=dense_mask)
    assert got == want
    messages = [r.getMessage() for r in fresh_log.records]
    if want is None and dtype != jnp.float32:  # float32 is XLA's by design, not a fallback
        assert len(messages) == 1 and "not cuDNN" in messages[0], messages
        assert str(head_dim) in messages[0] or f"L={length}" in messages[0]
    else:
        assert not messages
