"""`TrainState`, and building it already sharded from abstract shapes.

The state is never materialised on one device: `jax.eval_shape(init)` gives the boxed abstract
parameters and their logical axis names, the rules table turns those into NamedShardings, and
`jax.jit(init, out_shardings=...)` creates every array where it lives.
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from lmsuite import partitioning


class TrainState(flax.struct.PyTreeNode):
    """Step counter, float32 parameters and optimizer state; `tx` is static.

    `skipped` counts steps whose loss or gradient was not finite and were skipped (only when the
    step is built with `skip_nonfinite=True`). `carry` is what an objective carries from step to
    step through the model (`Objective.carry`: XLNet's memory, one (B, C, D) array per layer,
    sharded along the batch like activations); None for every other objective. It lives here so
    that a checkpoint keeps it and a resumed run continues exactly.
    """

    step: jax.Array
    params: Any
    opt_state: Any
    skipped: jax.Array
    tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)
    carry: Any = None


def _param_like(tree, params_treedef) -> bool:
    try:
        return jax.tree.structure(tree) == params_treedef
    except TypeError:
        return False


def opt_state_shardings(abstract_opt_state, abstract_params, param_shardings, mesh: Mesh):
    """Shards every optimizer-state subtree shaped like the parameters as the parameters.

    Adam's mu and nu follow their parameter; leaves of other shapes (step counts, Adafactor's
    factored row/column statistics) are small and replicated.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    treedef = jax.tree.structure(abstract_params)

    def per_subtree(subtree):
        if _param_like(subtree, treedef):
            return jax.tree.map(
                lambda a, p, s: s if a.shape == p.shape else replicated,
                subtree,
                abstract_params,
                param_shardings,
            )
        return jax.tree.map(lambda _: replicated, subtree)

    return jax.tree.map(per_subtree, abstract_opt_state, is_leaf=lambda x: _param_like(x, treedef))


def sharded_abstract_state(
    *,
    init_params: Callable[[jax.Array], Any],
    tx: optax.GradientTransformation,
    mesh: Mesh,
    rng: jax.Array,
    rules: partitioning.Rules = partitioning.DEFAULT_RULES,
    carry_shapes: Any = None,
) -> tuple[TrainState, TrainState, Any]:
    """The state's shapes and shardings, without creating any array.

    `lmsuite compile` stops here (its mesh's devices exist only to compile for); training goes
    on to `create_sharded_state`. `carry_shapes`: ShapeDtypeStructs of `TrainState.carry`
    (None: no carry), each (B, ...) and sharded along its batch dimension.

    Returns:
      (abstract_state, state_shardings, logical_param_specs): ShapeDtypeStructs carrying their
      shardings, the matching tree of NamedShardings, and the parameters' logical
      PartitionSpecs.
    """
    abstract_boxed = jax.eval_shape(init_params, rng)
    logical_specs = nn.get_partition_spec(abstract_boxed)
    abstract_params = nn.unbox(abstract_boxed)
    param_shardings = partitioning.tree_shardings(logical_specs, mesh, rules=rules)
    partitioning.check_divisible(abstract_params, param_shardings, what="params")
    abstract_opt_state = jax.eval_shape(tx.init, abstract_params)
    replicated = NamedSharding(mesh, PartitionSpec())
    shardings = TrainState(
        step=replicated,
        params=param_shardings,
        opt_state=opt_state_shardings(abstract_opt_state, abstract_params, param_shardings, mesh),
        skipped=replicated,
        tx=tx,
        carry=carry_shardings(carry_shapes, mesh, rules=rules),
    )
    if carry_shapes is not None:
        partitioning.check_divisible(carry_shapes, shardings.carry, what="carry")
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    shapes = TrainState(
        step=scalar,
        params=abstract_params,
        opt_state=abstract_opt_state,
        skipped=scalar,
        tx=tx,
        carry=carry_shapes,
    )
    return abstract_state(shardings, shapes), shardings, logical_specs


def carry_shardings(carry_shapes, mesh: Mesh, *, rules: partitioning.Rules) -> Any:
    """Each carried (B, ...) array sharded along its batch dimension, the rest replicated (as the
    activations it came from: XLNet's (B, C, D) memory is a layer's output)."""
    return jax.tree.map(
        lambda s: partitioning.named_sharding(
            mesh, (partitioning.BATCH,) + (None,) * (len(s.shape) - 1), rules=rules
        ),
        carry_shapes,
    )


def create_sharded_state(
    *,
    init_params: Callable[[jax.Array], Any],
    tx: optax.GradientTransformation,
    mesh: Mesh,
    rng: jax.Array,
    rules: partitioning.Rules = partitioning.DEFAULT_RULES,
    carry_shapes: Any = None,
) -> tuple[TrainState, TrainState, Any]:
    """Initialises a sharded TrainState.

    Args:
      init_params: rng -> parameter tree whose leaves are `nn.LogicallyPartitioned` boxes (the
        `"params"` collection of `model.init`).
      tx: the optimizer.
      mesh, rules: where the logical axis names go.
      rng: the parameter-initialisation key.
      carry_shapes: ShapeDtypeStructs of the carried state, created as zeros (None: none).

    Returns:
      (state, state_shardings, logical_param_specs): the state with every leaf placed by its
      sharding, the matching tree of NamedShardings (for the step's in/out shardings and for
      restoring checkpoints), and the logical PartitionSpecs of the parameters (for reports).
    """
    _, shardings, logical_specs = sharded_abstract_state(
        init_params=init_params, tx=tx, mesh=mesh, rng=rng, rules=rules, carry_shapes=carry_shapes
    )

    def init(key):
        params = nn.unbox(init_params(key))
        return TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=tx.init(params),
            skipped=jnp.zeros((), jnp.int32),
            tx=tx,
            carry=jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), carry_shapes),
        )

    # No mesh context here: `out_shardings` places the state, and Flax's constraint-on-unbox
    # would reject kernels whose two dimensions share a logical name (a (embed, embed) dense).
    state = jax.jit(init, out_shardings=shardings)(rng)
    return state, shardings, logical_specs


def abstract_state(state_shardings: TrainState, state_shapes: TrainState) -> TrainState:
    """ShapeDtypeStructs carrying shardings: the restore target for a checkpoint."""
    return jax.tree.map(
        lambda shape, sharding: jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=sharding),
        state_shapes,
        state_shardings,
    )
