"""A generation's spec under hot spares and policy elastic: the roster, the slice shape, and the spec of a plan.

The cluster spec names the cluster at full size (``hosts``, ``num_slices``) and its standby hosts
(``spares``); a generation is whole roster slices at positions ``0 .. k - 1`` (its *plan*, see
:mod:`tpuctl.coordination.plan`). What the merge, the mapping and the job's environment run on is the
generation's own spec, :func:`for_plan`:

* ``hosts``: the members' addresses in rank order (rank = the process rank of the generation: ``JAX_PROCESS_ID``,
  ``RANK``, the mapping's task index); a host's task id (its place in the roster) never changes;
* ``num_slices``: the plan's length;
* every mesh resized on its *slice axis* (the one axis its ``dcn_shape`` gives more than one slice; without
  ``dcn_shape`` the first axis, as the builder lays the slices out): that axis' size is ``size / num_slices * k``.
  A mesh whose slices spread over several axes, or whose slice axis does not divide, cannot be resized:
  :class:`MeshResizeError` names the mesh, its shape and the slice count.

Worked example: v4-16 (2 hosts a slice) x 3, mesh ``{data: 6, model: 4}``; slice 1 lost, plan ``[0, 2]``:
hosts ``h0 h1 h4 h5`` (ranks 0-3; task 4 is rank 2), ``num_slices: 2``, mesh ``{data: 4, model: 4}``.
A spare slice 3 in slice 1's place, plan ``[0, 3, 2]``: hosts ``h0 h1 s0 s1 h4 h5``, meshes unchanged.

Pure: no I/O; the environment a host's shape is read from is handed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, cast

from tpuctl.errors import InputError, TopologyError
from tpuctl.mesh.model import MeshSpec
from tpuctl.spec.model import ClusterSpec
from tpuctl.tpu.slice import TpuSlice, resolve_slice

if TYPE_CHECKING:
    from tpuctl.coordination.plan import Plan, Roster, SliceShape

SIM_ACCELERATOR_ENV = "TPUCTL_SIM_ACCELERATOR"
"""The sim backend: the accelerator type this host reports as its own slice's (default: the spec's), so a test
can make a spare that does not match (``TPUCTL_SIM_ACCELERATOR=v4-32``)."""
TPU_ACCELERATOR_ENV = "TPU_ACCELERATOR_TYPE"
"""A real backend: the accelerator type Cloud TPU / GKE gives the host (default: the spec's)."""


class MeshResizeError(InputError):
    """A declared mesh cannot be built at a generation's slice count (exit 2: the spec's meshes)."""


def roster_of(spec: ClusterSpec) -> Roster:
    """The spec's hosts and spares as the coordination service counts them."""
    from tpuctl.coordination.plan import Roster

    return Roster(active=len(spec.hosts), spares=len(spec.spares), hosts_per_slice=spec.slice.hosts_per_slice)


def shape_of(tpu: TpuSlice) -> SliceShape:
    """One slice's shape: accelerator type, topology, hosts per slice."""
    from tpuctl.coordination.plan import SliceShape

    return SliceShape(tpu.accelerator_type, tpu.topology_str, tpu.hosts_per_slice)


def cluster_shape(spec: ClusterSpec) -> SliceShape:
    """The shape every host of the cluster, spares included, must report."""
    return shape_of(spec.slice)


def host_shape(spec: ClusterSpec, environ: Mapping[str, str]) -> SliceShape:
    """The shape this host's backend reports for its own slice: the spec's, unless the host says otherwise
    (the sim backend: ``TPUCTL_SIM_ACCELERATOR``; a real one: ``TPU_ACCELERATOR_TYPE``). InputError for a type
    tpuctl does not know."""
    name = SIM_ACCELERATOR_ENV if spec.backend == "sim" else TPU_ACCELERATOR_ENV
    accelerator = environ.get(name, "").strip()
    if not accelerator or accelerator == spec.slice.accelerator_type:
        return cluster_shape(spec)
    try:
        own = resolve_slice(accelerator=accelerator, chips_per_host=spec.slice.chips_per_host)
    except TopologyError as exc:
        raise InputError(f"{name}={accelerator!r}: {exc.message}", hint=exc.hint) from exc
    return shape_of(own)


def _dcn(mesh: MeshSpec) -> tuple[int, ...] | None:
    given = mesh.option("dcn_shape")
    return None if given is None else tuple(int(d) for d in cast("tuple[int, ...]", given))


def slice_axis(mesh: MeshSpec, num_slices: int) -> int | None:
    """The index of the axis the slices go along (None: several axes hold slices)."""
    dcn = _dcn(mesh)
    if dcn is None:
        return 0
    spread = [i for i, d in enumerate(dcn) if d > 1]
    if num_slices == 1 and not spread:
        return 0
    return spread[0] if len(spread) == 1 else None


def resize_mesh(mesh: MeshSpec, num_slices: int, slices: int) -> MeshSpec:
    """``mesh`` (declared for ``num_slices`` slices) for a generation of ``slices``: its slice axis scaled."""
    if slices == num_slices:
        return mesh
    shape = "{" + ", ".join(f"{n}: {s}" for n, s in mesh.axes) + "}"
    axis = slice_axis(mesh, num_slices)
    if axis is None:
        raise MeshResizeError(
            f"mesh {mesh.name!r} {shape} cannot go to {slices} slices: its dcn_shape "
            f"{list(_dcn(mesh) or ())} spreads the {num_slices} slices over several axes",
            hint="give the mesh a dcn_shape with the slices on one axis (e.g. [3, 1]) to run on fewer slices",
        )
    name, size = mesh.axes[axis]
    if size % num_slices:
        raise MeshResizeError(
            f"mesh {mesh.name!r} {shape} cannot go to {slices} slices: its slice axis {name}={size} does not "
            f"split into the spec's {num_slices} slices",
            hint=f"make {name} a multiple of {num_slices}",
        )
    axes = tuple((n, s // num_slices * slices if i == axis else s) for i, (n, s) in enumerate(mesh.axes))
    options = mesh.options
    if _dcn(mesh) is not None:
        dcn = tuple(slices if i == axis else 1 for i in range(len(mesh.axes)))
        options = tuple((k, dcn if k == "dcn_shape" else v) for k, v in options)
    return replace(mesh, axes=axes, options=options)


def for_plan(spec: ClusterSpec, plan: Plan) -> ClusterSpec:
    """The spec of the generation ``plan`` describes (module docstring); the spec itself for generation 1's
    plan. O(members + meshes)."""
    roster = roster_of(spec)
    if plan == roster.identity():
        return spec
    roster_hosts = spec.roster_hosts
    members = plan.members(roster)
    if max(members) >= len(roster_hosts):
        raise InputError(
            f"generation plan {plan.describe()} names task {max(members)}, but the spec has "
            f"{len(roster_hosts)} hosts and spares",
            hint="every host must run tpuctl init with the same spec",
        )
    k = len(plan)
    num_slices = spec.slice.num_slices
    tpu = replace(spec.slice, num_slices=k) if k != num_slices else spec.slice
    meshes = tuple(resize_mesh(m, num_slices, k) for m in spec.meshes)
    return replace(spec, slice=tpu, hosts=tuple(roster_hosts[t] for t in members), meshes=meshes, spares=())


__all__ = [
    "SIM_ACCELERATOR_ENV",
    "MeshResizeError",
    "cluster_shape",
    "for_plan",
    "host_shape",
    "resize_mesh",
    "roster_of",
    "shape_of",
]


def resize_problems(meshes: tuple[MeshSpec, ...], num_slices: int, fewest: int) -> list[str]:
    """What stops each mesh from running on every slice count policy elastic allows (``fewest`` up to
    ``num_slices``), one line per mesh that cannot; [] when every one can. O(meshes x slice counts)."""
    found = []
    for mesh in meshes:
        for slices in range(fewest, num_slices):
            try:
                resize_mesh(mesh, num_slices, slices)
            except MeshResizeError as exc:
                found.append(f"{exc.message} (restart.policy elastic may go down to min_slices {fewest}); {exc.hint}")
                break
    return found
