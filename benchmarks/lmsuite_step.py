"""lmsuite's side of the step benchmarks: the real `jit_train_step` over one resident batch.

Driver-only (it imports jax and lmsuite); `step_protocol.py` stays importable from the peers'
virtual environment.
"""

import jax
import numpy as np
import optax

from lmsuite import partitioning
from lmsuite.training import input_pipeline, step, train_state


def resident_step(
    *,
    model,
    objective,
    batch_np: dict[str, np.ndarray],
    tx: optax.GradientTransformation,
    init_params,
    learning_rate: float,
    seed: int,
    carry_shapes=None,
):
    """(step, state): `state -> (TrainState, metrics)` running the training step lmsuite trains
    with on `batch_np` (placed once), and the initial (TrainState, None).

    `init_params`: rng -> the boxed parameter tree (`model.init(...)["params"]`, or given values
    re-boxed); `carry_shapes`: the objective's carried state (XLNet's memory), zeros at first.
    """
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    state, shardings, _ = train_state.create_sharded_state(
        init_params=init_params,
        tx=tx,
        mesh=mesh,
        rng=jax.random.PRNGKey(seed),
        carry_shapes=carry_shapes,
    )
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch_np.items()}
    batch_sharding = step.batch_shardings(shapes, mesh, rules=partitioning.DEFAULT_RULES)
    batch = input_pipeline.to_global(batch_np, batch_sharding)
    run = step.jit_train_step(
        apply_fn=model.apply,
        objective=objective,
        learning_rate_fn=optax.constant_schedule(learning_rate),
        state_shardings=shardings,
        batch_sharding=batch_sharding,
        mesh=mesh,
    )
    rng = jax.random.PRNGKey(seed + 1)
    return (lambda s: run(s[0], batch, rng)), (state, None)


def print_medians(times, *, tokens_per_step: int, side: str, against: str, label: str) -> float:
    """Median tokens/s and ms/step of each entry of `times` by wall and CPU time, then the ratio
    of `side`'s tokens/s to `against`'s, printed with `label`; returns the CPU-time ratio."""
    import statistics

    ratio = float("nan")
    for clock, unit in (("seconds", "s"), ("cpu_seconds", "CPU-s")):
        print(f"by {'wall' if clock == 'seconds' else 'CPU'} time:")
        medians = {}
        for name, rounds in times.items():
            t = medians[name] = statistics.median(x[clock] for x in rounds)
            print(f"  {name:8s} {tokens_per_step / t:8.0f} tokens/{unit:5s} {t * 1e3:7.0f} ms/step")
        ratio = medians[against] / medians[side]
        print(f"  ratio {label} = {ratio:.2f}")
    return ratio
