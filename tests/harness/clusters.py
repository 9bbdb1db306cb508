"""Real tpuctl clusters on loopback addresses (127.0.0.x), every process through one :class:`Processes`.

* :class:`LocalCluster`: a spec written here, one ``tpuctl init`` per host, started by the test;
* :class:`SimCluster`: ``tpuctl sim up`` (its own spec), then ``tpuctl run`` jobs on its hosts;
* :class:`Clusters`: the clusters one test makes, each in a folder of its own, closed together (the
  ``make_cluster`` and ``sim_cluster`` fixtures of ``tests/conftest.py``).

``close()`` ends what the cluster started, by pid: the ``tpuctl`` processes (SIGTERM, then SIGKILL), the
jobs (the pids their scripts wrote to ``ROOT/*.pids``) and the agents (``ROOT/*/agent.pid``). Agent logs
are shown with the processes' logs on failure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tpuctl.sim.cluster import free_port, loopback_hosts
from tpuctl.tpu.slice import resolve_slice

from .processes import TPUCTL, Finished, Proc, Processes, wait_until


def spec_text(
    accelerator: str,
    hosts: list[str],
    port: int,
    *,
    cluster: str = "test-pod",
    heartbeat: str = "500ms",
    heartbeat_timeout: str = "3s",
    register_timeout: str = "30s",
    barrier_timeout: str = "30s",
    job_ports: str = "",
    successors: str = "",
    num_slices: int = 1,
    spares: list[str] | None = None,
    extra: str = "",
) -> str:
    """The spec: ``hosts`` every slice's hosts (``num_slices`` slices of ``accelerator``), ``spares`` the standby
    hosts (whole slices; the test's ``extra`` names a restart policy that allows them)."""
    host_lines = "\n".join(f"  - {h}" for h in hosts)
    slices = f"num_slices: {num_slices}\n" if num_slices > 1 else ""
    spare_lines = "spares:\n" + "".join(f"  - {h}\n" for h in spares) if spares else ""
    return (
        f"cluster: {cluster}\naccelerator: {accelerator}\n{slices}backend: sim\nhosts:\n{host_lines}\n{spare_lines}"
        f"coordinator: {{port: {port}, heartbeat_interval: {heartbeat}, heartbeat_timeout: {heartbeat_timeout}, "
        f"register_timeout: {register_timeout}{', job_ports: ' + job_ports if job_ports else ''}"
        f"{', successors: ' + successors if successors else ''}}}\n"
        f"barrier_timeout: {barrier_timeout}\n{extra}"
    )


class _Cluster:
    """What both kinds share: host state dirs under ``root``, ``tpuctl`` commands, the processes started."""

    def __init__(self, root: Path, accelerator: str, processes: Processes) -> None:
        self.root = root
        self.accelerator = accelerator
        self.processes = processes
        self.labels: list[str] = []  # the processes this cluster started
        root.mkdir(parents=True, exist_ok=True)
        processes.include_logs(root, "*/agent.log")

    def state(self, task: int) -> Path:
        return self.root / f"host-{task}"

    def mapping(self, task: int) -> Path:
        return self.state(task) / "mapping.json"

    def info(self, task: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.state(task) / "agent.json").read_text())
        return data

    def agent_pid(self, task: int) -> int:
        pid_file = self.state(task) / "agent.pid"
        pid = int(pid_file.read_text()) if pid_file.exists() else None
        assert pid is not None and self.processes.ours(pid), f"no live agent for task {task}"
        return pid

    def start(self, label: str, command: list[str], *, env: dict[str, str] | None = None) -> Proc:
        proc = self.processes.start(label, command, env=env, cwd=self.root)
        self.labels.append(proc.label)
        return proc

    def tpuctl(
        self, *args: str, task: int | None = None, timeout: float = 60.0, env: dict[str, str] | None = None
    ) -> Finished:
        """``tpuctl ARGS [--state-dir HOST-DIR]`` to completion."""
        command = [*TPUCTL, *args, *(["--state-dir", str(self.state(task))] if task is not None else [])]
        label = f"tpuctl-{args[0] if args else 'help'}" + (f"-{task}" if task is not None else "")
        finished = self.processes.run(label, command, timeout=timeout, env=env)
        self.labels.append(finished.label)
        return finished

    def spawn(self, *args: str, task: int) -> Proc:
        """``tpuctl ARGS --state-dir HOST-DIR`` in the background."""
        return self.start(f"{args[0]}-{task}", [*TPUCTL, *args, "--state-dir", str(self.state(task))])

    def wait(self, label: str, timeout: float) -> Finished:
        return self.processes.wait(label, timeout)

    def wait_all(self, labels: list[str], timeout: float) -> list[Finished]:
        return self.processes.wait_all(labels, timeout)

    def wait_for_log(self, task: int, needle: str, timeout: float = 30.0) -> None:
        log = self.state(task) / "agent.log"
        wait_until(
            lambda: log.exists() and needle in log.read_text(errors="replace"),
            timeout,
            f"task {task} to log {needle!r}",
            logs=self.logs,
        )

    def logs(self) -> str:
        return self.processes.logs()

    def stop_jobs(self) -> None:
        """The jobs' processes, by the pids the job scripts wrote (``ROOT/*.pids``)."""
        self.processes.stop_recorded(self.root.glob("*.pids"))

    def stop_agents(self) -> None:
        """Every agent under ``root`` (other state dirs too) still alive, by the pid it wrote."""
        self.processes.stop_recorded(self.root.glob("*/agent.pid"))

    def stop_started(self) -> None:
        """The processes this cluster started (not the rest of its harness's), SIGTERM then SIGKILL."""
        labels = [label for label in self.labels if label in self.processes.procs]
        if labels:
            self.processes.stop(*labels)

    def close(self) -> None:
        """``tpuctl`` first (SIGTERM: ``tpuctl run`` stops its job), then the jobs left, then the agents."""
        self.stop_started()
        self.stop_jobs()
        self.stop_agents()


