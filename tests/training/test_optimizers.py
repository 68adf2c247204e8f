"""The optimizers reproduce the papers' update rules."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lmsuite.training import optimizers


def _run_constant_gradient(tx, params, grads, steps):
    state = tx.init(params)
    updates = []
    for _ in range(steps):
        update, state = tx.update(grads, state, params)
        updates.append(update)
    return updates


@pytest.mark.parametrize("t, factor", [(1, 3.16228), (12, 6.5685)])
def test_adam_without_bias_correction_reference_factor(t, factor):
    """TF BERT's Adam (no bias correction) against the bias-corrected step, constant gradient g.

    m_t = (1 - b1^t) g and v_t = (1 - b2^t) g^2, so without correction the step is
    (1 - b1^t) / sqrt(1 - b2^t) * lr * sign(g), while with correction m_hat / sqrt(v_hat) = sign(g)
    and the step is exactly lr. The factor is their ratio (equivalently |step| / lr):
    t=1: 0.1 / sqrt(0.001) = 3.16228; t=12: (1 - 0.9^12) / sqrt(1 - 0.999^12) = 6.5685.
    eps is set to 1e-12 and |g| = 3 so that eps does not move the 5th digit.
    """
    params = {"w": jnp.ones((3,))}
    grads = {"w": jnp.full((3,), 3.0)}
    kwargs = dict(learning_rate=1e-3, weight_decay=0.0, eps=1e-12)
    raw = _run_constant_gradient(
        optimizers.adamw(bias_correction=False, **kwargs), params, grads, t
    )[-1]["w"]
    corrected = _run_constant_gradient(
        optimizers.adamw(bias_correction=True, **kwargs), params, grads, t
    )[-1]["w"]
    np.testing.assert_allclose(corrected, -1e-3, rtol=2e-5)  # float32 1 - b2**t
    np.testing.assert_allclose(raw / corrected, factor, rtol=2e-5)
    np.testing.assert_allclose(-raw / 1e-3, factor, rtol=2e-5)


def _toy_params():
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "layers_0": {
            "attention_norm": {"scale": jnp.ones((8,)), "bias": jnp.zeros((8,)) + 0.1},
            "mlp": {
                "wi": {"kernel": jax.random.normal(k1, (8, 16)), "bias": jnp.full((16,), 0.5)},
                "wo": {"kernel": 3.0 * jax.random.normal(k2, (16, 8))},
            },
        },
        "token_embedder": {"embedding": jax.random.normal(k3, (32, 8))},
    }


def test_decay_mask_excludes_norms_and_biases():
    mask = optimizers.decay_mask(_toy_params())
    assert mask["layers_0"]["attention_norm"] == {"scale": False, "bias": False}
    assert mask["layers_0"]["mlp"]["wi"] == {"kernel": True, "bias": False}
    assert mask["layers_0"]["mlp"]["wo"]["kernel"] is True
    assert mask["token_embedder"]["embedding"] is True


def test_decay_mask_excludes_every_name_ending_in_bias():
    """TF BERT, ALBERT and XLNet exclude every variable whose name holds "bias" (the MLM head's
    output_bias too), but not the kernels beside them."""
    params = {
        "lm_head": {"output_bias": jnp.ones(3), "kernel": jnp.ones((2, 3))},
        "attention": {"segment_embedding": jnp.ones(2)},
        "bias_free": {"kernel": jnp.ones(2)},
    }
    mask = optimizers.decay_mask(params)
    assert mask["lm_head"] == {"output_bias": False, "kernel": True}
    assert mask["attention"] == {"segment_embedding": True}
    assert mask["bias_free"]["kernel"] is True


def test_decay_mask_of_a_tiny_xlnet_is_the_references():
    """XLNet's `_do_use_weight_decay` (zihangdai/xlnet model_utils.py) checks its include list
    r_w_bias, r_r_bias, r_s_bias before the exclude list LayerNorm, layer_norm, bias: the
    relative-attention biases are decayed, LayerNorm parameters and the other biases are not."""
    from lmsuite.cli import model_config_from_gin
    from lmsuite.models.summary import abstract_variables

    boxed = abstract_variables(model_config_from_gin(["models/xlnet_tiny.gin"]))["params"]
    params = nn.unbox(boxed)  # the train state holds unboxed parameters
    flat = jax.tree_util.tree_leaves_with_path(optimizers.decay_mask(params))
    decayed = {optimizers._path_string(path) for path, m in flat if m}
    kept = {optimizers._path_string(path) for path, m in flat if not m}
    assert {
        "layers_0/attention/content_bias",  # r_w_bias
        "layers_0/attention/position_bias",  # r_r_bias
        "layers_0/attention/segment_bias",  # r_s_bias
        "layers_0/attention/query/kernel",
        "layers_0/attention/segment_embedding",  # seg_embed
        "layers_0/mlp/wi/kernel",
        "mask_emb",
        "token_embedder/embedding",
    } <= decayed
    assert {
        "layers_0/mlp/wi/bias",
        "layers_0/post_attention_norm/scale",
        "layers_0/post_attention_norm/bias",
        "lm_head/output_bias",  # lm_loss/bias
    } <= kept
    assert not any("norm" in p or p.endswith("/bias") or p.endswith("output_bias") for p in decayed)


def test_albert_lamb_trust_ratio_and_plain_adam_for_masked():
    """Adapted variables move by exactly lr * ||w|| per step; norms and biases take plain Adam."""
    lr = optimizers.ALBERT_LAMB_LEARNING_RATE
    params = _toy_params()
    grads = jax.tree.map(
        lambda p: jnp.sin(jnp.arange(p.size, dtype=jnp.float32)).reshape(p.shape) + 0.3, params
    )
    tx = optimizers.lamb(learning_rate=lr, weight_decay=0.01, eps=1e-6)
    state = tx.init(params)
    b1, b2, eps = 0.9, 0.999, 1e-6
    for t in range(1, 4):
        updates, state = tx.update(grads, state, params)
        mask = optimizers.decay_mask(params)
        flat_u = jax.tree_util.tree_leaves_with_path(updates)
        flat_p = dict(jax.tree_util.tree_leaves_with_path(params))
        flat_g = dict(jax.tree_util.tree_leaves_with_path(grads))
        flat_m = dict(jax.tree_util.tree_leaves_with_path(mask))
        for path, u in flat_u:
            w, g = flat_p[path], flat_g[path]
            if flat_m[path]:
                np.testing.assert_allclose(jnp.linalg.norm(u), lr * jnp.linalg.norm(w), rtol=1e-5)
            else:
                # Constant gradient, no bias correction: m = (1-b1^t) g, v = (1-b2^t) g^2.
                adam = (1 - b1**t) * g / (jnp.sqrt((1 - b2**t) * g**2) + eps)
                np.testing.assert_allclose(u, -lr * adam, rtol=1e-5)
        params = optax.apply_updates(params, updates)


def test_adamw_decays_only_masked_in_parameters():
    params = _toy_params()
    zeros = jax.tree.map(jnp.zeros_like, params)
    tx = optimizers.adamw(learning_rate=0.1, weight_decay=0.5)
    updates, _ = tx.update(zeros, tx.init(params), params)
    mask = optimizers.decay_mask(params)
    for u, p, m in zip(
        jax.tree.leaves(updates), jax.tree.leaves(params), jax.tree.leaves(mask), strict=True
    ):
        np.testing.assert_allclose(u, -0.1 * 0.5 * p if m else 0.0 * p, rtol=1e-6)


@pytest.mark.parametrize("name", optimizers.OPTIMIZERS)
def test_make_optimizer_clips_global_norm(name):
    params = {"w": jnp.ones((256, 128)), "b": jnp.ones((128,))}
    big = jax.tree.map(lambda p: 1e6 * jnp.ones_like(p), params)
    tx = optimizers.make_optimizer(name=name, learning_rate=1e-3, clip_norm=1.0)
    updates, _ = jax.jit(tx.update)(big, tx.init(params), params)
    assert all(bool(jnp.all(jnp.isfinite(u))) for u in jax.tree.leaves(updates))
    # Clipping happens before the optimizer: the first transformation's output has norm 1.
    clipped, _ = optax.clip_by_global_norm(1.0).update(big, optax.EmptyState())
    np.testing.assert_allclose(optax.global_norm(clipped), 1.0, rtol=1e-5)


def test_unknown_optimizer_names_choices():
    with pytest.raises(ValueError, match="adamw.*got 'adamx'"):
        optimizers.make_optimizer(name="adamx", learning_rate=1e-3)


@pytest.mark.parametrize("name", ["adamw", "lamb", "adafactor"])
def test_optimizer_state_is_sharded_like_the_parameters_under_fsdp(name):
    """Under a fully sharded mesh every optimizer-state array shaped like its parameter (Adam's
    and LAMB's mu and nu) is split as the parameter is, not replicated on every device; what
    stays replicated is small (counts, Adafactor's factored rows and columns)."""
    from jax.sharding import PartitionSpec

    from lmsuite import partitioning
    from lmsuite.models import Transformer
    from lmsuite.training import train_state
    from tests.training import tiny

    config = tiny.CONFIG.replace(d_model=128, num_heads=4, d_ff=256)
    model = Transformer(config)
    ids = jnp.zeros((1, 16), jnp.int32)
    mesh = partitioning.make_mesh(data=1, fsdp=8, tensor=1, devices=jax.devices()[:8])
    tx = optimizers.make_optimizer(name=name, learning_rate=1e-3)
    state, shardings, _ = train_state.sharded_abstract_state(
        init_params=lambda rng: model.init({"params": rng}, ids)["params"],
        tx=tx,
        mesh=mesh,
        rng=jax.random.PRNGKey(0),
    )
    param_specs = {
        (p.shape, str(s.spec))
        for p, s in zip(*map(jax.tree.leaves, (state.params, shardings.params)), strict=True)
    }
    sharded = replicated_bytes = 0
    for leaf, sharding in zip(
        *map(jax.tree.leaves, (state.opt_state, shardings.opt_state)), strict=True
    ):
        if sharding.spec != PartitionSpec():
            sharded += 1
            assert (leaf.shape, str(sharding.spec)) in param_specs
        else:
            replicated_bytes += leaf.size * leaf.dtype.itemsize
    param_bytes = sum(p.size * p.dtype.itemsize for p in jax.tree.leaves(state.params))
    if name in ("adamw", "lamb"):
        assert sharded >= 2 * sum(
            s.spec != PartitionSpec() for s in jax.tree.leaves(shardings.params)
        )
    assert replicated_bytes < 0.5 * param_bytes
