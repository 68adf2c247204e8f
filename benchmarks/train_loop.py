"""Tokens/s of the full training loop against the bare jitted step, same config.

  python benchmarks/train_loop.py [--gin_file=experiments/default.gin] [--steps=N]
      [--trials=7] [--gin.KEY=VALUE ...]

The loop includes the SeqIO input and prefetch thread, metrics.jsonl/TensorBoard writes, the
progress bar and the config's own asynchronous checkpoints (`train.checkpoint_every`; the
default --steps, checkpoint_every + 100, puts one inside the timed steps; evaluation is off).
The bare step reruns one device-resident batch with nothing else. The loop's first 10-step
window (compilation) is not timed. Every step computes a full batch x length block whatever its
padding, so loop and bare step are compared by steps/s; tokens/s counts the loop's real
(non-pad) tokens, and the bare step's is its steps/s times the loop's mean tokens per step.
(Comparing tokens/s directly would charge the loop for padding: the bare step's one batch is
full, 4,096 tokens, while default.gin's batches average ~4,056.)

On a shared 2-core machine the speed drifts by +-10% over tens of seconds, so each trial
brackets one loop run between two bare runs of half its timed steps, and the result is the
median over `--trials` of loop / bare. The target is a loop
overhead of at most 5% (ratio >= 0.95).

Runs of a few hundred steps: the steps right after compilation run slower (the loop's and the
bare step's alike, fresh memory and caches), which at 100 steps per run made a loop with no
input cost at all read 7% slower than the bare step; at 400 steps it read 2%.

The default config is `make pretrain`'s (`experiments/default.gin`: bert_tiny, 32 x 128 tokens,
~0.09 s steps on 2 cores, a checkpoint every 500 steps). `--gin_file=experiments/smoke.gin`
(~12 ms steps, a checkpoint every 10) measures the worst case, where per-step host work and the
checkpoint write are large against the step. `--gin_file=experiments/t5_1_1_tiny.gin` measures
an encoder-decoder run, whose input pipeline corrupts spans and packs examples on the host.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax

from lmsuite import cli, partitioning
from lmsuite.models import Transformer, memory_shapes
from lmsuite.training import input_pipeline, loop, report, step, train_state


def bare_step_measurer(run) -> Callable[[int], float]:
    """Compiles and warms up the bare step of `run` (a `TrainConfig`); the returned function
    runs `steps` more and returns the seconds they took.

    The step is built as `loop.train` builds it: the recipe's objective and feature converter,
    the model initialised from the batched input's `element_spec`, the carried state (XLNet's
    memory) from zeros, the config's rules, microbatches and non-finite policy.
    """
    trainer = run.trainer
    data, fsdp, tensor = trainer.mesh_shape
    mesh = partitioning.make_mesh(data=data, fsdp=fsdp, tensor=tensor)
    rules = trainer.rules
    model = Transformer(run.model)
    # The run's own batches (a mixture's task ids and label fill, its stages, its buffer).
    built = run.built()
    objective = built.objective
    tx, learning_rate_fn = run.optimizer.build(train_steps=trainer.train_steps)
    dataset = run.data.train_dataset(built, seed=trainer.seed)
    example = report.example_inputs(dataset.element_spec)
    carry_shapes = None
    if objective.carry is not None:
        carry_shapes = memory_shapes(run.model, run.data.batch_size)
    state, shardings, _ = train_state.create_sharded_state(
        init_params=lambda r: model.init({"params": r}, **objective.model_inputs(example))[
            "params"
        ],
        tx=tx,
        mesh=mesh,
        rng=jax.random.PRNGKey(0),
        rules=rules,
        carry_shapes=carry_shapes,
    )
    local = next(dataset.as_numpy_iterator())
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in local.items()}
    batch_sharding = step.batch_shardings(shapes, mesh, rules=rules)
    batch = input_pipeline.to_global(local, batch_sharding)
    run = step.jit_train_step(
        apply_fn=model.apply,
        objective=objective,
        learning_rate_fn=learning_rate_fn,
        state_shardings=shardings,
        batch_sharding=batch_sharding,
        mesh=mesh,
        rules=rules,
        num_microbatches=trainer.num_microbatches,
        skip_nonfinite=trainer.skip_nonfinite,
    )
    rng = jax.random.PRNGKey(1)
    for _ in range(3):  # compile and warm up
        state, metrics = run(state, batch, rng)
    jax.block_until_ready(metrics)

    def measure(steps: int) -> float:
        nonlocal state
        start = time.perf_counter()
        for _ in range(steps):
            state, metrics = run(state, batch, rng)
        jax.block_until_ready(metrics)
        return time.perf_counter() - start

    return measure


def loop_rates(run, steps: int) -> tuple[float, float]:
    """Runs the full loop for `steps` steps; (steps/s, real tokens/s) over its timed windows."""
    with tempfile.TemporaryDirectory() as model_dir:
        loop.train(
            run.replace(
                trainer=run.trainer.replace(train_steps=steps, log_every=10),
                checkpointing=run.checkpointing.replace(model_dir=model_dir),
            )
        )
        records = [json.loads(line) for line in Path(model_dir, "metrics.jsonl").open()]
    windows = [r for r in records if "tokens_per_sec" in r][1:]  # the first holds compilation
    seconds = sum(10 / r["steps_per_sec"] for r in windows)
    tokens = sum(10 / r["steps_per_sec"] * r["tokens_per_sec"] for r in windows)
    wait = windows[-1]["input_wait_sec"] - windows[0]["input_wait_sec"]
    print(f"loop: {seconds:.1f} s timed, of which {wait:.2f} s waiting for input")
    return 10 * len(windows) / seconds, tokens / seconds


def main(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--gin_file", default="experiments/default.gin")
    known, rest = parser.parse_known_args(argv)
    args = cli.parse_args(["train", f"--gin_file={known.gin_file}", "--model_dir=/unused", *rest])
    run = cli.load_run(args)
    run = run.replace(
        trainer=run.trainer.replace(progress_bar=True, eval_every=0, final_eval=False)
    )
    if known.steps is None:
        known.steps = run.checkpointing.every + 100
    if known.steps < 30 or known.trials < 1:
        parser.error(f"need --steps >= 30 and --trials >= 1, got {known.steps}, {known.trials}")
    print(
        f"{known.gin_file}: {known.trials} trials of {known.steps} steps, a checkpoint every "
        f"{run.checkpointing.every}"
    )
    measure_bare = bare_step_measurer(run)
    timed = known.steps - 10  # the loop's first 10-step window holds compilation
    ratios, bare_tokens, loop_tokens = [], [], []
    for trial in range(known.trials):
        # The machine's speed drifts over tens of seconds: bracket each loop run by two bare
        # halves and compare the loop with their combined rate.
        seconds = measure_bare(timed // 2)
        loop_steps, loop_tokens_per_sec = loop_rates(run, known.steps)
        seconds += measure_bare(timed - timed // 2)
        bare_steps = timed / seconds
        ratios.append(loop_steps / bare_steps)
        loop_tokens.append(loop_tokens_per_sec)
        bare_tokens.append(bare_steps * loop_tokens_per_sec / loop_steps)
        print(
            f"trial {trial}: bare {bare_steps:.3f}, loop {loop_steps:.3f} steps/s "
            f"({bare_tokens[-1]:.0f} vs {loop_tokens[-1]:.0f} tokens/s), ratio {ratios[-1]:.3f}"
        )
    print(f"bare jitted step: {statistics.median(bare_tokens):10.0f} tokens/s (median)")
    print(f"full loop:        {statistics.median(loop_tokens):10.0f} tokens/s (median)")
    ratio = statistics.median(ratios)
    print(
        f"loop / bare:      {ratio:10.3f}  (steps/s, median of {known.trials} paired trials, "
        f"range {min(ratios):.3f}-{max(ratios):.3f}; overhead {100 * (1 - ratio):.1f}%; "
        "target <= 5%)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
