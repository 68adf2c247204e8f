"""Which meshes and microbatch counts to try for a slice: `lmsuite compile --mesh=auto` and the
suggestion printed when a step does not fit (`lmsuite.training.aot` compiles them)."""

import dataclasses

from lmsuite.models import ModelConfig
from lmsuite.training import aot
from lmsuite.training.compile_report import CompileReport


def suggest_microbatches(found: CompileReport, batch_size: int) -> int | None:
    """For a step XLA refused: the power of two of microbatches that would bring its
    temporaries (which shrink with the microbatch, to first order) under the HBM left beside the
    arguments, if the batch allows that many rows per device; None when nothing would."""
    if found.fits or not found.usable_hbm_bytes:
        return None
    room = found.usable_hbm_bytes - found.argument_bytes
    if room <= 0:  # the state alone does not fit: shard it (fsdp) or take a larger slice
        return None
    needed, k = found.temp_bytes / room, 2
    while k < needed:
        k *= 2
    # Each microbatch is split over the devices: batch / k rows must divide among them.
    if batch_size % k or (batch_size // k) % found.num_devices:
        return None
    return k


def candidate_meshes(
    num_devices: int, *, batch_size: int, model_config: ModelConfig, num_microbatches: int = 1
) -> list[tuple[int, int, int]]:
    """Every (data, fsdp, tensor) over `num_devices` whose batch axes divide the batch (per
    microbatch) and whose tensor axis divides the heads and the FFN width; pure data
    parallelism first, then more fsdp, then more tensor."""
    out = []
    per_micro = batch_size // max(num_microbatches, 1)
    for tensor in _divisors(num_devices):
        if model_config.num_heads % tensor or model_config.d_ff % tensor:
            continue
        for fsdp in _divisors(num_devices // tensor):
            data = num_devices // (tensor * fsdp)
            if per_micro % (data * fsdp):
                continue
            out.append((data, fsdp, tensor))
    return sorted(out, key=lambda m: (m[2], m[1]))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def auto_mesh(
    *, accelerator: str, progress=None, **train_arguments
) -> list[tuple[tuple[int, int, int], CompileReport | None, str | None]]:
    """Compiles every candidate mesh: [(mesh, report or None, why it failed or None)], those
    that fit first (fastest projected step first), then the rest by how much they need."""
    num_devices = len(aot.slice_devices(accelerator))
    meshes = candidate_meshes(
        num_devices,
        batch_size=train_arguments["batch_size"],
        model_config=train_arguments["model_config"],
        num_microbatches=train_arguments.get("num_microbatches", 1),
    )
    if not meshes:
        raise ValueError(
            f"no (data, fsdp, tensor) mesh over {accelerator}'s {num_devices} devices divides "
            f"batch_size {train_arguments['batch_size']} and the model's "
            f"{train_arguments['model_config'].num_heads} heads"
        )
    batch, source = aot.abstract_batch(
        task=train_arguments["task"],
        sequence_length=train_arguments["sequence_length"],
        recipe=train_arguments["recipe"],
        batch_size=train_arguments["batch_size"],
    )
    results = []
    for mesh in meshes if progress is None else progress(meshes):
        arguments = dict(train_arguments, mesh_shape=mesh, batch=batch)
        try:
            found = aot.compile_train_step(accelerator=accelerator, **arguments)
            results.append((mesh, dataclasses.replace(found, shapes_task=source), None))
        except ValueError as error:  # parameters this mesh cannot divide
            results.append((mesh, None, str(error).splitlines()[0]))

    def order(item):
        _, found, _ = item
        if found is None:
            return (2, 0.0)
        return (0, found.step_seconds or 0.0) if found.fits else (1, float(found.total_bytes))

    return sorted(results, key=order)