class LocalCluster(_Cluster):
    """A cluster spec under ``root`` and one ``tpuctl init`` per host, each started by the test.

    ``num_slices`` slices of ``accelerator`` (tasks ``0 .. active - 1``) and ``spares`` spare slices after them
    (tasks ``active ..``; ``num_hosts`` counts them too: every host's task id is below it)."""

    def __init__(
        self, root: Path, accelerator: str, processes: Processes, *, num_slices: int = 1, spares: int = 0,
        **spec_options: str,
    ) -> None:  # fmt: skip
        super().__init__(root, accelerator, processes)
        self.hosts_per_slice = resolve_slice(accelerator=accelerator).num_hosts
        self.active = self.hosts_per_slice * num_slices
        self.num_hosts = self.active + self.hosts_per_slice * spares
        self.spares = range(self.active, self.num_hosts)
        """The spares' task ids (``init --spare``)."""
        self.hosts = loopback_hosts(self.num_hosts)
        self.port = free_port(self.hosts[0])
        self.spec = root / "cluster.yaml"
        spares_hosts = self.hosts[self.active :]
        text = spec_text(accelerator, self.hosts[: self.active], self.port, num_slices=num_slices, spares=spares_hosts,
                         **spec_options)  # fmt: skip
        self.spec.write_text(text)

    def start_init(
        self, task: int, *, spec: Path | None = None, state: Path | None = None, env: dict[str, str] | None = None,
        label: str | None = None,
    ) -> Proc:  # fmt: skip
        """``tpuctl init`` of host ``task`` (a spare's with ``--spare``)."""
        state = state or self.state(task)
        state.mkdir(parents=True, exist_ok=True, mode=0o700)  # state dirs are owner-only
        command = [
            *TPUCTL, "init", "--config", str(spec or self.spec), "--task-id", str(task),
            "--state-dir", str(state), "--out", str(state / "mapping.json"), *(["--spare"] if task in self.spares else []),
        ]  # fmt: skip
        return self.start(label or f"init-{task}", command, env=env)

    def wait_init(self, label: str, timeout: float = 60.0) -> Finished:
        return self.processes.wait(label, timeout)

    def up(self, timeout: float = 90.0) -> list[Finished]:
        for task in range(self.num_hosts):
            self.start_init(task)
        results = self.processes.wait_all([f"init-{t}" for t in range(self.num_hosts)], timeout)
        bad = [r for r in results if r.code != 0]
        assert not bad, f"{len(bad)} hosts failed to come up:\n{self.logs()}"
        return results


