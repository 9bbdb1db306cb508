"""``tpuctl sim up|status|run|down``: a whole simulated cluster on this machine, and commands across it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from tpuctl.agent.statedir import StateDir, default_sim_root
from tpuctl.cli.app import SuggestingGroup
from tpuctl.cli.common import WholeNumber, parse_duration_option, say
from tpuctl.cli.output import dumps, emit, format_options
from tpuctl.errors import EXIT_CLUSTER, ClusterError, InputError
from tpuctl.spec.model import DEFAULT_OUTPUT

INIT_TIMEOUT_S = 180.0
INIT_MARGIN_S = 60.0  # beyond the spec's restart timeout, for a restarted host's init to say why it failed
F = TypeVar("F", bound=Callable[..., Any])


def default_root() -> Path:
    return default_sim_root()


def root_flag(root: Path) -> str:
    """`` --root ROOT`` for a command line, or nothing for the default root."""
    return "" if root == default_root() else f" --root {root}"


def next_commands(root: Path) -> list[str]:
    """What to do with a running simulated cluster, as exact command lines (real paths)."""
    flag = root_flag(root)
    return [
        f"tpuctl sim status{flag}",
        f"tpuctl sim run{flag} -- python job.py",
        f"tpuctl status --state-dir {root / 'host-0'}",
        f"tpuctl sim down{flag}",
    ]


root_option = click.option(
    "--root",
    metavar="DIR",
    type=click.Path(path_type=Path),
    help=f"The hosts' state dirs are DIR/host-N (default {default_root()}: $TPUCTL_STATE_DIR/sim, else /tmp/tpuctl-sim-UID).",
)


@click.group("sim", cls=SuggestingGroup)
def sim() -> None:
    """A whole cluster on this machine: real tpuctl processes on 127.0.0.x, simulated TPUs."""


_UP_HELP = f"""Start one `tpuctl init` per host of ACCELERATOR (e.g. v4-32), show the topology, pass a barrier.

    \b
      tpuctl sim up v4-32                  # 4 hosts on 127.0.0.2-5, state dirs {default_root()}/host-N
      tpuctl sim status                    # every host's agent, as the coordinator sees it
      tpuctl sim restart 2                 # host 2 lost and back as a new generation (needs --rejoin)
      tpuctl sim up v4-16 --num-slices 3 --spares 1   # 3 slices of 2 hosts, one spare slice (tasks 6-7)
      tpuctl sim run -- python job.py      # job.py on every host at once, under `tpuctl run`
      tpuctl status --state-dir {default_root()}/host-2
      tpuctl sim down
    With --root DIR, pass the same --root to sim status, sim run and sim down.
    Ctrl-C during start-up (or with --hold, at any time) tears everything down.

    Exit codes: 0 up, 2 bad slice or spec, 3 a host failed to come up (all torn down), 130 interrupted.
    """


@sim.command("up", help=_UP_HELP)
@click.argument("accelerator", required=False)
@click.option(
    "--config", "-c", metavar="FILE", help="Use this spec (backend sim, loopback hosts) instead of generating one."
)
@root_option
@click.option("--hold", is_flag=True, help="Stay in the foreground; Ctrl-C tears the cluster down.")
@click.option(
    "--rejoin",
    is_flag=True,
    help="With ACCELERATOR: the spec gets restart: {policy: rejoin}, so a lost host brought back "
    "(`tpuctl sim restart TASK`) re-forms the cluster as a new generation.",
)
@click.option(
    "--num-slices",
    type=WholeNumber(1, 64),
    default=1,
    show_default=True,
    help="With ACCELERATOR: this many slices of it (multislice; the spec's num_slices).",
)
@click.option(
    "--spares",
    type=WholeNumber(0, 64),
    default=0,
    show_default=True,
    help="With ACCELERATOR: this many spare SLICES (standby hosts after the cluster's, started with "
    "`init --spare`); brings restart: {policy: rejoin}, which spares need.",
)
@format_options("text: the topology; json: one document (schema tpuctl.sim.up/v1: root, tasks with state dirs).")
def up(
    accelerator: str | None,
    config: str | None,
    root: Path | None,
    hold: bool,
    rejoin: bool,
    num_slices: int,
    spares: int,
    fmt: str,
) -> None:
    from tpuctl.agent.statedir import record_sim_root
    from tpuctl.render.text import render_text
    from tpuctl.sim import cluster as sc
    from tpuctl.spec.yamlfile import load_spec, load_spec_text

    root = (root or default_root()).absolute()
    root.mkdir(parents=True, exist_ok=True)
    sc.check_root(root)
    if config:
        given = [name for name, on in (("--rejoin", rejoin), ("--num-slices", num_slices > 1), ("--spares", spares)) if on]
        if given:
            raise InputError(
                f"{', '.join(given)} go(es) with ACCELERATOR (a generated spec); a spec of your own says its restart "
                "policy, num_slices and spares",
                hint="put them in the spec: restart: {policy: rejoin}, num_slices: N, spares: [ADDRESS, ...]",
            )
        spec = load_spec(config)
        spec_path = Path(config).absolute()
    elif accelerator:
        from tpuctl.tpu.slice import resolve_slice

        per_slice = resolve_slice(accelerator=accelerator).num_hosts
        count = per_slice * num_slices
        addresses = sc.loopback_hosts(count + per_slice * spares)  # the spares' after the cluster's
        hosts = addresses[:count]
        text = sc.sim_spec_text(
            accelerator, hosts, sc.free_port(hosts[0]), root, rejoin=rejoin, num_slices=num_slices,
            spares=addresses[count:],
        )  # fmt: skip
        spec_path = root / "cluster.yaml"
        spec = load_spec_text(text, str(spec_path))
        spec_path.write_text(text)
    else:
        raise InputError("say which slice to simulate", hint="e.g. tpuctl sim up v4-32, or --config FILE")
    if spec.backend != "sim":
        raise InputError(f"{spec_path}: backend is {spec.backend!r}; sim up needs backend: sim")
    hosts = list(spec.hosts)
    standby = list(spec.spares)  # tasks len(hosts).. : they stand by (no mapping, no barrier) until they take a place
    if config and spec.output != DEFAULT_OUTPUT:
        say(
            f"note: {spec_path}'s output: {spec.output} is not used: the {len(hosts)} simulated hosts share this "
            f"machine, so each writes its own mapping file, {root}/host-N/mapping.json"
        )
    spare_tasks = _tasks(len(hosts), len(standby))
    spare_text = f" and {len(standby)} spare host(s) ({spare_tasks})" if standby else ""
    say(f"starting {len(hosts)} hosts of {spec.slice.describe()}{spare_text} under {root}")
    started = time.monotonic()
    try:
        procs = sc.start_inits(root, spec_path, len(hosts), len(standby))
        runs = sc.wait_all(procs, INIT_TIMEOUT_S)
        sc.require_up(runs, hosts + standby, root)
        elapsed = time.monotonic() - started
        digests = set(sc.mapping_digests(root, len(hosts)))
        if len(digests) != 1:
            raise ClusterError(f"the hosts wrote {len(digests)} different mapping files; they must be identical")
        if fmt == "json":
            emit(dumps(_up_document(spec.cluster, spec.slice.accelerator_type, root, spec_path, hosts, standby)), None)
        else:
            click.echo(render_text(spec.slice, hosts))
        say(f"all {len(hosts)} hosts up in {elapsed:.2f} s; every host wrote the same mapping")
        if standby:
            say(f"{len(standby)} spare host(s) standing by ({spare_tasks}: {standby[0]} ...): a spare slice takes a "
                "lost slice's place when the cluster needs it")  # fmt: skip
        barrier_started = time.monotonic()
        barrier_runs = sc.wait_all(sc.start_barriers(root, len(hosts), "sim-up", "60s"), 60.0)
        sc.require_up(barrier_runs, hosts, root)
        say(f"barrier 'sim-up' passed on all {len(hosts)} hosts in {time.monotonic() - barrier_started:.2f} s")
    except BaseException:
        say("tearing the simulated cluster down")
        sc.stop_hosts(root)
        raise
    record_sim_root(root)
    say("next:\n" + "\n".join(f"  {line}" for line in next_commands(root)))
    if hold:
        say("holding; Ctrl-C tears the cluster down")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            stopped = sc.stop_hosts(root)
            say(f"stopped {len(stopped)} agents")


def _tasks(first: int, count: int) -> str:
    """``task 6`` or ``tasks 6-7``."""
    return f"task {first}" if count == 1 else f"tasks {first}-{first + count - 1}"


def _up_document(
    cluster: str, accelerator: str, root: Path, spec_path: Path, hosts: list[str], spares: list[str]
) -> dict[str, object]:
    from tpuctl.sim import cluster as sc

    roster = hosts + spares
    return {
        "schema": "tpuctl.sim.up/v1",
        "cluster": cluster,
        "accelerator": accelerator,
        "root": str(root),
        "config": str(spec_path),
        "num_hosts": len(hosts),
        "tasks": [
            {
                "task": t,
                "address": a,
                "state_dir": str(sc.host_dir(root, t)),
                "mapping": str(sc.host_dir(root, t) / "mapping.json"),
                "role": "member" if t < len(hosts) else "standby",  # generation 1: the spares stand by
            }
            for t, a in enumerate(roster)
        ],
    }


_RESTART_HELP = f"""Restart simulated host TASK's agent: kill it if it runs (SIGKILL, as a crashed or preempted
    host is lost), then `tpuctl init` it again with the cluster's spec, its state dir and its mapping
    file, as a real host brought back would be. The other hosts re-form the cluster with it as a new
    generation, which needs restart: {{policy: rejoin}} in the spec (`sim up ACCELERATOR --rejoin` writes it).

    \b
      tpuctl sim up v4-32 --rejoin
      kill -9 $(cat {default_root()}/host-2/agent.pid)   # a host lost (or leave it running)
      tpuctl sim restart 2                               # back, as generation 2
      tpuctl sim status
    With --root DIR, pass the --root of sim up.

    Exit codes: 0 back and the new generation formed, 2 no such task or the spec's restart policy is not
    rejoin, 3 the host did not come back (what its init said), 5 no simulated cluster runs under the root.
    """


@sim.command("restart", help=_RESTART_HELP)
@click.argument("task", type=WholeNumber(min=0), metavar="TASK")
@root_option
def restart(task: int, root: Path | None) -> None:
    from tpuctl.sim import cluster as sc
    from tpuctl.sim.status import host_dirs, no_sim
    from tpuctl.spec.yamlfile import load_spec

    root = (root or default_root()).absolute()
    if not host_dirs(root):
        raise no_sim(root, "it has no host-N state dirs")
    spec_path = sc.running_spec(root, task)
    spec = load_spec(spec_path)
    hosts = list(spec.roster_hosts)  # the spares too (tasks after the cluster's)
    if task >= len(hosts):
        raise InputError(
            f"task {task} is not a host of the simulated cluster under {root}: {spec_path} has tasks 0 to "
            f"{len(hosts) - 1}",
            hint=f"tpuctl sim status{root_flag(root)} lists them",
        )
    if not spec.restart.rejoin:
        raise InputError(
            f"{spec_path}: restart policy is {spec.restart.policy}: a host that left ends the cluster, it cannot "
            "come back as a new generation",
            hint=f"start the cluster with restart: {{policy: rejoin}} (tpuctl sim down{root_flag(root)}, then "
            f"tpuctl sim up ACCELERATOR --rejoin{root_flag(root)}, or -c SPEC with it)",
        )
    others = [t for t, folder in host_dirs(root) if t != task and StateDir(folder).live_pid() is not None]
    if not others:
        raise no_sim(root, f"no host but task {task} has a running agent: there is no cluster to rejoin")
    stopped = sc.lose_host(root, task)
    if stopped is not None:
        say(f"killed task {task}'s agent (pid {stopped}), as a lost host's")
    say(f"starting task {task} ({hosts[task]}) again under {sc.host_dir(root, task)}")
    started = time.monotonic()
    again = sc.start_init(root, spec_path, task, spare=spec.is_spare(task))
    (run,) = sc.wait_all([again], spec.restart.timeout + INIT_MARGIN_S)
    sc.require_up([dataclasses.replace(run, task=task)], hosts, root)
    generation = StateDir(sc.host_dir(root, task)).read_info().generation
    say(f"task {task} is back in {time.monotonic() - started:.2f} s: the cluster formed generation {generation}")


@sim.command("down")
@root_option
def down(root: Path | None) -> None:
    """Stop every agent of the simulated cluster (SIGTERM, then SIGKILL after 10 s).

    \b
      tpuctl sim down
      tpuctl sim down --root /tmp/sim
    Exit codes: 0 stopped (or nothing was running), 5 the root is not ours.
    """
    from tpuctl.agent.statedir import record_sim_root
    from tpuctl.sim import cluster as sc

    root = (root or default_root()).absolute()
    stopped = sc.stop_hosts(root)
    record_sim_root(root, keep=False)
    say(f"stopped {len(stopped)} agents under {root}" if stopped else f"no simulated hosts running under {root}")


@sim.command("status")
@root_option
@format_options("text: a table; json: one document (schema tpuctl.sim.status/v1).")
def status(root: Path | None, fmt: str) -> int:
    """Every simulated host in one table: its agent (running or not, pid), its state and last heartbeat
    as the coordinator sees them, its state dir. Every host keeps its address when task 0 (the
    coordinator) is gone; causes are named once, under health.

    \b
      tpuctl sim status
      tpuctl sim status --root /tmp/sim -o json

    Exit codes: 0 when every agent runs and every task is connected, 3 when not (a host failed, left, or
    its agent stopped), 5 when no simulated cluster runs under the root.
    """
    from tpuctl.sim.status import render, sim_status

    doc = sim_status((root or default_root()).absolute())
    emit(dumps(doc) if fmt == "json" else render(doc), None)
    return 0 if doc["healthy"] else EXIT_CLUSTER


@sim.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@root_option
@click.option(
    "--grace",
    metavar="DURATION",
    default="10s",
    show_default=True,
    help="After SIGTERM, how long each job may take to exit before SIGKILL (as `tpuctl run --grace`).",
)
@click.option("--timeout", metavar="DURATION", help="Stop the jobs (SIGTERM) after this long; exit code 4.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="[--] CMD [ARGS]...")
def run(root: Path | None, grace: str, timeout: str | None, command: tuple[str, ...]) -> int:
    """Run CMD under `tpuctl run` on every simulated host at once; each output line is prefixed [task N].

    \b
      tpuctl sim run -- python job.py            # jax.distributed.initialize() needs no arguments
      tpuctl sim run --timeout 5m -- sh -c 'echo $TPUCTL_TASK_ID'
    A simulated host has no TPU: JAX_PLATFORMS=cpu, JAX_NUM_CPU_DEVICES (the host's device count) and
    JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo are set unless already set. Ctrl-C and SIGTERM are forwarded to every job; whatever still runs --grace
    + 10 s later gets SIGKILL. Exit code: the highest of the hosts' (0 when every job exited 0; 3 when
    the cluster failed), 4 after --timeout, 130 after Ctrl-C, 5 when no simulated cluster runs.
    Exit codes: as above.
    """
    from tpuctl.sim.run import SimRun

    grace_s = parse_duration_option(grace, "--grace")
    assert grace_s is not None
    timeout_s = parse_duration_option(timeout, "--timeout")
    return SimRun((root or default_root()).absolute(), list(command), grace=grace_s, timeout=timeout_s, say=say).run()
