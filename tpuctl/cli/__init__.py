"""The ``tpuctl`` command line. :func:`main` is the console script's entry point.

Plain ``barrier``, ``status`` and ``env`` calls, the ones job scripts make every step, run through
:mod:`tpuctl.cli.light` on the standard library alone; everything else (and ``--help``, and any usage
error) goes to the click application in :mod:`tpuctl.cli.app`, whose commands load lazily.

Errors: a ``TpuctlError`` prints ``tpuctl: error: ...`` (plus its hint) on stderr and exits with its
code; usage errors exit 2; Ctrl-C exits 130; anything else is a bug: exit 1 with a short message, and
the traceback with ``--debug`` (or ``TPUCTL_DEBUG=1``). This module imports only the standard library
(and :mod:`tpuctl.errors` when a command fails).
"""

# No `from __future__ import annotations` here: that statement imports the __future__ module, a cost
# paid before the light path's request. Annotations naming what only the type checker imports are quoted.
import os
import sys

TYPE_CHECKING = False  # typing and collections.abc are not imported on the light path
if TYPE_CHECKING:
    from collections.abc import Sequence

    from tpuctl.errors import TpuctlError


def report_error(exc: "TpuctlError") -> int:
    """Print a tpuctl error (and its hint) on stderr; its exit code. An interruption (exit 128 + a signal's
    number) is not an error: ``tpuctl: interrupted; ...``."""
    label = "" if exc.exit_code >= 128 else "error: "
    sys.stderr.write(f"tpuctl: {label}{exc.message}\n" + (f"hint: {exc.hint}\n" if exc.hint else ""))
    return exc.exit_code


def report_bug(exc: BaseException, debug: bool) -> int:
    """Print an internal error plainly (the traceback only with ``debug``); exit code 1."""
    if debug:
        import traceback

        traceback.print_exc()
    from tpuctl.errors import EXIT_INTERNAL

    sys.stderr.write(f"tpuctl: internal error: {type(exc).__name__}: {exc}\n")
    if not debug:
        sys.stderr.write("hint: re-run with --debug for the traceback, and please report it\n")
    return EXIT_INTERNAL


def main(argv: "Sequence[str] | None" = None) -> None:
    """Console-script entry point: run the command and turn every failure into a message and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("TPUCTL_DEBUG", "") not in ("", "0")
    if getattr(sys.stdout, "errors", None) == "strict" and hasattr(sys.stdout, "reconfigure"):
        # A table cell cut with "…" (tpuctl.messages.cell) on a terminal that is not UTF-8 prints "?", not
        # a UnicodeEncodeError (UTF-8 is Python's default, also under the C locale).
        sys.stdout.reconfigure(errors="replace")
    from tpuctl.cli.light import run_light

    try:
        # a shell asking for completions (tpuctl completion's script) is click's to answer
        code = None if "_TPUCTL_COMPLETE" in os.environ else run_light(args)
    except KeyboardInterrupt:
        from tpuctl.errors import EXIT_INTERRUPTED

        sys.stderr.write("tpuctl: interrupted\n")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        # not at the top: barrier, status and env load tpuctl.errors after their request, or to raise one
        from tpuctl.errors import TpuctlError

        sys.exit(report_error(exc) if isinstance(exc, TpuctlError) else report_bug(exc, debug))
    if code is not None:
        sys.exit(code)
    from tpuctl.cli.app import main as run_app

    run_app(args, debug)
