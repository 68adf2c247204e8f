"""`lmsuite compile`: size a run for a TPU slice on a CPU host (see `lmsuite.training.aot`).

lmsuite compile --gin_file=experiments/t5_1_1_base.gin --topology=v4-32 [--mesh=2,8,1 | auto]
                [--json] [--model_dir=DIR (writes the compiled executable)]
"""

import json
import sys

from lmsuite.cli.config import ConfigError, described, load_config

GIB = 2**30


def parse_mesh(text: str) -> tuple[int, int, int] | str:
    """ "2,4,1" -> (2, 4, 1); "auto" stays "auto"."""
    if text == "auto":
        return text
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 3 or sizes.count(-1) > 1 or not all(s == -1 or s >= 1 for s in sizes):
        raise ConfigError(
            [f"--mesh={text!r}: expected three comma-separated sizes data,fsdp,tensor, each >= 1 "
             "(one may be -1), e.g. --mesh=-1,4,1, or --mesh=auto"]
        )  # fmt: skip
    return sizes


def add_parser(commands, gin_flags) -> None:
    parser = commands.add_parser(
        "compile",
        **described(
            "compile the train step for a TPU slice on this CPU host: per-chip memory, fits or "
            "not, projected step time and MFU (needs pip install 'lmsuite[tpu]')"
        ),
    )
    gin_flags(parser, model_dir_required=False)
    parser.add_argument(
        "--topology",
        required=True,
        help="a TPU slice as gcloud names it: v3-8, v3-32, v4-8, v4-32, v5litepod-16, v5p-8, ...",
    )
    parser.add_argument(
        "--mesh",
        default=None,
        help="data,fsdp,tensor (one may be -1); 'auto' compiles every mesh that divides the "
        "batch and the heads and lists those that fit, best first (default: the config's "
        "MESH_SHAPE)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run_compile)


def run_compile(args) -> list[dict]:
    from lmsuite.training import accelerators, aot, mesh_search

    mesh = None if args.mesh is None else parse_mesh(args.mesh)
    try:
        slice_ = accelerators.get(args.topology)
    except ValueError as error:
        raise ConfigError([f"--topology: {error}"]) from error
    kwargs = load_config(args, need_data=False, devices=slice_.num_devices)
    if mesh not in (None, "auto"):
        kwargs["mesh_shape"] = mesh
    serialize_to = args.model_dir or None
    say = (lambda *_: None) if args.json else (lambda text: print(text, file=sys.stderr))
    say(f"lmsuite compile: {args.topology} ({slice_.topology_name}, {slice_.num_devices} "
        f"devices, {slice_.num_hosts} hosts), recipe {kwargs['recipe'].recipe.name!r}, "
        f"batch {kwargs['batch_size']}")  # fmt: skip
    try:
        if mesh == "auto":
            from tqdm import tqdm

            results = mesh_search.auto_mesh(
                accelerator=args.topology,
                progress=lambda ms: tqdm(ms, desc="meshes", unit="mesh", disable=args.json),
                **kwargs,
            )
            rows = [
                found.as_dict() if found else {"mesh_shape": list(m), "error": why}
                for m, found, why in results
            ]
        else:
            found = aot.compile_train_step(
                accelerator=args.topology, serialize_to=serialize_to, **kwargs
            )
            rows = [found.as_dict()]
            rows[0]["suggested_microbatches"] = mesh_search.suggest_microbatches(
                found, kwargs["batch_size"]
            )
    except ValueError as error:
        raise ConfigError([str(error)]) from error
    print(json.dumps(rows, indent=2) if args.json else format_reports(rows))
    return rows


def format_reports(rows: list[dict]) -> str:
    """A table of compiled meshes, then the estimate's method."""
    lines = [
        f"{'mesh':>12}  {'fits':>4}  {'args GiB':>8}  {'out GiB':>7}  {'temp GiB':>8}  "
        f"{'total GiB':>9}  {'HBM GiB':>7}  {'TFLOP/dev':>9}  {'GB/dev':>7}  "
        f"{'step ms':>8}  {'MFU':>5}  {'per-op ms':>9}  {'MFU':>5}"
    ]
    for row in rows:
        mesh = "x".join(map(str, row["mesh_shape"]))
        if "error" in row:
            lines.append(f"{mesh:>12}  {'-':>4}  {row['error']}")
            continue
        measured = row["step_seconds"] is not None
        lines.append(
            f"{mesh:>12}  {'yes' if row['fits'] else 'NO':>4}  "
            f"{row['argument_bytes'] / GIB:>8.2f}  {row['output_bytes'] / GIB:>7.2f}  "
            f"{row['temp_bytes'] / GIB:>8.2f}  {row['total_bytes'] / GIB:>9.2f}  "
            f"{row['hbm_bytes'] / GIB:>7.1f}  "
            + (
                f"{row['flops'] / 1e12:>9.2f}  {row['bytes_accessed'] / 1e9:>7.1f}  "
                f"{row['step_seconds'] * 1e3:>8.1f}  {100 * row['mfu']:>4.0f}%  "
                f"{row['per_op_step_seconds'] * 1e3:>9.1f}  {100 * row['per_op_mfu']:>4.0f}%"
                if measured
                else f"{'-':>9}  {'-':>7}  {'-':>8}  {'-':>5}  {'-':>9}  {'-':>5}"
            )
        )
    first = next((r for r in rows if "error" not in r), None)
    if first is not None:
        if not first["fits"]:
            usable = first["usable_hbm_bytes"] or first["hbm_bytes"]
            lines.append(
                f"does not fit: needs {first['total_bytes'] / GIB:.2f} GiB per device, "
                f"{first['over_bytes'] / GIB:.2f} GiB more than the {usable / GIB:.2f} GiB XLA "
                "can use; try --mesh=auto (more fsdp shards the state), "
                "train.num_microbatches, or a larger slice"
            )
            if first["out_of_memory"]:
                lines.append(f"XLA: {first['out_of_memory']}")
            if first.get("suggested_microbatches"):
                lines.append(
                    f"--gin.train.num_microbatches={first['suggested_microbatches']} may fit "
                    "(activations shrink with the microbatch; compile it to know)"
                )
        lines.append(
            f"shapes from task {first['shapes_task']!r}; {first['tokens_per_step']:,} tokens per "
            f"step; compiled in {first['compile_seconds']:.1f} s"
        )
        if first.get("serialized_to"):
            lines.append(f"executable: {first['serialized_to']}")
        if first.get("per_op_classes"):
            lines.append(format_classes(first["per_op_classes"], first["per_op_step_seconds"]))
    lines.append(
        "step ms is the whole-step roofline, an optimistic bound: max(FLOPs / peak, bytes / HBM "
        "bandwidth) per device, collectives not counted. per-op ms sums each op's slowest unit "
        "(MXU FLOPs, HBM bytes, VPU ops, ICI bytes; lmsuite/training/roofline.py), the closer "
        "estimate. MFU = the unpartitioned step's FLOPs over all devices' peak in that time"
    )
    return "\n".join(lines)


def format_classes(classes: dict[str, dict[str, float]], total_seconds: float) -> str:
    """The per-op projection by class: time, share, and the work behind it."""
    lines = [f"per-op time by class ({total_seconds * 1e3:.1f} ms per step):"]
    for name, row in sorted(classes.items(), key=lambda kv: -kv[1].get("seconds", 0.0)):
        seconds = row.get("seconds", 0.0)
        if not seconds:
            continue
        lines.append(
            f"  {name:<10} {seconds * 1e3:8.1f} ms {100 * seconds / total_seconds:5.1f}%  "
            f"{row.get('flops', 0) / 1e12:7.2f} TFLOP  {row.get('hbm_bytes', 0) / 1e9:7.1f} GB HBM"
            f"  {row.get('vector_ops', 0) / 1e12:6.3f} T VPU ops"
            + (f"  {row['ici_bytes'] / 1e9:.2f} GB ICI" if row.get("ici_bytes") else "")
        )
    return "\n".join(lines)
