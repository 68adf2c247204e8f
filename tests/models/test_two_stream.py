"""Behavioural properties of XLNet (`architecture="xlnet"`) on tiny configs.

Which input tokens an output depends on is read from the Jacobian of the logits with respect to
the token embeddings (a perturbation added to the token embedder's output through
`nn.intercept_methods`): a leaked connection is a non-zero entry, a missing one a zero.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from lmsuite.convert import xlnet as xlnet_family
from lmsuite.layers.embedding import Embed
from lmsuite.models import ModelConfig, Transformer
from lmsuite.models.option_groups import XLNetOptions
from lmsuite.models.segment_recurrence import relative_shift, relative_shift_rows
from lmsuite.models.summary import summarize

VOCAB, D, L, BATCH = 37, 16, 7, 2
# A factorisation order: position ORDER[k] is predicted k-th; the last three are the targets.
ORDER = np.array([3, 0, 5, 1, 6, 2, 4])
RANK = np.argsort(ORDER)
TARGETS = ORDER[4:]


def _config(**options) -> ModelConfig:
    return ModelConfig(
        architecture="xlnet",
        vocab_size=VOCAB,
        d_model=D,
        num_heads=2,
        d_ff=24,
        num_layers=2,
        heads=("lm",),
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        init_stddev=0.3,  # lively activations, so that every real dependency is far from 0
        xlnet=XLNetOptions(**{"mem_len": 4, **options}),
    )


def _ids(batch: int = BATCH, length: int = L, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, VOCAB, size=(batch, length)).astype(np.int32)


def _init(config: ModelConfig):
    model = Transformer(config)
    variables = model.init(jax.random.PRNGKey(0), _ids())
    return model, nn.unbox(variables["params"])


def _perm_inputs(batch: int = BATCH):
    """perm_mask (i sees j iff j comes strictly earlier in ORDER) and the targets' mapping."""
    perm_LL = (RANK[None, :] >= RANK[:, None]).astype(np.float32)
    target_PL = np.eye(L, dtype=np.float32)[TARGETS]
    tile = lambda x: np.broadcast_to(x, (batch, *x.shape)).copy()
    return tile(perm_LL), tile(target_PL)


def _token_jacobian(model, params, ids, **kwargs) -> np.ndarray:
    """|| d (logits[0, t] . w) / d token_embedding[0, s] ||: (outputs t, inputs s)."""
    w_V = jnp.asarray(np.random.default_rng(1).normal(size=VOCAB), jnp.float32)

    def f(delta_1LD):
        def add_delta(next_fun, args, kw, context):
            out = next_fun(*args, **kw)
            is_tokens = context.module.name == "token_embedder" and isinstance(
                context.module, Embed
            )
            return out + delta_1LD if is_tokens and context.method_name == "__call__" else out

        with nn.intercept_methods(add_delta):
            out = model.apply({"params": params}, ids[:1], **kwargs)
        return out["lm_logits"][0] @ w_V

    jac = jax.jit(jax.jacrev(f))(jnp.zeros((1, ids.shape[1], D), jnp.float32))
    return np.linalg.norm(np.asarray(jac)[:, 0], axis=-1)


def _assert_dependencies(jac, allowed):
    leaked = np.argwhere(~allowed & (jac != 0))
    assert leaked.size == 0, f"outputs t depend on inputs s they must not see: (t, s) = {leaked}"
    missing = np.argwhere(allowed & (jac < 1e-6))
    assert missing.size == 0, f"outputs t ignore inputs s they should see: (t, s) = {missing}"


@pytest.mark.parametrize("attn_type", ["bi", "uni"])
def test_query_stream_never_sees_its_own_token_nor_blocked_ones(attn_type):
    model, params = _init(_config(attn_type=attn_type))
    perm, targets = _perm_inputs(1)
    types = np.array([[0, 0, 0, 1, 1, 1, 2]], np.int32)
    jac_PL = _token_jacobian(
        model, params, _ids(), perm_mask=perm, target_mapping=targets, token_type_ids=types
    )
    allowed_PL = RANK[None, :] < RANK[TARGETS][:, None]
    if attn_type == "uni":
        allowed_PL &= np.arange(L)[None, :] <= TARGETS[:, None]
    _assert_dependencies(jac_PL, allowed_PL)
    assert np.all(jac_PL[np.arange(3), TARGETS] == 0)  # exactly zero, not merely small


def test_content_stream_sees_itself_and_what_comes_before():
    model, params = _init(_config())
    perm, _ = _perm_inputs(1)  # blocks the diagonal too: only the content stream lifts it
    jac_LL = _token_jacobian(model, params, _ids(), perm_mask=perm)
    _assert_dependencies(jac_LL, (RANK[None, :] < RANK[:, None]) | np.eye(L, dtype=bool))


