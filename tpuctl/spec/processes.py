"""Several TPU processes per machine, from libtpu's own variables: how detection splits machines into tasks.

Pure, like :mod:`tpuctl.spec.detect` (which calls it): values come in as a mapping with their labels.

libtpu describes a slice twice: machines (``TPU_HOST_BOUNDS`` machines of ``TPU_CHIPS_PER_HOST_BOUNDS``
chips) and processes (``TPU_PROCESS_BOUNDS`` processes of ``TPU_CHIPS_PER_PROCESS_BOUNDS`` chips; torch_xla
and libtpu fall back to the host bounds when these are unset). Each product is the chip grid. tpuctl's task
is a process, so a recorded GKE LeaderWorkerSet pod on tpu7x-16 with two TPU containers per machine::

    TPU_HOST_BOUNDS=1,1,2     TPU_CHIPS_PER_HOST_BOUNDS=2,2,1       two machines of 2x2 chips
    TPU_PROCESS_BOUNDS=2,1,2  TPU_CHIPS_PER_PROCESS_BOUNDS=1,2,1    four processes of 1x2 chips

is four tasks of two chips, tasks 0 and 1 on the first machine. ``TPU_VISIBLE_CHIPS`` names a process's
chips as its machine numbers them (x fastest within the machine block): task 1's are ``1,3``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tpuctl.errors import TopologyError
from tpuctl.spec.model import topology_problem
from tpuctl.tpu.hardware import Triple
from tpuctl.tpu.slice import TpuSlice, format_dims, group_tasks, with_blocks

HOST_BOUNDS_ENV = "TPU_HOST_BOUNDS"
CHIPS_PER_HOST_BOUNDS_ENV = "TPU_CHIPS_PER_HOST_BOUNDS"
PROCESS_BOUNDS_ENV = "TPU_PROCESS_BOUNDS"
CHIPS_PER_PROCESS_BOUNDS_ENV = "TPU_CHIPS_PER_PROCESS_BOUNDS"
VISIBLE_CHIPS_ENV = "TPU_VISIBLE_CHIPS"
PROCESS_ENVS = (PROCESS_BOUNDS_ENV, CHIPS_PER_PROCESS_BOUNDS_ENV)

Label = Callable[[str], str]
"""A variable's name as problems show it (``TPU_PROCESS_BOUNDS``, or ``metadata tpu-env TPU_PROCESS_BOUNDS``)."""


def _value(values: Mapping[str, str], name: str) -> str | None:
    value = values.get(name, "").strip()
    return value or None


def parse_bounds(values: Mapping[str, str], name: str, label: Label, problems: list[str]) -> Triple | None:
    """``x,y,z`` (or ``x,y``: z = 1) of positive integers; None when unset or malformed (a problem added)."""
    raw = _value(values, name)
    if raw is None:
        return None
    parts = raw.replace(" ", "").split(",")
    if not 2 <= len(parts) <= 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        problems.append(f"{label(name)}={raw!r} is not x,y,z; expected positive counts along x, y, z, e.g. 2,2,1")
        return None
    x, y, *z = (int(p) for p in parts)
    return (x, y, z[0] if z else 1)


def _text(block: tuple[int, ...]) -> str:
    return ",".join(map(str, block))


def split_processes(
    values: Mapping[str, str], tpu: TpuSlice, per_machine: int, per_task: bool, label: Label, problems: list[str]
) -> TpuSlice | None:
    """``tpu`` (machines of its host block) split into the processes the environment describes.

    ``per_machine``: entries per machine in the host list; ``per_task``: the slice's host block was taken
    from the list (several entries per machine, no bounds given), so consecutive entries form a machine.
    None (problems added) when the bounds contradict the slice or each other.
    """
    found: list[str] = []
    process_bounds = parse_bounds(values, PROCESS_BOUNDS_ENV, label, found)
    block = parse_bounds(values, CHIPS_PER_PROCESS_BOUNDS_ENV, label, found)
    host_bounds = parse_bounds(values, HOST_BOUNDS_ENV, label, found)
    problems += found
    if found:
        return None
    topology = tpu.topology
    grid = f"{tpu.accelerator_type}'s {format_dims(topology)} chip grid"
    if process_bounds is None and block is None:
        if per_machine > 1 and not per_task:
            problems.append(
                f"the host list runs {per_machine} TPU processes per machine, but {PROCESS_BOUNDS_ENV} and "
                f"{CHIPS_PER_PROCESS_BOUNDS_ENV} are not set; expected both, how a machine's chips split among its "
                f"processes (e.g. {PROCESS_BOUNDS_ENV}=2,1,2 and {CHIPS_PER_PROCESS_BOUNDS_ENV}=1,2,1 for two "
                "processes on each 2,2,1 machine of tpu7x-16)"
            )
            return None
        try:
            tpu = group_tasks(tpu, per_machine)
        except TopologyError as exc:
            problems.append(f"the host list's {per_machine} processes per machine: {topology_problem(exc)}")
            return None
    else:
        block = _block(process_bounds, block, topology, label, problems)
        if block is None:
            return None
        if process_bounds is not None and tuple(p * c for p, c in zip(process_bounds, block, strict=True)) != topology:
            problems.append(
                f"{label(PROCESS_BOUNDS_ENV)}={_text(process_bounds)} times {label(CHIPS_PER_PROCESS_BOUNDS_ENV)}="
                f"{_text(block)} is {format_dims(tuple(p * c for p, c in zip(process_bounds, block, strict=True)))} "
                f"chips; expected the {grid} (processes x chips per process, axis by axis)"
            )
            return None
        try:
            tpu = with_blocks(tpu, block, tpu.chips_per_host_bounds)
        except TopologyError as exc:
            problems.append(
                f"{label(CHIPS_PER_PROCESS_BOUNDS_ENV)}={_text(block)} on {_text(tpu.chips_per_host_bounds)} "
                f"machines: {topology_problem(exc)}"
            )
            return None
    if host_bounds is not None and host_bounds != tpu.machine_bounds:
        problems.append(
            f"{label(HOST_BOUNDS_ENV)}={_text(host_bounds)}, but {_text(tpu.machine_block)} machines tile the {grid} "
            f"as {_text(tpu.machine_bounds)}; expected {_text(tpu.machine_bounds)}"
        )
        return None
    if per_machine > 1 and per_machine != tpu.tasks_per_machine:
        problems.append(
            f"the host list runs {per_machine} TPU processes per machine, but {_text(tpu.chips_per_host_bounds)} "
            f"processes on {_text(tpu.machine_block)} machines are {tpu.tasks_per_machine} per machine; expected "
            "each machine's processes side by side, as many as the bounds say"
        )
        return None
    return tpu


def _block(
    process_bounds: Triple | None, block: Triple | None, topology: Triple, label: Label, problems: list[str]
) -> Triple | None:
    """The process block, from ``TPU_CHIPS_PER_PROCESS_BOUNDS`` or the chip grid over ``TPU_PROCESS_BOUNDS``."""
    if block is not None:
        return block
    assert process_bounds is not None
    if any(t % p for t, p in zip(topology, process_bounds, strict=True)):
        problems.append(
            f"{label(PROCESS_BOUNDS_ENV)}={_text(process_bounds)} does not divide the {format_dims(topology)} chip "
            f"grid; expected a process count along each axis that divides it (or set {CHIPS_PER_PROCESS_BOUNDS_ENV})"
        )
        return None
    x, y, z = (t // p for t, p in zip(topology, process_bounds, strict=True))
    return (x, y, z)


def parse_visible_chips(
    values: Mapping[str, str], tpu: TpuSlice, label: Label, problems: list[str]
) -> tuple[int, ...] | None:
    """``TPU_VISIBLE_CHIPS`` (chip numbers on this machine), checked against a process's share; None when unset."""
    raw = _value(values, VISIBLE_CHIPS_ENV)
    if raw is None:
        return None
    on_machine = tpu.machine_block[0] * tpu.machine_block[1] * tpu.machine_block[2]
    expected = (
        f"expected {tpu.chips_per_host} distinct chip numbers from 0 to {on_machine - 1}, comma separated "
        f"(this process's chips of its {_text(tpu.machine_block)} machine)"
    )
    parts = [p.strip() for p in raw.split(",")]
    if not all(p.isdigit() for p in parts):
        problems.append(f"{label(VISIBLE_CHIPS_ENV)}={raw!r} is not a list of chip numbers; {expected}")
        return None
    chips = [int(p) for p in parts]
    outside = [c for c in chips if c >= on_machine]
    if outside:
        problems.append(
            f"{label(VISIBLE_CHIPS_ENV)}={raw!r}: chip {outside[0]} is not on this machine, which has chips 0 to "
            f"{on_machine - 1}; {expected}"
        )
        return None
    if len(set(chips)) != len(chips) or len(chips) != tpu.chips_per_host:
        problems.append(f"{label(VISIBLE_CHIPS_ENV)}={raw!r} names {len(set(chips))} chip(s); {expected}")
        return None
    return tuple(sorted(chips))


def visible_chips_problem(values: Mapping[str, str], tpu: TpuSlice, task: int, label: Label) -> str | None:
    """Why ``TPU_VISIBLE_CHIPS`` is not ``task``'s chips on its machine, or None (also when unset)."""
    problems: list[str] = []
    chips = parse_visible_chips(values, tpu, label, problems)
    if problems:
        return problems[0]
    mine = tpu.visible_chips(task)
    if chips is None or chips == mine:
        return None
    first = task - tpu.rank_on_machine(task)  # a machine's tasks are consecutive (machine_problem)
    owners = [t for t in range(first, first + tpu.tasks_per_machine) if tpu.visible_chips(t) == chips]
    whose = f"task {owners[0]}'s" if owners else "no task's"
    return (
        f"{label(VISIBLE_CHIPS_ENV)}={_text(chips)} are {whose} chips, but this process is task {task}, whose chips "
        f"on machine {tpu.machine_of(task)} are {_text(mine)}; expected {_text(mine)}"
    )


__all__ = [
    "CHIPS_PER_PROCESS_BOUNDS_ENV",
    "HOST_BOUNDS_ENV",
    "PROCESS_BOUNDS_ENV",
    "VISIBLE_CHIPS_ENV",
    "parse_bounds",
    "parse_visible_chips",
    "split_processes",
    "visible_chips_problem",
]
