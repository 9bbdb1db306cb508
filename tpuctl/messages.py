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

__all__ = [
    "ELLIPSIS",
    "cell",
    "closest",
    "count",
    "did_you_mean",
    "listed",
    "plural",
    "sample",
    "shown",
    "suggestion",
    "table",
]

SHOWN_CHARS = 120
"""How much of a name or key ``shown`` quotes before eliding the rest."""
ELLIPSIS = "\u2026"
"""What ends a table cell cut to its column's width (one character: the width stays exact)."""
CELL_CHARS = 60
"""The widest cell of a table of free text (``table(..., widths=CELL_CHARS)``): a cause or a message
longer than this is cut with ``ELLIPSIS``; the document (``--format json``) has the whole text."""


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


def cell(text: str, width: int = CELL_CHARS) -> str:
    """``text`` on one line (runs of white space as one space), cut to ``width`` characters with
    ``ELLIPSIS`` as the last one: a table cell that keeps its column's width."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: max(0, width - 1)] + ELLIPSIS


def table(
    rows: Sequence[Sequence[str]], *, indent: str = "", widths: Sequence[int | None] | int | None = None
) -> list[str]:
    """Left-aligned columns two spaces apart; the last column is not padded, trailing spaces are stripped.

    The first row is usually the header. Rows may be shorter than others: a column's width counts only
    the rows where it is not the last cell. With ``widths``, every cell is cut to that many characters
    (:func:`cell`: one line, ``ELLIPSIS`` at the cut), so one long cause never widens every row; a
    sequence gives each column its own limit (None: that column is not cut).
    """
    if widths is not None:
        limits: list[int | None] = (
            [widths] * max(map(len, rows), default=0) if isinstance(widths, int) else list(widths)
        )
        rows = [[_cut(text, limits[i] if i < len(limits) else None) for i, text in enumerate(row)] for row in rows]
    columns: list[int] = []
    for row in rows:
        for i, text in enumerate(row[:-1]):
            if i == len(columns):
                columns.append(0)
            columns[i] = max(columns[i], len(text))
    lines = []
    for row in rows:
        cells = [f"{text:<{columns[i]}}" for i, text in enumerate(row[:-1])] + list(row[-1:])
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def _cut(text: str, width: int | None) -> str:
    return text if width is None else cell(text, width)
