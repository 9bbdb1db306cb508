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
    """Tell this host's agent that the job reached STEP, for the watchdog; print `checkpoint STEP`
    when the job should checkpoint now.

    \b
    A shell job's loop reports each step; the watchdog is armed by the first report:
      for step in $(seq 1000); do train_step; tpuctl progress "$step"; done
    After a preemption notice, every host's loop gets `checkpoint N` on stdout at the same step N (the
    step the hosts agreed on); save it, report it and stop:
      if [ "$(tpuctl progress "$step")" = "checkpoint $step" ]; then
        save "$step" && tpuctl progress --checkpointed "$step"; exit 0
      fi
    Python jobs call tpuctl.job.progress(step) and tpuctl.job.should_checkpoint(step) instead (cheaper:
    no process per step); jobs that print their step need neither: tpuctl run --progress-regex
    'step (\\d+)'. Answered at once, or within the agreement's bound while the hosts agree on a step
    (at most 10 s). Steps only grow; the script's process id names the reporting process.

    Exit codes: 0 sent (or no agent listens: said on stderr, the job goes on), 2 STEP is not a whole
    number, 5 the state dir is not this user's.
    """
    return run_progress(step, checkpointed, state_dir)