def test_padding_is_invisible():
    model, params = _init(_config())
    mask = np.ones((1, L), np.int32)
    mask[0, 5:] = 0
    jac_LL = _token_jacobian(model, params, _ids(), attention_mask=mask)
    real = mask[0].astype(bool)
    _assert_dependencies(jac_LL, real[None, :] | np.eye(L, dtype=bool))


def test_memory_carries_no_gradient_but_is_read():
    model, params = _init(_config(reuse_len=5))
    first = model.apply({"params": params}, _ids(seed=1))["new_mems"]
    ids = _ids(seed=2)

    def memory_sum(p, mems):
        new = model.apply({"params": p}, ids, mems=mems)["new_mems"]
        return sum(jnp.sum(m * m) for m in new)

    def logits_sum(mems):
        return jnp.sum(model.apply({"params": params}, ids, mems=mems)["lm_logits"] ** 2)

    g_params, g_mems = jax.grad(memory_sum, argnums=(0, 1))(params, first)
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves((g_params, g_mems)))
    assert all(np.abs(np.asarray(g)).max() > 1e-3 for g in jax.grad(logits_sum)(first))


def test_new_memory_is_the_tail_of_old_memory_and_reused_inputs():
    config = _config(mem_len=4, reuse_len=3)
    model, params = _init(config)
    old = tuple(jnp.full((BATCH, 2, D), float(i + 1)) for i in range(config.num_layers))
    ids = _ids(seed=3)
    new = model.apply({"params": params}, ids, mems=old)["new_mems"]
    embedded = np.asarray(params["token_embedder"]["embedding"])[ids]
    expected0 = np.concatenate([np.asarray(old[0]), embedded[:, :3]], axis=1)[:, -4:]
    np.testing.assert_allclose(np.asarray(new[0]), expected0, atol=1e-6)
    assert [m.shape for m in new] == [(BATCH, 4, D)] * 2
    np.testing.assert_array_equal(np.asarray(new[1])[:, :1], np.asarray(old[1])[:, -1:])


def test_causal_segments_with_memory_equal_one_long_segment():
    """attn_type="uni": a segment fed the previous one's memory gives the logits it has inside
    the concatenated sequence (same relative distances, same visible keys)."""
    model, params = _init(_config(attn_type="uni", mem_len=4))
    ids = _ids(length=L)
    apply = lambda x, **kw: model.apply({"params": params}, x, **kw)
    whole = apply(ids)["lm_logits"]
    first = apply(ids[:, :4])
    second = apply(ids[:, 4:], mems=first["new_mems"])["lm_logits"]
    np.testing.assert_allclose(np.asarray(second), np.asarray(whole[:, 4:]), atol=2e-5)
    np.testing.assert_allclose(np.asarray(first["lm_logits"]), np.asarray(whole[:, :4]), atol=2e-5)


