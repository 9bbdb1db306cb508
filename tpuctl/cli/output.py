"""Writing a command's data: stdout by default, or a file written atomically with ``-o``."""

from __future__ import annotations

from pathlib import Path

import click

from tpuctl.errors import InputError
from tpuctl.files import atomic_write


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never a part.

    :func:`tpuctl.files.atomic_write` with its default permissions: a replaced file keeps its mode, a new
    one gets the umask's (as the shell's ``>`` would), not the 0600 of a temp file.
    """
    try:
        atomic_write(path, text)
    except OSError as exc:
        raise InputError(
            f"cannot write {path}: {exc.strerror or exc}", hint="check the folder exists and is writable"
        ) from exc


def emit(text: str, output: str | None) -> None:
    """Print ``text`` on stdout, or write it to ``output`` and say so on stderr."""
    if output is None or output == "-":
        click.echo(text, nl=not text.endswith("\n"))
        return
    write_atomic(Path(output), text)
    click.echo(f"wrote {output}", err=True)
