"""``tpuctl sim up`` / ``tpuctl sim down``: a whole simulated cluster on this machine."""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from tpuctl.agent.statedir import STATE_DIR_ENV
from tpuctl.cli.common import say
from tpuctl.errors import ClusterError, InputError

INIT_TIMEOUT_S = 180.0


def default_root() -> Path:
    base = os.environ.get(STATE_DIR_ENV)
    return Path(base) / "sim" if base else Path(f"/tmp/tpuctl-sim-{os.getuid()}")


root_option = click.option(
    "--root",
    metavar="DIR",
    type=click.Path(path_type=Path),
    help="Where the hosts' state dirs go (default /tmp/tpuctl-sim-UID).",
)


@click.group("sim")
def sim() -> None:
    """A whole cluster on this machine: real tpuctl processes on 127.0.0.x, simulated TPUs."""


@sim.command("up")
@click.argument("accelerator", required=False)
@click.option(
    "--config", "-c", metavar="FILE", help="Use this spec (backend sim, loopback hosts) instead of generating one."
)
@root_option
@click.option("--hold", is_flag=True, help="Stay in the foreground; Ctrl-C tears the cluster down.")
def up(accelerator: str | None, config: str | None, root: Path | None, hold: bool) -> None:
    """Start one `tpuctl init` per host of ACCELERATOR (e.g. v4-32), show the topology, pass a barrier.

    \b
      tpuctl sim up v4-32          # 4 hosts on 127.0.0.2-5
      tpuctl --state-dir /tmp/tpuctl-sim-$UID/host-2 status   (or: tpuctl sim status)
      tpuctl sim down
    Ctrl-C during start-up (or with --hold, at any time) tears everything down.
    """
    from tpuctl.render.text import render_text
    from tpuctl.sim import cluster as sc
    from tpuctl.spec.yamlfile import load_spec, load_spec_text

    root = (root or default_root()).absolute()
    root.mkdir(parents=True, exist_ok=True)
    sc.check_root(root)
    if config:
        spec = load_spec(config)
        spec_path = Path(config).absolute()
    elif accelerator:
        from tpuctl.tpu.slice import resolve_slice

        count = resolve_slice(accelerator=accelerator).num_hosts
        hosts = sc.loopback_hosts(count)
        text = sc.sim_spec_text(accelerator, hosts, sc.free_port(hosts[0]), root)
        spec_path = root / "cluster.yaml"
        spec = load_spec_text(text, str(spec_path))
        spec_path.write_text(text)
    else:
        raise InputError("say which slice to simulate", hint="e.g. tpuctl sim up v4-32, or --config FILE")
    if spec.backend != "sim":
        raise InputError(f"{spec_path}: backend is {spec.backend!r}; sim up needs backend: sim")
    hosts = list(spec.hosts)
    say(f"starting {len(hosts)} hosts of {spec.slice.describe()} under {root}")
    started = time.monotonic()
    try:
        procs = sc.start_inits(root, spec_path, len(hosts))
        runs = sc.wait_all(procs, INIT_TIMEOUT_S)
        sc.require_up(runs, hosts)
        elapsed = time.monotonic() - started
        digests = set(sc.mapping_digests(root, len(hosts)))
        if len(digests) != 1:
            raise ClusterError(f"the hosts wrote {len(digests)} different mapping files; they must be identical")
        click.echo(render_text(spec.slice, hosts))
        say(f"all {len(hosts)} hosts up in {elapsed:.2f} s; every host wrote the same mapping")
        barrier_started = time.monotonic()
        barrier_runs = sc.wait_all(sc.start_barriers(root, len(hosts), "sim-up", "60s"), 60.0)
        sc.require_up(barrier_runs, hosts)
        say(f"barrier 'sim-up' passed on all {len(hosts)} hosts in {time.monotonic() - barrier_started:.2f} s")
    except BaseException:
        say("tearing the simulated cluster down")
        sc.stop_hosts(root)
        raise
    say(f"status: tpuctl status --state-dir {sc.host_dir(root, 0)}    stop: tpuctl sim down --root {root}")
    if hold:
        say("holding; Ctrl-C tears the cluster down")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            stopped = sc.stop_hosts(root)
            say(f"stopped {len(stopped)} agents")


@sim.command("down")
@root_option
def down(root: Path | None) -> None:
    """Stop every agent of the simulated cluster (SIGTERM, then SIGKILL after 10 s)."""
    from tpuctl.sim import cluster as sc

    root = (root or default_root()).absolute()
    stopped = sc.stop_hosts(root)
    say(f"stopped {len(stopped)} agents under {root}" if stopped else f"no simulated hosts running under {root}")
