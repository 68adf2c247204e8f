"""Steps/s and MFU of `lmsuite train`'s step on one accelerator: bfloat16, fused attention and
the rbg PRNG against the same step in float32 with plain attention and threefry, in one run.

How to run on a GPU (one device is measured; nothing here runs in CI):

    pip install 'lmsuite[gpu]'
    python benchmarks/accelerator_step.py --experiments=bert_base,t5_1_1_base \\
        --steps=20 --warmup=3 --out=accelerator_step.jsonl

CPU dry run (the experiments' tiny twins, batch 4, 2 steps: it proves the script, it measures
nothing worth keeping):

    JAX_PLATFORMS=cpu python benchmarks/accelerator_step.py --dry_run

For each experiment two variants are built from its gin file, as `lmsuite train` builds them
(`cli.load_run`, the recipe, `Transformer`, `create_sharded_state`, `step.jit_train_step`, the
loop's dropout key):
  baseline  ModelConfig.dtype='float32', ModelConfig.attention_impl='plain',
            train.prng_impl='threefry2x32'
  fast      ModelConfig.dtype='bfloat16', ModelConfig.attention_impl='fused',
            train.prng_impl='rbg', and ModelConfig.attention_dropout_rate=0.0 where the
            experiment sets it above 0 (bert_base's 0.1): no fused kernel drops attention
            probabilities, so with dropout the fused request would run the plain path. The script
            prints this deviation, and every reason the fused request still ran plain attention
            (T5's relative-position bias keeps its self-attention plain; its cross-attention fuses).

The batch is one real batch of the experiment's shapes, read once from its task or, when the
task's corpus is not prepared here, from the same objective on the embedded corpus
(`aot.shapes_task`, as `lmsuite compile` takes its shapes); it stays on the device, so the input
pipeline is not measured. Each variant is lowered (XLA's FLOP count of the step: forward,
backward and optimizer), compiled, run `--warmup` steps, then `--steps` timed steps ending in
`block_until_ready`.

MFU = model FLOPs per step x steps/s / the device's bf16 dense peak (`report.PEAK_FLOPS` by
`device_kind`: NVIDIA's datasheets give 989 TFLOP/s for H100 SXM and H200, 312 for A100; a CPU's
is measured). Model FLOPs are the baseline's XLA count for both variants: the same math, and on a
GPU cuDNN's attention is a custom call that XLA's count leaves out. The fast variant's own
count is kept in the JSON (`xla_flops`). Memory is XLA's figure for the compiled step
(arguments + outputs not donated + temporaries) and, where the backend reports it, the
device's allocator high-water mark so far in this process (it only grows from one variant to
the next).

A variant that runs out of device memory halves the experiment's batch, says so, and both
variants are measured again at the smaller batch, so the ratio compares equal batches.
"""

import argparse
import json
import logging
import math
import shlex
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # lmsuite when not pip-installed
from lmsuite import cli, partitioning  # noqa: E402
from lmsuite.layers import fused_attention  # noqa: E402
from lmsuite.models import Transformer, memory_shapes  # noqa: E402
from lmsuite.training import (  # noqa: E402
    aot,
    input_pipeline,
    recipes,
    report,
    step,
    train_state,
)

GIB = 2**30
VARIANTS = {
    "baseline": {
        "ModelConfig.dtype": "'float32'",
        "ModelConfig.attention_impl": "'plain'",
        "train.prng_impl": "'threefry2x32'",
    },
    "fast": {
        "ModelConfig.dtype": "'bfloat16'",
        "ModelConfig.attention_impl": "'fused'",
        "train.prng_impl": "'rbg'",
    },
}
TINY_TWINS = {"bert_base": "bert_tiny", "t5_1_1_base": "t5_1_1_tiny"}
DRY_RUN = dict(batch_size=4, steps=2, warmup=1)


class OutOfMemory(Exception):
    """The device refused the step for want of memory."""


def load_run(experiment: str, bindings: dict[str, str]):
    """The experiment's checked `TrainConfig`, as `lmsuite train --gin.KEY=VALUE ...` loads it
    (its data need not be prepared: only its shapes are used)."""
    flags = [f"--gin.{key}={value}" for key, value in bindings.items()]
    args = cli.parse_args(
        ["train", f"--gin_file=experiments/{experiment}.gin", "--model_dir=/unused", *flags]
    )
    return cli.load_run(args, need_data=False)


def fast_bindings(experiment: str, baseline) -> tuple[dict[str, str], list[str]]:
    """(gin bindings, deviations from the experiment to print) of the fast variant, given the
    experiment's baseline run."""
    bindings = dict(VARIANTS["fast"])
    notes = []
    rate = baseline.model.attention_dropout_rate
    if rate > 0:
        bindings["ModelConfig.attention_dropout_rate"] = "0.0"
        notes.append(
            f"{experiment}: attention_dropout_rate 0.0 instead of the experiment's {rate} so "
            "that attention can fuse (the baseline keeps it)"
        )
    return bindings, notes


