"""What one train step of a run costs before it runs: XLA's FLOP count of the step (forward,
backward and optimizer update; ELECTRA's generator and XLNet's two streams included) and the
tokens it reads, so a budget in FLOPs or tokens can be turned into a number of steps
(`lmsuite study`).

  >>> cost = step_cost(run)          # run: a TrainConfig
  >>> steps = round(2e14 / cost.flops)
"""

import dataclasses

import jax
import jax.numpy as jnp

from lmsuite import partitioning
from lmsuite.models import Transformer, families
from lmsuite.training import aot, report
from lmsuite.training.train_config import TrainConfig


@dataclasses.dataclass(frozen=True)
class StepCost:
    """One step of a run: `flops` as XLA counts the unpartitioned step (the count the training
    loop's MFU uses), `tokens` the non-padding input tokens of a full batch as the objective
    counts them (`Objective.num_tokens` of an all-ones batch: every position), `params` the
    model's parameter count."""

    flops: float
    tokens: int
    params: int


def step_cost(config: TrainConfig) -> StepCost:
    """The `StepCost` of `config`'s train step, lowered (not compiled) on one CPU device from
    shapes alone: nothing is read, allocated or trained.

    Scanned layers and rematerialisation are lowered unrolled and without recomputation: the
    count is the model's FLOPs, not the recomputation a memory setting adds. A run that
    accumulates gradients over microbatches is counted with one (the same FLOPs, bar the
    optimizer update counted once instead of per microbatch).

    Raises:
      ValueError: the backend gives no FLOP count (XLA's cost analysis is missing).
    """
    built = config.built()
    spec = config.data.train_dataset(built, seed=config.trainer.seed).element_spec
    example = report.example_inputs(spec)
    batch = {
        k: jax.ShapeDtypeStruct((config.data.batch_size,) + v.shape[1:], v.dtype)
        for k, v in example.items()
    }
    model_config = config.model.replace(scan_layers=False, remat="none")
    model = Transformer(model_config)

    def init_params(rng):
        return model.init({"params": rng}, **built.objective.model_inputs(example))["params"]

    tx, learning_rate_fn = config.optimizer.build(train_steps=config.trainer.train_steps)
    lowered, (state, _, _) = aot.lower_step(
        mesh=partitioning.make_mesh(devices=jax.devices("cpu")[:1]),
        model=model,
        init_params=init_params,
        recipe=built,
        optimizer=tx,
        learning_rate_fn=learning_rate_fn,
        batch=batch,
        rules=config.trainer.rules,
        seed=config.trainer.seed,
        num_microbatches=1,
        skip_nonfinite=config.trainer.skip_nonfinite,
        prng_impl=config.trainer.prng_impl,
    )
    flops = report.lowered_flops(lowered)
    if flops is None:
        raise ValueError(
            f"XLA gives no FLOP count for {families.describe(config.model)}'s train step on "
            f"{jax.devices('cpu')[0].platform}; a FLOPs budget needs one"
        )
    tokens = built.objective.num_tokens({k: jnp.ones(v.shape, v.dtype) for k, v in batch.items()})
    return StepCost(flops=flops, tokens=int(tokens), params=report.num_params(state.params))
