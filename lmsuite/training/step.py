"""The training step: a pure function of (state, batch, rng), jitted once with explicit
shardings and the state donated.

Gradient accumulation scans over microbatches. Every loss term is a sum divided by a
denominator computed from the *whole* batch first, so the accumulated gradient is the big
batch's gradient, not an average of microbatch averages.
"""

import functools
from collections.abc import Callable, Iterable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lmsuite import partitioning
from lmsuite.objectives import Objective
from lmsuite.objectives.base import MetricParts
from lmsuite.training.train_state import TrainState

Batch = dict[str, jax.Array]


def split_microbatches(batch: Batch, num_microbatches: int) -> Batch:
    """Reshapes every (B, ...) feature to (num_microbatches, B / num_microbatches, ...).

    Example: {"x": shape (8, 16)}, 4 -> {"x": shape (4, 2, 16)}; rows 0-1 form microbatch 0.
    """

    def split(name, x):
        if x.shape[0] % num_microbatches:
            raise ValueError(
                f"batch feature {name!r} has {x.shape[0]} rows, not divisible into "
                f"{num_microbatches} microbatches"
            )
        return x.reshape((num_microbatches, x.shape[0] // num_microbatches) + x.shape[1:])

    return {name: split(name, x) for name, x in batch.items()}


def model_inputs(objective: Objective, batch: Batch, carry: Any) -> dict:
    """The model's keyword arguments for `batch`, with the carried state (reset where a row
    starts a new stream) when the objective carries one."""
    inputs = objective.model_inputs(batch)
    if objective.carry is not None:
        inputs[objective.carry.model_input] = objective.carry.reset(carry, batch)
    return inputs


def _new_carry(objective: Objective, outputs) -> Any:
    return None if objective.carry is None else outputs[objective.carry.model_output]


def dropout_key(seed: int, impl: str = "threefry2x32") -> jax.Array:
    """The run's dropout key, a typed key of PRNG implementation `impl` (see
    `TrainerConfig.prng_impl`). A threefry key holds the same bits as `PRNGKey(seed)`."""
    return jax.random.key(seed, impl=impl)


def _rngs(rng: jax.Array) -> dict[str, jax.Array]:
    """The model's rng streams: "dropout", and "sample" for models that sample inside the step
    (ELECTRA's generator); models without sampling ignore it."""
    return {"dropout": rng, "sample": jax.random.fold_in(rng, 1)}


# Held-out batches draw ELECTRA's replacements with one fixed key, so evaluations compare.
_EVAL_SAMPLE_SEED = 0


def loss_and_grads(
    params: Any,
    batch: Batch,
    rng: jax.Array,
    *,
    apply_fn: Callable[..., dict[str, jax.Array]],
    objective: Objective,
    num_microbatches: int = 1,
    carry: Any = None,
) -> tuple[jax.Array, dict[str, jax.Array], Any, Any]:
    """(loss, term metrics, gradients, next carry) of the whole batch, accumulated over
    microbatches.

    Microbatch i uses dropout key `fold_in(rng, i)`; without accumulation the key is `rng`; the
    "sample" stream is derived from the same key (`_rngs`).
    `carry` (the objective's carried state, each (B, ...)) is split along the batch with it, so
    row r of the batch always meets row r of the carry.
    """
    denominators = objective.denominators(batch)

    def loss_fn(params, micro, micro_carry, micro_rng):
        outputs = apply_fn(
            {"params": params},
            **model_inputs(objective, micro, micro_carry),
            deterministic=False,
            rngs=_rngs(micro_rng),
        )
        loss, metrics = objective.loss_and_metrics(outputs, micro, denominators)
        return loss, (metrics, _new_carry(objective, outputs))

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if num_microbatches == 1:
        (loss, (metrics, new_carry)), grads = grad_fn(params, batch, carry, rng)
        return loss, metrics, grads, new_carry

    micro_batches = split_microbatches(batch, num_microbatches)
    micro_carries = jax.tree.map(
        lambda x: x.reshape((num_microbatches, x.shape[0] // num_microbatches) + x.shape[1:]),
        carry,
    )

    def accumulate(sums, xs):
        index, micro, micro_carry = xs
        (micro_loss, (micro_metrics, next_carry)), micro_grads = grad_fn(
            params, micro, micro_carry, jax.random.fold_in(rng, index)
        )
        return jax.tree.map(jnp.add, sums, (micro_loss, micro_metrics, micro_grads)), next_carry

    first = jax.tree.map(lambda x: x[0], (micro_batches, micro_carries))
    metric_shapes = jax.eval_shape(lambda: loss_fn(params, *first, rng)[1][0])
    zeros = (
        jnp.zeros((), jnp.float32),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes),
        jax.tree.map(jnp.zeros_like, params),
    )
    (loss, metrics, grads), next_carries = jax.lax.scan(
        accumulate, zeros, (jnp.arange(num_microbatches), micro_batches, micro_carries)
    )
    new_carry = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), next_carries)
    return loss, metrics, grads, new_carry


def train_step(
    state: TrainState,
    batch: Batch,
    rng: jax.Array,
    *,
    apply_fn: Callable[..., dict[str, jax.Array]],
    objective: Objective,
    learning_rate_fn: Callable[[jax.Array], jax.Array],
    num_microbatches: int = 1,
    skip_nonfinite: bool = False,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer update.

    Args:
      state: the current TrainState (donated by the jitted version).
      batch: global batch of features, each (B, ...).
      rng: the run's dropout key; this step uses `fold_in(rng, state.step)`.
      apply_fn: `model.apply`.
      objective: model inputs and loss terms; with `objective.carry`, the model also takes
        `state.carry` and the new state holds what it returned.
      learning_rate_fn: the schedule, only to report the rate used.
      num_microbatches: gradient-accumulation steps per update.
      skip_nonfinite: if the loss or gradient norm is NaN/Inf, keep the old parameters and
        optimizer state and count the step in `state.skipped` (otherwise the update is applied
        and the caller stops on the `nonfinite` metric).

    Returns:
      (new_state, metrics): scalars `loss`, `grad_norm`, `learning_rate`, `num_tokens`,
      `nonfinite`, `skipped` and each term's `{term}_loss` / `{term}_accuracy`.
    """
    loss, metrics, grads, carry = loss_and_grads(
        state.params,
        batch,
        jax.random.fold_in(rng, state.step),
        apply_fn=apply_fn,
        objective=objective,
        num_microbatches=num_microbatches,
        carry=state.carry,
    )
    grad_norm = optax.global_norm(grads)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    if skip_nonfinite:
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        params = keep(params, state.params)
        opt_state = keep(opt_state, state.opt_state)
        carry = keep(carry, state.carry)  # a skipped step's memory may hold the NaN
    skipped = state.skipped + jnp.where(finite, 0, 1).astype(state.skipped.dtype) * skip_nonfinite
    new_state = state.replace(
        step=state.step + 1, params=params, opt_state=opt_state, skipped=skipped, carry=carry
    )
    metrics = dict(metrics)
    metrics |= {
        "loss": loss,
        "grad_norm": grad_norm,
        "learning_rate": jnp.asarray(learning_rate_fn(state.step), jnp.float32),
        "num_tokens": objective.num_tokens(batch),
        "nonfinite": jnp.logical_not(finite).astype(jnp.int32),
        "skipped": skipped,
    }
    return new_state, metrics


def batch_shardings(batch_shapes: dict[str, Any], mesh: Mesh, *, rules) -> dict[str, NamedSharding]:
    """Every feature sharded along its first (batch) dimension by the `batch` rule."""
    return {
        name: partitioning.named_sharding(
            mesh, (partitioning.BATCH,) + (None,) * (len(shape.shape) - 1), rules=rules
        )
        for name, shape in batch_shapes.items()
    }


def jit_train_step(
    *,
    apply_fn: Callable[..., dict[str, jax.Array]],
    objective: Objective,
    learning_rate_fn: Callable[[jax.Array], jax.Array],
    state_shardings: TrainState,
    batch_sharding: dict[str, NamedSharding],
    mesh: Mesh,
    rules: partitioning.Rules = partitioning.DEFAULT_RULES,
    num_microbatches: int = 1,
    skip_nonfinite: bool = False,
) -> Callable[[TrainState, Batch, jax.Array], tuple[TrainState, dict[str, jax.Array]]]:
    """`train_step` jitted with the given shardings and the state donated.

    The returned function runs under the mesh and the logical-axis rules so that the model's
    activation constraints resolve.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    jitted = jax.jit(
        functools.partial(
            train_step,
            apply_fn=apply_fn,
            objective=objective,
            learning_rate_fn=learning_rate_fn,
            num_microbatches=num_microbatches,
            skip_nonfinite=skip_nonfinite,
        ),
        in_shardings=(state_shardings, batch_sharding, replicated),
        out_shardings=(state_shardings, replicated),
        donate_argnums=(0,),
    )

    def run(state, batch, rng):
        with jax.set_mesh(mesh), nn.logical_axis_rules(tuple(rules)):
            return jitted(state, batch, rng)

    def lower(state, batch, rng):
        with jax.set_mesh(mesh), nn.logical_axis_rules(tuple(rules)):
            return jitted.lower(state, batch, rng)

    run.lower = lower  # for XLA's FLOP count (report.lowered_flops)
    return run


def eval_step(
    state: TrainState,
    batch: Batch,
    carry: Any = None,
    *,
    apply_fn: Callable[..., dict[str, jax.Array]],
    objective: Objective,
) -> tuple[MetricParts, Any]:
    """(the objective's metric parts of one batch without dropout, the next carry); the
    batches' parts give their loss and metrics taken together (`held_out_metrics`).

    Evaluation carries its own state from batch to batch (`initial_carry` of the run's shapes),
    never the training one: held-out rows continue held-out text.
    """
    outputs = apply_fn(
        {"params": state.params},
        **model_inputs(objective, batch, carry),
        deterministic=True,
        rngs={"sample": jax.random.PRNGKey(_EVAL_SAMPLE_SEED)},
    )
    parts = objective.metric_parts(outputs, batch, objective.denominators(batch))
    return parts, _new_carry(objective, outputs)


def held_out_metrics(objective: Objective, parts: Iterable[MetricParts]) -> dict[str, float]:
    """`loss` and the objective's metrics over all the batches of `parts` (`eval_step`'s, one
    per batch): every sum and denominator is added up first, so a metric weighs each
    prediction once, however the batches divide them; {} for no batches.

    Example (MLM, two batches): 40 nats over 10 predictions, then 1 nat over 1 prediction
    -> mlm_loss 41 / 11 = 3.73 (the mean of the batches' means, 4.0 and 1.0, would be 2.5).
    """
    total = None
    for batch_parts in parts:
        host = jax.tree.map(np.float64, jax.device_get(batch_parts))
        total = host if total is None else jax.tree.map(np.add, total, host)
    if total is None:
        return {}
    loss, metrics = objective.combine(total, xp=np)
    # in the objective's order (the tree's sums come back with their keys sorted)
    return {name: float(metrics[name]) for name in objective.metrics} | {"loss": float(loss)}


def jit_eval_step(
    *,
    apply_fn: Callable[..., dict[str, jax.Array]],
    objective: Objective,
    state_shardings: TrainState,
    batch_sharding: dict[str, NamedSharding],
    mesh: Mesh,
    rules: partitioning.Rules = partitioning.DEFAULT_RULES,
) -> Callable[[TrainState, Batch, Any], tuple[MetricParts, Any]]:
    """`eval_step` jitted with explicit shardings (nothing donated); the carry is sharded as the
    state's, the metric parts replicated."""
    jitted = jax.jit(
        functools.partial(eval_step, apply_fn=apply_fn, objective=objective),
        in_shardings=(state_shardings, batch_sharding, state_shardings.carry),
        out_shardings=(NamedSharding(mesh, PartitionSpec()), state_shardings.carry),
    )

    def run(state, batch, carry=None):
        with jax.set_mesh(mesh), nn.logical_axis_rules(tuple(rules)):
            return jitted(state, batch, carry)

    return run
