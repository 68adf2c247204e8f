"""Cloud TPU slices by name: their chip layout for compiling, and each device's HBM and peaks.

`lmsuite compile` builds a slice's devices on a CPU host from libtpu's topology description
(`jax.experimental.topologies`), so a run is sized before a TPU is rented. A JAX device is a
chip on v4, v5e and v5p (v4 and v5p run their two TensorCores as one "megacore") and a
TensorCore on v3, which is why v3 figures are per core.

The accelerator names are the ones `gcloud compute tpus tpu-vm create --accelerator-type`
takes: v3-N and v4-N / v5p-N count TensorCores (two per chip), v5litepod-N counts chips.

  >>> slice_ = get("v4-32")
  >>> slice_.topology_name, slice_.num_devices, slice_.hbm_bytes / 2**30
  ('v4:2x2x4', 16, 32.0)
"""

import dataclasses
import re

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Generation:
    """One TPU generation's figures per JAX device (Google's published per-chip figures;
    halved on v3, whose device is one of the chip's two cores)."""

    name: str  # as in the accelerator type: v3, v4, v5litepod, v5p
    libtpu_name: str  # the prefix of libtpu's topology names
    device_kind: str
    hbm_bytes: int
    peak_flops: float  # bf16 matmul FLOP/s; XLA runs float32 matmuls as bf16 passes by default
    hbm_bandwidth: float  # bytes/s
    chip_config: str  # "megacore" (one device per chip) or "default"
    devices_per_chip: int
    cores_in_name: bool  # v3-8 counts 8 cores (4 chips); v5litepod-8 counts 8 chips
    chip_layouts: dict[int, tuple[int, ...]]  # chips -> the slice's chip grid


_LAYOUTS_3D = {
    4: (2, 2, 1),
    8: (2, 2, 2),
    16: (2, 2, 4),
    32: (2, 4, 4),
    64: (4, 4, 4),
    128: (4, 4, 8),
    256: (4, 8, 8),
    512: (8, 8, 8),
    1024: (8, 8, 16),
    2048: (8, 16, 16),
}
_LAYOUTS_2D = {
    1: (1, 1),
    4: (2, 2),
    8: (2, 4),
    16: (4, 4),
    32: (4, 8),
    64: (8, 8),
    128: (8, 16),
    256: (16, 16),
    512: (16, 32),
    1024: (32, 32),
}

GENERATIONS = {
    g.name: g
    for g in (
        Generation(
            "v3", "v3", "TPU v3", 16 * GIB, 123e12 / 2, 900e9 / 2, "default", 2, True,
            {c: s for c, s in _LAYOUTS_2D.items() if c >= 4 and c != 8},  # no v3-16
        ),
        Generation(
            "v4", "v4", "TPU v4", 32 * GIB, 275e12, 1200e9, "megacore", 1, True, _LAYOUTS_3D
        ),
        Generation(
            "v5litepod", "v5e", "TPU v5 lite", 16 * GIB, 197e12, 819e9, "default", 1, False,
            {c: s for c, s in _LAYOUTS_2D.items() if c <= 256},
        ),
        Generation(
            "v5p", "v5", "TPU v5", 95 * GIB, 459e12, 2765e9, "megacore", 1, True, _LAYOUTS_3D
        ),
    )
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Slice:
    """A named TPU slice (e.g. v4-32): its generation, chip grid and device count."""

    name: str
    generation: Generation
    chips: tuple[int, ...]

    @property
    def num_chips(self) -> int:
        n = 1
        for d in self.chips:
            n *= d
        return n

    @property
    def num_devices(self) -> int:
        return self.num_chips * self.generation.devices_per_chip

    @property
    def num_hosts(self) -> int:
        """Hosts of the slice: each drives up to 4 chips (v5e single-host slices up to 8)."""
        per_host = 8 if self.generation.name == "v5litepod" and self.num_chips <= 8 else 4
        return max(1, self.num_chips // per_host)

    @property
    def topology_name(self) -> str:
        return f"{self.generation.libtpu_name}:{'x'.join(map(str, self.chips))}"

    @property
    def hbm_bytes(self) -> int:
        return self.generation.hbm_bytes

    def topology_kwargs(self) -> dict:
        """Keyword arguments of `jax.experimental.topologies.get_topology_desc`: full tori
        (every dimension of 4 chips or more) wrap around, as the slices' ICI does."""
        dims = len(self.chips)
        name = self.generation.name
        if name in ("v4", "v5p"):  # 4x4x4 and larger are tori
            wrap = (min(self.chips) >= 4,) * dims
        elif name == "v5litepod":  # 16x16 wraps both ways, 8x16 along its 16
            wrap = tuple(c >= 16 for c in self.chips)
        else:  # v3: only the full 32x32 pod is a torus
            wrap = (self.chips == (32, 32),) * dims
        return dict(
            chip_config_name=self.generation.chip_config,
            chips_per_host_bounds=(2, 2, 1),
            num_slices=1,
            wrap=wrap + (False,) * (3 - dims),
        )


def known_names() -> list[str]:
    """Every accelerator name `get` accepts, smallest first per generation."""
    out = []
    for g in GENERATIONS.values():
        per_chip = 2 if g.cores_in_name else 1
        out += [f"{g.name}-{chips * per_chip}" for chips in sorted(g.chip_layouts)]
    return out


def get(name: str) -> Slice:
    """The slice called `name` (v3-8, v4-32, v5litepod-16, v5p-8; "v5e-16" works too)."""
    match = re.fullmatch(r"(v3|v4|v5p|v5litepod|v5e)-(\d+)", name.strip())
    if match is None:
        raise ValueError(f"unknown TPU accelerator {name!r}; known: {', '.join(known_names())}")
    generation = GENERATIONS["v5litepod" if match[1] == "v5e" else match[1]]
    count = int(match[2])
    chips = count // 2 if generation.cores_in_name else count
    if (generation.cores_in_name and count % 2) or chips not in generation.chip_layouts:
        same = [n for n in known_names() if n.startswith(generation.name + "-")]
        raise ValueError(
            f"unknown TPU accelerator {name!r}: {generation.name} slices are {', '.join(same)}"
        )
    return Slice(name=name, generation=generation, chips=generation.chip_layouts[chips])
