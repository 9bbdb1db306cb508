"""The data commands' options and output: ``--format``/``-o``/``--json``, ``--out FILE``, JSON documents.

The convention (docs/reference/cli/index.md, "CLI convention") is decided in :mod:`tpuctl.cli.formats` so that the light path
shares it; this module adds the click options and writes the data: stdout, or ``--out FILE`` written
atomically with the mapping's mode (:data:`tpuctl.files.SHARED_MODE`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import click

from tpuctl.cli.formats import FORMAT_NAMES, JSON, OUT_NAME, TEXT, choose_format, format_help
from tpuctl.errors import InputError
from tpuctl.files import SHARED_MODE, atomic_write

F = TypeVar("F", bound=Callable[..., Any])


def format_options(
    what: str,
    choices: Sequence[str] = (TEXT, JSON),
    *,
    aliases: Mapping[str, str] | None = None,
    out_is_the_document: bool = False,
) -> Callable[[F], F]:
    """Add ``-f/-o/--format/--output FORMAT`` and ``--json``; the command gets the chosen ``fmt: str``.

    ``what``: a sentence saying what each format prints (the option's help). ``out_is_the_document``: the
    command's ``--out FILE`` (:func:`out_option`) receives what it prints, so the file's ending chooses
    the format when none is given (:func:`format_for_file`); not so for ``init``, whose ``--out`` is
    the mapping.
    """

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is not None:  # eager: a wrong format is the first problem reported, before missing options
            choose_format(_name(ctx), value, False, choices, aliases=aliases)
        return value

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def command(*args: Any, fmt: str | None, as_json: bool, **kwargs: Any) -> Any:
            name = _name(click.get_current_context())
            chosen = choose_format(name, fmt, as_json, choices, aliases=aliases)
            out = kwargs.get("out")
            if out_is_the_document and isinstance(out, str) and out != "-":
                chosen = format_for_file(name, out, chosen, fmt is not None or as_json, choices)
            return func(*args, fmt=chosen, **kwargs)

        wrapped: Any = click.option("--json", "as_json", is_flag=True, help="Same as --format json.")(command)
        wrapped = click.option(
            *FORMAT_NAMES, "fmt", metavar="FORMAT", default=None, is_eager=True, callback=check,
            help=format_help(choices, what),
        )(wrapped)  # fmt: skip
        return wrapped  # type: ignore[no-any-return]

    return decorate


FILE_FORMATS = {".svg": "svg", ".json": JSON, ".txt": TEXT}
"""File name endings that say a format: ``--out slice.svg`` without a format means ``--format svg``."""


def format_for_file(command: str, out: str, chosen: str, given: bool, choices: Sequence[str]) -> str:
    """The format to write ``out`` in: ``chosen`` when given (``--format``, ``--json``), else the one its
    ending says (:data:`FILE_FORMATS`), else ``chosen``. A given format the ending contradicts, or an
    ending saying a format the command cannot write, is refused (exit 2): a ``.svg`` full of text helps no
    one."""
    ending = Path(out).suffix.lower()
    said = FILE_FORMATS.get(ending)
    if said is None or said == chosen:
        return chosen
    listed = ", ".join(choices)
    if said not in choices:
        raise InputError(
            f"tpuctl {command}: --out {out} ends in {ending} ({said}), but this command writes {listed}",
            hint=f"name the file for one of them, e.g. --out {Path(out).with_suffix('.' + _ending(choices[0]))}",
        )
    if given:
        raise InputError(
            f"tpuctl {command}: --out {out} ends in {ending} ({said}), but the format asked for is {chosen}",
            hint=f"give --format {said}, or a file name for {chosen} "
            f"(e.g. --out {Path(out).with_suffix('.' + _ending(chosen))})",
        )
    return said


def _ending(fmt: str) -> str:
    return next((e.lstrip(".") for e, f in FILE_FORMATS.items() if f == fmt), fmt)


def _name(ctx: click.Context) -> str:
    """``topology show`` for ``tpuctl topology show``: the command as messages name it."""
    return ctx.command_path.partition(" ")[2] or ctx.command_path


def out_option(what: str) -> Callable[[F], F]:
    """``--out FILE``: where the command writes ``what`` (atomically, mode 0644); the command gets ``out``."""
    return click.option(
        OUT_NAME, "out", metavar="FILE", help=f"Write {what} to FILE (atomically, mode 0644) instead of stdout."
    )


def write_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never a part.

    :func:`tpuctl.files.atomic_write` with the device mapping's mode (0644), whatever the umask and
    whatever mode a replaced file had: what tpuctl writes is for other users' jobs and tools to read.
    """
    try:
        atomic_write(path, text, mode=SHARED_MODE)
    except OSError as exc:
        raise InputError(
            f"cannot write {path}: {exc.strerror or exc}", hint="check the folder exists and is writable"
        ) from exc


def emit(text: str, out: str | None) -> None:
    """Print ``text`` on stdout, or write it to ``out`` (``-`` is stdout) and say so on stderr."""
    if out is None or out == "-":
        click.echo(text, nl=not text.endswith("\n"))
        return
    write_file(Path(out), text)
    click.echo(f"wrote {out}", err=True)


def dumps(document: Mapping[str, Any]) -> str:
    """A JSON document as every command prints it: indented, keys in the document's order, newline."""
    return json.dumps(document, indent=2) + "\n"