class SimCluster(_Cluster):
    """``tpuctl sim up ACCELERATOR --root ROOT``; ``run(task, ...)`` starts ``tpuctl run`` on host ``task``."""

    def __init__(self, root: Path, accelerator: str, processes: Processes) -> None:
        super().__init__(root, accelerator, processes)
        self.num_hosts = 0
        self.brought_up: Finished | None = None
        """``tpuctl sim up``'s run (its output: the hints it prints), once :meth:`up` ran."""

    @property
    def env(self) -> dict[str, str]:
        """For ``sim up`` / ``sim down``: the record of simulated clusters' roots is the test's, not this user's."""
        return {"TPUCTL_STATE_DIR": str(self.root.parent / f"{self.root.name}-state")}

    def up(self, *options: str, timeout: float = 120.0) -> None:
        """``tpuctl sim up ACCELERATOR --root ROOT OPTIONS`` (``"-o", "json"``: its document, in
        ``brought_up.out``)."""
        done = self.brought_up = self.tpuctl(
            "sim", "up", self.accelerator, "--root", str(self.root), *options, timeout=timeout, env=self.env
        )
        assert done.code == 0, f"tpuctl sim up {self.accelerator} failed:\n{self.logs()}"
        self.num_hosts = len(list(self.root.glob("host-*")))

    def run(
        self, task: int, *command: str, label: str | None = None, grace: str = "5s", env: dict[str, str] | None = None
    ) -> str:
        """Start ``tpuctl run --state-dir ROOT/host-TASK -- COMMAND`` in the background; returns its label."""
        run = [*TPUCTL, "run", "--grace", grace, "--state-dir", str(self.state(task)), "--", *command]
        return self.start(label or f"run-{task}", run, env=env).label

    def close(self) -> None:
        # `tpuctl run` first (SIGTERM: it stops its job), then the jobs' processes by the pids the job scripts
        # wrote (ROOT/*.pids), then the agents: `tpuctl sim down`, and by their pids whatever it left
        self.stop_started()
        self.stop_jobs()
        if self.num_hosts:
            self.tpuctl("sim", "down", "--root", str(self.root), timeout=30, env=self.env)
        self.stop_agents()


class Clusters:
    """The clusters a test (or a module's fixture) makes: each in its own folder under ``root`` (``c0``,
    ``c1``, ...), their processes those of ``processes`` (logs shown on failure); :meth:`close` ends every
    one, by pid."""

    def __init__(self, root: Path, processes: Processes) -> None:
        self.root = root
        self.processes = processes
        self.made: list[_Cluster] = []

    def _folder(self) -> Path:
        return self.root / f"c{len(self.made)}"

    def local(self, accelerator: str, **spec_options: Any) -> LocalCluster:
        """``local("v4-32", heartbeat_timeout="2s")``: a loopback cluster's spec; the test starts its hosts."""
        cluster = LocalCluster(self._folder(), accelerator, self.processes, **spec_options)
        self.made.append(cluster)
        return cluster

    def sim(self, accelerator: str, *options: str) -> SimCluster:
        """``sim("v4-16")``: a simulated cluster that is up (closed with the others even if ``sim up`` failed);
        ``options`` go to ``tpuctl sim up``."""
        cluster = SimCluster(self._folder(), accelerator, self.processes)
        self.made.append(cluster)
        cluster.up(*options)
        return cluster

    def close(self) -> None:
        """Every cluster made here, in order; one that fails to close does not keep the rest running."""
        failed: list[BaseException] = []
        for cluster in self.made:
            try:
                cluster.close()
            except Exception as exc:
                failed.append(exc)
        if failed:
            raise failed[0]