def read_batch(run, built, batch_size: int):
    """(one batch of `batch_size` rows as numpy, the task it was read from)."""
    source = aot.shapes_task(run.data.task)
    dataset = input_pipeline.process_dataset(
        task=source,
        sequence_length=run.data.sequence_length,
        feature_converter=built.feature_converter,
        global_batch_size=batch_size,
        shuffle=False,
    )
    return next(dataset.as_numpy_iterator()), source


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def measure(run, batch_np, *, steps: int, warmup: int) -> dict:
    """Builds, lowers, compiles and times `run`'s train step over `batch_np` on the first
    device.

    Raises:
      OutOfMemory: compiling or running the step exhausted the device's memory.
    """
    trainer = run.trainer
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    built = recipes.build(run.recipe, model_config=run.model)
    objective = built.objective
    model = Transformer(run.model)
    tx, learning_rate_fn = run.optimizer.build(train_steps=trainer.train_steps)
    batch_size = len(next(iter(batch_np.values())))
    example = {k: v[:1] for k, v in batch_np.items()}
    carry_shapes = None
    if objective.carry is not None:
        carry_shapes = memory_shapes(run.model, batch_size)
    # The fused path logs each reason it falls back once per process, while the model is traced
    # (init or lowering).
    collect = _Collect()
    fused_attention.logger.addHandler(collect)
    try:
        state, shardings, _ = train_state.create_sharded_state(
            init_params=lambda r: model.init({"params": r}, **objective.model_inputs(example))[
                "params"
            ],
            tx=tx,
            mesh=mesh,
            rng=jax.random.PRNGKey(trainer.seed),
            rules=trainer.rules,
            carry_shapes=carry_shapes,
        )
        shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch_np.items()}
        batch_sharding = step.batch_shardings(shapes, mesh, rules=trainer.rules)
        batch = input_pipeline.to_global(batch_np, batch_sharding)
        train_step = step.jit_train_step(
            apply_fn=model.apply,
            objective=objective,
            learning_rate_fn=learning_rate_fn,
            state_shardings=shardings,
            batch_sharding=batch_sharding,
            mesh=mesh,
            rules=trainer.rules,
            num_microbatches=trainer.num_microbatches,
            skip_nonfinite=trainer.skip_nonfinite,
        )
        rng = step.dropout_key(trainer.seed + 1, trainer.prng_impl)
        started = time.perf_counter()
        lowered = train_step.lower(state, batch, rng)
        xla_flops = report.lowered_flops(lowered, loop_trips=trainer.num_microbatches)
        compiled = lowered.compile()
        compile_seconds = time.perf_counter() - started
        for _ in range(warmup):
            state, metrics = compiled(state, batch, rng)
        jax.block_until_ready(state)
        started = time.perf_counter()
        for _ in range(steps):
            state, metrics = compiled(state, batch, rng)
        jax.block_until_ready((state, metrics))
        seconds = time.perf_counter() - started
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" in str(error):
            raise OutOfMemory(str(error).splitlines()[0]) from error
        raise
    finally:
        fused_attention.logger.removeHandler(collect)
    memory = compiled.memory_analysis()
    xla_bytes = None
    if memory is not None:
        xla_bytes = int(
            memory.argument_size_in_bytes
            + memory.output_size_in_bytes
            - memory.alias_size_in_bytes
            + memory.temp_size_in_bytes
        )
    stats = jax.devices()[0].memory_stats() or {}
    loss = float(metrics["loss"]) if "loss" in metrics else float("nan")
    return dict(
        batch_size=batch_size,
        sequence_length=dict(run.data.sequence_length),
        tokens_per_step=int(objective.num_tokens(batch)),
        steps=steps,
        warmup=warmup,
        seconds=seconds,
        steps_per_sec=steps / seconds,
        compile_seconds=compile_seconds,
        xla_flops=xla_flops,
        xla_memory_bytes=xla_bytes,
        device_peak_bytes_so_far=stats.get("peak_bytes_in_use"),
        cudnn_attention_calls=compiled.as_text().count("__cudnn$fmha"),
        plain_attention_reasons=collect.lines,
        final_loss=loss,
    )


