"""Writing a command's data: stdout by default, or a file written atomically with ``-o``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import click

from tpuctl.errors import InputError


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never a part."""
    folder = path.parent if str(path.parent) else Path(".")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise InputError(
            f"cannot write {path}: {exc.strerror}", hint="check the folder exists and is writable"
        ) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def emit(text: str, output: str | None) -> None:
    """Print ``text`` on stdout, or write it to ``output`` and say so on stderr."""
    if output is None or output == "-":
        click.echo(text, nl=not text.endswith("\n"))
        return
    write_atomic(Path(output), text)
    click.echo(f"wrote {output}", err=True)
