"""ModelConfig.remat and ModelConfig.scan_layers change memory and compile time, not the network:
the same outputs and gradients, per-layer dropout under scan, and clear refusals."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lmsuite.cli import model_config_from_gin
from lmsuite.models import ModelConfig, Transformer, families, scan_layout
from lmsuite.models.stack import Stack

# Relative bias broadcast to every layer (t5), DeBERTa's relative terms (deberta_v3), TUPE's
# positional term, a causal stack, and ELECTRA's two stacks.
GIN = {
    "bert": "models/bert_tiny.gin",
    "t5": "models/t5_tiny.gin",
    "gpt2": "models/gpt2_tiny.gin",
    "deberta": "models/deberta_v3_tiny.gin",
    "tupe": "models/tupe_tiny.gin",
    "electra": "models/electra_tiny.gin",
}


def _config(name: str, **changes) -> ModelConfig:
    # Three layers (four in the T5 decoder): a layer axis of 2 could hide a transposed stack.
    config = model_config_from_gin([GIN[name]]).replace(**({"num_layers": 3} | changes))
    if families.family(config).seq2seq:
        config = config.replace(num_decoder_layers=4)
    return config


def _inputs(config: ModelConfig, *, batch: int = 2, length: int = 8) -> dict:
    rs = np.random.RandomState(0)
    ids = rs.randint(5, config.vocab_size, (batch, length)).astype(np.int32)
    mask = np.ones((batch, length), np.int32)
    mask[1, length // 2 :] = 0
    inputs = {"input_ids": ids * mask, "attention_mask": mask}
    fam = families.family(config)
    if fam.seq2seq:
        inputs["decoder_input_ids"] = rs.randint(5, config.vocab_size, (batch, 5)).astype(np.int32)
    if fam is families.ELECTRA:
        inputs["masked_positions"] = np.array([[1, 2], [0, 3]], np.int32)
    return inputs


def _loss_fn(config: ModelConfig, inputs: dict, *, deterministic: bool = True):
    model = Transformer(config)
    rngs = {"dropout": jax.random.PRNGKey(3), "sample": jax.random.PRNGKey(4)}

    def loss(params):
        out = model.apply({"params": params}, **inputs, deterministic=deterministic, rngs=rngs)
        logits = [v for k, v in sorted(out.items()) if k.endswith("_logits")]
        return sum(jnp.sum(jnp.sin(x.astype(jnp.float32))) for x in logits), out

    return loss


def _init(config: ModelConfig, inputs: dict):
    model = Transformer(config)
    rngs = {"params": jax.random.PRNGKey(0), "sample": jax.random.PRNGKey(1)}
    return nn.unbox(model.init(rngs, **inputs)["params"])


def _assert_trees_close(a, b, tol=1e-5):
    """Leaf by leaf within tol of the leaf's largest entry: scan and remat reorder float sums."""
    flat_a = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(a)}
    flat_b = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(b)}
    assert sorted(flat_a) == sorted(flat_b)
    for path, x in flat_a.items():
        expected = np.asarray(flat_b[path])
        atol = tol * max(1.0, float(np.abs(expected).max()))
        np.testing.assert_allclose(np.asarray(x), expected, rtol=tol, atol=atol, err_msg=path)


@pytest.mark.parametrize("name", sorted(GIN))
def test_scanned_stack_gives_the_unscanned_outputs_and_gradients(name):
    config = _config(name)
    scanned = config.replace(scan_layers=True)
    inputs = _inputs(config)
    params = _init(config, inputs)
    stacked = scan_layout.scan_params(params, scanned)
    for path, num_layers in scan_layout.stack_paths(config):
        node = stacked
        for key in path:
            node = node[key]
        assert not any(k.startswith("layers_") for k in node)
        assert {x.shape[0] for x in jax.tree.leaves(node["layers"])} == {num_layers}
    (loss, out), grads = jax.value_and_grad(_loss_fn(config, inputs), has_aux=True)(params)
    (loss_s, out_s), grads_s = jax.value_and_grad(_loss_fn(scanned, inputs), has_aux=True)(stacked)
    np.testing.assert_allclose(loss_s, loss, rtol=1e-5)
    _assert_trees_close(out_s, out)
    _assert_trees_close(scan_layout.unscan_params(grads_s, scanned), grads)


