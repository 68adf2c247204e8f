"""What `lmsuite compile` found for one slice and mesh: `CompileReport`, and the figures XLA's
analyses and refusals give it (device bytes; the message of a program that needs more HBM)."""

import dataclasses
import re
from typing import Any

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """What compiling one step for one slice and mesh found. Bytes and FLOPs are per device.

    When XLA refuses the program for want of HBM (`out_of_memory` holds its message), nothing
    was compiled: the temporaries and the usable HBM are XLA's figures from that message, the
    argument bytes the state's and batch's shards summed unpadded, and there are no FLOPs or
    times (None).
    """

    accelerator: str
    topology: str
    mesh_shape: tuple[int, int, int]
    num_devices: int
    hbm_bytes: int  # the chip's HBM per device; XLA keeps part of it for itself
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    total_bytes: int
    flops: float | None
    bytes_accessed: float | None
    step_flops: float | None  # the whole step, unpartitioned
    compute_seconds: float | None
    memory_seconds: float | None
    step_seconds: float | None
    mfu: float | None
    tokens_per_step: int
    shapes_task: str
    compile_seconds: float
    serialized_to: str | None = None
    # The per-op roofline (`roofline.py`): each op's slowest unit, summed over the ops.
    per_op_step_seconds: float | None = None
    per_op_mfu: float | None = None
    per_op_classes: dict[str, dict[str, float]] | None = None  # class -> seconds, flops, ...
    out_of_memory: str | None = None
    usable_hbm_bytes: int | None = None  # what XLA said it could use, when it refused
    compiled: Any = dataclasses.field(default=None, repr=False, compare=False)  # the executable

    @property
    def fits(self) -> bool:
        return self.out_of_memory is None and self.total_bytes <= self.hbm_bytes

    @property
    def over_bytes(self) -> int:
        """How much more than the device's HBM the step needs (0 when it fits)."""
        limit = self.hbm_bytes if self.usable_hbm_bytes is None else self.usable_hbm_bytes
        return 0 if self.fits else max(0, self.total_bytes - limit)

    def as_dict(self) -> dict[str, Any]:
        names = [f.name for f in dataclasses.fields(self) if f.name != "compiled"]
        out = {name: getattr(self, name) for name in names}
        out |= {"fits": self.fits, "over_bytes": self.over_bytes}
        out["mesh_shape"] = list(self.mesh_shape)
        return out


_XLA_OUT_OF_HBM = re.compile(
    r"required for HLO temporaries \(([\d.]+)([KMGT])\) exceeds available HBM \(([\d.]+)([KMGT])\)"
)
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def refused_for_hbm(message, arguments, common, step_flops, seconds) -> CompileReport:
    """The report of a step XLA refused: it needs more HBM than the device has."""
    first = message.strip().splitlines()[0]
    found = _XLA_OUT_OF_HBM.search(message)
    temp = usable = None
    if found:
        temp = int(float(found[1]) * _UNITS[found[2]])
        usable = int(float(found[3]) * _UNITS[found[4]])
    argument_bytes = sum(
        int(np.prod(leaf.sharding.shard_shape(leaf.shape))) * leaf.dtype.itemsize  # keys too
        for leaf in jax.tree.leaves(arguments)
    )
    return CompileReport(
        **common,
        argument_bytes=argument_bytes,
        output_bytes=0,
        alias_bytes=0,
        temp_bytes=temp or 0,
        code_bytes=0,
        total_bytes=argument_bytes + (temp or 0),
        flops=None,
        bytes_accessed=None,
        step_flops=float(step_flops) if step_flops else None,
        compute_seconds=None,
        memory_seconds=None,
        step_seconds=None,
        mfu=None,
        compile_seconds=seconds,
        out_of_memory=first,
        usable_hbm_bytes=usable,
    )


def device_bytes(memory) -> int:
    """The step's device memory: XLA's peak where it reports one, else arguments + outputs
    not aliased to a donated argument + temporaries, plus the program itself."""
    peak = int(getattr(memory, "peak_memory_in_bytes", 0) or 0)
    summed = (
        memory.argument_size_in_bytes
        + memory.output_size_in_bytes
        - memory.alias_size_in_bytes
        + memory.temp_size_in_bytes
    )
    return int(max(peak, summed) + memory.generated_code_size_in_bytes)
