"""The ``tpuctl`` command line: a click group whose commands load lazily, one module per command.

Start-up is kept cheap: this module imports only click; a command's module (and whatever grpc,
tensorflow or jax it needs) is imported when that command runs. ``tpuctl --help`` lists the commands
from the table below without importing any of them.

Errors: a ``TpuctlError`` prints ``tpuctl: error: ...`` (plus its hint) on stderr and exits with its
code; click usage errors exit 2; Ctrl-C exits 130; anything else is a bug: exit 1 with a short
message, and the traceback with ``--debug`` (or ``TPUCTL_DEBUG=1``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

import click

from tpuctl import __version__
from tpuctl.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, TpuctlError

# name -> (module:attribute, one-line help shown by `tpuctl --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("tpuctl.cli.init:init", "Join this host to the cluster and write the device mapping."),
    "barrier": ("tpuctl.cli.barrier:barrier", "Wait until every host reaches the named barrier."),
    "status": ("tpuctl.cli.status:status", "Show every host's state as the coordinator sees it."),
    "down": ("tpuctl.cli.down:down", "Stop this host's agent (or the whole cluster with --all)."),
    "env": ("tpuctl.cli.env:env", "Print the environment a job on this host needs."),
    "run": ("tpuctl.cli.run:run", "Run a job with the cluster's environment and watch the cluster."),
    "topology": ("tpuctl.cli.topology:topology", "Show a slice: hosts, chips, device ids, links."),
    "mesh": ("tpuctl.cli.mesh:mesh", "Plan a logical device mesh offline."),
    "validate": ("tpuctl.cli.validate:validate", "Check a cluster spec and report every problem."),
    "sim": ("tpuctl.cli.sim:sim", "Run a whole simulated cluster on this machine."),
}


class LazyGroup(click.Group):
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
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _available(name: str) -> bool:
    module_name = COMMANDS[name][0].split(":")[0]
    return importlib.util.find_spec(module_name) is not None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="tpuctl")
@click.option("--debug", is_flag=True, envvar="TPUCTL_DEBUG", help="Show tracebacks for internal errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """tpuctl: bring up a TPU pod's hosts as one cluster, before any training job starts.

    \b
    On every host:   tpuctl init --config cluster.yaml
    In job scripts:  tpuctl barrier NAME
    To look around:  tpuctl topology show --accelerator v4-32
    Everything on one machine (simulated TPUs): tpuctl sim up v4-32

    Exit codes: 0 ok, 1 internal error, 2 bad input, 3 cluster failure, 4 deadline exceeded,
    5 local state (already/not running), 6 no TPU found, 7 bad mapping file, 130 interrupted.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point: run the CLI and turn every failure into a message and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("TPUCTL_DEBUG", "") not in ("", "0")
    try:
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
        click.echo(f"tpuctl: error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # a bug: say so plainly, traceback only on request
        if debug:
            traceback.print_exc()
        click.echo(f"tpuctl: internal error: {type(exc).__name__}: {exc}", err=True)
        if not debug:
            click.echo("hint: re-run with --debug for the traceback, and please report it", err=True)
        sys.exit(EXIT_INTERNAL)
    sys.exit(result if isinstance(result, int) else 0)
