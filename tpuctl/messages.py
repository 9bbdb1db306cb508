"""The wording shared by every message tpuctl prints: suggestions, counts, bounded lists, plain tables.

Why one module: these phrases were written separately in the spec checker, the slice model, the mesh
builder, the mapping and the CLI, and drifted (``did you mean v4-8?`` beside ``did you mean 'jax'?``,
two problem lists, five tables). A user reads them side by side, so they are spelled once here. Pure
standard library, no I/O: the core packages (``tpu``, ``mesh``, ``spec``, ``mapping``) import it freely.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing and collections.abc are not imported on the light path
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

__all__ = ["closest", "count", "did_you_mean", "listed", "plural", "sample", "shown", "suggestion", "table"]

SHOWN_CHARS = 120
"""How much of a name or key ``shown`` quotes before eliding the rest."""


def closest(word: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str | None:
    """The choice most like ``word`` (difflib's ratio at least ``cutoff``), or None when none is close."""
    import difflib  # not at the top: barrier/status/env import this module and rarely suggest

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return close[0] if close else None


def suggestion(guess: str) -> str:
    """``did you mean 'v4-8'?``: the one wording of a suggestion, the value quoted as Python quotes it."""
    return f"did you mean {guess!r}?"


def did_you_mean(word: str, choices: Iterable[str], *, cutoff: float = 0.6, otherwise: str | None = None) -> str:
    """``did you mean 'port'?`` when a choice is close to ``word``; else ``otherwise``.

    ``otherwise`` defaults to ``expected one of a, b, c`` (the choices in the order given); pass a
    sentence of your own (``"backends are sim, jax"``), or ``""`` when the caller adds nothing.
    """
    options = list(choices)
    guess = closest(word, options, cutoff=cutoff)
    if guess is not None:
        return suggestion(guess)
    if otherwise is not None:
        return otherwise
    return "expected one of " + ", ".join(options)


def plural(count: int, noun: str) -> str:
    """``1 host``, ``4 hosts``, ``2 entries`` (the count as written, no separators)."""
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun[:-1]}ies" if noun.endswith("y") else f"{count} {noun}s"


def count(n: int) -> str:
    """2304 -> "2,304"."""
    return f"{n:,}"


def shown(name: str, limit: int = SHOWN_CHARS) -> str:
    """``repr(name)``, elided in the middle past ``limit`` characters, saying how long it was."""
    if len(name) <= limit:
        return repr(name)
    half = limit // 2
    return f"{name[:half]!r}...{name[-half:]!r} ({count(len(name))} characters)"


def listed(problems: Sequence[str], *, limit: int = 10) -> str:
    """Problems one per line, indented two spaces, the first ``limit`` of them then ``... and N more``.

    A problem spanning several lines keeps its continuation lines under its first one.
    """
    shown = ["  " + p.replace("\n", "\n  ") for p in problems[:limit]]
    if len(problems) > limit:
        shown.append(f"  ... and {len(problems) - limit:,} more")
    return "\n".join(shown)


def sample(items: Iterable[object], *, limit: int = 10, total: int | None = None) -> str:
    """``a, b, c, ... and 2,271 more``: a bounded list for one line of a message (hosts of a large pod).

    ``total``: ``items`` is already a sample of that many (a service that sends a few names and a
    count); the "more" counts the ones not shown out of ``total``.
    """
    values = [str(i) for i in items]
    shown = values[:limit]
    more = (len(values) if total is None else max(total, len(values))) - len(shown)
    if more <= 0:
        return ", ".join(shown)
    return ", ".join(shown) + f", ... and {more:,} more"


def table(rows: Sequence[Sequence[str]], *, indent: str = "") -> list[str]:
    """Left-aligned columns two spaces apart; the last column is not padded, trailing spaces are stripped.

    The first row is usually the header. Rows may be shorter than others: a column's width counts only
    the rows where it is not the last cell.
    """
    widths: list[int] = []
    for row in rows:
        for i, cell in enumerate(row[:-1]):
            if i == len(widths):
                widths.append(0)
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in rows:
        cells = [f"{cell:<{widths[i]}}" for i, cell in enumerate(row[:-1])] + list(row[-1:])
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines
