"""The coordinator's standby list (``coordinator: {successors: [...]}``) and the succession order.

Task 0 starts the coordination service. Under ``restart: {policy: rejoin}`` the coordination state is soft
(a generation rebuilds from re-registration), so when the coordinator's host is lost a successor starts the
service for the next generation. Every survivor computes the same order from the spec alone, so no host
needs configuration::

    coordinator: {successors: [0, 2, 4]}   # task ids; default: up to 3, spread over the slices

The default (``default_successors``) takes the first host of each slice, then the second host of each
slice, and so on, up to ``DEFAULT_SUCCESSORS`` tasks: on 2 slices of 2 hosts ``[0, 2, 1]``, on one slice
``[0, 1, 2]``, on 8 slices ``[0, h, 2h]`` (h hosts per slice). A slice is lost whole on a real pod (ICI
slices are recovered together), so the next coordinator is on another slice when there is one.

``succession_order(successors, lost)``: the list rotated to start after the lost coordinator, the lost one
last (it may come back: ``tpuctl init`` on its host); a lost coordinator not on the list is tried after
every successor. ``successors: [0]`` is the old behaviour: the survivors wait for task 0 to return.
Pure: O(len(successors)).
"""

from __future__ import annotations

from collections.abc import Sequence

from tpuctl.spec.checker import Checker, Node

DEFAULT_SUCCESSORS = 3
"""How many tasks the default standby list names: two coordinator losses in a row survived, and a host
starting ``tpuctl init`` probes at most this many addresses (plus ``hosts[0]``) for a live service."""
MAX_SUCCESSORS = 16
"""The longest standby list: every init probes each of them, so it stays short at any cluster size."""


def default_successors(num_hosts: int, hosts_per_slice: int, limit: int = DEFAULT_SUCCESSORS) -> tuple[int, ...]:
    """The first ``limit`` tasks in slice-major round-robin order: the first host of each slice, then the
    second of each, ... (``default_successors(4, 2) == (0, 2, 1)``). O(limit)."""
    per_slice = max(1, min(hosts_per_slice, num_hosts))
    slices = max(1, num_hosts // per_slice)
    out: list[int] = []
    for index in range(min(limit, num_hosts)):
        within, slice_index = divmod(index, slices)
        out.append(slice_index * per_slice + within)
    return tuple(out)


def succession_order(successors: Sequence[int], lost: int) -> tuple[int, ...]:
    """Who to try, in order, after coordinator task ``lost`` was lost: the successors after ``lost`` in the
    list, then those before it, then ``lost`` itself (``succession_order([0, 2, 1], 0) == (2, 1, 0)``,
    ``succession_order([0, 2, 1], 2) == (1, 0, 2)``)."""
    items = list(dict.fromkeys(successors))
    if lost in items:
        at = items.index(lost)
        return (*items[at + 1 :], *items[:at], lost)
    return (*items, lost)


def check_successors(ck: Checker, node: Node, num_hosts: int | None, rejoin: bool | None) -> tuple[int, ...] | None:
    """``coordinator.successors``: task ids of the spec's hosts, each once, at most ``MAX_SUCCESSORS``; only
    under ``restart: {policy: rejoin}`` (None after recording a problem). ``num_hosts``/``rejoin``: None when
    their own sections have problems (not checked against them then)."""
    path = "coordinator.successors"
    expected = "a list of task ids, e.g. successors: [0, 2, 4]"
    items = ck.sequence(node, path, expected)
    if items is None:
        return None
    if not items:
        ck.add(node, path, f"is empty; expected {expected} (task 0 is a successor only when listed)")
        return None
    if len(items) > MAX_SUCCESSORS:
        ck.add(node, path, f"names {len(items)} tasks; expected at most {MAX_SUCCESSORS} (every init probes each one)")
        return None
    ok = True
    seen: dict[int, int] = {}
    out: list[int] = []
    for index, item in enumerate(items):
        where = f"{path}[{index}]"
        task = ck.integer(item, where, 0)
        if task is None:
            ok = False
            continue
        if num_hosts is not None and task >= num_hosts:
            last = num_hosts - 1
            ck.add(item, where, f"task {task} is not a host of this cluster; expected a task id from 0 to {last} "
                   f"(the spec lists {num_hosts} hosts; a task id is a position in hosts)")  # fmt: skip
            ok = False
            continue
        if task in seen:
            ck.add(item, where, f"task {task} repeats {path}[{seen[task]}]; expected each task once")
            ok = False
            continue
        seen[task] = index
        out.append(task)
    if rejoin is False:
        ck.add(
            node, path,
            "a successor takes over when the coordinator's host is lost, which needs the cluster to re-form; "
            "expected restart: {policy: rejoin} beside it (under policy fail a lost coordinator ends the cluster)",
        )  # fmt: skip
        return None
    return tuple(out) if ok else None


__all__ = ["DEFAULT_SUCCESSORS", "MAX_SUCCESSORS", "check_successors", "default_successors", "succession_order"]
