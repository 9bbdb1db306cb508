"""The ``tpuctl`` click application: a group whose commands load lazily, one module per command.

Start-up is kept cheap: this module imports only click; a command's module (and whatever grpc,
tensorflow or jax it needs) is imported when that command runs. ``tpuctl --help`` lists the commands
from the table below without importing any of them. (Plain ``barrier``, ``status`` and ``env`` calls
never get here: :func:`tpuctl.cli.main` runs them through :mod:`tpuctl.cli.light` first.)

Errors: a ``TpuctlError`` prints ``tpuctl: error: ...`` (plus its hint) on stderr and exits with its
code; click usage errors exit 2; Ctrl-C exits 130; anything else is a bug: exit 1 with a short
message, and the traceback with ``--debug`` (or ``TPUCTL_DEBUG=1``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

import click

from tpuctl import __version__
from tpuctl.cli import report_bug, report_error
from tpuctl.cli.common import apply_log_level, log_options, with_log_options
from tpuctl.errors import EXIT_INTERRUPTED, TpuctlError
from tpuctl.loglevel import LOG_LEVEL_ENV, chosen_level

# name -> (module:attribute, one-line help shown by `tpuctl --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("tpuctl.cli.init:init", "Join this host to the cluster and write the device mapping."),
    "barrier": ("tpuctl.cli.barrier:barrier", "Wait until every host reaches the named barrier."),
    "progress": ("tpuctl.cli.progress:progress", "Tell this host's agent the job reached a step (the watchdog)."),
    "status": ("tpuctl.cli.status:status", "Show every host's state as the coordinator sees it."),
    "dump": ("tpuctl.cli.dump:dump", "Take every host's job stacks and group hosts by where they are (the black box)."),
    "goodput": ("tpuctl.cli.goodput:goodput", "Show where the cluster's wall time went (the goodput ledger)."),
    "preempt": ("tpuctl.cli.preempt:preempt", "Tell the cluster this host is going away: every job saves the same step."),
    "down": ("tpuctl.cli.down:down", "Stop this host's agent (or the whole cluster with --all)."),
    "env": ("tpuctl.cli.env:env", "Print the environment a job on this host needs."),
    "run": ("tpuctl.cli.run:run", "Run a job with the cluster's environment and watch the cluster."),
    "topology": ("tpuctl.cli.topology:topology", "Show a slice: hosts, chips, device ids, links."),
    "mesh": ("tpuctl.cli.mesh:mesh", "Plan a logical device mesh offline."),
    "validate": ("tpuctl.cli.validate:validate", "Check a cluster spec and report every problem."),
    "detect": ("tpuctl.cli.detect:detect", "Show the spec init detects without --config, and each value's source."),
    "sim": ("tpuctl.cli.sim:sim", "Run a whole simulated cluster on this machine."),
    "doctor": ("tpuctl.cli.doctor:doctor", "Check this host before a start: TPU devices, ports, peers, state."),
    "logs": ("tpuctl.cli.logs:logs", "Show this host's agent log (--follow it)."),
    "completion": ("tpuctl.cli.completion:completion", "Print the shell completion script: bash, zsh or fish."),
}


class SuggestingGroup(click.Group):
    """A group whose unknown command names get the close ones suggested, with any click 8 (click's own
    suggestion, from 8.2, reads ``self.commands``, which a lazy group leaves empty)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and not ctx.resilient_parsing and self.get_command(ctx, name) is None:
            ctx.fail(f"No such command {name!r}.{suggest(name, self.list_commands(ctx))}")
        return super().resolve_command(ctx, args)


class LazyGroup(SuggestingGroup):
    """A group that imports a command's module only when that command is invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if _available(name)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or not _available(cmd_name):
            return None
        module_name, attr = entry[0].split(":")
        command = getattr(importlib.import_module(module_name), attr)
        assert isinstance(command, click.Command)
        return with_log_options(command)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def suggest(word: str, names: list[str]) -> str:
    """`` Did you mean 'status'?`` for the closest of ``names`` (difflib, ratio 0.7 and up: at click's 0.6,
    ``stauts`` would also suggest ``restart``), else nothing."""
    import difflib

    close = difflib.get_close_matches(word.lower(), names, n=3, cutoff=0.7)
    if not close:
        return ""
    if len(close) == 1:
        return f" Did you mean {close[0]!r}?"
    return f" Did you mean one of: {', '.join(close)}?"


def _available(name: str) -> bool:
    module_name = COMMANDS[name][0].split(":")[0]
    return importlib.util.find_spec(module_name) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", "-V", prog_name="tpuctl", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, envvar="TPUCTL_DEBUG", help="Show tracebacks for internal errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """tpuctl: bring up a TPU pod's hosts as one cluster, before any training job starts.

    \b
    On every host:   tpuctl init --config cluster.yaml
    In job scripts:  tpuctl barrier NAME
    To look around:  tpuctl topology show --accelerator v4-32
    Everything on one machine (simulated TPUs): tpuctl sim up v4-32

    Every data command takes --format text|json (-o json, --json); files go to --out FILE;
    --log-level LEVEL (or -v, -vv, TPUCTL_LOG_LEVEL) on any command; tpuctl completion bash|zsh|fish.

    Exit codes: 0 ok, 1 internal error, 2 bad input, 3 cluster failure, 4 deadline exceeded,
    5 local state (already/not running), 6 no TPU found, 7 bad mapping file, 130 interrupted
    (128+N for signal N).
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


cli.params.extend(log_options())


def main(args: list[str], debug: bool) -> None:
    """Run the click application and turn every failure into a message and an exit code."""
    try:
        level = chosen_level(None, 0, os.environ.get(LOG_LEVEL_ENV))
        if level is not None:
            apply_log_level(level)
        result: Any = cli.main(args=args, prog_name="tpuctl", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("tpuctl: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
        click.echo("tpuctl: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except TpuctlError as exc:
        sys.exit(report_error(exc))
    except Exception as exc:  # a bug: say so plainly, traceback only on request
        sys.exit(report_bug(exc, debug))
    sys.exit(result if isinstance(result, int) else 0)
