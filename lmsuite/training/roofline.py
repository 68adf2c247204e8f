"""A per-op roofline of a compiled train step: each op's time is the slowest of its three
units, and the step is their sum.

`aot.py`'s first projection takes max(FLOPs / peak, bytes / bandwidth) over the whole step. It
lets matmul-bound and memory-bound ops hide each other, leaves out the vector unit (a dropout
mask's random bits are integer work on the VPU, not matmuls), and counts traffic to on-chip
memory as HBM traffic. This module reads the optimised HLO instead (`hlo_text.py`) and, for
each op the TPU runs (a fusion, a copy, a collective, a custom call), takes

    seconds = max(MXU FLOPs / MXU peak, HBM bytes / HBM bandwidth, VPU ops / VPU rate)
    (collectives: bytes moved / ICI bandwidth)

and sums them, ops in a loop body times the loop's trip count. Asynchronous copies (the
compiler's prefetches to on-chip memory and evictions, `copy-start`) run on DMA engines beside
the computation: their HBM time is charged only where it exceeds the HBM time the synchronous
ops leave idle (an MXU-bound matmul leaves most of it). Otherwise ops do not overlap
(collectives are summed, which errs slow), and the three units inside one op overlap perfectly
(which errs fast); both projections are estimates, this one the closer to what a profile shows.

What each term counts:
  MXU FLOPs   2 x multiply-adds of every dot and convolution, padding excluded (XLA's own rule).
  HBM bytes   the op's operands and results that live in HBM (memory space 0), as the layout
              stores them (tiles padded); a slice of a parameter counts the slice, an in-place
              update counts the update. Operands the compiler prefetched to on-chip memory are
              charged to the prefetch (copy-start), which moves them from HBM once.
  VPU ops     one per result element of every elementwise, compare, select, convert and
              reduction (per input element) instruction inside the op; data movement
              (broadcast, reshape, transpose, slice, bitcast, copy) is not counted.

Each op is put in one class, from what JAX named it (`op_name`): rng (random bits: threefry's
integer ops or RngBitGenerator), attention (scores, softmax and the weighted sum, not the
q/k/v/out projections), matmul (the other dots), optimizer (the update after the gradients),
collective, copy (asynchronous copies), other (norms, activations, embeddings, the loss).
"""

import collections
import dataclasses
import math
import re

import numpy as np

from lmsuite.training import accelerators
from lmsuite.training.hlo_text import Computation, Instruction, Module, parse, trip_count

CLASSES = ("matmul", "attention", "rng", "optimizer", "collective", "copy", "other")

# Instructions that move or relabel data without VPU arithmetic (or carry no data).
_NO_VECTOR_WORK = {
    "parameter", "constant", "bitcast", "broadcast", "reshape", "transpose", "slice",
    "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "tuple",
    "get-tuple-element", "copy", "copy-start", "slice-start", "reverse", "gather", "scatter",
    "iota", "custom-call",
    "after-all", "partition-id", "replica-id", "bitcast-convert", "opt-barrier",
    "convolution", "dot", "fusion", "while", "call", "conditional",
}  # fmt: skip
# Top-level instructions that are bookkeeping, not work on the chip.
_FREE = {
    "parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
    "partition-id", "replica-id", "opt-barrier", "copy-done", "slice-done", "all-reduce-done",
    "all-gather-done", "collective-permute-done", "async-done", "async-update",
    "send-done", "recv-done",
}  # fmt: skip
_COLLECTIVES = {
    "all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter",
    "all-to-all", "collective-permute", "collective-permute-start", "ragged-all-to-all",
}  # fmt: skip
# Copies the compiler issues asynchronously (prefetches to on-chip memory, evictions, slices):
# DMA engines run them while the cores compute.
_ASYNC_COPIES = {"copy-start", "slice-start"}
# JAX's random functions as they appear in op_name (threefry is inlined under them).
_RNG_NAMES = re.compile(r"jit\(_bernoulli\)|jit\(_uniform\)|threefry|random_bits|rng_bit_generator")
_PROJECTIONS = re.compile(
    r"/attention/(query|key|value|out)/|/cross_attention/(query|key|value|out)/"
)


