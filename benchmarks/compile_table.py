"""The table of compiled configurations in docs/tpu.md: each production experiment's train step
compiled ahead of time for TPU slices on this CPU host (`lmsuite compile`), at its paper's
global batch.

  python benchmarks/compile_table.py [--experiments=bert_base,t5_1_1_base]
      [--topologies=v3-8,v4-8,v4-32] [--out=benchmarks/compile_table.jsonl]

Each row is compiled with the experiment's own mesh (data parallel over every device); a row
that does not fit is compiled again fully sharded (fsdp over every device) to say whether a
mesh on that slice would fit. Rows already in --out are reused (a long table survives an
interruption); the markdown table is printed at the end. The step time and MFU are roofline
estimates (see lmsuite/training/aot.py), not measurements.
"""

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lmsuite import cli  # noqa: E402
from lmsuite.training import accelerators, aot, mesh_search  # noqa: E402

GIB = 2**30
EXPERIMENTS = ["bert_base", "bert_large", "albert_xxlarge", "t5_1_1_base", "t5_base", "bart_base"]
TOPOLOGIES = ["v3-8", "v4-8", "v4-32"]


def compile_row(
    experiment: str, topology: str, mesh: tuple[int, int, int] | None, microbatches: int = 1
) -> dict:
    argv = ["compile", f"--gin_file=experiments/{experiment}.gin", f"--topology={topology}"]
    args = cli.parse_args(argv)
    slice_ = accelerators.get(topology)
    kwargs = cli.load_config(args, need_data=False, devices=slice_.num_devices)
    if mesh is not None:
        kwargs["mesh_shape"] = mesh
    if microbatches > 1:
        kwargs["num_microbatches"] = microbatches
    started = time.perf_counter()
    try:
        found = aot.compile_train_step(accelerator=topology, **kwargs).as_dict()
    except ValueError as error:  # the batch or the parameters do not divide on this slice
        found = {"error": str(error).splitlines()[0], "mesh_shape": list(mesh or ())}
    mesh_text = ",".join(map(str, mesh or kwargs["mesh_shape"]))
    found |= {
        "experiment": experiment,
        "batch_size": kwargs["batch_size"],
        "num_microbatches": microbatches,
        "command": f"lmsuite compile --gin_file=experiments/{experiment}.gin "
        f"--topology={topology} --mesh={mesh_text}"
        + (f" --gin.train.num_microbatches={microbatches}" if microbatches > 1 else ""),
        "wall_seconds": time.perf_counter() - started,
    }
    return found


def _microbatches_to_try(fsdp: dict | None) -> int | None:
    """`aot.suggest_microbatches` for the fully sharded row, if XLA refused it."""
    if not fsdp or "error" in fsdp:
        return None
    fields = {f.name for f in dataclasses.fields(aot.CompileReport)}
    found = aot.CompileReport(**{k: v for k, v in fsdp.items() if k in fields and k != "compiled"})
    return mesh_search.suggest_microbatches(found, fsdp["batch_size"])


def markdown(rows: list[dict]) -> str:
    lines = [
        "| experiment | slice | batch | mesh | fits | GiB per device (HBM) | projected step | "
        "projected MFU | fully sharded (fsdp) | fsdp + microbatches |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key = {(r["experiment"], r["accelerator_name"], r["kind"]): r for r in rows}
    for (experiment, topology, kind), row in by_key.items():
        if kind != "default":
            continue
        if "error" in row:
            lines.append(f"| {experiment} | {topology} | {row['batch_size']} | - | no | "
                         f"{row['error']} | | | | |")  # fmt: skip
            continue
        fsdp = by_key.get((experiment, topology, "fsdp"))
        alt = ""
        if fsdp is not None:
            alt = (
                f"{'x'.join(map(str, fsdp['mesh_shape']))}: "
                + ("fits" if fsdp.get("fits") else "does not fit")
                + (f", {fsdp['total_bytes'] / GIB:.1f} GiB" if "total_bytes" in fsdp else "")
            )
        micro = by_key.get((experiment, topology, "micro"))
        micro_text = ""
        if micro is not None and "error" in micro:
            micro_text = f"{micro['num_microbatches']} microbatches: {micro['error']}"
        elif micro is not None:
            micro_text = (
                f"{micro['num_microbatches']} x {row['batch_size'] // micro['num_microbatches']}: "
                + ("fits" if micro.get("fits") else "does not fit")
                + (f", {micro['total_bytes'] / GIB:.1f} GiB" if "total_bytes" in micro else "")
                + (f", {micro['step_seconds'] * 1e3:.0f} ms" if micro.get("step_seconds") else "")
            )
        over = "" if row["fits"] else f" ({row['over_bytes'] / GIB:.1f} GiB over)"
        timed = row["step_seconds"] is not None
        lines.append(
            f"| {experiment} | {topology} | {row['batch_size']} | "
            f"{'x'.join(map(str, row['mesh_shape']))} | {'yes' if row['fits'] else 'no'}{over} | "
            f"{row['total_bytes'] / GIB:.1f} ({row['hbm_bytes'] / GIB:.0f}) | "
            + (f"{row['step_seconds'] * 1e3:.0f} ms | {100 * row['mfu']:.0f}% | " if timed
               else "- | - | ")
            + f"{alt} | {micro_text} |"
        )  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", default=",".join(EXPERIMENTS))
    parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
    parser.add_argument("--out", default="benchmarks/compile_table.jsonl")
    args = parser.parse_args(argv)
    out = Path(args.out)
    rows = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    done = {(r["experiment"], r["accelerator_name"], r["kind"]) for r in rows}
    for topology in args.topologies.split(","):
        for experiment in args.experiments.split(","):
            for kind in ("default", "fsdp", "micro"):
                if (experiment, topology, kind) in done:
                    continue
                previous = {
                    r["kind"]: r
                    for r in rows
                    if (r["experiment"], r["accelerator_name"]) == (experiment, topology)
                }
                mesh, microbatches = (1, -1, 1), 1
                if kind == "default":
                    mesh = None
                elif kind == "fsdp":
                    if previous["default"].get("fits", True) or "error" in previous["default"]:
                        continue
                else:
                    microbatches = _microbatches_to_try(previous.get("fsdp"))
                    if microbatches is None:
                        continue
                row = compile_row(experiment, topology, mesh, microbatches)
                row |= {"accelerator_name": topology, "kind": kind}
                rows.append(row)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(
                    f"{experiment} {topology} {kind}: "
                    + (row.get("error") or f"{row['total_bytes'] / GIB:.2f} GiB, "
                       f"fits={row['fits']}, {row['wall_seconds']:.0f} s"),
                    flush=True,
                )  # fmt: skip
    print(markdown(rows))


if __name__ == "__main__":
    main()
