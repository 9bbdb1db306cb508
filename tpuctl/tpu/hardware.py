"""Facts about each TPU generation, as named constants with their source.

Pure data: no I/O. Sources are the Cloud TPU docs (per-generation pages, "types and topologies"), the
accelerator tables of MaxText/xpk, and libtpu itself (``jax.experimental.topologies``), which the test
suite uses as the oracle for everything derived from this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Triple = tuple[int, int, int]

WrapRule = Literal["cube", "full_axis"]


@dataclass(frozen=True, kw_only=True)
class Generation:
    """One TPU generation and the hardware facts tpuctl derives slices from."""

    name: str
    """Canonical name used in specs and output: v2, v3, v4, v5e, v5p, v6e, 7x."""
    type_prefix: str
    """Accelerator type prefix, as in ``<prefix>-N`` (``v5litepod``, ``tpu7x``, ...)."""
    aliases: tuple[str, ...]
    """Other spellings accepted for the generation or the type prefix."""
    ndims: int
    """Chip-grid dimensionality: 2 (v2, v3, v5e, v6e) or 3 (v4, v5p, 7x)."""
    cores_per_chip: int
    """TensorCores per chip."""
    type_counts: Literal["cores", "chips"]
    """What N counts in ``<prefix>-N``: TensorCores, or chips (v5e and v6e have one core per chip)."""
    device_kinds: tuple[str, ...]
    """``device_kind`` strings; the first is what a TPU VM reports, the others are also seen."""
    megacore: bool
    """Whether the two TensorCores of a chip form one device (v4, v5p) by default."""
    megacore_optional: bool
    """Whether a slice may switch megacore off (v4 ``chip_config_name="default"``: 2 devices per chip).
    libtpu 0.0.52 builds v5p as megacore whatever it is asked, so v5p is not optional here."""
    libtpu_name: str
    """Topology-name prefix libtpu understands (``v5`` is v5p)."""
    pod: Triple
    """The full pod's chip grid (z = 1 for 2D generations)."""
    pod_chips: int
    """Largest slice in chips (not always prod(pod): v5p schedules up to 8960 chips)."""
    wrap_rule: WrapRule
    """``cube``: every axis wraps iff every dim >= 4 (one 4x4x4 cube or more); ``full_axis``: an axis wraps
    iff the slice spans the whole pod along it."""

    @property
    def all_names(self) -> tuple[str, ...]:
        return (self.name, self.type_prefix, *self.aliases)


