"""Ahead-of-time compilation of the real train step for a TPU slice, on a CPU host.

`compile_train_step` builds the run's abstract state and batch with the shardings `loop.train`
gives them, on a mesh of libtpu's compile-only devices for the slice, and compiles the same
`step.jit_train_step` that training runs. Nothing is allocated: the state, the batch and the
devices are all shapes. XLA's memory analysis gives the per-device bytes; its cost analysis the
FLOPs and bytes one step moves.

The step time is a roofline estimate, not a measurement: the larger of FLOPs / peak FLOP/s and
bytes accessed / HBM bandwidth, per device, from the compiled (partitioned, optimised) step.
It ignores collectives' time on the interconnect and overlap, so it is a lower bound on the
time and an upper bound on MFU. MFU counts the unpartitioned step's FLOPs (XLA's count of the
program before it is split over devices: forward, backward and optimizer, attention included)
against every device's peak over that time.

  >>> report = compile_train_step(accelerator="v4-8", **train_arguments)
  >>> report.fits, report.total_bytes / 2**30, report.step_seconds, report.mfu
"""

import functools
import os
import time
import warnings
from collections.abc import Mapping, Sequence

import jax
import numpy as np
import optax
from etils import epath

from lmsuite import partitioning
from lmsuite.models import ModelConfig, Transformer, memory_shapes
from lmsuite.training import (
    accelerators,
    input_pipeline,
    preflight,
    recipes,
    report,
    roofline,
    step,
)
from lmsuite.training.compile_report import CompileReport, device_bytes, refused_for_hbm
from lmsuite.training.train_state import sharded_abstract_state

# The start of JAX's warning for a persistent-cache entry it cannot load (`compile_train_step`).
UNREADABLE_CACHE_ENTRY = "Error reading persistent compilation cache entry"


@functools.cache
def slice_devices(accelerator: str) -> tuple[jax.Device, ...]:
    """libtpu's compile-only devices for the slice (needs the `tpu` extra: libtpu)."""
    slice_ = accelerators.get(accelerator)
    from jax.experimental import topologies

    # Off a TPU VM libtpu looks for its worker's metadata at start-up and logs errors when none
    # answers; these say "one worker, this host" (only the first call's values are read). With
    # no chip to guard, several compiling processes may load libtpu at once (its lockfile would
    # refuse the second).
    for name, value in (
        ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1"),
        ("TPU_SKIP_MDS_QUERY", "1"),
        ("TPU_ACCELERATOR_TYPE", accelerator),
        ("TPU_WORKER_HOSTNAMES", "localhost"),
        ("TPU_WORKER_ID", "0"),
    ):
        os.environ.setdefault(name, value)
    try:
        topology = topologies.get_topology_desc(
            slice_.topology_name, "tpu", **slice_.topology_kwargs()
        )
    except Exception as error:  # libtpu missing or too old for the generation
        raise RuntimeError(
            f"cannot describe {accelerator} ({slice_.topology_name}) with this libtpu: "
            f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
            ". `lmsuite compile` needs libtpu on the CPU host: pip install 'lmsuite[tpu]'"
        ) from error
    devices = tuple(topology.devices)
    if len(devices) != slice_.num_devices:
        raise RuntimeError(
            f"libtpu describes {accelerator} with {len(devices)} devices; expected "
            f"{slice_.num_devices}"
        )
    return devices