@dataclasses.dataclass(frozen=True)
class Rates:
    """One device's peaks (a chip on v4/v5e/v5p, a TensorCore on v3)."""

    mxu_flops: float  # bf16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    vpu_ops: float  # 32-bit elementwise ops/s
    ici_bandwidth: float  # bytes/s a ring along one axis moves (both directions of a link)


def rates_for(generation: accelerators.Generation) -> Rates:
    """The rates of a TPU generation. MXU peak and HBM bandwidth are Google's published figures
    (`accelerators.py`). The VPU has 8 x 128 lanes of ALUs per TensorCore, 2 ALUs per lane on
    v3/v4 and 4 on v5 ("How to Scale Your Model", ch. 2 appendix C); its clock follows from the
    bf16 peak and the MXUs (each 128 x 128, 2 FLOPs per cell per cycle: 2 MXUs per TensorCore on
    v3, 4 on v4/v5). ICI: one link's one-way bandwidth (same source: v3 1e11, v4 4.5e10, v5e
    5e10, v5p 1e11 bytes/s), doubled for a bidirectional ring."""
    mxus, alus, link = {
        "v3": (2, 2, 1e11),
        "v4": (4, 2, 4.5e10),
        "v5litepod": (4, 4, 5e10),
        "v5p": (4, 4, 1e11),
    }[generation.name]
    cores = 2 if generation.chip_config == "megacore" else 1
    clock = generation.peak_flops / (cores * mxus * 128 * 128 * 2)
    return Rates(
        mxu_flops=generation.peak_flops,
        hbm_bandwidth=generation.hbm_bandwidth,
        vpu_ops=cores * 8 * 128 * alus * clock,
        ici_bandwidth=2 * link,
    )


@dataclasses.dataclass(frozen=True)
class OpCost:
    """One op the chip runs, its work and projected time, `trips` times per step."""

    name: str
    opcode: str
    op_class: str
    op_name: str
    flops: float
    hbm_bytes: float
    vector_ops: float
    ici_bytes: float
    trips: int
    seconds: float  # for all trips
    bound: str  # which unit sets the time: mxu, hbm, vpu, ici


@dataclasses.dataclass(frozen=True)
class Roofline:
    """The per-op projection of one device's step."""

    ops: tuple[OpCost, ...]
    rates: Rates

    @property
    def hbm_idle_seconds(self) -> float:
        """Time inside the synchronous ops when HBM is not their bottleneck (an MXU- or
        VPU-bound op leaves it idle): what asynchronous copies can use unseen."""
        return sum(
            op.seconds - op.hbm_bytes * op.trips / self.rates.hbm_bandwidth
            for op in self.ops
            if op.op_class != "copy"
        )

    @property
    def exposed_copy_fraction(self) -> float:
        """The share of the asynchronous copies' HBM time that the step waits for."""
        copies = sum(op.seconds for op in self.ops if op.op_class == "copy")
        if not copies:
            return 0.0
        return max(0.0, copies - self.hbm_idle_seconds) / copies

    @property
    def seconds(self) -> float:
        """The synchronous ops' sum plus the copies' time that no idle HBM time hides."""
        exposed = self.exposed_copy_fraction
        return sum(op.seconds * (exposed if op.op_class == "copy" else 1.0) for op in self.ops)

    def by_class(self) -> dict[str, dict[str, float]]:
        """Per class: seconds (copies: only the exposed part), FLOPs, HBM bytes, VPU ops, ICI
        bytes (all trips)."""
        out = {c: collections.Counter() for c in CLASSES}
        exposed = self.exposed_copy_fraction
        for op in self.ops:
            row = out[op.op_class]
            row["seconds"] += op.seconds * (exposed if op.op_class == "copy" else 1.0)
            row["flops"] += op.flops * op.trips
            row["hbm_bytes"] += op.hbm_bytes * op.trips
            row["vector_ops"] += op.vector_ops * op.trips
            row["ici_bytes"] += op.ici_bytes * op.trips
        return {c: dict(v) for c, v in out.items()}


def project(hlo_text: str, rates: Rates) -> Roofline:
    """The per-op roofline of a compiled module's text (`compiled.as_text()`)."""
    module = parse(hlo_text)
    ops: list[OpCost] = []
    _walk(module, module.entry, 1, rates, ops)
    return Roofline(tuple(ops), rates)


