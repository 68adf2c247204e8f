"""The sharded train step: accumulation, mesh invariance, FSDP memory, mixed precision, NaNs.

Mesh tests need 8 devices: the Makefile sets XLA_FLAGS=--xla_force_host_platform_device_count=8.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lmsuite import partitioning
from lmsuite.models import Transformer, scan_layout
from lmsuite.objectives import mlm
from lmsuite.training import step
from tests.training import tiny

needs_8 = pytest.mark.skipif(
    jax.device_count() < 8, reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8"
)


def _run(mesh, steps, **kwargs):
    state, run, batch_sharding, _ = tiny.build(mesh=mesh, **kwargs)
    losses = []
    for _ in range(steps):
        batch = jax.device_put(kwargs.get("batch", tiny.mlm_batch(seed=0)), batch_sharding)
        state, metrics = run(state, batch, jax.random.PRNGKey(7))
        losses.append(float(metrics["loss"]))
    return state, losses


def test_accumulating_4_microbatches_equals_one_batch():
    """Gradients of 4 accumulated microbatches equal the 8-row batch's to 1e-6 relative.

    Without dropout the only difference is float32 summation order.
    """
    config = tiny.CONFIG.replace(dropout_rate=0.0, attention_dropout_rate=0.0)
    model = Transformer(config)
    params = model.init({"params": jax.random.PRNGKey(0)}, jnp.zeros((1, 8), jnp.int32))["params"]
    params = nn.unbox(params)
    batch = tiny.mlm_batch(batch_size=8)
    results = [
        jax.jit(
            functools.partial(
                step.loss_and_grads, apply_fn=model.apply, objective=mlm(), num_microbatches=n
            )
        )(params, batch, jax.random.PRNGKey(1))
        for n in (1, 4)
    ]
    (loss1, metrics1, grads1, _), (loss4, metrics4, grads4, _) = results
    np.testing.assert_allclose(loss4, loss1, rtol=1e-6)
    np.testing.assert_allclose(metrics4["mlm_accuracy"], metrics1["mlm_accuracy"], rtol=1e-6)
    # Relative to the whole gradient: some leaves (key biases) have an exactly-zero gradient.
    error = optax.global_norm(jax.tree.map(jnp.subtract, grads4, grads1))
    assert error <= 1e-6 * optax.global_norm(grads1)


@pytest.fixture(scope="module", params=["gathered", "dense"])
def targets(request):
    """MLM targets as EncoderMlmFeatureConverter gives them (logits at P gathered positions) or
    as SeqIO's EncoderFeatureConverter does (logits at every position)."""
    return request.param


@pytest.fixture(scope="module")
def single_device_losses(targets):
    batch = tiny.mlm_batch(dense=targets == "dense")
    losses = _run(partitioning.make_mesh(devices=jax.devices()[:1]), 5, batch=batch)[1]
    assert losses[-1] < losses[0]
    return losses


@needs_8
@pytest.mark.parametrize(
    "mesh_shape",
    [
        pytest.param((8, 1, 1), marks=pytest.mark.slow),
        pytest.param((2, 4, 1), marks=pytest.mark.slow),
        (2, 2, 2),
    ],
)
def test_meshes_give_single_device_losses(mesh_shape, targets, single_device_losses):
    """5 steps with dropout on. The gathered (2, 2, 2) case failed before VocabHead constrained
    its transform output (an XLA partitioning bug; tests/training/test_mesh_gradients.py).

    (8, 1, 1) and (2, 4, 1) run in `make test-all` only: (2, 2, 2) shards over every axis,
    data included."""
    data, fsdp, tensor = mesh_shape
    mesh = partitioning.make_mesh(data=data, fsdp=fsdp, tensor=tensor)
    losses = _run(mesh, 5, batch=tiny.mlm_batch(dense=targets == "dense"))[1]
    np.testing.assert_allclose(losses, single_device_losses, rtol=1e-5)


