"""``tpuctl env``: the environment a job on this host needs, from the running cluster."""

from __future__ import annotations

import click

from tpuctl.cli.common import state_dir_option
from tpuctl.cli.light import ENV_ALIASES, ENV_FORMATS, run_env
from tpuctl.cli.output import format_options


@click.command("env")
@format_options(
    "text (or sh): export lines for eval; json: one document (schema tpuctl.env/v1: set, unset).",
    ENV_FORMATS,
    aliases=ENV_ALIASES,
)
@state_dir_option
def env(fmt: str, state_dir: str | None) -> int:
    """Print the environment a job on this host needs: DTensor, JAX, PyTorch/XLA, Cloud TPU and tpuctl variables.

    \b
      eval "$(tpuctl env)"                  # bash/zsh/sh; values are shell-quoted
      tpuctl env -o json | jq -r .set.JAX_COORDINATOR_ADDRESS
    Variables it does not set are removed (unset lines), so stale ones never reach the job.
    `tpuctl run -- CMD` starts CMD with this environment and also watches the cluster.
    Exit codes: 0 ok, 3 the cluster is in error (or this host is a spare standing by: no job environment
    until it takes a place), 5 no agent runs for this state dir, 7 bad mapping file.
    """
    return run_env(fmt, state_dir)