@pytest.mark.parametrize("name", ["bert", "t5", "electra"])
def test_scanned_init_has_the_scanned_tree_with_a_layers_axis(name):
    scanned = _config(name, scan_layers=True)
    inputs = _inputs(scanned)
    model = Transformer(scanned)
    boxed = jax.eval_shape(lambda r: model.init({"params": r}, **inputs), jax.random.PRNGKey(0))
    params = nn.unbox(boxed["params"])
    unstacked = jax.eval_shape(lambda p: scan_layout.unscan_params(p, scanned), params)
    expected = jax.eval_shape(lambda: _init(scanned.replace(scan_layers=False), inputs))
    assert jax.tree.map(lambda x: x.shape, unstacked) == jax.tree.map(lambda x: x.shape, expected)
    specs = nn.get_partition_spec(boxed["params"])
    kernel = specs[scan_layout.stack_paths(scanned)[0][0][0]]
    if name == "electra":
        kernel = specs["discriminator"]["encoder"]
    assert tuple(kernel["layers"]["mlp"]["wo"]["kernel"]) == ("layers", "mlp", "embed")


@pytest.mark.parametrize(
    "remat, name, scan",
    [
        # the fast suite: each policy once, one scanned and one unscanned; test-all: all of them
        ("dots", "bert", True),
        ("full", "bert", False),
        pytest.param("dots", "bert", False, marks=pytest.mark.slow),
        pytest.param("full", "bert", True, marks=pytest.mark.slow),
        pytest.param("dots", "t5", True, marks=pytest.mark.slow),
        pytest.param("full", "t5", True, marks=pytest.mark.slow),
    ],
)
def test_remat_gives_the_same_loss_and_gradients_with_dropout(name, scan, remat):
    config = _config(name, scan_layers=scan)
    inputs = _inputs(config)
    params = _init(config, inputs)
    grad = lambda cfg: jax.jit(
        jax.value_and_grad(_loss_fn(cfg, inputs, deterministic=False), has_aux=True)
    )(params)
    (loss, _), grads = grad(config)
    (loss_r, _), grads_r = grad(config.replace(remat=remat))
    np.testing.assert_allclose(loss_r, loss, rtol=1e-5)
    _assert_trees_close(grads_r, grads, tol=1e-5)


@pytest.mark.parametrize("scan", [False, True])
def test_remat_policies_keep_less_for_the_backward_pass(scan):
    """What the gradient keeps from the forward pass (the residuals in jax.vjp's closure)
    shrinks from none to dots to full."""
    config = _config("bert", scan_layers=scan, d_model=64, d_ff=256)
    inputs = _inputs(config, batch=4, length=32)
    params = _init(config, inputs)

    def kept_bytes(remat):
        loss = _loss_fn(config.replace(remat=remat), inputs)
        _, vjp_fn = jax.vjp(lambda p: loss(p)[0], params)
        return sum(x.nbytes for x in jax.tree.leaves(vjp_fn))

    none, dots, full = kept_bytes("none"), kept_bytes("dots"), kept_bytes("full")
    assert none > dots > full, (none, dots, full)


@pytest.mark.parametrize("scan", [False, True])
def test_each_layer_draws_its_own_dropout_mask(scan):
    """Every layer adds dropout(1) to the residual and nothing else (zero weights, pre-norm with
    zero scales, attention output bias 1), so with p = 0.5 an entry of output - input is
    2 * (the number of layers that kept it). Two layers sharing one dropout key give 0 or 4
    only; independent keys also give 2."""
    config = _config(
        "bert",
        num_layers=2,
        norm_position="pre",
        final_norm=False,
        dropout_rate=0.5,
        attention_dropout_rate=0.0,
        scan_layers=scan,
    )
    stack = Stack(config=config, num_layers=2)
    x_BLD = jnp.asarray(np.random.RandomState(0).randn(4, 8, config.d_model), jnp.float32)
    params = nn.unbox(stack.init(jax.random.PRNGKey(0), x_BLD)["params"])
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: (
            jnp.ones_like(p)
            if jax.tree_util.keystr(path).endswith("['attention']['out']['bias']")
            else jnp.zeros_like(p)
        ),
        params,
    )
    y_BLD = stack.apply(
        {"params": params}, x_BLD, deterministic=False, rngs={"dropout": jax.random.PRNGKey(5)}
    )
    added = np.round(np.asarray(y_BLD - x_BLD), 4)
    assert set(np.unique(added)) == {0.0, 2.0, 4.0}