def measure_experiment(experiment: str, *, batch_size, steps: int, warmup: int) -> list[dict]:
    """Both variants of `experiment` at the largest batch (from `batch_size`, or the
    experiment's, halving) at which both fit; one row each, the fast row with the ratios."""
    bindings = {"baseline": dict(VARIANTS["baseline"])}
    runs = {"baseline": load_run(experiment, bindings["baseline"])}
    bindings["fast"], notes = fast_bindings(experiment, runs["baseline"])
    runs["fast"] = load_run(experiment, bindings["fast"])
    for note in notes:
        print(f"note: {note}")
    batch = batch_size or runs["baseline"].data.batch_size
    while True:
        # The variants share the data: one batch, read with the baseline's recipe.
        built = recipes.build(runs["baseline"].recipe, model_config=runs["baseline"].model)
        batch_np, source = read_batch(runs["baseline"], built, batch)
        rows = []
        try:
            for name, run in runs.items():
                print(f"{experiment} {name}: batch {batch}, compiling ...", flush=True)
                row = measure(run, batch_np, steps=steps, warmup=warmup)
                for reason in row["plain_attention_reasons"]:
                    print(f"  fused-path log: {reason}")
                rows.append(
                    dict(
                        experiment=experiment,
                        variant=name,
                        bindings=bindings[name],
                        shapes_task=source,
                        **row,
                    )
                )
            break
        except OutOfMemory as error:
            if batch == 1:
                raise
            print(f"{experiment} {name}: out of memory at batch {batch} ({error}); halving to "
                  f"{batch // 2} and measuring both variants again")  # fmt: skip
            batch //= 2
    baseline, fast = rows
    peak = report.device_peak_flops()
    for row in rows:
        row["notes"] = notes if row["variant"] == "fast" else []
        row["model_flops"] = baseline["xla_flops"]
        row["tokens_per_sec"] = row["tokens_per_step"] * row["steps_per_sec"]
        row["peak_flops"] = peak
        row["mfu"] = (
            row["model_flops"] * row["steps_per_sec"] / peak
            if peak and row["model_flops"]
            else None
        )
    fast["steps_per_sec_ratio"] = fast["steps_per_sec"] / baseline["steps_per_sec"]
    return rows


def format_table(rows: list[dict]) -> str:
    """One line per variant, and per experiment the fast / baseline ratio of steps/s."""
    gib = lambda b: "-" if b is None else f"{b / GIB:.2f}"  # noqa: E731
    lines = [
        f"{'experiment':14s} {'variant':8s} {'batch':>5s} {'steps/s':>9s} {'tokens/s':>10s} "
        f"{'TFLOP/step':>10s} {'MFU':>6s} {'XLA GiB':>8s} {'peak GiB':>8s} {'cuDNN':>5s} "
        f"{'compile s':>9s} {'fast/base':>9s}"
    ]
    for row in rows:
        flops = row["model_flops"]
        mfu = row["mfu"]
        ratio = row.get("steps_per_sec_ratio")
        lines.append(
            f"{row['experiment']:14s} {row['variant']:8s} {row['batch_size']:5d} "
            f"{row['steps_per_sec']:9.3f} {row['tokens_per_sec']:10.0f} "
            f"{'-' if flops is None else f'{flops / 1e12:.4g}':>10s} "
            f"{'-' if mfu is None else f'{100 * mfu:.1f}%':>6s} "
            f"{gib(row['xla_memory_bytes']):>8s} {gib(row['device_peak_bytes_so_far']):>8s} "
            f"{row['cudnn_attention_calls']:5d} {row['compile_seconds']:9.1f} "
            f"{'' if ratio is None else f'x{ratio:.2f}':>9s}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiments", default="bert_base,t5_1_1_base")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps (default 3)")
    parser.add_argument(
        "--batch_size", type=int, default=None, help="default: the experiment's BATCH_SIZE"
    )
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="the experiments' tiny twins, batch 4, 2 steps: checks the script on a CPU",
    )
    parser.add_argument("--out", default=None, help="append one JSON line per variant here")
    args = parser.parse_args(argv)
    experiments = [e for e in args.experiments.split(",") if e]
    steps, warmup, batch_size = args.steps, args.warmup, args.batch_size
    if args.dry_run:
        experiments = [TINY_TWINS.get(e, e) for e in experiments]
        steps = steps or DRY_RUN["steps"]
        warmup = DRY_RUN["warmup"] if warmup is None else warmup
        batch_size = batch_size or DRY_RUN["batch_size"]
    steps = steps or 20
    warmup = 3 if warmup is None else warmup
    if steps < 1 or warmup < 0 or (batch_size is not None and batch_size < 1):
        parser.error(f"need --steps >= 1, --warmup >= 0, --batch_size >= 1; got {argv}")
    device = jax.devices()[0]
    print(
        f"device: {device.device_kind} ({device.platform}), jax {jax.__version__}; "
        f"{steps} timed steps after {warmup} warmup" + (" (dry run)" if args.dry_run else "")
    )
    if report.device_peak_flops() is None:
        print(
            f"warning: no peak FLOP/s for device kind {device.device_kind!r}; add it to "
            "lmsuite.training.report.PEAK_FLOPS for MFU"
        )
    rows = []
    for experiment in experiments:
        rows += measure_experiment(experiment, batch_size=batch_size, steps=steps, warmup=warmup)
    print(format_table(rows))
    for row in rows:
        if not math.isfinite(row["final_loss"]):
            print(f"warning: {row['experiment']} {row['variant']}: loss {row['final_loss']}")
    if args.out:
        command = shlex.join([sys.executable, __file__, *argv])
        with open(args.out, "a") as out:
            for row in rows:
                record = dict(
                    device_kind=device.device_kind,
                    platform=device.platform,
                    jax_version=jax.__version__,
                    command=command,
                    dry_run=args.dry_run,
                    time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    **row,
                )
                out.write(json.dumps(record) + "\n")
        print(f"wrote {len(rows)} rows to {args.out}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
