"""Tokens/s of the full training loop against the bare jitted step, same config.

  python benchmarks/train_loop.py [--steps=60] [--gin.KEY=VALUE ...]

The loop includes the SeqIO input and prefetch thread, metrics.jsonl/TensorBoard writes, the
progress bar and asynchronous checkpoints (every steps/2). The bare step reruns one device-resident
batch with nothing else. Both skip their first window (compilation). Prints the ratio; the target
is a loop overhead of at most 5% (ratio >= 0.95).
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import jax

from lmsuite import cli, partitioning
from lmsuite.models import Transformer
from lmsuite.training import input_pipeline, loop, report, step, train_state


def bare_step_tokens_per_sec(kwargs: dict, steps: int) -> float:
    data, fsdp, tensor = kwargs["mesh_shape"]
    mesh = partitioning.make_mesh(data=data, fsdp=fsdp, tensor=tensor)
    model = Transformer(kwargs["model_config"])
    objective = kwargs["objective"]
    example = report.example_inputs(
        objective, kwargs["sequence_length"], kwargs["feature_converter"]
    )
    state, shardings, _ = train_state.create_sharded_state(
        init_params=lambda r: model.init({"params": r}, **objective.model_inputs(example))[
            "params"
        ],
        tx=kwargs["optimizer"],
        mesh=mesh,
        rng=jax.random.PRNGKey(0),
    )
    local = next(
        input_pipeline.process_dataset(
            task=kwargs["task"],
            sequence_length=kwargs["sequence_length"],
            feature_converter=kwargs["feature_converter"],
            global_batch_size=kwargs["batch_size"],
        ).as_numpy_iterator()
    )
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in local.items()}
    batch_sharding = step.batch_shardings(shapes, mesh, rules=partitioning.DEFAULT_RULES)
    batch = input_pipeline.to_global(local, batch_sharding)
    run = step.jit_train_step(
        apply_fn=model.apply,
        objective=objective,
        learning_rate_fn=kwargs["learning_rate_fn"],
        state_shardings=shardings,
        batch_sharding=batch_sharding,
        mesh=mesh,
    )
    rng = jax.random.PRNGKey(1)
    for _ in range(3):  # compile and warm up
        state, metrics = run(state, batch, rng)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = run(state, batch, rng)
    jax.block_until_ready(metrics)
    elapsed = time.perf_counter() - start
    return float(objective.num_tokens(batch)) * steps / elapsed


def loop_tokens_per_sec(kwargs: dict, steps: int) -> float:
    with tempfile.TemporaryDirectory() as model_dir:
        loop.train(
            model_dir=model_dir,
            **kwargs | {"train_steps": steps, "checkpoint_every": steps // 2, "log_every": 10},
        )
        records = [json.loads(line) for line in Path(model_dir, "metrics.jsonl").open()]
    windows = [r for r in records if "tokens_per_sec" in r][1:]  # the first holds compilation
    seconds = sum(10 / r["steps_per_sec"] for r in windows)
    tokens = sum(10 / r["steps_per_sec"] * r["tokens_per_sec"] for r in windows)
    wait = windows[-1]["input_wait_sec"] - windows[0]["input_wait_sec"]
    print(f"loop: {seconds:.1f} s timed, of which {wait:.2f} s waiting for input")
    return tokens / seconds


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--gin_file", default="experiments/smoke.gin")
    known, rest = parser.parse_known_args(argv)
    args = cli.parse_args(["train", f"--gin_file={known.gin_file}", "--model_dir=/unused", *rest])
    kwargs = cli.load_config(args) | {"progress_bar": True}
    bare = bare_step_tokens_per_sec(kwargs, known.steps)
    full = loop_tokens_per_sec(kwargs, known.steps)
    print(f"bare jitted step: {bare:10.0f} tokens/s")
    print(f"full loop:        {full:10.0f} tokens/s")
    overhead = 100 * (1 - full / bare)
    print(f"loop / bare:      {full / bare:10.3f}  (overhead {overhead:.1f}%; target <= 5%)")


if __name__ == "__main__":
    main(sys.argv[1:])
