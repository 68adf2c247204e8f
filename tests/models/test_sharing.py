"""Cross-layer sharing (ALBERT): shared parameters exist once and are what every layer uses."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from lmsuite.layers import masks
from lmsuite.models import ModelConfig, Transformer
from lmsuite.models.block import Block
from lmsuite.models.embedder import Embedder

LAYERS = 3
CFG = ModelConfig(
    vocab_size=37,
    d_model=12,
    num_heads=3,
    d_ff=17,
    num_layers=LAYERS,
    max_length=16,
    embedding_dim=8,
    heads=("mlm",),
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
IDS = np.array([[5, 9, 2, 7, 3, 11], [4, 8, 6, 0, 0, 0]], np.int32)
MASK = (np.arange(6)[None, :] < np.array([[6], [3]])).astype(np.int32)


def _init(cfg, seed=0):
    """Random values for every parameter (norms and biases too), without compiling `init`."""
    rng = np.random.default_rng(seed)
    return {
        k: jnp.asarray(rng.normal(size=v.shape, scale=0.3) + k.endswith("scale"), jnp.float32)
        for k, v in _shapes(cfg).items()
    }


def _shapes(cfg):
    """Parameter shapes only (abstract evaluation, nothing computed)."""
    params = jax.eval_shape(Transformer(cfg).init, jax.random.PRNGKey(0), IDS)["params"]
    return traverse_util.flatten_dict(nn.unbox(params), sep="/")


def _count(flat, prefix=""):
    return sum(int(np.prod(v.shape)) for k, v in flat.items() if k.startswith(prefix))


@functools.cache
def _apply(cfg):
    return jax.jit(
        lambda params: Transformer(cfg).apply({"params": params}, IDS, attention_mask=MASK)
    )


def _forward(cfg, flat):
    return _apply(cfg)(traverse_util.unflatten_dict(flat, sep="/"))["hidden"]


def test_share_all_has_one_layer_and_a_count_independent_of_depth():
    counts = {}
    for n in (1, 2, 5):
        flat = _shapes(CFG.replace(share_layers="all", num_layers=n))
        layers = {k.split("/")[1] for k in flat if k.startswith("encoder/")}
        assert layers == {"layers_shared"}
        counts[n] = _count(flat)
    assert counts[1] == counts[2] == counts[5]
    unshared = _shapes(CFG)
    layer = _count(unshared, "encoder/layers_0/")
    assert _count(unshared) - counts[1] == (LAYERS - 1) * layer


@pytest.mark.parametrize(
    "share, shared_name, module",
    [("attention", "shared_attention", "attention"), ("ffn", "shared_mlp", "mlp")],
)
def test_partial_sharing_shares_exactly_one_sublayer(share, shared_name, module):
    unshared = _shapes(CFG)
    shared = _shapes(CFG.replace(share_layers=share))
    per_layer = {
        k.split("/", 2)[2]: v.shape
        for k, v in unshared.items()
        if k.startswith("encoder/layers_0/")
    }
    # The shared module: the unshared layer's `module` subtree, once, under `shared_name`.
    expected_shared = {
        k[len(module) + 1 :]: s for k, s in per_layer.items() if k.startswith(module + "/")
    }
    got_shared = {
        k.split("/", 2)[2]: v.shape
        for k, v in shared.items()
        if k.startswith(f"encoder/{shared_name}/")
    }
    assert got_shared == expected_shared and got_shared
    # Each layer keeps everything else (its other sublayer and all of its norms).
    for i in range(LAYERS):
        rest = {
            k.split("/", 2)[2]: v.shape
            for k, v in shared.items()
            if k.startswith(f"encoder/layers_{i}/")
        }
        assert rest == {k: s for k, s in per_layer.items() if not k.startswith(module + "/")}
    module_size = sum(int(np.prod(s)) for s in expected_shared.values())
    assert _count(unshared) - _count(shared) == (LAYERS - 1) * module_size


@pytest.mark.parametrize(
    "share, shared_name, module, probe",
    [
        ("all", "layers_shared", "", "mlp/wi/kernel"),
        ("attention", "shared_attention", "attention/", "attention/value/kernel"),
        ("ffn", "shared_mlp", "mlp/", "mlp/wi/kernel"),
    ],
)
def test_shared_model_equals_unshared_model_with_copied_weights(share, shared_name, module, probe):
    """Copying the shared weights into every layer of an unshared model gives the same output:
    every layer of the shared model really reads the one shared copy."""
    cfg = CFG.replace(share_layers=share)
    shared = _init(cfg)
    copied = {}
    for k, v in shared.items():
        if k.startswith(f"encoder/{shared_name}/"):
            rest = k[len(f"encoder/{shared_name}/") :]
            for i in range(LAYERS):
                copied[f"encoder/layers_{i}/{module}{rest}"] = v
        else:
            copied[k] = v
    assert set(copied) == set(_shapes(CFG))
    out = _forward(cfg, shared)
    np.testing.assert_allclose(_forward(CFG, copied), out, rtol=1e-5, atol=1e-5)
    # Changing only layer 2's copy makes the unshared model differ: the check has teeth.
    key = f"encoder/layers_2/{probe}"
    noise = jax.random.normal(jax.random.PRNGKey(1), copied[key].shape)
    copied[key] = copied[key] + 0.5 * noise
    assert np.max(np.abs(_forward(CFG, copied) - out)) > 1e-3


def test_share_all_is_one_block_applied_num_layers_times():
    cfg = CFG.replace(share_layers="all")
    params = traverse_util.unflatten_dict(_init(cfg), sep="/")

    @jax.jit
    def run(params):
        # The embedder's output is captured from the same forward pass.
        out, state = Transformer(cfg).apply(
            {"params": params},
            IDS,
            attention_mask=MASK,
            capture_intermediates=lambda mdl, _: isinstance(mdl, Embedder),
            mutable=["intermediates"],
        )
        x = state["intermediates"]["embedder"]["__call__"][0]
        block = Block(config=cfg)
        steps = []
        for _ in range(LAYERS):
            x = block.apply(
                {"params": params["encoder"]["layers_shared"]}, x, mask=masks.padding_mask(MASK)
            )
            steps.append(x)
        return out["hidden"], steps

    hidden, steps = run(params)
    np.testing.assert_allclose(steps[-1], hidden, rtol=1e-5, atol=1e-5)
    # N - 1 applications are not enough: the depth is really N.
    assert np.max(np.abs(steps[-2] - hidden)) > 1e-3
