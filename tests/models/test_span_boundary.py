"""The span boundary head (lmsuite.models.span_boundary): what it reads, its equations, and how
the Transformer exposes it."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from scipy.special import erf

from lmsuite.models import ModelConfig, Transformer
from lmsuite.models.embedder import make_token_embedder
from lmsuite.models.span_boundary import SpanBoundaryHead

V, D, L, W, S = 31, 16, 10, 6, 4


def _config(**overrides) -> ModelConfig:
    fields = dict(
        vocab_size=V,
        d_model=D,
        num_heads=2,
        d_ff=24,
        num_layers=2,
        max_length=16,
        heads=("mlm", "sbo"),
        sbo_max_span=S,
        sbo_position_dim=W,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        init_stddev=0.3,
    )
    return ModelConfig(**(fields | overrides))


class _HeadOnly(nn.Module):
    """The head on given encoder outputs, with a token table to tie to."""

    config: ModelConfig

    @nn.compact
    def __call__(self, hidden_BLD, left_BP, right_BP, offsets_BP):
        embedder = make_token_embedder(self.config)
        head = SpanBoundaryHead(config=self.config, token_embedder=embedder, name="sbo_head")
        return head(hidden_BLD, left_BP, right_BP, offsets_BP)


# Row 0: run [3, 5] (tokens 3, 4, 5) and run [7, 7]; row 1: run [1, 2].
LEFT = np.array([[2, 2, 2, 6], [0, 0, 0, 0]], np.int32)
RIGHT = np.array([[6, 6, 6, 8], [3, 3, 3, 3]], np.int32)
OFFSETS = np.array([[0, 1, 2, 0], [0, 1, 0, 0]], np.int32)


def _head_and_params(config, seed=0):
    module = _HeadOnly(config)
    hidden = jax.random.normal(jax.random.PRNGKey(seed), (2, L, D))
    params = module.init(jax.random.PRNGKey(1), hidden, LEFT, RIGHT, OFFSETS)["params"]
    # Random values everywhere (norm scales and biases included), so nothing cancels by init.
    leaves, tree = jax.tree.flatten(nn.unbox(params))
    keys = jax.random.split(jax.random.PRNGKey(2), len(leaves))
    leaves = [0.5 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves, strict=True)]
    return module, jax.tree.unflatten(tree, leaves), hidden


@pytest.mark.parametrize("use_jit", [False, True])
def test_each_prediction_reads_exactly_its_two_boundaries_and_its_offset(use_jit):
    module, params, hidden = _head_and_params(_config())
    apply = lambda h, offsets=OFFSETS: module.apply({"params": params}, h, LEFT, RIGHT, offsets)
    apply = jax.jit(apply) if use_jit else apply
    base = np.asarray(apply(hidden))
    noise = 10.0 * jax.random.normal(jax.random.PRNGKey(3), hidden.shape)
    for b in range(2):
        for j in range(LEFT.shape[1]):
            keep = np.zeros((2, L, 1), bool)
            keep[b, [LEFT[b, j], RIGHT[b, j]]] = True
            # Every other position (the span's own tokens included) changed: no effect.
            elsewhere = np.asarray(apply(jnp.where(keep, hidden, hidden + noise)))
            np.testing.assert_array_equal(elsewhere[b, j], base[b, j])
            for side in (LEFT, RIGHT):
                moved = hidden.at[b, side[b, j]].add(noise[b, side[b, j]])
                assert np.abs(np.asarray(apply(moved))[b, j] - base[b, j]).max() > 1e-3
    shifted = np.asarray(apply(hidden, OFFSETS + 1))
    assert np.abs(shifted - base).max(axis=-1).min() > 1e-3


def test_offsets_beyond_the_table_read_its_last_row():
    module, params, hidden = _head_and_params(_config())
    last = np.full_like(OFFSETS, S - 1)
    beyond = np.full_like(OFFSETS, S + 7)
    run = lambda offsets: module.apply({"params": params}, hidden, LEFT, RIGHT, offsets)
    np.testing.assert_array_equal(run(beyond), run(last))


def _layer_norm(x, scale, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def test_logits_follow_the_reference_equations():
    """h = LN(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s}] + b1)), y = LN(GeLU(W2 h + b2)),
    logits = y T^T + b, with W1 one matrix over the concatenation (pair_bert.py)."""
    config = _config()
    module, params, hidden = _head_and_params(config)
    got = np.asarray(module.apply({"params": params}, hidden, LEFT, RIGHT, OFFSETS))
    p = jax.tree.map(np.asarray, params)
    head, table_VD = p["sbo_head"], p["token_embedder"]["embedding"]
    gelu = lambda x: 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))
    w1 = np.concatenate(
        [head["boundaries"]["kernel"].reshape(2 * D, D), head["offsets"]["kernel"]], axis=0
    )
    x = np.asarray(hidden)
    rows = np.arange(2)[:, None]
    h0 = np.concatenate([x[rows, LEFT], x[rows, RIGHT], head["offset_embedding"][OFFSETS]], axis=-1)
    eps = config.norm_eps
    h1 = _layer_norm(gelu(h0 @ w1 + head["boundaries"]["bias"]), **head["norm_0"], eps=eps)
    y = gelu(h1 @ head["dense_1"]["kernel"] + head["dense_1"]["bias"])
    y = _layer_norm(y, **head["norm_1"], eps=eps)
    want = y @ table_VD.T + head["output"]["output_bias"]
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def _flat(params):
    return traverse_util.flatten_dict(nn.unbox(params), sep="/")


def _spans(masked_positions):
    return dict(
        masked_positions=masked_positions,
        span_left_positions=LEFT,
        span_right_positions=RIGHT,
        span_offsets=OFFSETS,
    )


def test_the_model_adds_only_sbo_head_parameters_and_sbo_logits_only_given_spans():
    ids = jax.random.randint(jax.random.PRNGKey(0), (2, L), 7, V)
    positions = np.array([[3, 4, 5, 7], [1, 2, 0, 0]], np.int32)
    sbo_model = Transformer(_config())
    # Built without span inputs (as conversion and checkpoint loading build it): the head's
    # parameters are there all the same.
    params = nn.unbox(sbo_model.init(jax.random.PRNGKey(1), ids)["params"])
    plain = Transformer(_config(heads=("mlm",))).init(jax.random.PRNGKey(1), ids)["params"]
    with_spans = sbo_model.init(jax.random.PRNGKey(1), ids, **_spans(positions))["params"]
    flat, flat_plain = _flat(params), _flat(plain)
    assert {k: v.shape for k, v in _flat(with_spans).items()} == {
        k: v.shape for k, v in flat.items()
    }
    extra = set(flat) - set(flat_plain)
    assert set(flat_plain) <= set(flat) and extra and all(k.startswith("sbo_head/") for k in extra)
    assert "sbo_head/output/output_projection" not in flat  # tied to the token table

    without = sbo_model.apply({"params": params}, ids, masked_positions=positions)
    assert "sbo_logits" not in without
    out = sbo_model.apply({"params": params}, ids, **_spans(positions))
    assert out["sbo_logits"].shape == (2, 4, V)
    np.testing.assert_array_equal(out["mlm_logits"], without["mlm_logits"])
    plain_params = {k: v for k, v in params.items() if k != "sbo_head"}
    reference = Transformer(_config(heads=("mlm",))).apply(
        {"params": plain_params}, ids, masked_positions=positions
    )
    np.testing.assert_array_equal(reference["mlm_logits"], out["mlm_logits"])

    # The output projection is the token table: moving it moves the SBO logits.
    table = params["token_embedder"]["embedding"]
    moved = params | {"token_embedder": {"embedding": table * 1.5}}
    moved_out = sbo_model.apply({"params": moved}, ids, **_spans(positions))
    assert np.abs(np.asarray(moved_out["sbo_logits"] - out["sbo_logits"])).max() > 1e-3


def test_untied_models_get_their_own_sbo_projection():
    ids = np.full((2, L), 7, np.int32)
    params = Transformer(_config(tie_embeddings=False)).init(jax.random.PRNGKey(0), ids)
    assert "sbo_head/output/output_projection/kernel" in _flat(params["params"])


def test_bad_span_inputs_and_configs_are_refused_by_name():
    ids = np.full((2, L), 7, np.int32)
    positions = np.array([[3, 4, 5, 7], [1, 2, 0, 0]], np.int32)
    model = Transformer(_config())
    params = model.init(jax.random.PRNGKey(0), ids)
    partial = dict(_spans(positions), span_offsets=None)
    with pytest.raises(ValueError, match=r"\['span_offsets'\] are missing"):
        model.apply(params, ids, **partial)
    with pytest.raises(ValueError, match="has no 'sbo'"):
        Transformer(_config(heads=("mlm",))).init(jax.random.PRNGKey(0), ids, **_spans(positions))
    with pytest.raises(ValueError, match=r"span_left_positions must be \(batch, P\).*\(2, 4\)"):
        model.apply(params, ids, **dict(_spans(positions), span_left_positions=LEFT[:, :3]))
    spans = dict(_spans(positions), span_right_positions=RIGHT + L)
    with pytest.raises(ValueError, match=r"span_right_positions holds position 1[0-9]"):
        model.apply(params, ids, **spans)
    with pytest.raises(ValueError, match=r"heads \['sbo'\] need another architecture: 'decoder'"):
        _config(architecture="decoder", heads=("lm", "sbo"))
    with pytest.raises(ValueError, match="sbo_max_span must be a positive int"):
        _config(sbo_max_span=0)
