"""``tpuctl down``: stop this host's agent, or every host's with ``--all``."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import click

from tpuctl.agent.control import Op, ask
from tpuctl.agent.statedir import resolve_state_dir
from tpuctl.cli.common import say, state_dir_option
from tpuctl.errors import StateError

STOP_TIMEOUT_S = 15.0


@click.command("down")
@click.option(
    "--all", "everyone", is_flag=True, help="Stop every host's agent (and the coordinator), not just this one."
)
@state_dir_option
def down(everyone: bool, state_dir: str | None) -> None:
    """Stop this host's tpuctl agent: it leaves the cluster cleanly and exits.

    \b
      tpuctl down                      # this host leaves; the others see it leave
      tpuctl down --all                # the whole cluster shuts down
    With --all the whole cluster shuts down: every other host's agent learns it at once and exits.
    Without --all the other hosts see this one leave: their `tpuctl status` exits 3 and their
    barriers fail, naming it.

    With --all the agent waits up to 10 s for a coordinator that is reconnecting, restarting or
    moving, and tells it once it answers.

    Exit codes: 0 stopped; 3 with --all, nothing was shut down: the coordinator could not be told
    within 10 s (this agent still runs), the cluster is not running, or this agent was stopping
    anyway; 5 no agent runs for this state dir (or it did not stop
    in time, or with --all it could not take the command: it stopped alone, the cluster was not
    shut down).
    """
    state = resolve_state_dir(state_dir)
    pid = state.live_pid()
    if pid is None:
        raise StateError(f"no tpuctl agent is running for state dir {state.path}", hint="nothing to stop")
    answered = True
    try:
        request = ask(state, Op.DOWN, {"all": everyone}, timeout=STOP_TIMEOUT_S)
    except StateError:
        # The agent is alive but takes no command (still joining: its control socket opens once its mapping
        # is written; or frozen): SIGTERM stops it, and it leaves as for `tpuctl down`. It tells no other
        # host to shut down.
        answered = False
        os.kill(pid, signal.SIGTERM)
    else:
        with contextlib.suppress(StateError):  # it took the command and went before it answered: it stops
            request.answer()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while state.live_pid() is not None:
        if time.monotonic() > deadline:
            raise StateError(
                f"the tpuctl agent (pid {pid}) did not exit within {STOP_TIMEOUT_S:.0f} s",
                hint=f"see {state.log_file}; `kill {pid}` ends it",
            )
        time.sleep(0.05)
    if everyone and not answered:
        raise StateError(
            f"the tpuctl agent (pid {pid}) did not take the command (it is still joining the cluster, or not "
            "answering), so it was stopped with SIGTERM, alone: the cluster was not shut down, and the other "
            "hosts' agents still run",
            hint="run `tpuctl down --all` on a host whose agent is up (`tpuctl status` answers there), "
            "or `tpuctl down` on every host",
        )
    say(f"tpuctl agent (pid {pid}) stopped" + (" and the cluster shut down" if everyone else ""))