def shapes_task(task: str) -> str:
    """The task whose batch shapes stand in for `task`'s: itself, or for a production corpus
    that is not prepared here (compiling reads no examples, but SeqIO opens the source to build
    the pipeline), the same objective on an embedded corpus. Shapes depend on the objective,
    the lengths and the converter, not on the text.

    Example: "c4_t5_span_corruption" (c4 not prepared) -> "wiki_sample_t5_span_corruption".
    """
    import seqio

    from lmsuite.data import corpora
    from lmsuite.data import tasks as tasks_lib

    provider = seqio.get_mixture_or_task(task)
    subs = list(provider.tasks) if isinstance(provider, seqio.Mixture) else [provider]
    corpus_names = [tasks_lib.PRETRAINING_TASKS.get(s.name, (None,))[0] for s in subs]
    if all(c is None or preflight.unprepared_tfds(c) is None for c in corpus_names):
        return task
    names = seqio.TaskRegistry.names() | seqio.MixtureRegistry.names()
    for corpus in corpus_names[:1]:
        suffix = task.removeprefix(f"{corpus}_")
        embedded_corpora = [
            n for n, c in corpora.PRETRAINING.items() if not isinstance(c, corpora.TfdsCorpus)
        ]
        for embedded in embedded_corpora:
            if f"{embedded}_{suffix}" in names:
                return f"{embedded}_{suffix}"
    raise ValueError(
        f"task {task!r} reads data that is not prepared here, and no embedded corpus has its "
        "objective to take the batch shapes from; prepare the data (README, 'Production "
        "corpora') or point --tfds_data_dir at it"
    )


def abstract_batch(
    *,
    task: str,
    sequence_length: Mapping[str, int],
    recipe: recipes.Built,
    batch_size: int,
) -> tuple[dict[str, jax.ShapeDtypeStruct], str]:
    """(the global batch as shapes, the task they were read from), from the run's own
    batched dataset's `element_spec`: nothing is read. A mixture's batches carry its task ids
    and every head's labels, as in training (`DataConfig.train_dataset`); XLNet's row layout
    (`rows_task`) orders the examples without changing a shape, and is left out."""
    source = shapes_task(task)
    dataset = input_pipeline.process_dataset(
        task=source,
        sequence_length=sequence_length,
        feature_converter=recipe.feature_converter,
        global_batch_size=jax.process_count(),  # only the sizes after the batch are read
        shuffle=False,
        task_ids_along=recipe.task_ids_along,
        label_fill=dict(recipe.objective.label_heads) or None,
    )
    example = report.example_inputs(dataset.element_spec)
    return {
        k: jax.ShapeDtypeStruct((batch_size,) + v.shape[1:], v.dtype) for k, v in example.items()
    }, source


