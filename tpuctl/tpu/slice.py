"""A pure model of TPU slices: which chips, which hosts, and how the TPU runtime numbers the devices.

Everything here is a function of the slice's description; nothing reads the environment or a clock.
The numbering reproduces libtpu exactly (checked against ``jax.experimental.topologies`` in the tests):

* a chip sits at ``(x, y, z)``; a chip shows ``devices_per_chip`` devices, ``core`` 0 or 1;
* hosts are blocks of ``chips_per_host_bounds`` chips tiled over the slice, x fastest, then y, then z:
  ``task = hx + HX * (hy + HY * hz) + slice * hosts_per_slice``;
* the global device id is x-minor over the whole slice, core fastest:
  ``id = core + devices_per_chip * (x + X * (y + Y * z))`` (+ ``100000 * (slice + 1)`` in a multislice);
  so a host's ids are not contiguous (v5e 4x4: host 0 holds 0, 1, 4, 5);
* the runtime's device list is task-major, then z, y, x within the host, then core.

A *host* here is a task: one TPU process (libtpu's process, JAX's process index). Usually a machine runs
one, and its chips are the host block. A machine may run several (7x, a LeaderWorkerSet pod with two TPU
containers): then ``chips_per_host_bounds`` is one process's block (libtpu's ``TPU_CHIPS_PER_PROCESS_BOUNDS``,
the tasks tile the slice as ``TPU_PROCESS_BOUNDS``), and ``chips_per_machine_bounds`` the machine's
(``TPU_CHIPS_PER_HOST_BOUNDS``, machines tile it as ``TPU_HOST_BOUNDS``). libtpu numbers processes x
fastest over the process grid, as it numbers hosts (``get_topology_desc`` with a process block as its
``chips_per_host_bounds``: checked in the tests), so a machine's tasks are consecutive only when its block
spans whole rows of tasks: :func:`machine_problem` refuses any other split.

Example, ``v5litepod-16`` (4x4 chips, four 2x2 hosts)::

    y\\x  0  1 | 2  3
    0    0  1 | 2  3      task 0 | task 1
    1    4  5 | 6  7
    ----------+------
    2    8  9 |10 11      task 2 | task 3
    3   12 13 |14 15
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property

from tpuctl.errors import TopologyError
from tpuctl.messages import did_you_mean, suggestion
from tpuctl.tpu.hardware import (
    CUBE_SIDE,
    GENERATIONS,
    HOST_BLOCK_1,
    HOST_BLOCK_4,
    HOST_BLOCK_8,
    LITE_TOPOLOGIES,
    MULTISLICE_ID_STRIDE,
    SINGLE_CHIP,
    SUB_CUBE_TOPOLOGIES,
    V2,
    V2_TYPES,
    V2V3_TOPOLOGIES,
    V3,
    V3_TYPES,
    V7X,
    Generation,
    Triple,
    find_generation,
)


@dataclass(frozen=True)
class Device:
    """One device as the TPU runtime lists it."""

    id: int
    """Global device id (``jax.Device.id``)."""
    task: int
    """Process (host) index across all slices (``process_index``)."""
    slice: int
    """Slice index (0 unless multislice)."""
    coords: Triple
    """Chip coordinates (x, y, z) within the slice."""
    core: int
    """``core_on_chip``: 0, or 0/1 when a chip shows two devices."""
    ordinal: int
    """Local device ordinal: position among its task's devices in runtime order."""