def _walk(module: Module, computation: Computation, trips: int, rates: Rates, ops: list):
    for inst in computation.instructions:
        if inst.opcode in _FREE:
            continue
        if inst.opcode == "while":
            count = trip_count(module, computation, inst)
            body = inst.attribute("body")
            _walk(module, module.computations[body.lstrip("%")], trips * count, rates, ops)
            continue
        if inst.opcode in ("call", "conditional"):  # conditionals: every branch, an upper bound
            for name in inst.called():
                _walk(module, module.computations[name], trips, rates, ops)
            continue
        ops.append(_cost(module, computation, inst, trips, rates))


def _cost(module, computation, inst: Instruction, trips: int, rates: Rates) -> OpCost:
    flops = vector = ici = 0.0
    body = None
    if inst.opcode == "fusion" or inst.opcode.startswith("async-start"):
        names = inst.called()
        body = module.computations[names[0]] if names else None
    if inst.opcode in _COLLECTIVES or (body is not None and body.root.opcode in _COLLECTIVES):
        ici = _collective_bytes(computation, inst)
        hbm = 0.0
        op_class = "collective"
    else:
        hbm = _hbm_bytes(computation, inst, body)
        if body is not None:
            flops, vector, rng_vector = _fused_work(module, body)
        else:
            flops = _matmul_flops(inst, computation)
            vector = 0.0 if inst.opcode in _NO_VECTOR_WORK else _vector_ops(inst, computation)
            rng_vector = vector if _RNG_NAMES.search(inst.op_name) else 0.0
        if inst.opcode == "custom-call":
            flops, vector = _kernel_work(inst, computation)
        op_class = _classify(inst, flops, vector, rng_vector)
    times = {
        "mxu": flops / rates.mxu_flops,
        "hbm": hbm / rates.hbm_bandwidth,
        "vpu": vector / rates.vpu_ops,
        "ici": ici / rates.ici_bandwidth,
    }
    bound = max(times, key=times.get)
    return OpCost(
        name=inst.name,
        opcode=inst.opcode,
        op_class=op_class,
        op_name=inst.op_name,
        flops=flops,
        hbm_bytes=hbm,
        vector_ops=vector,
        ici_bytes=ici,
        trips=trips,
        seconds=times[bound] * trips,
        bound=bound,
    )


def _classify(inst: Instruction, flops: float, vector: float, rng_vector: float) -> str:
    name = inst.op_name
    if inst.opcode in _ASYNC_COPIES:
        return "copy"
    if rng_vector and rng_vector >= 0.5 * vector:
        return "rng"
    if inst.name.startswith(tuple(_SPLASH_MATMULS)):
        return "attention"
    if "/attention/" in name and not _PROJECTIONS.search(name):
        return "attention"
    if flops:
        return "matmul"
    if name and not re.search(r"jvp\(|transpose\(", name):
        return "optimizer"  # after the forward (jvp) and backward (transpose) passes
    return "other"


def _hbm_side(array) -> float:
    return array.bytes if array.memory_space == 0 else 0.0


def _hbm_bytes(computation: Computation, inst: Instruction, body: Computation | None) -> float:
    """HBM bytes the op reads and writes (see the module docstring)."""
    if inst.opcode in ("copy-start", "copy"):  # a prefetch or an eviction: one side on chip
        source = _operand_arrays(computation, inst.operands[0])
        # copy-start's result is (destination, source, context): the destination is written
        result = inst.shape[:1]
        return sum(map(_hbm_side, source)) + sum(map(_hbm_side, result))
    if inst.opcode == "slice-start":  # an asynchronous slice: (operand), slice, context
        source = _operand_arrays(computation, inst.operands[0])
        piece = inst.shape[-2]
        return (piece.bytes if source and source[0].memory_space == 0 else 0.0) + _hbm_side(piece)
    if body is None:
        reads = sum(sum(map(_hbm_side, _operand_arrays(computation, o))) for o in inst.operands)
        return reads + sum(map(_hbm_side, inst.shape))
    reads = 0.0
    in_place = set()
    for position, operand in enumerate(inst.operands):
        param = _parameter(body, position)
        arrays = _operand_arrays(computation, operand)
        users = [i for i in body.instructions if param is not None and param.name in i.operands]
        if users and all(
            u.opcode == "dynamic-slice" and u.operands[0] == param.name for u in users
        ):
            reads += sum(_hbm_side(a) * _fraction(u, arrays) for u in users for a in arrays)
        elif users and all(
            u.opcode == "dynamic-update-slice" and u.operands[0] == param.name for u in users
        ):
            in_place.add(param.name)  # the buffer updated in place: only the update moves
        else:
            reads += sum(map(_hbm_side, arrays))
    writes = 0.0
    roots = _root_values(body)
    for array, root in zip(inst.shape, roots, strict=False):
        if root is not None and root.opcode == "dynamic-update-slice":
            update = body.by_name.get(root.operands[1])
            share = update.shape[0].elements / max(1, root.shape[0].elements) if update else 1
            writes += _hbm_side(array) * share
        else:
            writes += _hbm_side(array)
    return reads + writes