def compile_train_step(
    *,
    accelerator: str,
    model_config: ModelConfig,
    task: str,
    sequence_length: Mapping[str, int],
    recipe: recipes.Built,
    optimizer: optax.GradientTransformation,
    learning_rate_fn: optax.Schedule,
    batch_size: int,
    mesh_shape: Sequence[int] = (-1, 1, 1),
    rules: partitioning.Rules = partitioning.DEFAULT_RULES,
    seed: int = 0,
    num_microbatches: int = 1,
    skip_nonfinite: bool = False,
    prng_impl: str = "threefry2x32",
    serialize_to: str | None = None,
    batch: Mapping[str, jax.ShapeDtypeStruct] | None = None,
    **_unused_train_arguments,
) -> CompileReport:
    """Compiles `lmsuite train`'s step for `accelerator` with `mesh_shape` (data, fsdp, tensor;
    one may be -1) and reports its memory, FLOPs and projected time.

    Takes gin's `train` arguments (`cli.load_config`: the run config flattened; the ones that
    shape the step are read, the rest ignored), so `lmsuite compile` passes them unchanged.
    `serialize_to` writes the compiled executable there (jax.experimental.serialize_executable's
    payload). `batch` skips building the input pipeline (auto-mesh compiles reuse one).

    Raises:
      ValueError: an unknown accelerator, a mesh that does not multiply to its device count, a
        batch the batch axes do not divide, parameters the mesh does not divide.
    """
    slice_ = accelerators.get(accelerator)
    devices = slice_devices(accelerator)
    if len(mesh_shape) != 3:
        raise ValueError(f"mesh {tuple(mesh_shape)}: expected three sizes (data, fsdp, tensor)")
    data, fsdp, tensor = mesh_shape
    try:
        mesh = partitioning.make_mesh(data=data, fsdp=fsdp, tensor=tensor, devices=devices)
    except ValueError as error:
        raise ValueError(f"{accelerator}: {error}") from error
    data, fsdp, tensor = (mesh.shape[axis] for axis in partitioning.MESH_AXES)
    problems: list[str] = []
    preflight.batch_checks(problems, batch_size, (data, fsdp, tensor), num_microbatches)
    if problems:
        raise ValueError("; ".join(problems))
    shapes_from = task
    if batch is None:
        batch, shapes_from = abstract_batch(
            task=task,
            sequence_length=sequence_length,
            recipe=recipe,
            batch_size=batch_size,
        )
    objective = recipe.objective
    model = Transformer(model_config)
    example = {k: np.zeros((1,) + v.shape[1:], v.dtype) for k, v in batch.items()}  # one row

    def init_params(rng):
        return model.init({"params": rng}, **objective.model_inputs(example))["params"]

    started = time.perf_counter()
    build = functools.partial(
        lower_step,
        model=model,
        init_params=init_params,
        recipe=recipe,
        optimizer=optimizer,
        learning_rate_fn=learning_rate_fn,
        batch=batch,
        rules=rules,
        seed=seed,
        skip_nonfinite=skip_nonfinite,
        prng_impl=prng_impl,
    )
    lowered, arguments = build(mesh=mesh, num_microbatches=num_microbatches)
    # XLA counts the unpartitioned program's FLOPs only when lowered for a real backend: the
    # same step on one CPU device (lowered, not compiled).
    # (Without the microbatch loop, whose body XLA would count once: the same FLOPs.)
    single = partitioning.make_mesh(devices=jax.devices("cpu")[:1])
    as_lowered = functools.partial(
        _lowered_on, build, objective=objective, example=example, mesh=single
    )
    on_one_device = build(mesh=single, num_microbatches=1)[0]
    loop_scale = {"flops": 1.0, "bytes accessed": 1.0}
    if model_config.scan_layers:
        unrolled = as_lowered(model_config.replace(scan_layers=False))
        loop_scale = _loop_scale(on_one_device, unrolled)
    if model_config.scan_layers or model_config.remat != "none":
        # MFU counts the model's FLOPs: every layer once, no recomputation.
        on_one_device = as_lowered(model_config.replace(scan_layers=False, remat="none"))
    step_flops = report.lowered_flops(on_one_device)
    tokens = objective.num_tokens(
        {k: jax.numpy.ones(v.shape, v.dtype) for k, v in batch.items()}
    )  # fmt: skip
    common = dict(
        accelerator=accelerator,
        topology=slice_.topology_name,
        mesh_shape=(data, fsdp, tensor),
        num_devices=len(devices),
        hbm_bytes=slice_.hbm_bytes,
        tokens_per_step=int(tokens),
        shapes_task=shapes_from,
    )
    try:
        with warnings.catch_warnings():
            # With a persistent compilation cache (JAX_COMPILATION_CACHE_DIR), a step compiled
            # before is found there, but a topology's compiler cannot load an executable: JAX
            # warns "Error reading persistent compilation cache entry ... PjRtCompiler must be
            # constructed with a Client" and compiles it again, which is all there is to do.
            warnings.filterwarnings("ignore", UNREADABLE_CACHE_ENTRY, UserWarning)
            compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return refused_for_hbm(
            str(error), arguments, common, step_flops, time.perf_counter() - started
        )
    compile_seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if cost else {}) if isinstance(cost, list | tuple) else (cost or {})
    # XLA counts the microbatch loop's body once; scaled by the trips, the update is counted
    # that many times too (small against the passes it follows).
    flops = float(cost.get("flops", 0.0)) * num_microbatches * loop_scale["flops"]
    bytes_accessed = (
        float(cost.get("bytes accessed", 0.0)) * num_microbatches * loop_scale["bytes accessed"]
    )
    generation = slice_.generation
    compute_seconds = flops / generation.peak_flops
    memory_seconds = bytes_accessed / generation.hbm_bandwidth
    step_seconds = max(compute_seconds, memory_seconds)
    step_flops = float(step_flops or flops * len(devices))
    peak = len(devices) * generation.peak_flops
    mfu = step_flops / (peak * step_seconds) if step_seconds else 0
    per_op = roofline.project(compiled.as_text(), roofline.rates_for(generation))
    per_op_mfu = step_flops / (peak * per_op.seconds) if per_op.seconds else 0
    serialized_to = None
    if serialize_to is not None:
        serialized_to = _serialize(compiled, serialize_to, accelerator, (data, fsdp, tensor))
    return CompileReport(
        **common,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        temp_bytes=int(memory.temp_size_in_bytes),
        code_bytes=int(memory.generated_code_size_in_bytes),
        total_bytes=device_bytes(memory),
        flops=flops,
        bytes_accessed=bytes_accessed,
        step_flops=step_flops,
        compute_seconds=compute_seconds,
        memory_seconds=memory_seconds,
        step_seconds=step_seconds,
        mfu=float(mfu),
        per_op_step_seconds=per_op.seconds,
        per_op_mfu=float(per_op_mfu),
        per_op_classes=per_op.by_class(),
        compile_seconds=compile_seconds,
        serialized_to=serialized_to,
        compiled=compiled,
    )