def test_scan_layout_round_trip_is_exact_and_refuses_a_wrong_tree():
    config = _config("t5")
    params = _init(config, _inputs(config))
    scanned = scan_layout.scan_params(params, config)
    back = scan_layout.unscan_params(scanned, config)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert "layers_0" in params["encoder"]  # the input is left as it was
    with pytest.raises(ValueError, match="encoder is not an unscanned stack of 3 layers"):
        scan_layout.scan_params(scanned, config)
    with pytest.raises(ValueError, match="encoder is not a scanned stack"):
        scan_layout.unscan_params(params, config)
    with pytest.raises(ValueError, match="must stack 5 layers on its leading axis, got"):
        scan_layout.unscan_params(scanned, config.replace(num_layers=5))
    boxed = Transformer(config).init(jax.random.PRNGKey(0), **_inputs(config))["params"]
    with pytest.raises(ValueError, match="boxed"):
        scan_layout.scan_params(boxed, config)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(remat="some"), r"ModelConfig.remat must be one of \('none', 'dots', 'full'\)"),
        (dict(scan_layers=1), "ModelConfig.scan_layers must be a bool, got 1"),
        (
            dict(scan_layers=True, share_layers="all"),
            "scan_layers=True cannot apply: share_layers='all'",
        ),
        (
            dict(scan_layers=True, share_layers="ffn"),
            "scan_layers=True cannot apply: share_layers='ffn'",
        ),
    ],
)
def test_invalid_combinations_name_the_option(changes, message):
    with pytest.raises(ValueError, match=message):
        _config("bert", **changes)


def test_scan_refuses_the_enhanced_mask_decoder_and_xlnet():
    deberta = _config("deberta")
    emd = "scan_layers=True cannot apply: DebertaOptions.emd_layers=2"
    with pytest.raises(ValueError, match=emd):
        deberta.replace(deberta=deberta.deberta.replace(emd_layers=2), scan_layers=True)
    xlnet = model_config_from_gin(["models/xlnet_tiny.gin"])
    with pytest.raises(ValueError, match="architecture='xlnet' runs its own two-stream"):
        xlnet.replace(scan_layers=True)
    # remat alone is fine for both
    deberta.replace(deberta=deberta.deberta.replace(emd_layers=2), remat="full")
    xlnet.replace(remat="dots")


def test_cached_decoding_refuses_the_scanned_layout():
    config = _config("gpt2", scan_layers=True)
    params = _init(config, _inputs(config))
    cache = families.init_cache(config, batch_size=2, length=8)
    with pytest.raises(ValueError, match="cached decoding runs the unscanned layout"):
        Transformer(config).apply(
            {"params": params},
            np.ones((2, 1), np.int32),
            cache=cache,
            cache_index=jnp.int32(0),
        )


@pytest.mark.parametrize("remat", ["dots", "full"])
def test_xlnet_and_shared_layers_take_remat(remat):
    """XLNet's own layer loop, ALBERT's one block, a shared FFN and DeBERTa's enhanced mask
    decoder (which reruns the last layer) take remat: the same tree and the same gradients."""
    deberta = _config("deberta")
    configs = [
        deberta.replace(deberta=deberta.deberta.replace(emd_layers=2)),
        model_config_from_gin(["models/xlnet_tiny.gin"]),
        model_config_from_gin(["models/albert_tiny.gin"]),
        _config("bert", share_layers="ffn"),
    ]
    for config in configs:
        inputs = {"input_ids": np.random.RandomState(0).randint(5, 100, (2, 8)).astype(np.int32)}
        params = _init(config, inputs)
        rematted = config.replace(remat=remat)
        assert jax.tree.structure(_init(rematted, inputs)) == jax.tree.structure(params)
        (_, _), grads = jax.value_and_grad(_loss_fn(config, inputs), has_aux=True)(params)
        (_, _), grads_r = jax.value_and_grad(_loss_fn(rematted, inputs), has_aux=True)(params)
        _assert_trees_close(grads_r, grads)