def _fraction(user: Instruction, arrays) -> float:
    whole = sum(a.elements for a in arrays) or 1
    return user.shape[0].elements / whole


def _root_values(body: Computation) -> list[Instruction | None]:
    root = body.root
    if root.opcode == "tuple":
        return [body.by_name.get(o) for o in root.operands]
    return [root]


def _parameter(body: Computation, position: int) -> Instruction | None:
    return next((i for i in body.instructions if i.parameter_number == position), None)


def _operand_arrays(computation: Computation, name: str):
    source = computation.by_name.get(name)
    return source.shape if source is not None else ()


def _fused_work(module: Module, body: Computation) -> tuple[float, float, float]:
    """(MXU FLOPs, VPU ops, VPU ops of random-bit generation) inside a fused computation, the
    fusions nested in it included."""
    flops = vector = rng = 0.0
    for inst in body.instructions:
        if inst.opcode == "fusion":
            inner = _fused_work(module, module.computations[inst.called()[0]])
            flops, vector, rng = flops + inner[0], vector + inner[1], rng + inner[2]
            continue
        flops += _matmul_flops(inst, body)
        if inst.opcode in _NO_VECTOR_WORK:
            continue
        ops = _vector_ops(inst, body)
        vector += ops
        if _RNG_NAMES.search(inst.op_name) or inst.opcode == "rng-bit-generator":
            rng += ops
    return flops, vector, rng


def _vector_ops(inst: Instruction, computation: Computation) -> float:
    if inst.opcode in ("reduce", "reduce-window"):
        first = _operand_arrays(computation, inst.operands[0])
        return float(first[0].padded_elements) if first else 0.0
    return float(sum(a.padded_elements for a in inst.shape))


def _matmul_flops(inst: Instruction, computation: Computation) -> float:
    if inst.opcode == "dot":
        lhs = _operand_arrays(computation, inst.operands[0])
        contracting = inst.attribute("lhs_contracting_dims") or ""
        size = math.prod(lhs[0].dims[int(d)] for d in contracting.split(",") if d.strip())
        return 2.0 * inst.shape[0].elements * size
    if inst.opcode == "convolution":
        return _convolution_flops(inst, computation)
    return 0.0


def _convolution_flops(inst: Instruction, computation: Computation) -> float:
    """2 x the multiply-adds that touch real (not padding) input, as XLA counts them."""
    labels = inst.attribute("dim_labels")
    lhs_labels, rhs_labels_out = labels.split("_")
    rhs_labels, out_labels = rhs_labels_out.split("->")
    lhs = _operand_arrays(computation, inst.operands[0])[0]
    rhs = _operand_arrays(computation, inst.operands[1])[0]
    out = inst.shape[0]
    spatial = sorted(c for c in out_labels if c.isdigit())
    window = _window(inst.attribute("window") or "", len(spatial))
    pairs = 1
    for k, digit in enumerate(spatial):
        in_size = lhs.dims[lhs_labels.index(digit)]
        out_size = out.dims[out_labels.index(digit)]
        size = rhs.dims[rhs_labels.index(digit)]
        w = window[k]
        o = np.arange(out_size)[:, None]
        j = np.arange(size)[None, :]
        position = o * w["stride"] + j * w["rhs_dilate"] - w["pad_low"]
        valid = (position >= 0) & (position % w["lhs_dilate"] == 0)
        valid &= position // w["lhs_dilate"] < in_size
        pairs *= int(valid.sum())
    batch = out.dims[out_labels.index("b")]
    features = out.dims[out_labels.index("f")]
    inputs = rhs.dims[rhs_labels.index("i")]
    return 2.0 * batch * features * pairs * inputs