def _lowered_on(build, config: ModelConfig, *, objective, example, mesh):
    """`lmsuite train`'s step for a model of `config`, lowered (not compiled) on `mesh`."""
    model = Transformer(config)

    def init_params(rng):
        return model.init({"params": rng}, **objective.model_inputs(example))["params"]

    return build(mesh=mesh, num_microbatches=1, model=model, init_params=init_params)[0]


def _loop_scale(scanned, unrolled) -> dict[str, float]:
    """Per count (FLOPs, bytes), unrolled / scanned: XLA counts the scan over layers
    (ModelConfig.scan_layers) once, as it does the microbatch loop. The factor scales the
    compiled step's per-device counts to all the layers (an estimate: the partitioned program's
    loop is assumed to hold the same share of the work as the unpartitioned one's)."""
    counts = []
    for lowered in (scanned, unrolled):
        cost = lowered.cost_analysis()
        counts.append((cost[0] if cost else {}) if isinstance(cost, list | tuple) else (cost or {}))
    scanned, unrolled = counts
    return {
        key: unrolled[key] / scanned[key]
        if scanned.get(key, 0) > 0 and unrolled.get(key, 0) > 0
        else 1.0
        for key in ("flops", "bytes accessed")
    }


def lower_step(
    *,
    mesh,
    model,
    init_params,
    recipe,
    optimizer,
    learning_rate_fn,
    batch,
    rules,
    seed,
    num_microbatches,
    skip_nonfinite,
    prng_impl,
):
    """`lmsuite train`'s jitted step, lowered for `mesh` from shapes alone."""
    batch_size = next(iter(batch.values())).shape[0]
    carry_shapes = (
        None if recipe.objective.carry is None else memory_shapes(model.config, batch_size)
    )
    state, state_shardings, _ = sharded_abstract_state(
        init_params=init_params,
        tx=optimizer,
        mesh=mesh,
        rng=jax.random.PRNGKey(seed),
        rules=rules,
        carry_shapes=carry_shapes,
    )
    batch_sharding = step.batch_shardings(batch, mesh, rules=rules)
    abstract_input = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding[k])
        for k, v in batch.items()
    }
    key = step.dropout_key(seed + 1, prng_impl)  # the loop's key: its shape and dtype
    rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=state_shardings.step)
    train_step = step.jit_train_step(
        apply_fn=model.apply,
        objective=recipe.objective,
        learning_rate_fn=learning_rate_fn,
        state_shardings=state_shardings,
        batch_sharding=batch_sharding,
        mesh=mesh,
        rules=rules,
        num_microbatches=num_microbatches,
        skip_nonfinite=skip_nonfinite,
    )
    return train_step.lower(state, abstract_input, rng), (state, abstract_input, rng)


def _serialize(compiled, directory: str, accelerator: str, mesh) -> str:
    """Writes XLA's serialized executable. Its argument and result tree structures are not
    written (the state's optimizer closures do not pickle): `deserialize_and_load` takes them
    from the same config's abstract state, batch and key."""
    from jax.experimental import serialize_executable

    payload, _, _ = serialize_executable.serialize(compiled)
    name = f"train_step_{accelerator}_{'x'.join(map(str, mesh))}.xla"
    path = epath.Path(directory) / "compiled" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(payload)
    return str(path)
