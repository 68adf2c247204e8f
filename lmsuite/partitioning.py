"""Logical axis names, the default logical -> mesh rules, and `make_mesh`.

Every parameter is created with logical axis names (`nn.with_logical_partitioning`); activations
are constrained with `nn.with_logical_constraint` at block boundaries. This table is the one
place that maps those names onto the physical mesh axes `data`, `fsdp` and `tensor`.
"""

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis names used across lmsuite.
BATCH = "batch"
LENGTH = "length"
EMBED = "embed"  # the model width D and the factorized embedding width E
HEADS = "heads"
KV = "kv"  # per-head width K
# An inner width: the FFN's F, and the output side of square D -> D (or E -> D) projections,
# so that no kernel names the same mesh axis twice.
MLP = "mlp"
VOCAB = "vocab"
# Small tables that are never worth sharding: segment types, position tables, relative buckets.
TABLE = "table"
# The leading axis of a scanned stack's parameters (ModelConfig.scan_layers): one entry per layer,
# never sharded, since every device runs every layer.
LAYERS = "layers"

DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    (BATCH, ("data", "fsdp")),
    (LENGTH, None),
    (EMBED, "fsdp"),
    (HEADS, "tensor"),
    (KV, None),
    (MLP, "tensor"),
    (VOCAB, "tensor"),
    (TABLE, None),
    (LAYERS, None),
)


def make_mesh(
    *, data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """Builds a (data, fsdp, tensor) mesh over all devices of all processes.

    One of the sizes may be -1: it takes whatever the others leave.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(
            f"at most one mesh axis may be -1, got data={data}, fsdp={fsdp}, tensor={tensor}"
        )
    known = int(np.prod([s for s in sizes if s != -1]))
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(
            f"mesh sizes must be positive or -1, got data={data}, fsdp={fsdp}, tensor={tensor}"
        )
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(
                f"{len(devices)} devices cannot be split into fsdp*tensor*data "
                f"with fixed part {known}"
            )
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(
            f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} needs "
            f"{int(np.prod(sizes))} devices, but {len(devices)} are available"
        )
    grid = np.asarray(devices, dtype=object).reshape(sizes)
    return Mesh(grid, MESH_AXES)


Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]


def mesh_axes(logical: Sequence[str | None], *, rules: Rules = DEFAULT_RULES) -> PartitionSpec:
    """Maps logical axis names to a PartitionSpec over mesh axes.

    Example: ("batch", "length") -> PartitionSpec(("data", "fsdp"), None) with the default rules;
    ("embed", "embed") -> PartitionSpec("fsdp", None).
    """
    table = dict(rules)
    unknown = [name for name in logical if name is not None and name not in table]
    if unknown:
        raise ValueError(f"logical axis names {unknown} have no rule; rules cover {sorted(table)}")
    # A mesh axis can shard one dimension only: a later dimension that would reuse it stays
    # unsharded, e.g. a (embed, embed) kernel -> PartitionSpec("fsdp", None).
    used: set[str] = set()
    out = []
    for name in logical:
        axes = None if name is None else table[name]
        names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        if used.intersection(names):
            axes = None
        else:
            used.update(names)
        out.append(axes)
    return PartitionSpec(*out)


def named_sharding(
    mesh: Mesh, logical: Sequence[str | None], *, rules: Rules = DEFAULT_RULES
) -> NamedSharding:
    """A NamedSharding on `mesh` for an array whose dimensions carry these logical names."""
    return NamedSharding(mesh, mesh_axes(logical, rules=rules))


def tree_shardings(logical_specs, mesh: Mesh, *, rules: Rules = DEFAULT_RULES):
    """Maps a tree of logical PartitionSpecs (e.g. from `nn.get_partition_spec`) to shardings.

    Example: {"kernel": PartitionSpec("embed", "mlp")} -> {"kernel": NamedSharding(mesh,
    PartitionSpec("fsdp", "tensor"))}.
    """
    return jax.tree.map(
        lambda spec: named_sharding(mesh, tuple(spec), rules=rules),
        logical_specs,
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )


def check_divisible(abstract, shardings, *, what: str = "array") -> None:
    """Raises a ValueError listing every array dimension its mesh axes do not divide."""
    problems = []
    for (path, leaf), sharding in zip(
        jax.tree_util.tree_leaves_with_path(abstract), jax.tree.leaves(shardings), strict=True
    ):
        spec = tuple(sharding.spec) + (None,) * (len(leaf.shape) - len(sharding.spec))
        for dim, axes in zip(leaf.shape, spec, strict=False):
            if axes is None:
                continue
            axes = (axes,) if isinstance(axes, str) else axes
            size = int(np.prod([sharding.mesh.shape[a] for a in axes]))
            if dim % size:
                name = jax.tree_util.keystr(path)
                problems.append(
                    f"{what}{name} shape {leaf.shape}: {dim} not divisible by {axes}={size}"
                )
    if problems:
        raise ValueError(
            "mesh axes must divide the dimensions they shard:\n  " + "\n  ".join(problems)
        )