@dataclass(frozen=True)
class TpuSlice:
    """A (multi)slice: generation, chip grid, host block, and the options that change numbering."""

    generation: Generation
    topology: Triple
    """Chips along x, y, z (z = 1 for 2D generations)."""
    chips_per_host_bounds: Triple
    num_slices: int = 1
    megacore: bool = False
    """Two TensorCores shown as one device (v4/v5p default)."""
    device_kind: str = ""
    """``device_kind`` string the devices report; defaults to the generation's TPU-VM naming."""
    chips_per_machine_bounds: Triple | None = None
    """Chips of one machine when it runs several tasks (a whole number of task blocks); None: one task per
    machine. Build it with :func:`with_blocks`, which checks it."""

    def __post_init__(self) -> None:
        if not self.device_kind:
            object.__setattr__(self, "device_kind", self.generation.device_kinds[0])
        if self.chips_per_machine_bounds == self.chips_per_host_bounds:
            object.__setattr__(self, "chips_per_machine_bounds", None)  # one spelling of "one task per machine"

    # --- sizes ---------------------------------------------------------------------------------

    @property
    def devices_per_chip(self) -> int:
        return 1 if self.megacore else self.generation.cores_per_chip

    @property
    def chips_per_slice(self) -> int:
        x, y, z = self.topology
        return x * y * z

    @property
    def chips_per_host(self) -> int:
        x, y, z = self.chips_per_host_bounds
        return x * y * z

    @property
    def host_bounds(self) -> Triple:
        """Hosts along x, y, z within one slice (``TPU_HOST_BOUNDS``)."""
        t, c = self.topology, self.chips_per_host_bounds
        return (t[0] // c[0], t[1] // c[1], t[2] // c[2])

    @property
    def hosts_per_slice(self) -> int:
        hx, hy, hz = self.host_bounds
        return hx * hy * hz

    @property
    def num_hosts(self) -> int:
        return self.hosts_per_slice * self.num_slices

    # --- machines (several tasks per machine) --------------------------------------------------

    @property
    def machine_block(self) -> Triple:
        """Chips of one machine (x, y, z): ``TPU_CHIPS_PER_HOST_BOUNDS``."""
        return self.chips_per_machine_bounds or self.chips_per_host_bounds

    @property
    def machine_bounds(self) -> Triple:
        """Machines along x, y, z within one slice: ``TPU_HOST_BOUNDS``."""
        t, m = self.topology, self.machine_block
        return (t[0] // m[0], t[1] // m[1], t[2] // m[2])

    @property
    def tasks_per_machine_bounds(self) -> Triple:
        """One machine's tasks along x, y, z (1, 1, 1 unless several tasks share a machine)."""
        m, c = self.machine_block, self.chips_per_host_bounds
        return (m[0] // c[0], m[1] // c[1], m[2] // c[2])

    @property
    def tasks_per_machine(self) -> int:
        x, y, z = self.tasks_per_machine_bounds
        return x * y * z

    @property
    def num_machines(self) -> int:
        x, y, z = self.machine_bounds
        return x * y * z * self.num_slices

    def _task_grid_position(self, task: int) -> tuple[int, Triple]:
        """(slice, position of the task in its slice's task grid)."""
        hx, hy, _ = self.host_bounds
        slice_index, local = divmod(task, self.hosts_per_slice)
        return slice_index, (local % hx, local // hx % hy, local // (hx * hy))

    def machine_of(self, task: int) -> int:
        """The machine (index over all slices, x fastest) that runs ``task``."""
        slice_index, (px, py, pz) = self._task_grid_position(task)
        tx, ty, tz = self.tasks_per_machine_bounds
        mx, my, mz = self.machine_bounds
        return px // tx + mx * (py // ty + my * (pz // tz)) + slice_index * mx * my * mz

    def rank_on_machine(self, task: int) -> int:
        """The task's position among its machine's tasks (torchrun's ``LOCAL_RANK``)."""
        _, (px, py, pz) = self._task_grid_position(task)
        tx, ty, tz = self.tasks_per_machine_bounds
        return px % tx + tx * (py % ty + ty * (pz % tz))

    def visible_chips(self, task: int) -> tuple[int, ...]:
        """The task's chips as its machine numbers them (``TPU_VISIBLE_CHIPS``): x fastest within the machine
        block, as torch_xla's one-chip-per-process start-up counts them (local rank r is chip r). Ascending."""
        mx, my, mz = self.machine_block
        coords = {d.coords for d in self.devices_of_task(task)}
        return tuple(sorted(x % mx + mx * (y % my + my * (z % mz)) for x, y, z in coords))

    @property
    def devices_per_host(self) -> int:
        return self.chips_per_host * self.devices_per_chip

    @property
    def devices_per_slice(self) -> int:
        return self.chips_per_slice * self.devices_per_chip

    @property
    def num_devices(self) -> int:
        return self.devices_per_slice * self.num_slices

    @property
    def tensorcores_per_slice(self) -> int:
        return self.chips_per_slice * self.generation.cores_per_chip

    # --- names ---------------------------------------------------------------------------------

    @property
    def accelerator_type(self) -> str:
        """``<prefix>-N`` as Cloud TPU names the slice (one slice of a multislice)."""
        gen = self.generation
        n = self.tensorcores_per_slice if gen.type_counts == "cores" else self.chips_per_slice
        return f"{gen.type_prefix}-{n}"

    @property
    def topology_str(self) -> str:
        """``AxBxC`` (``AxB`` for 2D generations), as ``TPU_TOPOLOGY`` spells it."""
        return format_dims(self.topology[: self.generation.ndims])

    @property
    def libtpu_topology_name(self) -> str:
        """The name ``jax.experimental.topologies.get_topology_desc`` takes for this slice."""
        return f"{self.generation.libtpu_name}:{self.topology_str}"

    # --- links ---------------------------------------------------------------------------------

    @property
    def wraparound(self) -> tuple[bool, bool, bool]:
        """Whether each axis closes into a ring through wraparound links."""
        gen = self.generation
        if gen.wrap_rule == "cube":
            full = all(d >= CUBE_SIDE for d in self.topology)
            return (full, full, full)
        # full_axis: an axis wraps only when it spans the whole pod (16 on v5e/v6e).
        x, y, _ = self.topology
        px, py, _ = gen.pod
        return (x == px and x > 1, y == py and y > 1, False)

    # --- devices -------------------------------------------------------------------------------

    def device_id(self, coords: Triple, core: int, slice_index: int = 0) -> int:
        x, y, z = coords
        nx, ny, _ = self.topology
        local = core + self.devices_per_chip * (x + nx * (y + ny * z))
        if self.num_slices > 1:
            return MULTISLICE_ID_STRIDE * (slice_index + 1) + local
        return local

    def task_of(self, coords: Triple, slice_index: int = 0) -> int:
        cx, cy, cz = self.chips_per_host_bounds
        hx, hy, _ = self.host_bounds
        x, y, z = coords
        return x // cx + hx * (y // cy + hy * (z // cz)) + slice_index * self.hosts_per_slice

    @cached_property
    def devices(self) -> tuple[Device, ...]:
        """Every device in the runtime's list order. O(N), computed once per slice."""
        out: list[Device] = []
        cx, cy, cz = self.chips_per_host_bounds
        hx_n, hy_n, hz_n = self.host_bounds
        dpc = self.devices_per_chip
        task = 0
        for s in range(self.num_slices):
            for hz in range(hz_n):
                for hy in range(hy_n):
                    for hx in range(hx_n):
                        ordinal = 0
                        for z in range(hz * cz, hz * cz + cz):
                            for y in range(hy * cy, hy * cy + cy):
                                for x in range(hx * cx, hx * cx + cx):
                                    for core in range(dpc):
                                        coords = (x, y, z)
                                        out.append(
                                            Device(self.device_id(coords, core, s), task, s, coords, core, ordinal)
                                        )
                                        ordinal += 1
                        task += 1
        return tuple(out)

    def devices_of_task(self, task: int) -> tuple[Device, ...]:
        if not 0 <= task < self.num_hosts:
            raise TopologyError(
                f"task {task} is not in this slice: {self.describe()} has tasks 0..{self.num_hosts - 1}"
            )
        per = self.devices_per_host
        return self.devices[task * per : (task + 1) * per]

    def describe(self) -> str:
        text = f"{self.accelerator_type} ({self.topology_str}, {self.num_hosts} hosts"
        if self.tasks_per_machine > 1:
            text += f" on {self.num_machines} machines"
        if self.num_slices > 1:
            text += f" in {self.num_slices} slices"
        return text + ")"


# --- parsing ---------------------------------------------------------------------------------------

_TYPE_RE = re.compile(r"^\s*([a-z0-9]+?)-(\d+)\s*$", re.IGNORECASE | re.ASCII)
_DIMS_RE = re.compile(r"^\s*\d+(\s*x\s*\d+){1,2}\s*$", re.IGNORECASE | re.ASCII)
_SPELLING_RE = re.compile(r"^\s*(.*?)[-_\s]*(\d+)\s*$", re.ASCII)
_WORDS_RE = re.compile(r"[-_\s]+")


def format_dims(dims: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in dims)


def parse_dims(text: str, ndims: int | None = None) -> Triple:
    """``"2x2x4"`` -> (2, 2, 4); ``"4x4"`` -> (4, 4, 1)."""
    if not _DIMS_RE.match(text):
        raise TopologyError(
            f"topology {text!r} is not of the form AxB or AxBxC", hint="write chip counts per axis, e.g. 2x2x4"
        )
    parts = tuple(int(p) for p in text.lower().replace(" ", "").split("x"))
    if ndims is not None and len(parts) != ndims and not (ndims == 2 and len(parts) == 3 and parts[2] == 1):
        raise TopologyError(
            f"topology {text!r} has {len(parts)} axes; this generation's slices have {ndims}",
            hint="v2, v3, v5e and v6e are 2D (AxB); v4, v5p and 7x are 3D (AxBxC)",
        )
    if any(p < 1 for p in parts):
        raise TopologyError(f"topology {text!r} has an axis of size 0")
    if len(parts) == 2:
        return (parts[0], parts[1], 1)
    return (parts[0], parts[1], parts[2])


def _cube_topology(chips: int) -> Triple | None:
    """Default chip grid of a slice of >= one cube: 4*(a, b, c), a <= b <= c, abc = chips/64,
    the smallest c (most cubic) and then the largest a. Reproduces every v4/v5p/7x entry of the
    MaxText/xpk tables (e.g. 320 chips -> 4x4x20, 4608 -> 12x16x24, 8960 -> 16x20x28)."""
    cube = CUBE_SIDE**3
    if chips % cube:
        return None
    k = chips // cube
    best: tuple[tuple[int, int], Triple] | None = None
    for a in range(1, k + 1):
        if k % a:
            continue
        for b in range(a, k // a + 1):
            if (k // a) % b:
                continue
            c = k // a // b
            if c < b:
                continue
            key = (c, -a)
            if best is None or key < best[0]:
                best = (key, (CUBE_SIDE * a, CUBE_SIDE * b, CUBE_SIDE * c))
    return best[1] if best else None


def _valid_counts(gen: Generation) -> list[int]:
    """Some valid N for ``<prefix>-N`` (every one for the small generations), for hints."""
    if gen is V2:
        return list(V2_TYPES)
    if gen is V3:
        return list(V3_TYPES)
    if gen.type_counts == "chips":
        return sorted(LITE_TOPOLOGIES)
    sub = sorted(SUB_CUBE_TOPOLOGIES) + ([1] if gen is V7X else [])
    cubes = [64 * k for k in range(1, gen.pod_chips // 64 + 1) if _cube_topology(64 * k)]
    return [c * gen.cores_per_chip for c in sorted(sub) + cubes]


def topology_for_type(gen: Generation, n: int) -> Triple | None:
    """Chip grid of ``<prefix>-n``, or None when the generation has no such type."""
    if gen is V2 or gen is V3:
        allowed = V2_TYPES if gen is V2 else V3_TYPES
        return V2V3_TOPOLOGIES[n] if n in allowed else None
    if gen.type_counts == "chips":
        return LITE_TOPOLOGIES.get(n)
    if n % gen.cores_per_chip:
        return None
    chips = n // gen.cores_per_chip
    if gen is V7X and chips == 1:
        return SINGLE_CHIP
    if chips in SUB_CUBE_TOPOLOGIES:
        return SUB_CUBE_TOPOLOGIES[chips]
    if chips > gen.pod_chips:
        return None
    return _cube_topology(chips)


def _closest(n: int, options: list[int]) -> int:
    return min(options, key=lambda o: (abs(o - n), o))


def known_type_names() -> list[str]:
    """A sample of valid accelerator type names (every small one), for "did you mean"."""
    names: list[str] = []
    for gen in GENERATIONS:
        names += [f"{gen.type_prefix}-{n}" for n in _valid_counts(gen)[:16]]
    return names


def _respelt(name: str) -> str | None:
    """The accelerator type ``name`` means when it names one generation in other words: ``tpu-v5e-16``,
    ``TPU v5e 16``, ``v5e_16`` -> ``v5litepod-16`` (the nearest valid N); None when no single generation
    is named. A letter-by-letter guess would answer ``tpu-v5e-16`` with ``tpu7x-16``."""
    spelt = _SPELLING_RE.match(name.lower())
    if spelt is None:
        return None
    words = [w for w in _WORDS_RE.split(spelt.group(1)) if w]
    named = {
        gen.name: gen for w in words for word in (w, w.removeprefix("tpu")) if (gen := find_generation(word)) is not None
    }
    if len(named) != 1:
        return None
    (gen,) = named.values()
    return f"{gen.type_prefix}-{_closest(int(spelt.group(2)), _valid_counts(gen))}"


def parse_accelerator_type(name: str) -> tuple[Generation, Triple]:
    """``"v4-32"`` -> (v4, (2, 2, 4)). Raises TopologyError with a "did you mean" hint."""
    match = _TYPE_RE.match(name)
    gen = find_generation(match.group(1)) if match else None
    if match is None or gen is None:
        prefixes = ", ".join(f"{g.type_prefix}-N" for g in GENERATIONS)
        respelt = _respelt(name)
        hint = (
            suggestion(respelt)
            if respelt is not None
            else did_you_mean(
                name.strip().lower(),
                known_type_names(),
                cutoff=0.5,
                otherwise=f"accelerator types look like {prefixes}",
            )
        )
        raise TopologyError(f"unknown accelerator type {name!r}", hint=hint)
    n = int(match.group(2))
    topology = topology_for_type(gen, n)
    if topology is None:
        counts = _valid_counts(gen)
        what = "TensorCores (2 per chip)" if gen.type_counts == "cores" else "chips"
        shown = ", ".join(str(c) for c in counts[:10]) + (", ..." if len(counts) > 10 else "")
        raise TopologyError(
            f"{name!r} is not a {gen.name} slice: N counts {what} and must be one of {shown}",
            hint=suggestion(f"{gen.type_prefix}-{_closest(n, counts)}"),
        )
    return gen, topology


def check_topology(gen: Generation, topology: Triple) -> None:
    """Refuse a chip grid the generation cannot have."""
    text = format_dims(topology[: gen.ndims])
    chips = topology[0] * topology[1] * topology[2]
    if gen.ndims == 2:
        if topology[2] != 1:
            raise TopologyError(f"{gen.name} slices are 2D; topology {format_dims(topology)} has a z axis")
        if gen is V2 or gen is V3:
            allowed = {V2V3_TOPOLOGIES[n] for n in (V2_TYPES if gen is V2 else V3_TYPES)}
        else:
            allowed = set(LITE_TOPOLOGIES.values())
        if topology not in allowed:
            shapes = ", ".join(format_dims(t[:2]) for t in sorted(allowed, key=lambda t: (t[0] * t[1], t)))
            raise TopologyError(f"{gen.name} has no {text} slice", hint=f"{gen.name} slice shapes are {shapes}")
        return
    # Below one cube only the listed shapes exist (2x2x1 is listed as is, not sorted); 1x1x1 only on 7x.
    sub_cube = set(SUB_CUBE_TOPOLOGIES.values()) | ({SINGLE_CHIP} if gen is V7X else set())
    if topology in sub_cube:
        return
    bad = [d for d in topology if d > CUBE_SIDE and d % CUBE_SIDE]
    if bad:
        raise TopologyError(
            f"{gen.name} topology {text}: every axis must be <= {CUBE_SIDE} or a multiple of {CUBE_SIDE}",
            hint=f"axis sizes {', '.join(map(str, bad))} are neither",
        )
    if list(topology) != sorted(topology):
        raise TopologyError(
            f"{gen.name} topology {text} is not in AxBxC order with A <= B <= C",
            hint=suggestion(format_dims(tuple(sorted(topology)))),
        )
    if chips > gen.pod_chips:
        raise TopologyError(
            f"{gen.name} topology {text} has {chips} chips; the largest {gen.name} slice has {gen.pod_chips}",
            hint="use a smaller slice, or num_slices for a multislice job",
        )
    if any(d > CUBE_SIDE for d in topology) and min(topology) < CUBE_SIDE:
        raise TopologyError(
            f"{gen.name} topology {text}: slices larger than one {CUBE_SIDE}x{CUBE_SIDE}x{CUBE_SIDE} cube "
            f"are whole cubes, so every axis must be a multiple of {CUBE_SIDE}"
        )
    if min(topology) < CUBE_SIDE:
        shapes = ", ".join(format_dims(t) for t in sorted(sub_cube, key=lambda t: (t[0] * t[1] * t[2], t)))
        raise TopologyError(
            f"{gen.name} has no {text} slice",
            hint=f"{gen.name} slices smaller than one {CUBE_SIDE}x{CUBE_SIDE}x{CUBE_SIDE} cube are {shapes}",
        )


def _default_host_block(gen: Generation, topology: Triple) -> Triple:
    chips = topology[0] * topology[1] * topology[2]
    if chips == 1:
        return HOST_BLOCK_1
    if gen.type_counts == "chips" and topology == (2, 4, 1):
        return HOST_BLOCK_8  # v5litepod-8 / v6e-8 is one 8-chip VM
    return HOST_BLOCK_4


def host_block_for(gen: Generation, topology: Triple, chips_per_host: int | None) -> Triple:
    """Chips per host (x, y, z) for ``chips_per_host`` chips, or the generation's default."""
    if chips_per_host is None:
        block = _default_host_block(gen, topology)
    elif chips_per_host == 1 and topology == (1, 1, 1):
        block = HOST_BLOCK_1
    elif chips_per_host == 4:
        block = HOST_BLOCK_4
    elif chips_per_host == 8 and gen.type_counts == "chips":
        block = HOST_BLOCK_8
    else:
        choices = "4 or 8" if gen.type_counts == "chips" else "4"
        raise TopologyError(
            f"{gen.name} hosts cannot have {chips_per_host} chips",
            hint=f"{gen.name} hosts have {choices} chips (1 only for a single-chip slice)",
        )
    if any(t % b for t, b in zip(topology, block, strict=True)):
        raise TopologyError(
            f"a {format_dims(block)} host block does not tile the {format_dims(topology)} chip grid",
            hint="use a slice that is a whole number of hosts, or another chips_per_host",
        )
    return block


# --- several tasks per machine ---------------------------------------------------------------------


def _dims(block: Triple) -> str:
    return ",".join(str(d) for d in block)


def machine_problem(topology: Triple, task_block: Triple, machine_block: Triple) -> str | None:
    """Why ``machine_block`` machines running ``task_block`` tasks cannot tile ``topology``, or None.

    The machine block tiles the chip grid, the task block divides the machine block on every axis, and a
    machine's tasks are consecutive in libtpu's process order (x fastest): a machine more than one task
    tall along y spans every task along x, one deeper along z spans every task along x and y.
    """
    if any(d < 1 for d in task_block + machine_block):
        return f"blocks {_dims(task_block)} and {_dims(machine_block)} must have every axis at least 1"
    if any(t % m for t, m in zip(topology, machine_block, strict=True)):
        return f"{_dims(machine_block)} machines do not tile the {format_dims(topology)} chip grid"
    if any(m % c for m, c in zip(machine_block, task_block, strict=True)):
        return f"{_dims(task_block)} processes do not split a {_dims(machine_block)} machine (every axis a multiple)"
    tx, ty, tz = (m // c for m, c in zip(machine_block, task_block, strict=True))
    hx, hy, hz = (t // c for t, c in zip(topology, task_block, strict=True))
    if ((ty > 1 or tz > 1) and tx != hx) or (tz > 1 and ty != hy):
        return (
            f"a {_dims(machine_block)} machine of {_dims(task_block)} processes would run processes that are not "
            f"consecutive in the runtime's order (x fastest over the {hx},{hy},{hz} process grid)"
        )
    return None


def with_blocks(tpu: TpuSlice, task_block: Triple, machine_block: Triple) -> TpuSlice:
    """``tpu`` with tasks of ``task_block`` chips on machines of ``machine_block``; TopologyError (naming
    the blocks) when :func:`machine_problem` finds them wrong."""
    problem = machine_problem(tpu.topology, task_block, machine_block)
    if problem is not None:
        raise TopologyError(problem)
    return replace(tpu, chips_per_host_bounds=task_block, chips_per_machine_bounds=machine_block)


def group_tasks(tpu: TpuSlice, per_machine: int) -> TpuSlice:
    """``tpu`` (one task per machine) with every ``per_machine`` consecutive tasks on one machine, as a host
    list naming each machine's processes side by side says; TopologyError when they do not form a box."""
    if per_machine == 1:
        return tpu
    hx, hy, hz = tpu.host_bounds
    if hx % per_machine == 0:
        tasks: Triple = (per_machine, 1, 1)
    elif per_machine % hx == 0 and hy % (per_machine // hx) == 0:
        tasks = (hx, per_machine // hx, 1)
    elif per_machine % (hx * hy) == 0 and hz % (per_machine // (hx * hy)) == 0:
        tasks = (hx, hy, per_machine // (hx * hy))
    else:
        raise TopologyError(
            f"{per_machine} consecutive processes of the {hx},{hy},{hz} process grid do not form a box of chips",
            hint="give TPU_PROCESS_BOUNDS and TPU_CHIPS_PER_PROCESS_BOUNDS (and TPU_CHIPS_PER_HOST_BOUNDS)",
        )
    c = tpu.chips_per_host_bounds
    return with_blocks(tpu, c, (c[0] * tasks[0], c[1] * tasks[1], c[2] * tasks[2]))


def resolve_slice(
    *,
    accelerator: str | None = None,
    generation: str | None = None,
    topology: str | None = None,
    chips_per_host: int | None = None,
    num_slices: int = 1,
    megacore: bool | None = None,
    device_kind: str | None = None,
    chips_per_process_bounds: Triple | None = None,
) -> TpuSlice:
    """Build a slice from an accelerator type (``v4-32``) or an explicit generation + topology.

    ``chips_per_host`` is a machine's chips; ``chips_per_process_bounds`` splits each machine into tasks of
    that block (several TPU processes per machine), checked by :func:`machine_problem`."""
    if accelerator and (generation or topology):
        raise TopologyError(
            "give either an accelerator type or a generation and topology, not both",
            hint=f"accelerator {accelerator!r} already fixes the generation and topology",
        )
    if accelerator:
        gen, dims = parse_accelerator_type(accelerator)
    elif generation and topology:
        found = find_generation(generation)
        if found is None:
            names = ", ".join(g.name for g in GENERATIONS)
            raise TopologyError(
                f"unknown TPU generation {generation!r}",
                hint=did_you_mean(
                    generation.lower(), [g.name for g in GENERATIONS], otherwise=f"generations are {names}"
                ),
            )
        gen = found
        dims = parse_dims(topology, gen.ndims)
        check_topology(gen, dims)
    else:
        raise TopologyError(
            "no slice given", hint="give an accelerator type (v4-32) or a generation and topology (v4, 2x2x4)"
        )
    if num_slices < 1:
        raise TopologyError(f"num_slices must be >= 1, got {num_slices}")
    if megacore is not None and megacore != gen.megacore and not gen.megacore_optional:
        state = "always" if gen.megacore else "never"
        raise TopologyError(
            f"{gen.name} chips are {state} megacore; megacore: {str(megacore).lower()} is not possible",
            hint="only v4 can switch megacore off (two devices per chip)"
            if megacore is False
            else f"{gen.name} shows each TensorCore as its own device; remove the megacore option",
        )
    kind = device_kind or gen.device_kinds[0]
    if kind not in gen.device_kinds:
        raise TopologyError(
            f"{gen.name} devices do not report device_kind {kind!r}",
            hint="known kinds: " + ", ".join(repr(k) for k in gen.device_kinds),
        )
    block = host_block_for(gen, dims, chips_per_host)
    mega = gen.megacore if megacore is None else megacore
    tpu = TpuSlice(gen, dims, block, num_slices, mega, kind)
    return tpu if chips_per_process_bounds is None else with_blocks(tpu, chips_per_process_bounds, block)