@pytest.mark.parametrize("options", [dict(), dict(untie_r=False, bi_data=True, clamp_len=2)])
def test_jit_and_eager_agree(options):
    model, params = _init(_config(**options))
    perm, targets = _perm_inputs()
    mems = tuple(jnp.ones((BATCH, 3, D)) * 0.1 * (i + 1) for i in range(2))
    kwargs = dict(
        perm_mask=perm,
        target_mapping=targets,
        mems=mems,
        token_type_ids=np.array([[0, 0, 0, 1, 1, 1, 2]] * BATCH, np.int32),
        attention_mask=np.array([[1] * L, [1] * 5 + [0] * 2], np.int32),
    )
    eager = model.apply({"params": params}, _ids(), **kwargs)
    jitted = jax.jit(lambda p, kw: model.apply({"params": p}, _ids(), **kw))(params, kwargs)
    assert eager["lm_logits"].shape == (BATCH, 3, VOCAB)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_parameter_tree_is_flat_and_logically_named():
    tied = Transformer(_config(untie_r=False)).init(jax.random.PRNGKey(0), _ids())["params"]
    top = {"token_embedder", "mask_emb", "layers_0", "layers_1", "lm_head"}
    assert set(tied) == top | {"relative_biases"}
    assert "content_bias" not in tied["layers_0"]["attention"]
    untied = Transformer(_config()).init(jax.random.PRNGKey(0), _ids())["params"]
    assert "relative_biases" not in untied and "content_bias" in untied["layers_1"]["attention"]
    leaves = jax.tree.leaves(untied, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    assert all(isinstance(x, nn.Partitioned) for x in leaves)


def _hf_count(hf_config) -> int:
    with torch.device("meta"):
        return transformers.XLNetLMHeadModel(hf_config).num_parameters()


@pytest.mark.parametrize(
    "sizes",
    [
        dict(d_model=768, n_layer=12, n_head=12, d_inner=3072),  # xlnet-base-cased
        dict(d_model=1024, n_layer=24, n_head=16, d_inner=4096),  # xlnet-large-cased
    ],
    ids=["base", "large"],
)
def test_parameter_count_equals_hf(sizes):
    hf_config = transformers.XLNetConfig(vocab_size=32000, **sizes)
    config = xlnet_family.config_from_hf(hf_config, "XLNetLMHeadModel")
    assert summarize(config)["total"] == _hf_count(hf_config)


def test_bad_inputs_are_named():
    config = _config()
    model, params = _init(config)
    ids = _ids()
    apply = lambda **kw: model.apply({"params": params}, ids, **kw)
    perm, targets = _perm_inputs()
    with pytest.raises(ValueError, match=r"perm_mask must be \(2, 7, 7\), got \(2, 7, 8\)"):
        apply(perm_mask=np.zeros((BATCH, L, L + 1)))
    with pytest.raises(
        ValueError, match=r"target_mapping must be \(B, P, L\) = \(2, P >= 1, 7\), got \(2, 3, 6\)"
    ):
        apply(target_mapping=targets[:, :, :-1])
    with pytest.raises(ValueError, match=r"mems must hold one array per layer \(2\), got 1"):
        apply(mems=[jnp.zeros((BATCH, 3, D))])
    with pytest.raises(ValueError, match=r"mems\[0\] must be \(B, C, D\) = \(2, C, 16\), got"):
        apply(mems=[jnp.zeros((BATCH, 3, 8))] * 2)
    with pytest.raises(ValueError, match=r"mems\[1\] has shape \(2, 4, 16\), but mems\[0\] has"):
        apply(mems=[jnp.zeros((BATCH, 3, D)), jnp.zeros((BATCH, 4, D))])
    with pytest.raises(ValueError, match=r"attention_mask must be \(2, 7\), got \(2, 7, 7\)"):
        apply(attention_mask=perm)
    with pytest.raises(ValueError, match=r"input_ids holds id 37, outside \[0, 37\)"):
        model.apply({"params": params}, np.full((1, 3), VOCAB, np.int32))
    with pytest.raises(TypeError, match="unexpected keyword argument 'masked_positions'"):
        apply(masked_positions=np.zeros((BATCH, 1), np.int32))
    odd = _config(bi_data=True)
    with pytest.raises(ValueError, match="bi_data needs an even batch .* got 3"):
        Transformer(odd).init(jax.random.PRNGKey(0), _ids(batch=3))


def test_other_architectures_refuse_xlnet_inputs():
    encoder = ModelConfig(vocab_size=VOCAB, d_model=D, num_heads=2, d_ff=24, num_layers=1)
    with pytest.raises(TypeError, match="EncoderModel.* unexpected keyword argument 'perm_mask'"):
        Transformer(encoder).init(jax.random.PRNGKey(0), _ids(), perm_mask=np.zeros((2, L, L)))


@pytest.mark.parametrize(
    "make,match",
    [
        (
            lambda: XLNetOptions(attn_type="tri"),
            r"attn_type must be one of \('bi', 'uni'\), got 'tri'",
        ),
        (lambda: XLNetOptions(mem_len=0), "mem_len must be None or a positive int, got 0"),
        (lambda: XLNetOptions(clamp_len=0), "clamp_len must be -1 .* got 0"),
        (lambda: _config().replace(xlnet=None), r"needs ModelConfig.xlnet=XLNetOptions"),
        (lambda: _config().replace(share_layers="all"), "needs ModelConfig.share_layers='none'"),
        (
            lambda: ModelConfig(architecture="decoder", heads=("lm",), xlnet=XLNetOptions()),
            "ModelConfig.xlnet is for architecture='xlnet' or 'transformer_xl', not 'decoder'",
        ),
    ],
)
def test_bad_config_is_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("attn_type", ["bi", "uni"])
def test_scoring_queries_at_their_rows_equals_the_rows_of_the_shift(attn_type):
    """`relative_shift_rows` (the query stream's P predictions) against `relative_shift` (every
    position in order), on the entries whose distance exists: all of them under "bi"."""
    batch, heads, length, memory = 2, 3, 7, 4
    keys = memory + length
    r = keys + length if attn_type == "bi" else keys + 1
    scores = np.random.default_rng(0).normal(size=(batch, heads, length, r)).astype(np.float32)
    rows = np.array([[6, 0, 3], [2, 2, 5]])
    at_rows = scores[np.arange(batch)[:, None], :, rows].transpose(0, 2, 1, 3)  # (B, H, Q, R)
    got = np.asarray(relative_shift_rows(jnp.asarray(at_rows), jnp.asarray(rows), length, keys))
    full = np.asarray(relative_shift(jnp.asarray(scores), keys))
    want = full[np.arange(batch)[:, None], :, rows].transpose(0, 2, 1, 3)
    exists = np.arange(keys)[None, None, :] + length - rows[:, :, None] < r  # (B, Q, M)
    assert got.shape == want.shape == (batch, heads, 3, keys)
    assert exists.all() == (attn_type == "bi")
    np.testing.assert_array_equal(
        np.where(exists[:, None], got, 0), np.where(exists[:, None], want, 0)
    )