def _window(text: str, rank: int) -> list[dict]:
    out = [dict(stride=1, pad_low=0, lhs_dilate=1, rhs_dilate=1) for _ in range(rank)]
    fields = dict(re.findall(r"(\w+)=([\w\-x]+)", text))
    for key, name in (
        ("stride", "stride"),
        ("lhs_dilate", "lhs_dilate"),
        ("rhs_dilate", "rhs_dilate"),
    ):
        if key in fields:
            for k, v in enumerate(fields[key].split("x")):
                out[k][name] = int(v)
    if "pad" in fields:
        for k, v in enumerate(fields["pad"].split("x")):
            out[k]["pad_low"] = int(v.split("_")[0])
    return out


# Splash attention's kernels: (B, H, L, M, K)-sized matmuls each runs (the forward: scores and
# the weighted sum; dq: scores again, dO.V^T, dS.K; dkv: scores, dO.V^T, dS^T.Q, P^T.dO).
_SPLASH_MATMULS = {"splash_mha_fwd": 2, "splash_mha_dq": 3, "splash_mha_dkv": 4}
# VPU ops per score a kernel spends: the segment mask, the running max, subtract, exp, the
# row sums and rescaling (forward), or exp of the recomputed scores and dS = P (dP - D)
# (backward). An estimate from the kernels' source, not a count.
SPLASH_VECTOR_OPS_PER_SCORE = 6


def _kernel_work(inst: Instruction, computation: Computation) -> tuple[float, float]:
    """(MXU FLOPs, VPU ops) of a custom call: a Pallas kernel's own estimate
    (`pl.CostEstimate`) when it gave one, splash attention's from its shapes (every block
    counted: a causal mask's skipped blocks make it an upper bound), else (0, 0)."""
    found = re.search(r'\\?"flops\\?"\s*:\s*\\?"?(\d+)', inst.attributes)
    if found:
        return float(found[1]), 0.0
    kind = next((k for k in _SPLASH_MATMULS if inst.name.startswith(k)), None)
    if kind is None:
        return 0.0, 0.0
    arrays = [
        a
        for name in inst.operands
        for a in _operand_arrays(computation, name)
        if a.dtype in ("f32", "bf16", "f16") and len(a.dims) >= 3
    ]
    if len(arrays) < 2:
        return 0.0, 0.0
    q, k = arrays[0], arrays[1]
    *lead, length, width = q.dims
    scores = math.prod(lead) * length * k.dims[-2]
    return 2.0 * _SPLASH_MATMULS[kind] * scores * width, float(SPLASH_VECTOR_OPS_PER_SCORE * scores)


def _collective_bytes(computation: Computation, inst: Instruction) -> float:
    """Bytes one device sends around its ring: 2 (n-1)/n of the buffer for an all-reduce,
    (n-1)/n of the gathered (or scattered) buffer otherwise."""
    groups = inst.attribute("replica_groups") or ""
    size = _group_size(groups)
    if size <= 1:
        return 0.0
    data = sum(a.elements * (a.bytes / max(1, a.padded_elements)) for a in inst.shape)
    if inst.opcode.startswith("all-reduce"):
        return 2.0 * data * (size - 1) / size
    return data * (size - 1) / size


def _group_size(groups: str) -> int:
    """Devices per replica group: `{{0,1},{2,3}}` -> 2, `[4,2]<=[8]` -> 2, mesh[...] {'data'}
    -> the data axis."""
    found = re.search(r"\{\{([\d,]+)\}", "{" + groups + "}")
    if found:
        return len(found[1].split(","))
    found = re.match(r"\[(\d+),(\d+)\]", groups)
    if found:
        return int(found[2])
    axes = dict((k, int(v)) for k, v in re.findall(r"'(\w+)'=(\d+)", groups))
    used = re.findall(r"'(\w+)'", groups.split("]")[-1])
    return math.prod(axes[a] for a in used if a in axes) if used else 1