# v2/v3: 4-chip hosts (2x2), 2 cores per chip; 2D torus pods of 16x16 (v2-512) and 32x32 (v3-2048).
# Per-slice wraparound is not documented for v2/v3; a slice spanning the full pod axis is taken to close
# the torus along it (inference, same rule as v5e/v6e).
V2 = Generation(
    name="v2",
    type_prefix="v2",
    aliases=(),
    ndims=2,
    cores_per_chip=2,
    type_counts="cores",
    device_kinds=("TPU v2",),
    megacore=False,
    megacore_optional=False,
    libtpu_name="v2",
    pod=(16, 16, 1),
    pod_chips=256,
    wrap_rule="full_axis",
)
V3 = Generation(
    name="v3",
    type_prefix="v3",
    aliases=(),
    ndims=2,
    cores_per_chip=2,
    type_counts="cores",
    device_kinds=("TPU v3",),
    megacore=False,
    megacore_optional=False,
    libtpu_name="v3",
    pod=(32, 32, 1),
    pod_chips=1024,
    wrap_rule="full_axis",
)
# v4: 2 TensorCores per chip joined as one megacore device by default; 4096-chip pod of 4x4x4 cubes.
V4 = Generation(
    name="v4",
    type_prefix="v4",
    aliases=(),
    ndims=3,
    cores_per_chip=2,
    type_counts="cores",
    device_kinds=("TPU v4",),
    megacore=True,
    megacore_optional=True,
    libtpu_name="v4",
    pod=(16, 16, 16),
    pod_chips=4096,
    wrap_rule="cube",
)
# v5e ("v5litepod"): 1 core per chip, 256-chip 2D pod; wraps only along a full 16-chip axis.
V5E = Generation(
    name="v5e",
    type_prefix="v5litepod",
    aliases=("v5lite", "v5e"),
    ndims=2,
    cores_per_chip=1,
    type_counts="chips",
    device_kinds=("TPU v5 lite", "TPU v5e"),
    megacore=False,
    megacore_optional=False,
    libtpu_name="v5e",
    pod=(16, 16, 1),
    pod_chips=256,
    wrap_rule="full_axis",
)
# v5p: TPU VMs report "TPU v5", Pathways reports "TPU v5p"; 8960-chip pod (16x20x28).
V5P = Generation(
    name="v5p",
    type_prefix="v5p",
    aliases=(),
    ndims=3,
    cores_per_chip=2,
    type_counts="cores",
    device_kinds=("TPU v5", "TPU v5p"),
    megacore=True,
    megacore_optional=False,
    libtpu_name="v5",
    pod=(16, 20, 28),
    pod_chips=8960,
    wrap_rule="cube",
)
# v6e (Trillium): like v5e.
V6E = Generation(
    name="v6e",
    type_prefix="v6e",
    aliases=(),
    ndims=2,
    cores_per_chip=1,
    type_counts="chips",
    device_kinds=("TPU v6 lite",),
    megacore=False,
    megacore_optional=False,
    libtpu_name="v6e",
    pod=(16, 16, 1),
    pod_chips=256,
    wrap_rule="full_axis",
)
# 7x (Ironwood): 2 devices per chip (no megacore); 9216-chip pod, e.g. 16x24x24.
V7X = Generation(
    name="7x",
    type_prefix="tpu7x",
    aliases=("v7x", "v7", "ironwood"),
    ndims=3,
    cores_per_chip=2,
    type_counts="cores",
    device_kinds=("TPU7x", "TPU7"),
    megacore=False,
    megacore_optional=False,
    libtpu_name="tpu7x",
    pod=(16, 24, 24),
    pod_chips=9216,
    wrap_rule="cube",
)

GENERATIONS: tuple[Generation, ...] = (V2, V3, V4, V5E, V5P, V6E, V7X)

# Cube side of the OCS-connected 3D generations: slices of at least one cube have wraparound links.
CUBE_SIDE = 4

# Chips per host block (x, y, z).
HOST_BLOCK_4: Triple = (2, 2, 1)
HOST_BLOCK_8: Triple = (2, 4, 1)  # 8-chip v5e/v6e hosts (ct5lp-hightpu-8t, ct6e-standard-8t)
HOST_BLOCK_1: Triple = (1, 1, 1)

# Multislice device ids as libtpu numbers them: 100000 * (slice + 1) + id within the slice.
MULTISLICE_ID_STRIDE = 100_000

# v2/v3 accelerator types and their chip grids (pytorch/xla host-bounds table x 2x2 chips per host).
V2V3_TOPOLOGIES: dict[int, Triple] = {
    8: (2, 2, 1),
    32: (4, 4, 1),
    64: (4, 8, 1),
    128: (8, 8, 1),
    256: (8, 16, 1),
    512: (16, 16, 1),
    1024: (16, 32, 1),
    2048: (32, 32, 1),
}
V2_TYPES = (8, 32, 128, 256, 512)
V3_TYPES = (8, 32, 64, 128, 256, 512, 1024, 2048)

# v5e/v6e: N = chips; the documented shapes.
LITE_TOPOLOGIES: dict[int, Triple] = {
    1: (1, 1, 1),
    4: (2, 2, 1),
    8: (2, 4, 1),
    16: (4, 4, 1),
    32: (4, 8, 1),
    64: (8, 8, 1),
    128: (8, 16, 1),
    256: (16, 16, 1),
}

# 3D generations below one cube: chips -> topology (MaxText/xpk tables).
SUB_CUBE_TOPOLOGIES: dict[int, Triple] = {
    4: (2, 2, 1),
    8: (2, 2, 2),
    16: (2, 2, 4),
    32: (2, 4, 4),
}
SINGLE_CHIP: Triple = (1, 1, 1)  # tpu7x-2 (tpu7x-standard-1t)


def find_generation(name: str) -> Generation | None:
    """The generation called ``name`` (canonical name, type prefix or alias), case-insensitive."""
    key = name.strip().lower()
    for gen in GENERATIONS:
        if key in gen.all_names:
            return gen
    return None
