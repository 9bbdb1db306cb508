"""``tpuctl env``: the environment a job on this host needs, from the running cluster."""

from __future__ import annotations

from typing import Any

import click

from tpuctl.agent.statedir import StateDir, resolve_state_dir
from tpuctl.cli.common import state_dir_option
from tpuctl.errors import ClusterError, StateError
from tpuctl.job.env import JobEnv

INFO_TIMEOUT_S = 10.0


@click.command("env")
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(["sh", "json"]),
    default="sh",
    show_default=True,
    help="sh: export lines for eval; json: one object of NAME: value.",
)
@state_dir_option
def env(fmt: str, state_dir: str | None) -> None:
    """Print the environment a job on this host needs: DTensor, JAX, Cloud TPU and tpuctl variables.

    \b
      eval "$(tpuctl env)"                  # bash/zsh/sh; values are shell-quoted
      tpuctl env --format json | jq -r .JAX_COORDINATOR_ADDRESS
    `tpuctl run -- CMD` starts CMD with this environment and also watches the cluster.
    Exit codes: 0 ok, 3 the cluster is in error, 5 no agent runs for this state dir, 7 bad mapping file.
    """
    state = resolve_state_dir(state_dir)
    job_env = cluster_job_env(state)
    click.echo(job_env.to_sh() if fmt == "sh" else job_env.to_json(), nl=False)


def cluster_job_env(state: StateDir, *, info: dict[str, Any] | None = None) -> JobEnv:
    """This host's job environment, from its live agent and mapping file.

    Refuses (ClusterError) when the cluster is already in error or shutting down.
    """
    from tpuctl.agent.control import call
    from tpuctl.job.env import job_environment

    if info is None:
        info = call(state, "info", timeout=INFO_TIMEOUT_S)
    report = call(state, "wait_error", {"timeout": 0}, timeout=INFO_TIMEOUT_S)
    if report.get("error"):
        raise ClusterError(f"{report['error']}", hint="`tpuctl status` shows every host; restart the cluster")
    if report.get("shutdown") or report.get("stopping"):
        raise StateError(f"the tpuctl agent for state dir {state.path} is shutting down")
    from tpuctl.mapping.file import read_mapping

    path = info.get("mapping")
    if not path:
        raise StateError(f"the agent for state dir {state.path} names no mapping file", hint="restart tpuctl init")
    return job_environment(info, read_mapping(path), state_dir=str(state.path.absolute()))
