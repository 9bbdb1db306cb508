"""``tpuctl preempt``: a preemption notice for this host, as the GCE metadata server or a SIGTERM raises one."""

from __future__ import annotations

import json

import click

from tpuctl.cli.common import parse_duration_option, say, state_dir_option
from tpuctl.cli.formats import JSON
from tpuctl.cli.output import format_options
from tpuctl.errors import InputError

SCHEMA = "tpuctl.preempt/v1"
CALL_TIMEOUT_S = 15.0  # the agent asks the coordinator (its RPC timeout, and a margin)


@click.command("preempt")
@format_options(f"text: one line saying what the cluster heard; json: the notice (schema {SCHEMA}).")
@click.option("--in", "within", metavar="DURATION", default=None,
              help="When this host goes (default 30s, as a GCE preemption): the notice's deadline.")  # fmt: skip
@click.option("--reason", metavar="TEXT", default="", help="Why, for every host's log and `tpuctl status`.")
@state_dir_option
def preempt(fmt: str, within: str | None, reason: str, state_dir: str | None) -> int:
    """Tell the cluster that this host is going away: every host's job saves the same step and exits.

    \b
      tpuctl preempt                                   # a drill: this host goes in 30 s
      tpuctl preempt --in 2m --reason "node drain"     # a scheduler that knows first
      tpuctl preempt --json | jq .deadline_in

    The same notice a spot VM's metadata server (instance/preempted TRUE) or a SIGTERM to `tpuctl run`
    raises: this host's agent tells the coordinator, which tells every host at once. Every job that asks
    (tpuctl.job.should_checkpoint(step) in Python, `tpuctl progress STEP` in a shell loop) gets True on
    every host at the same step: the first step every host can still reach. Once this host's job has
    saved it and exited, this host's agent leaves the cluster; with restart: {policy: rejoin} the others
    wait for it to come back (`tpuctl init` again) and `tpuctl run --max-restarts` resumes the job. When no
    job asks, or the hosts cannot agree in time, the agent leaves at once and every job gets SIGTERM and its
    --grace, as without a notice. Returns once the coordinator recorded the notice.

    Exit codes: 0 the cluster heard the notice, 2 bad option, 3 this host is no longer part of the cluster
    (it failed or left: the notice is ignored), 5 no agent runs for this state dir, or no generation of the
    cluster is up on it.
    """
    from tpuctl.agent.control import Op, call
    from tpuctl.agent.statedir import resolve_state_dir
    from tpuctl.preemption.notice import COMMAND_S, MAX_REASON

    seconds = parse_duration_option(within, "--in") or COMMAND_S
    if len(reason) > MAX_REASON:
        raise InputError(
            f"--reason is {len(reason):,} characters long; at most {MAX_REASON} are kept",
            hint="give a short reason: every host's log and status show it",
        )
    answer = call(
        resolve_state_dir(state_dir), Op.PREEMPT, {"source": "command", "reason": reason, "seconds": seconds},
        timeout=CALL_TIMEOUT_S,
    )  # fmt: skip
    document = {"schema": SCHEMA, **answer}
    if fmt == JSON:
        click.echo(json.dumps(document, indent=2, ensure_ascii=False))
        return 0
    taking = answer.get("taking_part")
    click.echo(
        f"task {answer.get('task')}: notice {answer.get('notice')} of generation {answer.get('generation')} sent to "
        f"every host ({answer.get('source')}{': ' + str(answer['reason']) if answer.get('reason') else ''}), this "
        f"host goes in {answer.get('deadline_in')} s"
    )
    if not taking:
        say("tpuctl: no process of this host's job asks whether to checkpoint: this host leaves once the hosts "
            "agree there is no step (every job then gets SIGTERM and its grace)")  # fmt: skip
    return 0
