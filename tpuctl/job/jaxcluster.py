"""A JAX cluster detector for jobs ``tpuctl run`` starts: plain ``jax.distributed.initialize()`` works.

JAX (0.10) reads ``JAX_COORDINATOR_ADDRESS`` itself but takes the number of processes and this process's
id only from a *cluster environment* (``jax._src.clusters.ClusterEnv``): SLURM, Open MPI, mpi4py, GKE or
GCE TPU VMs (those two only where ``running_in_cloud_tpu_vm``: TPU chips present), Kubernetes with the
``kubernetes`` package. None of them holds on a simulated host or a CPU stand-in, so without help
``initialize()`` fails with "Number of processes must be defined". JAX finds the subclasses of
``ClusterEnv`` that exist when it looks; this module defines one, ``TpuctlCluster`` (``name = "tpuctl"``),
present when tpuctl's variables are set:

    JAX_COORDINATOR_ADDRESS   host:port of process 0 (task 0's host and the cluster's JAX port)
    JAX_NUM_PROCESSES         the number of tasks
    JAX_PROCESS_ID            this task
    TPUCTL_TASK_ID            (the same task: the job was started by tpuctl)

It is checked after JAX's own detectors (it is registered last), so on a Cloud TPU VM JAX's GKE detector
answers first, from the ``TPU_WORKER_HOSTNAMES`` / ``TPU_WORKER_ID`` tpuctl also sets: the same numbers.

How it gets defined without the job importing anything: ``tpuctl run`` puts ``tpuctl/job/startup`` first on
the job's ``PYTHONPATH``; its ``sitecustomize`` calls :func:`install` (then runs the ``sitecustomize`` it
shadows, if any), which adds an import hook that waits for ``jax._src.clusters`` and defines the class
right after that module has run. Nothing is imported early: a job that never imports jax pays one
finder on ``sys.meta_path``; Python without tpuctl installed works too (the file is loaded by path).

Only the standard library, and no other tpuctl module: the job's Python may not have tpuctl installed.
"""

from __future__ import annotations

import os
import sys
from typing import Any

NAME = "tpuctl"
TARGET = "jax._src.clusters"
REQUIRED = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TPUCTL_TASK_ID")


def present(environ: Any = None) -> bool:
    """True when every variable the detector reads is set, and the numbers are a process of the cluster."""
    env = os.environ if environ is None else environ
    if not all(env.get(name, "").strip() for name in REQUIRED):
        return False
    try:
        count, process = int(env["JAX_NUM_PROCESSES"]), int(env["JAX_PROCESS_ID"])
    except ValueError:
        return False
    return 0 <= process < count


def coordinator(override_port: str | None, environ: Any = None) -> str:
    """``JAX_COORDINATOR_ADDRESS``, with its port replaced by ``JAX_COORDINATOR_PORT`` when JAX passes one."""
    env = os.environ if environ is None else environ
    address = str(env["JAX_COORDINATOR_ADDRESS"]).strip()
    if override_port:
        address = f"{address.rsplit(':', 1)[0]}:{override_port}"
    return address


def define(clusters: Any) -> type:
    """Define (and so register with JAX) the ``tpuctl`` cluster environment; returns the class."""
    for known in clusters.ClusterEnv._cluster_types:
        if getattr(known, "name", "") == NAME:
            return known  # type: ignore[no-any-return]

    class TpuctlCluster(clusters.ClusterEnv):  # type: ignore[misc]
        """A job started by ``tpuctl run``: everything comes from the variables tpuctl set."""

        name: str = NAME

        @classmethod
        def is_env_present(cls) -> bool:
            return present()

        @classmethod
        def get_coordinator_address(cls, timeout_secs: int | None, override_coordinator_port: str | None) -> str:
            return coordinator(override_coordinator_port)

        @classmethod
        def get_process_count(cls) -> int:
            return int(os.environ["JAX_NUM_PROCESSES"])

        @classmethod
        def get_process_id(cls) -> int:
            return int(os.environ["JAX_PROCESS_ID"])

    return TpuctlCluster


class _DefineAfter:
    """Wraps the loader of ``jax._src.clusters``: runs the module, then :func:`define` on it."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        try:
            define(module)
        except Exception as exc:  # a JAX whose ClusterEnv differs: say so, leave JAX as it is
            sys.stderr.write(f"tpuctl: the JAX cluster detector was not registered: {type(exc).__name__}: {exc}\n")


class _Finder:
    """On ``sys.meta_path`` until ``jax._src.clusters`` is imported (once): wraps that module's loader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        if self in sys.meta_path:  # (another thread may have imported it first)
            sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _DefineAfter(spec.loader)  # type: ignore[assignment]
        return spec


def install() -> bool:
    """Define the detector as soon as JAX's cluster module is imported (at once if it already is); False
    when tpuctl's variables are not set (nothing to detect) or the hook is already in place."""
    if not present():
        return False
    module = sys.modules.get(TARGET)
    if module is not None:
        define(module)
        return True
    if any(isinstance(finder, _Finder) for finder in sys.meta_path):
        return False
    sys.meta_path.insert(0, _Finder())
    return True
