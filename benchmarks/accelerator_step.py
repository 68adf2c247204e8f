"""Steps/s and MFU of `lmsuite train`'s step on one accelerator: bfloat16, fused attention and
the rbg PRNG against the same step in float32 with plain attention and threefry, in one run.

How to run on a GPU (one device is measured; nothing here runs in CI):

    pip install 'lmsuite[gpu]'
    python benchmarks/accelerator_step.py --experiments=bert_base,t5_1_1_base \\
        --steps=20 --warmup=3 --out=accelerator_step.jsonl

On an accelerator image that has JAX, Flax and Optax but no TensorFlow (lmsuite's data stack),
split the work: `--prepare` loads the variants and reads the batch where lmsuite installs whole,
and `--setup` measures from the source tree, importing only the model, objective and step
modules (the prepared files pickle the configs, the loss constructor and the batch):

    python benchmarks/accelerator_step.py --experiments=bert_base,t5_1_1_base --prepare=prepared
    python benchmarks/accelerator_step.py --experiments=bert_base,t5_1_1_base --setup=prepared \\
        --out=accelerator_step.jsonl

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
count is kept in the JSON (`xla_flops`). Where the backend counts no lowered step (jax 0.11's
GPU backend), the compiled module's count stands in (`flops_source`). Memory is XLA's figure
for the compiled step (arguments + outputs not donated + temporaries) and, where the backend
reports it, the device's allocator high-water mark so far in this process (it only grows from
one variant to the next).

A variant that runs out of device memory halves the batch (its first rows), says so, and both
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

# This folder (the preparation half) and lmsuite when not pip-installed.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
# Only modules that import no TensorFlow or SeqIO here: `--setup` measures on an accelerator
# image that has neither. The data stack is imported by `prepare_experiment` alone.
from accelerator_prepare import (  # noqa: E402
    ABLATION,
    Prepared,
    Variant,
    load_prepared,
    prepare_experiment,
    save_prepared,
    select_variants,
)

from lmsuite import partitioning  # noqa: E402
from lmsuite.layers import fused_attention  # noqa: E402
from lmsuite.models import Transformer, memory_shapes  # noqa: E402
from lmsuite.training import report, step, train_state  # noqa: E402

GIB = 2**30
TINY_TWINS = {"bert_base": "bert_tiny", "t5_1_1_base": "t5_1_1_tiny"}
DRY_RUN = dict(batch_size=4, steps=2, warmup=1)


def gib(size: int | None) -> str:
    return "-" if size is None else f"{size / GIB:.2f}"


class OutOfMemory(Exception):
    """The device refused the step for want of memory."""


def host_flops(prepared: Prepared) -> float | None:
    """XLA's count of `prepared`'s baseline step over its whole batch, lowered on this host."""
    (baseline,) = [variant for variant in prepared.variants if variant.name == "baseline"]
    lowered = lower_step(baseline, prepared.batch)[0]
    return report.lowered_flops(lowered, loop_trips=baseline.trainer["num_microbatches"])


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def lower_step(variant: Variant, batch_np) -> tuple:
    """(lowered step, state, batch, dropout key, the fused path's log lines) of `variant`'s train
    step over `batch_np` on the first device, as `lmsuite train` builds it (the recipe's
    objective, `Transformer`, `create_sharded_state`, `step.jit_train_step`, the loop's dropout
    key)."""
    trainer = variant.trainer
    mesh = partitioning.make_mesh(devices=jax.devices()[:1])
    objective = variant.loss(**variant.loss_options)
    model = Transformer(variant.model)
    tx, learning_rate_fn = variant.optimizer.build(train_steps=trainer["train_steps"])
    batch_size = len(next(iter(batch_np.values())))
    example = {k: v[:1] for k, v in batch_np.items()}
    carry_shapes = None
    if objective.carry is not None:
        carry_shapes = memory_shapes(variant.model, batch_size)
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
            rng=jax.random.PRNGKey(trainer["seed"]),
            rules=trainer["rules"],
            carry_shapes=carry_shapes,
        )
        shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch_np.items()}
        batch_sharding = step.batch_shardings(shapes, mesh, rules=trainer["rules"])
        batch = {k: jax.device_put(v, batch_sharding[k]) for k, v in batch_np.items()}
        train_step = step.jit_train_step(
            apply_fn=model.apply,
            objective=objective,
            learning_rate_fn=learning_rate_fn,
            state_shardings=shardings,
            batch_sharding=batch_sharding,
            mesh=mesh,
            rules=trainer["rules"],
            num_microbatches=trainer["num_microbatches"],
            skip_nonfinite=trainer["skip_nonfinite"],
        )
        rng = step.dropout_key(trainer["seed"] + 1, trainer["prng_impl"])
        lowered = train_step.lower(state, batch, rng)
    finally:
        fused_attention.logger.removeHandler(collect)
    return lowered, state, batch, rng, collect.lines


def measure(
    variant: Variant,
    batch_np,
    *,
    steps: int,
    warmup: int,
    trace_dir: str | None = None,
    host_flops: float | None = None,
) -> dict:
    """Lowers (`lower_step`), compiles and times `variant`'s train step over `batch_np`.
    `host_flops`: XLA's count of this step lowered on the preparing host, used where this
    backend counts no lowered step.

    Raises:
      OutOfMemory: compiling or running the step exhausted the device's memory.
    """
    trainer = variant.trainer
    objective = variant.loss(**variant.loss_options)
    batch_size = len(next(iter(batch_np.values())))
    try:
        started = time.perf_counter()
        lowered, state, batch, rng, fused_log = lower_step(variant, batch_np)
        xla_flops = report.lowered_flops(lowered, loop_trips=trainer["num_microbatches"])
        compiled = lowered.compile()
        compile_seconds = time.perf_counter() - started
        flops_source = "lowered"
        if xla_flops is None and host_flops is not None:
            xla_flops, flops_source = host_flops, "lowered on the preparing host"
        if xla_flops is None:  # a GPU backend counts only the optimized module
            xla_flops, flops_source = report.lowered_flops(compiled), "compiled"
        for _ in range(warmup):
            state, metrics = compiled(state, batch, rng)
        jax.block_until_ready(state)
        started = time.perf_counter()
        for _ in range(steps):
            state, metrics = compiled(state, batch, rng)
        jax.block_until_ready((state, metrics))
        seconds = time.perf_counter() - started
        top_ops = []
        if trace_dir is not None:
            top_ops = trace_steps(compiled, state, batch, rng, trace_dir)
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" in str(error):
            raise OutOfMemory(str(error).splitlines()[0]) from error
        raise
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
        sequence_length=variant.sequence_length,
        tokens_per_step=int(objective.num_tokens(batch)),
        steps=steps,
        warmup=warmup,
        seconds=seconds,
        steps_per_sec=steps / seconds,
        compile_seconds=compile_seconds,  # init, lowering and compile
        xla_flops=xla_flops,
        flops_source=flops_source,
        xla_memory_bytes=xla_bytes,
        device_peak_bytes_so_far=stats.get("peak_bytes_in_use"),
        cudnn_attention_calls=compiled.as_text().count("__cudnn$fmha"),
        plain_attention_reasons=fused_log,
        final_loss=loss,
        top_ops=top_ops,
    )


TRACE_STEPS = 3


def trace_steps(compiled, state, batch, rng, trace_dir: str, top: int = 25) -> list[dict]:
    """Runs `TRACE_STEPS` more steps under `jax.profiler` into `trace_dir` and returns the
    `top` device ops by time per step ({name, ms_per_step, calls_per_step}): where a step's time
    goes without a viewer (kernels on a GPU, XLA ops on a CPU)."""
    import collections
    import gzip

    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(TRACE_STEPS):
            state, metrics = compiled(state, batch, rng)
        jax.block_until_ready((state, metrics))
    files = sorted(Path(trace_dir).glob("**/*.trace.json.gz"), key=lambda f: f.stat().st_mtime)
    if not files:
        return []
    with gzip.open(files[-1]) as file:
        events = json.load(file)
    events = events["traceEvents"] if isinstance(events, dict) else events
    # Device streams only where the trace has them (a GPU's), else every complete event.
    names = {
        (e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") in ("thread_name", "process_name")
    }
    device_pids = {
        pid for (pid, _), name in names.items() if "/device:GPU" in name or "Stream" in name
    }
    durations, calls = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("ph") != "X" or (device_pids and event.get("pid") not in device_pids):
            continue
        durations[event["name"]] += event.get("dur", 0)
        calls[event["name"]] += 1
    return [
        dict(
            name=name[:160],
            ms_per_step=micros / TRACE_STEPS / 1000,
            calls_per_step=calls[name] / TRACE_STEPS,
        )
        for name, micros in durations.most_common(top)
    ]


def measure_experiment(
    prepared: Prepared, *, steps: int, warmup: int, trace_dir: str | None = None
) -> list[dict]:
    """Both variants of `prepared` at the largest batch (its batch's rows, halving) at which both
    fit; one row each, the fast row with the ratios."""
    for note in prepared.notes:
        print(f"note: {note}")
    batch = prepared_rows = len(next(iter(prepared.batch.values())))
    while True:
        batch_np = {k: v[:batch] for k, v in prepared.batch.items()}
        rows = []
        try:
            for variant in prepared.variants:
                print(
                    f"{prepared.experiment} {variant.name}: batch {batch}, compiling ...",
                    flush=True,
                )
                row = measure(
                    variant,
                    batch_np,
                    steps=steps,
                    warmup=warmup,
                    trace_dir=trace_dir
                    and str(Path(trace_dir) / f"{prepared.experiment}_{variant.name}"),
                    host_flops=prepared.host_flops
                    if variant.name == "baseline" and batch == prepared_rows
                    else None,
                )
                # At once, so that a call cut short by its time limit still shows it.
                print(
                    f"  {row['steps_per_sec']:.3f} steps/s, {gib(row['xla_memory_bytes'])} GiB "
                    f"(XLA), {row['cudnn_attention_calls']} cuDNN attention calls; init, lowering "
                    f"and compile {row['compile_seconds']:.0f} s",
                    flush=True,
                )
                for op in row["top_ops"]:
                    print(f"  {op['ms_per_step']:9.3f} ms/step x{op['calls_per_step']:5.1f}  "
                          f"{op['name'][:110]}")  # fmt: skip
                for reason in row["plain_attention_reasons"]:
                    print(f"  fused-path log: {reason}")
                rows.append(
                    dict(
                        experiment=prepared.experiment,
                        variant=variant.name,
                        bindings=variant.bindings,
                        shapes_task=prepared.shapes_task,
                        **row,
                    )
                )
            break
        except OutOfMemory as error:
            if batch == 1:
                raise
            print(
                f"{prepared.experiment} {variant.name}: out of memory at batch {batch} ({error}); "
                f"halving to {batch // 2} and measuring both variants again"
            )
            batch //= 2
    baseline = next((row for row in rows if row["variant"] == "baseline"), None)
    model_flops = None  # the baseline's count: the same math for every variant
    if baseline is not None:
        model_flops = baseline["xla_flops"]
    elif batch == prepared_rows:  # --variants without the baseline
        model_flops = prepared.host_flops
    peak = report.device_peak_flops()
    for row in rows:
        row["notes"] = prepared.notes if row["variant"] != "baseline" else []
        row["model_flops"] = model_flops
        row["tokens_per_sec"] = row["tokens_per_step"] * row["steps_per_sec"]
        row["peak_flops"] = peak
        row["mfu"] = (
            row["model_flops"] * row["steps_per_sec"] / peak
            if peak and row["model_flops"]
            else None
        )
    for row in rows:
        if baseline is not None and row is not baseline:
            row["steps_per_sec_ratio"] = row["steps_per_sec"] / baseline["steps_per_sec"]
    return rows


def format_table(rows: list[dict]) -> str:
    """One line per variant, and per experiment the fast / baseline ratio of steps/s."""
    lines = [
        f"{'experiment':14s} {'variant':15s} {'batch':>5s} {'steps/s':>9s} {'tokens/s':>10s} "
        f"{'TFLOP/step':>10s} {'MFU':>6s} {'XLA GiB':>8s} {'peak GiB':>8s} {'cuDNN':>5s} "
        f"{'compile s':>9s} {'vs base':>9s}"
    ]
    for row in rows:
        flops = row["model_flops"]
        mfu = row["mfu"]
        ratio = row.get("steps_per_sec_ratio")
        lines.append(
            f"{row['experiment']:14s} {row['variant']:15s} {row['batch_size']:5d} "
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
        "--batch_size",
        type=int,
        default=None,
        help="default: the experiment's BATCH_SIZE (with --setup: the first rows of the prepared "
        "batch)",
    )
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="the experiments' tiny twins, batch 4, 2 steps: checks the script on a CPU",
    )
    parser.add_argument("--out", default=None, help="append one JSON line per variant here")
    parser.add_argument(
        "--prepare",
        default=None,
        metavar="DIR",
        help="load each experiment's variants and read its batch (needs the data stack), write "
        "DIR/EXPERIMENT.pkl and measure nothing",
    )
    parser.add_argument(
        "--setup",
        default=None,
        metavar="DIR",
        help="measure the experiments that --prepare=DIR wrote: imports no TensorFlow or SeqIO, "
        "for accelerator images without them",
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="with --prepare or alone: also measure the steps between baseline and fast, one "
        f"change at a time ({', '.join(ABLATION)})",
    )
    parser.add_argument(
        "--variants",
        default=None,
        metavar="NAMES",
        help="measure only these variants (comma-separated, e.g. fast to trace it alone); "
        "without baseline, MFU uses the host's count from --prepare and no ratio is printed",
    )
    parser.add_argument(
        "--trace",
        default=None,
        metavar="DIR",
        help=f"after timing, profile {TRACE_STEPS} more steps of each variant into DIR and print "
        "its top device ops",
    )
    args = parser.parse_args(argv)
    if args.prepare and args.setup:
        parser.error("--prepare writes what --setup reads: give one of them")
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
    if args.prepare:
        Path(args.prepare).mkdir(parents=True, exist_ok=True)
        for experiment in experiments:
            prepared = prepare_experiment(experiment, batch_size=batch_size, ablate=args.ablate)
            prepared.host_flops = host_flops(prepared)
            path = save_prepared(args.prepare, prepared)
            print(f"wrote {path} (baseline: {prepared.host_flops or 0:.4g} FLOPs per step here)")
        return []
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
    command = shlex.join([sys.executable, __file__, *argv])
    rows = []
    for experiment in experiments:
        if args.setup:
            prepared = load_prepared(args.setup, experiment)
            rows_prepared = len(next(iter(prepared.batch.values())))
            if batch_size is not None and batch_size > rows_prepared:
                parser.error(
                    f"--batch_size={batch_size} but {args.setup} holds {rows_prepared} rows of "
                    f"{experiment}'s batch; prepare it with --batch_size={batch_size} or more"
                )
            if batch_size is not None and batch_size != rows_prepared:
                prepared.batch = {k: v[:batch_size] for k, v in prepared.batch.items()}
                if prepared.host_flops is not None:
                    print(
                        f"note: {experiment}: the host's FLOP count is of {rows_prepared} rows; "
                        f"prepare with --batch_size={batch_size} to use it at this batch"
                    )
                prepared.host_flops = None
        else:
            prepared = prepare_experiment(experiment, batch_size=batch_size, ablate=args.ablate)
        if args.variants:
            prepared.variants = select_variants(prepared, args.variants.split(","))
        measured = measure_experiment(prepared, steps=steps, warmup=warmup, trace_dir=args.trace)
        rows += measured
        # Each experiment is printed and written as it ends, so a run cut short keeps it.
        print(format_table(measured), flush=True)
        for row in measured:
            if not math.isfinite(row["final_loss"]):
                print(f"warning: {row['experiment']} {row['variant']}: loss {row['final_loss']}")
        if args.out:
            with open(args.out, "a") as out:
                for row in measured:
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
            print(f"wrote {len(measured)} rows to {args.out}")
    if len(experiments) > 1:
        print(format_table(rows))
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
