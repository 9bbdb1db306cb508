"""``tpuctl progress STEP``: the job reached STEP (run by :mod:`tpuctl.cli.light`)."""

from __future__ import annotations

import click

from tpuctl.cli.common import state_dir_option
from tpuctl.cli.light import run_progress


@click.command("progress")
@click.argument("step")
@click.option("--checkpointed", is_flag=True, help="A checkpoint of STEP is complete (durable), not only the step.")
@state_dir_option
def progress(step: str, checkpointed: bool, state_dir: str | None) -> int:
    """Tell this host's agent that the job reached STEP, for the watchdog.

    \b
    A shell job's loop reports each step; the watchdog is armed by the first report:
      for step in $(seq 1000); do train_step; tpuctl progress "$step"; done
    Python jobs call tpuctl.job.progress(step) instead (cheaper: no process per step); jobs that print
    their step need neither: tpuctl run --progress-regex 'step (\\d+)'. Never waits long: one line to the
    agent. Steps only grow; the script's process id names the reporting process.

    Exit codes: 0 sent (or no agent listens: said on stderr, the job goes on), 2 STEP is not a whole
    number, 5 the state dir is not this user's.
    """
    return run_progress(step, checkpointed, state_dir)
