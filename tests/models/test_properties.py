"""Behavioural properties of `Transformer` on tiny configs.

Causality and prefix bidirectionality are read from the Jacobian of the logits with respect to
the embedder's output (a perturbation added through `nn.intercept_methods`), so a single leaked
or missing connection shows up as a non-zero or zero entry.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.models import ModelConfig, Transformer
from lmsuite.models.embedder import Embedder

VOCAB, D, L = 37, 16, 8
LOGITS = {
    "encoder": "mlm_logits",
    "decoder": "lm_logits",
    "prefix_lm": "lm_logits",
    "encoder_decoder": "lm_logits",
}


def _config(architecture: str, **overrides) -> ModelConfig:
    fields = dict(
        architecture=architecture,
        vocab_size=VOCAB,
        d_model=D,
        num_heads=2,
        d_ff=24,
        num_layers=2,
        max_length=16,
        type_vocab_size=0,
        heads=("mlm",) if architecture == "encoder" else ("lm",),
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        init_stddev=0.3,  # lively activations, so that every real dependency is far from 0
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def _ids(batch: int, length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, VOCAB, size=(batch, length)).astype(np.int32)


def _init(config: ModelConfig, seed: int = 0):
    ids = np.ones((1, L), np.int32)
    extra = {}
    if config.architecture == "encoder_decoder":
        extra["decoder_input_ids"] = ids
    if config.architecture == "prefix_lm":
        extra["prefix_mask"] = ids
    model = Transformer(config)
    params = nn.unbox(model.init(jax.random.PRNGKey(seed), ids, **extra)["params"])
    return model, params


_JITTED = {}


def _apply(model, params, ids, **kwargs):
    """model.apply under one jit per config (eager mode compiles every op separately: slower)."""
    if model.config not in _JITTED:
        _JITTED[model.config] = jax.jit(lambda p, i, kw: model.apply({"params": p}, i, **kw))
    return _JITTED[model.config](params, ids, kwargs)


def _logits(model, params, ids, **kwargs):
    out = _apply(model, params, ids, **kwargs)
    return np.asarray(out[LOGITS[model.config.architecture]], np.float32)


def _embedding_jacobian(model, params, ids, **kwargs) -> np.ndarray:
    """|| d (logits[t] . w) / d embedded[s] || for one example: (L, L), rows t, columns s."""
    w_V = jnp.asarray(np.random.default_rng(1).normal(size=VOCAB), jnp.float32)

    def f(delta_1LD):
        def add_delta(next_fun, args, kw, context):
            out = next_fun(*args, **kw)
            if isinstance(context.module, Embedder) and context.method_name == "__call__":
                return out + delta_1LD
            return out

        with nn.intercept_methods(add_delta):
            out = model.apply({"params": params}, ids, **kwargs)
        return out["lm_logits"][0] @ w_V

    jac = jax.jit(jax.jacrev(f))(jnp.zeros((1, ids.shape[1], D), jnp.float32))
    return np.linalg.norm(np.asarray(jac)[:, 0], axis=-1)


def _assert_dependencies(jac_LL, allowed_LL):
    leaked = np.argwhere(~allowed_LL & (jac_LL != 0))
    assert leaked.size == 0, f"outputs t depend on inputs s they must not see: (t, s) = {leaked}"
    missing = np.argwhere(allowed_LL & (jac_LL < 1e-6))
    assert missing.size == 0, f"outputs t ignore inputs s they should see: (t, s) = {missing}"


def test_decoder_is_causal_through_gradients():
    model, params = _init(_config("decoder"))
    jac = _embedding_jacobian(model, params, _ids(1, L, seed=2))
    _assert_dependencies(jac, np.tril(np.ones((L, L), bool)))


def test_prefix_lm_prefix_is_bidirectional_targets_causal():
    model, params = _init(_config("prefix_lm"))
    prefix = np.array([[1, 1, 1, 0, 0, 0, 0, 0]], np.int32)
    jac = _embedding_jacobian(model, params, _ids(1, L, seed=3), prefix_mask=prefix)
    p = prefix[0].astype(bool)
    allowed = np.tril(np.ones((L, L), bool)) | (p[:, None] & p[None, :])
    _assert_dependencies(jac, allowed)
    assert jac[0, 2] > 0 and jac[2, 3] == 0  # prefix sees later prefix, never the targets


def _padding_case(architecture: str):
    """ids (2, L), attention_mask, and the model kwargs; example 1 holds padding.

    Encoder inputs are padded on the right; decoder-side inputs on the left, where causality
    alone would not hide the pads.
    """
    ids = _ids(2, L, seed=4)
    mask = np.ones((2, L), np.int32)
    if architecture in ("encoder", "encoder_decoder"):
        mask[1, 5:] = 0
    else:
        mask[1, :3] = 0
    kwargs = {"attention_mask": mask}
    if architecture == "prefix_lm":
        kwargs["prefix_mask"] = np.array([[1] * 4 + [0] * 4] * 2, np.int32)
    if architecture == "encoder_decoder":
        dec_mask = np.ones((2, 6), np.int32)
        dec_mask[1, :2] = 0
        kwargs.update(decoder_input_ids=_ids(2, 6, seed=5), decoder_attention_mask=dec_mask)
    return ids, mask, kwargs


def _change_pads(ids, valid):
    """Other ids wherever `valid` is 0: [[3, 4]], [[1, 0]] -> [[3, 11]]."""
    return np.where(valid == 1, ids, (ids + 7) % VOCAB)


@pytest.mark.parametrize("architecture", ["encoder", "decoder", "prefix_lm", "encoder_decoder"])
def test_pad_ids_change_no_real_output(architecture):
    model, params = _init(_config(architecture))
    ids, mask, kwargs = _padding_case(architecture)
    other_ids, other_kwargs = _change_pads(ids, mask), dict(kwargs)
    real = mask == 1
    if architecture == "encoder_decoder":
        dec_mask = kwargs["decoder_attention_mask"]
        other_kwargs["decoder_input_ids"] = _change_pads(kwargs["decoder_input_ids"], dec_mask)
        real = dec_mask == 1
    a = _logits(model, params, ids, **kwargs)
    b = _logits(model, params, other_ids, **other_kwargs)
    np.testing.assert_allclose(a[real], b[real], rtol=0, atol=1e-6)
    # The same change without the masks is visible: the pads really were within reach.
    drop_masks = lambda kw: {k: v for k, v in kw.items() if not k.endswith("attention_mask")}
    c = _logits(model, params, ids, **drop_masks(kwargs))
    d = _logits(model, params, other_ids, **drop_masks(other_kwargs))
    assert np.abs(c[real] - d[real]).max() > 1e-3


def _pack(rows_2N, pad: int = 1):
    """Two equal-length id rows -> one packed row with segment ids and restarting positions.

    [[a0, a1], [b0, b1]] with pad=1 -> ids [[a0 a1 b0 b1 0]], segments [[1 1 2 2 0]],
    positions [[0 1 0 1 0]].
    """
    n = rows_2N.shape[1]
    ids = np.concatenate([rows_2N.reshape(1, -1), np.zeros((1, pad), np.int32)], axis=1)
    segments = np.array([[1] * n + [2] * n + [0] * pad], np.int32)
    positions = np.array([list(range(n)) * 2 + [0] * pad], np.int32)
    return ids, segments, positions


@pytest.mark.parametrize(
    "architecture,position_type",
    [
        ("encoder", "learned"),
        ("decoder", "t5_relative"),
        ("prefix_lm", "learned"),
        ("encoder_decoder", "learned"),
    ],
)
def test_packed_sequences_equal_each_alone(architecture, position_type):
    """Two examples packed in one row give the outputs the pair gives as a batch of two."""
    model, params = _init(_config(architecture, position_type=position_type))
    alone_ids = _ids(2, 5, seed=6)
    ids, seg, pos = _pack(alone_ids)
    packed_kw, alone_kw = dict(segment_ids=seg, position_ids=pos), {}
    n = 5
    if architecture == "prefix_lm":
        prefix = np.array([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]], np.int32)
        packed_kw["prefix_mask"] = np.concatenate([prefix.reshape(1, -1), [[0]]], axis=1)
        alone_kw["prefix_mask"] = prefix
    if architecture == "encoder_decoder":
        n, dec = 4, _ids(2, 4, seed=8)
        packed_dec, dseg, dpos = _pack(dec)
        packed_kw.update(
            decoder_input_ids=packed_dec, decoder_segment_ids=dseg, decoder_position_ids=dpos
        )
        alone_kw["decoder_input_ids"] = dec
    packed = _logits(model, params, ids, **packed_kw)
    alone = _logits(model, params, alone_ids, **alone_kw)
    np.testing.assert_allclose(packed[0, : 2 * n].reshape(alone.shape), alone, rtol=0, atol=2e-5)


def test_jit_equals_no_jit():
    architecture = "encoder_decoder"
    model, params = _init(_config(architecture))
    ids, mask, kwargs = _padding_case(architecture)
    eager = model.apply({"params": params}, ids, **kwargs)[LOGITS[architecture]]
    np.testing.assert_allclose(
        _logits(model, params, ids, **kwargs), np.asarray(eager), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize(
    "architecture,position_type",
    [
        ("decoder", "sinusoidal"),
        ("encoder", "sinusoidal"),
        ("encoder_decoder", "t5_relative"),
        ("encoder_decoder", "none"),
    ],
)
def test_position_types_run_and_order_matters(architecture, position_type):
    """Swapping two inputs changes an output elsewhere only when positions carry information.

    With one layer and no positions, output t is a function of token t and the multiset of the
    tokens it attends to (for encoder_decoder: of the encoder's outputs), so position_type="none"
    is the control that shows the check can fail.
    """
    model, params = _init(_config(architecture, position_type=position_type, num_layers=1))
    ids = _ids(1, L, seed=11)
    swapped = ids.copy()
    swapped[0, [1, 2]] = ids[0, [2, 1]]
    kw = {"decoder_input_ids": _ids(1, 4, seed=12)} if architecture == "encoder_decoder" else {}
    out, out_swapped = _logits(model, params, ids, **kw), _logits(model, params, swapped, **kw)
    assert np.isfinite(out).all()
    probe = slice(None) if architecture == "encoder_decoder" else slice(5, 6)
    change = np.abs(out[:, probe] - out_swapped[:, probe]).max()
    if position_type == "none":
        assert change < 1e-5, change
    else:
        assert change > 1e-3, change


def test_bfloat16_compute_keeps_float32_params():
    cfg = _config("decoder", dtype="bfloat16")
    model, params = _init(cfg)
    dtypes = {leaf.dtype for leaf in jax.tree_util.tree_leaves(params)}
    assert dtypes == {jnp.dtype(jnp.float32)}
    ids = _ids(2, L, seed=10)
    out = _apply(model, params, ids)
    assert out["lm_logits"].dtype == jnp.bfloat16
    reference = _logits(Transformer(cfg.replace(dtype="float32")), params, ids)
    error = np.abs(np.asarray(out["lm_logits"], np.float32) - reference).max()
    assert error <= 0.05 * np.abs(reference).max(), error
    loss = lambda p: model.apply({"params": p}, ids)["lm_logits"].astype(jnp.float32).sum()
    grads = jax.jit(jax.grad(loss))(params)
    assert {g.dtype for g in jax.tree_util.tree_leaves(grads)} == {jnp.dtype(jnp.float32)}
