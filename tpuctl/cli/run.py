"""``tpuctl run [--] CMD ...``: run a job with the cluster's environment (:mod:`tpuctl.job.runner`)."""

from __future__ import annotations

import click

from tpuctl.agent.statedir import resolve_state_dir
from tpuctl.cli.common import WholeNumber, parse_duration_option, say, state_dir_option


@click.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option(
    "--grace",
    metavar="DURATION",
    default="10s",
    show_default=True,
    help="After SIGTERM, how long the job may take to exit before SIGKILL.",
)
@click.option(
    "--max-restarts",
    type=WholeNumber(0, 1000),
    default=0,
    show_default=True,
    help="Restart the job up to N times when its cluster re-forms as a new generation (spec restart.policy: rejoin).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Start the job even when the cluster is not healthy (a host failed or left; see `tpuctl status`).",
)
@click.option(
    "--progress-regex",
    metavar="REGEX",
    help="Read the job's step from its output lines (group 'step', or the first group), for the watchdog; "
    "every line still passes through unchanged. E.g. 'step (\\d+)'.",
)
@state_dir_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED, metavar="[--] CMD [ARGS]...")
def run(
    grace: str,
    max_restarts: int,
    force: bool,
    progress_regex: str | None,
    state_dir: str | None,
    command: tuple[str, ...],
) -> int:
    """Run CMD with this host's job environment (see `tpuctl env`) and watch the cluster.

    The job starts only on a healthy (or degraded) cluster, as `tpuctl status` judges it: when a host
    failed or left, it is not started (exit 3, naming the host and why) unless --force is given.

    \b
      tpuctl run -- python train.py --steps 1000
      tpuctl run --state-dir /tmp/tpuctl-sim-$UID/host-1 -- python job.py
    When any host fails (or the cluster is shut down, or this host's agent disappears), the job gets
    SIGTERM, then SIGKILL after --grace, and the exit code is 3 with a root-cause table on stderr:
    which host failed first, when, why; then every other host. Otherwise the exit code is the job's
    (128+N for signal N; 127 command not found, 126 not executable). Signals are forwarded to the job.

    With --max-restarts N (and the spec's restart: {policy: rejoin}), a generation's end stops the job,
    waits for the next generation and starts it again (TPUCTL_RESTART_COUNT counts), up to N times;
    then exit 3 with a table of every generation. Under restart policy fail (the default) it warns and
    restarts nothing.

    With --progress-regex, the job's stdout and stderr pass through tpuctl run (unchanged, line by
    line; PYTHONUNBUFFERED=1 is set for Python jobs) and each line matching REGEX reports its step to
    this host's agent, as tpuctl.job.progress(step) would: the watchdog needs no code change.

    On a host that stands by (a spare, or a host of a slice the generation left out), it waits, saying
    so on stderr, until a generation takes the host in, then starts CMD with that generation's
    environment; for the spec's restart.timeout at most (then exit 4, CMD not started).

    Exit codes: the job's; 2 bad --grace or --progress-regex; 3 cluster failure (job stopped, or not started), 4 this host
    stood by for restart.timeout without taking a place, 5 no agent, 126/127 CMD cannot be run.
    """
    seconds = parse_duration_option(grace, "--grace")
    assert seconds is not None
    pattern = None
    if progress_regex is not None:
        from tpuctl.job.printed import compile_pattern

        try:
            pattern = compile_pattern(progress_regex)
        except ValueError as exc:
            from tpuctl.errors import InputError

            raise InputError(
                f"--progress-regex: {exc}",
                hint="give a pattern whose group named step, or first group, is the step: 'step (\\d+)' or "
                "'(?P<step>\\d+)/\\d+ steps'",
            ) from None
    state = resolve_state_dir(state_dir)
    from tpuctl.job.runner import JobRunner

    return JobRunner(
        list(command), state, grace=seconds, say=say, max_restarts=max_restarts, force=force, progress_regex=pattern
    ).run()