@needs_8
def test_fsdp_4_stores_a_quarter_of_each_large_parameter_per_device():
    mesh = partitioning.make_mesh(data=2, fsdp=4, tensor=1)
    state, _, _, _ = tiny.build(mesh=mesh)
    large = [(p, x) for p, x in jax.tree_util.tree_leaves_with_path(state.params) if x.size >= 1024]
    assert len(large) >= 9
    for path, x in large:
        per_device = {shard.data.nbytes for shard in x.addressable_shards}
        assert per_device == {x.nbytes // 4}, jax.tree_util.keystr(path)
    # Adam's moments follow their parameter.
    mu = state.opt_state[1][0].mu
    kernel = mu["encoder"]["layers_0"]["mlp"]["wi"]["kernel"]
    assert kernel.addressable_shards[0].data.nbytes == kernel.nbytes // 4


def test_bfloat16_compute_keeps_float32_parameters_and_optimizer_state():
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    config = tiny.CONFIG.replace(dtype="bfloat16")
    state, losses = _run(mesh, 2, config=config)
    dtypes = {x.dtype for x in jax.tree.leaves((state.params, state.opt_state)) if x.ndim > 0}
    assert dtypes == {jnp.dtype(jnp.float32)}
    assert np.isfinite(losses).all()


def _cycle_losses(config, steps):
    """Training losses of `config` on four MLM batches in turn (the model memorises them)."""
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    state, run, batch_sharding, _ = tiny.build(mesh=mesh, config=config, lr=3e-3)
    batches = [jax.device_put(tiny.mlm_batch(seed=s), batch_sharding) for s in range(4)]
    losses = []
    for i in range(steps):
        state, metrics = run(state, batches[i % 4], jax.random.PRNGKey(i))
        losses.append(float(metrics["loss"]))
    return np.asarray(losses)


def test_bfloat16_learns_as_float32_does():
    """60 steps at bf16 end within 0.05 nats of float32's loss (one value per batch, last cycle).

    Parameters and Adam's moments stay float32, so only the forward and backward passes round,
    to 8 significant bits (2**-8 relative): the loss of a step moves by ~1e-3, and 60 steps of
    such nudges measured 1.3e-3 apart at the end, against a drop of ~1.8 nats from the start. A
    bf16 run that did not learn, or learned a different function, is off by far more than 0.05.
    """
    f32 = _cycle_losses(tiny.CONFIG, 60)
    bf16 = _cycle_losses(tiny.CONFIG.replace(dtype="bfloat16"), 60)
    assert bf16[-4:].mean() < bf16[:4].mean() - 1.0, bf16
    assert not np.array_equal(bf16, f32), "bf16 losses equal float32's bitwise: is bf16 in effect?"
    np.testing.assert_allclose(bf16[-4:].mean(), f32[-4:].mean(), atol=0.05)


@pytest.mark.parametrize("skip", [False, True])
def test_nonfinite_loss_is_flagged_and_optionally_skipped(skip):
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    bad = tiny.mlm_batch()
    bad["masked_weights"][0, 0] = np.nan
    state, run, sharding, _ = tiny.build(mesh=mesh, batch=bad, skip_nonfinite=skip)
    before = jax.tree.map(np.asarray, state.params)
    state, metrics = run(state, jax.device_put(bad, sharding), jax.random.PRNGKey(0))
    assert int(metrics["nonfinite"]) == 1
    assert int(state.skipped) == int(skip)
    assert int(state.step) == 1
    unchanged = all(
        np.array_equal(a, np.asarray(b))
        for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params), strict=True)
    )
    assert unchanged == skip


@needs_8
def test_scanned_rematted_step_trains_as_the_unscanned_one():
    """ModelConfig.scan_layers + remat="dots" on a (2, 2, 2) mesh: from the same parameters
    (scan_layout), the same losses; the stacked "layers" axis stays unsharded."""
    mesh = partitioning.make_mesh(data=2, fsdp=2, tensor=2)
    config = tiny.CONFIG.replace(num_layers=3, dropout_rate=0.0, attention_dropout_rate=0.0)
    scanned = config.replace(scan_layers=True, remat="dots")
    state, run, batch_sharding, _ = tiny.build(mesh=mesh, config=config)
    state_s, run_s, _, shardings_s = tiny.build(mesh=mesh, config=scanned)
    params = scan_layout.scan_params(jax.device_get(state.params), scanned)
    state_s = state_s.replace(params=jax.device_put(params, shardings_s.params))
    kernel = state_s.params["encoder"]["layers"]["mlp"]["wi"]["kernel"]
    assert kernel.shape == (3, 32, 64)
    assert tuple(kernel.sharding.spec) == (None, "fsdp", "tensor")
    losses, losses_s = [], []
    for seed in range(3):
        batch = jax.device_put(tiny.mlm_batch(seed=seed), batch_sharding)
        state, metrics = run(state, batch, jax.random.PRNGKey(7))
        state_s, metrics_s = run_s(state_s, batch, jax.random.PRNGKey(7))
        losses.append(float(metrics["loss"]))
        losses_s.append(float(metrics_s["loss"]))
    np.testing.assert_allclose(losses_s, losses, rtol=1e-5)
    assert losses[-1] != losses[0]
