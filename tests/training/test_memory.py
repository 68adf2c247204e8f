"""XLNet's memory in the train state: the step feeds `state.carry` to the model as `mems` (reset
where a row's stream starts) and keeps the model's `new_mems`; microbatches and a
(data=2, fsdp=2, tensor=2) mesh change neither the gradients nor the memory; bad layouts are
refused by name. Resuming a killed run bitwise is in tests/integration/test_faults.py."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lmsuite import cli, partitioning
from lmsuite.models import Transformer, memory_shapes
from lmsuite.objectives import plm
from lmsuite.training import preflight, recipes, step
from lmsuite.training.train_state import create_sharded_state

BATCH, LENGTH, PREDICTIONS, MEMORY = 8, 16, 4, 12

needs_8 = pytest.mark.skipif(
    jax.device_count() < 8, reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8"
)


def _config(**options):
    bindings = [f"XLNetOptions.{k} = {v!r}" for k, v in {"mem_len": MEMORY, **options}.items()]
    bindings.append("XLNetOptions.reuse_len = 8")
    return cli.model_config_from_gin(["models/xlnet_tiny.gin"], bindings).replace(
        dropout_rate=0.0, attention_dropout_rate=0.0
    )


def _batch(seed=0, stream_step=None):
    """A PLM batch as PermutationLmFeatureConverter emits it (random masks and targets)."""
    rs = np.random.RandomState(seed)
    positions = np.stack([np.sort(rs.permutation(LENGTH)[:PREDICTIONS]) for _ in range(BATCH)])
    ids = rs.randint(10, 8000, (BATCH, LENGTH)).astype(np.int32)
    return {
        "input_k": ids,
        "seg_id": (np.arange(LENGTH)[None] >= LENGTH // 2).repeat(BATCH, 0).astype(np.int32),
        "perm_mask": (rs.rand(BATCH, LENGTH, LENGTH) < 0.5).astype(np.float32),
        "target_mapping": np.eye(LENGTH, dtype=np.float32)[positions],
        "target": np.take_along_axis(ids, positions, axis=1),
        "target_mask": np.ones((BATCH, PREDICTIONS), np.float32),
        "stream_step": np.asarray(
            np.arange(BATCH) + 1 if stream_step is None else stream_step, np.int32
        ),
    }


def _memory(config, seed=1):
    keys = jax.random.split(jax.random.PRNGKey(seed), config.num_layers)
    return tuple(
        jax.random.normal(k, s.shape, s.dtype)
        for k, s in zip(keys, memory_shapes(config, BATCH), strict=True)
    )


def _params(config):
    model = Transformer(config)
    inputs = plm.permutation_lm().model_inputs(_batch())
    return nn.unbox(model.init(jax.random.PRNGKey(0), **inputs)["params"])


def test_the_step_feeds_the_carry_and_keeps_the_new_memory():
    config = _config()
    model, objective = Transformer(config), plm.permutation_lm()
    params, batch, memory = _params(config), _batch(), _memory(config)
    loss, _, _, carried = step.loss_and_grads(
        params, batch, jax.random.PRNGKey(0), apply_fn=model.apply, objective=objective,
        carry=memory,
    )  # fmt: skip
    direct = model.apply({"params": params}, **objective.model_inputs(batch), mems=memory)
    for got, want, old in zip(carried, direct["new_mems"], memory, strict=True):
        assert got.shape == (BATCH, MEMORY, config.d_model)
        np.testing.assert_array_equal(got, want)
        # The last reuse_len (8) rows of the new memory are this segment's first 8 states; the
        # first 4 are the old memory's last 4.
        np.testing.assert_array_equal(got[:, :4], old[:, -4:])
    without = model.apply({"params": params}, **objective.model_inputs(batch))
    assert not np.allclose(direct["lm_logits"], without["lm_logits"], atol=1e-3)
    targets = jax.nn.log_softmax(direct["lm_logits"])
    expected = -np.mean(np.take_along_axis(targets, batch["target"][..., None], -1))
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_rows_that_start_a_stream_see_zero_memory():
    config = _config()
    model, objective = Transformer(config), plm.permutation_lm()
    params, memory = _params(config), _memory(config)
    starts = np.array([0, 3, 0, 1, 5, 0, 2, 7])
    batch = _batch(stream_step=starts)
    _, _, _, carried = step.loss_and_grads(
        params, batch, jax.random.PRNGKey(0), apply_fn=model.apply, objective=objective,
        carry=memory,
    )  # fmt: skip
    keep = (starts != 0)[:, None, None]
    zeroed = tuple(np.where(keep, m, 0.0) for m in memory)
    want = model.apply({"params": params}, **objective.model_inputs(batch), mems=zeroed)
    for got, expected in zip(carried, want["new_mems"], strict=True):
        np.testing.assert_array_equal(got, expected)
    # A reset row's output does not depend on what it carried in; the others' does.
    other = _memory(config, seed=7)
    logits = [
        model.apply(
            {"params": params},
            **objective.model_inputs(batch),
            mems=objective.carry.reset(m, batch),
        )["lm_logits"]
        for m in (memory, other)
    ]
    np.testing.assert_array_equal(logits[0][starts == 0], logits[1][starts == 0])
    assert not np.allclose(logits[0][starts != 0], logits[1][starts != 0], atol=1e-3)


def test_microbatches_give_the_same_memory_and_gradients():
    config = _config()
    model, objective = Transformer(config), plm.permutation_lm()
    params, batch, memory = _params(config), _batch(stream_step=[0, 1, 2, 0, 4, 5, 0, 7]), None
    memory = _memory(config)
    run = functools.partial(
        step.loss_and_grads, apply_fn=model.apply, objective=objective, carry=memory
    )
    loss1, metrics1, grads1, carry1 = jax.jit(run)(params, batch, jax.random.PRNGKey(0))
    loss4, metrics4, grads4, carry4 = jax.jit(functools.partial(run, num_microbatches=4))(
        params, batch, jax.random.PRNGKey(0)
    )
    np.testing.assert_allclose(loss4, loss1, rtol=1e-6)
    np.testing.assert_allclose(metrics4["plm_accuracy"], metrics1["plm_accuracy"], rtol=1e-6)
    error = optax.global_norm(jax.tree.map(jnp.subtract, grads4, grads1))
    assert error <= 1e-5 * optax.global_norm(grads1)
    for a, b in zip(carry4, carry1, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _mesh_step(config, params, batch, memory, mesh):
    """One jitted train step on `mesh`: (new params, new carry, loss). The state is donated, so
    it is built from host copies."""
    params, memory = jax.tree.map(np.asarray, (params, memory))
    model, objective = Transformer(config), plm.permutation_lm()
    abstract = jax.eval_shape(
        lambda: Transformer(config).init(jax.random.PRNGKey(0), **objective.model_inputs(batch))[
            "params"
        ]
    )
    tx = optax.sgd(1.0)  # the update is minus the gradient: compare the updates
    state, shardings, _ = create_sharded_state(
        init_params=lambda rng: jax.tree.map(
            lambda box, value: box.replace_boxed(value),
            abstract,
            params,
            is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned),
        ),
        tx=tx,
        mesh=mesh,
        rng=jax.random.PRNGKey(0),
        carry_shapes=memory_shapes(config, BATCH),
    )
    state = state.replace(carry=jax.device_put(memory, shardings.carry))
    batch_sharding = step.batch_shardings(batch, mesh, rules=partitioning.DEFAULT_RULES)
    run = step.jit_train_step(
        apply_fn=model.apply,
        objective=objective,
        learning_rate_fn=lambda s: 1.0,
        state_shardings=shardings,
        batch_sharding=batch_sharding,
        mesh=mesh,
    )
    new, metrics = run(state, jax.device_put(batch, batch_sharding), jax.random.PRNGKey(0))
    assert all(c.sharding.spec[0] == ("data", "fsdp") or mesh.size == 1 for c in new.carry)
    return jax.tree.map(np.asarray, (new.params, new.carry, metrics["loss"]))


@needs_8
def test_a_data_fsdp_tensor_mesh_gives_one_devices_step():
    config = _config()
    params, memory = _params(config), _memory(config)
    batch = _batch(stream_step=[0, 1, 2, 3, 0, 5, 6, 7])
    one = _mesh_step(
        config, params, batch, memory, partitioning.make_mesh(devices=jax.devices()[:1])
    )
    mesh = partitioning.make_mesh(data=2, fsdp=2, tensor=2)
    eight = _mesh_step(config, params, batch, memory, mesh)
    np.testing.assert_allclose(eight[2], one[2], rtol=1e-6)
    deltas = [jax.tree.map(np.subtract, run[0], params) for run in (one, eight)]
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(deltas[0]))
    assert scale > 0
    bad = {
        jax.tree_util.keystr(path): float(np.abs(a - b).max()) / scale
        for (path, a), b in zip(
            jax.tree_util.tree_leaves_with_path(deltas[1]), jax.tree.leaves(deltas[0]), strict=True
        )
        if float(np.abs(a - b).max()) > 1e-5 * scale
    }
    assert not bad, bad
    for a, b in zip(eight[1], one[1], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_memory_needs_a_fixed_length_and_an_xlnet():
    with pytest.raises(ValueError, match="set XLNetOptions.mem_len .* got None"):
        memory_shapes(_config().replace(xlnet=_config().xlnet.__class__()), BATCH)
    bert = cli.model_config_from_gin(["models/bert_tiny.gin"])
    with pytest.raises(
        ValueError, match="only architecture='xlnet' or 'transformer_xl' carries memory.*'encoder'"
    ):
        memory_shapes(bert, BATCH)


def test_a_memory_of_another_batch_is_refused():
    config = _config()
    model, objective = Transformer(config), plm.permutation_lm()
    params = _params(config)
    short = tuple(m[: BATCH // 2] for m in _memory(config))
    with pytest.raises(
        ValueError, match=r"memory of layer 0 has shape \(4, 12, 64\), but the batch has 8 rows"
    ):
        step.loss_and_grads(
            params, _batch(), jax.random.PRNGKey(0), apply_fn=model.apply, objective=objective,
            carry=short,
        )  # fmt: skip


def test_the_recipe_refuses_models_the_stream_layout_cannot_feed():
    recipe = recipes.get("xlnet_plm")
    lengths = recipe.lengths_for(64)
    problems = preflight.recipe_run_problems(
        recipe, sequence_length=lengths, model_config=_config().replace(
            xlnet=_config().xlnet.__class__(reuse_len=16, bi_data=True)
        ),
    )  # fmt: skip
    text = "\n".join(problems)
    assert "set XLNetOptions.mem_len" in text
    assert "bi_data = True" in text
    assert "XLNetOptions.reuse_len = 16, but the data's windows reuse" in text
    assert "input_k // 2 = 32" in text
    good = _config().replace(xlnet=_config().xlnet.__class__(mem_len=48, reuse_len=32))
    assert preflight.recipe_run_problems(recipe, sequence_length=lengths, model_config=good) == []
