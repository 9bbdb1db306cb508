"""The one output convention of every data command, decided here for click and the light path alike.

Every command that prints data takes ``--format FORMAT`` (``-f``), ``-o/--output FORMAT`` as kubectl's
alias of it (never a file: ``-o json`` means JSON), and ``--json`` for ``--format json``. A command that
writes a file takes ``--out FILE``. :func:`choose_format` turns what was given into the one format, and
refuses a wrong value with the same message on both paths (exit 2, with a did-you-mean).

Standard library only: ``tpuctl status`` and ``tpuctl env`` parse their options here without click.
"""

# No `from __future__ import annotations` here: that statement imports the __future__ module, a cost
# paid before the light path's request. Annotations naming what only the type checker imports are quoted.
TYPE_CHECKING = False  # typing and collections.abc are not imported on the light path
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

TEXT = "text"
JSON = "json"
FORMAT_NAMES = ("--format", "-f", "--output", "-o")
"""Every spelling of the format option (one option, four names)."""
OUT_NAME = "--out"
"""The option naming a file a command writes (the same name on every command)."""


def choose_format(
    command: str,
    fmt: str | None,
    as_json: bool,
    choices: "Sequence[str]" = (TEXT, JSON),
    *,
    aliases: "Mapping[str, str] | None" = None,
    default: str = TEXT,
) -> str:
    """The format ``command`` prints: ``fmt`` (any of :data:`FORMAT_NAMES`), ``--json``, else ``default``.

    ``aliases`` maps extra accepted names to a choice (``tpuctl env``: ``sh`` is its text). Raises
    InputError (exit 2) for a format that is not one of ``choices``, naming the closest one, and for
    ``--json`` beside another format.
    """
    known = dict(aliases or {})
    if fmt is not None:
        value = known.get(fmt.lower(), fmt.lower())
        if value not in choices:
            from tpuctl.errors import InputError  # a wrong value's alone: not on the light path

            raise InputError(
                f"tpuctl {command}: {fmt!r} is not an output format", hint=format_hint(fmt, choices, known)
            )
        fmt = value
    if as_json:
        if fmt not in (None, JSON):
            from tpuctl.errors import InputError

            raise InputError(f"tpuctl {command}: --json and --format {fmt} disagree", hint="give one of them")
        return JSON
    return fmt if fmt is not None else default


def format_hint(word: str, choices: "Sequence[str]", aliases: "Mapping[str, str]") -> str:
    """``did you mean 'json'? formats: text, json``; for what looks like a file, where files go."""
    from tpuctl.messages import closest, suggestion  # a wrong format's hint only: not on the light path

    listed = "formats: " + ", ".join(choices)
    if "/" in word or "." in word:
        return f"-o/--output names a format ({listed}), never a file: to write {word}, use {OUT_NAME} {word}"
    guess = closest(word.lower(), [*choices, *aliases])
    return f"{suggestion(guess)} {listed}" if guess else listed


def format_help(choices: "Sequence[str]", what: str) -> str:
    """The help line of the format option: its choices, the aliases, what each gives."""
    return f"{'|'.join(choices)} (default {choices[0]}): {what} -o/--output is the same option."


__all__ = ["FORMAT_NAMES", "JSON", "OUT_NAME", "TEXT", "choose_format", "format_help", "format_hint"]
