"""The timeline on disk: ``STATE_DIR/goodput.jsonl`` in task 0's state dir, one JSON object a line.

The first line is the header (schema ``tpuctl.goodput-journal/v1``, the cluster, when init started);
every later line is a record that replaces what it names: a generation's whole record (the newest one
written wins), the folded sum of old generations, the notes, the ``checkpointing`` flag, or ``seen`` (the
timeline was current then). Reading is replaying the lines in order (:meth:`Timeline.from_lines`).

* **Appends** (``O_APPEND``, one ``write`` per batch of lines): an event (a generation's start, its end,
  a failure, a hang, a host's return, a preemption) is written at once and fsynced; progress figures and
  ``seen`` at most every ``MARK_EVERY_S``, not fsynced (a process crash keeps them; a machine crash may lose
  the last few seconds of figures, never an event).
* **Bounded**: past ``COMPACT_AT`` bytes the journal is rewritten as exactly the timeline's lines (atomically:
  a temp file, fsync, rename), at most ``KEEP_GENERATIONS`` generations of bounded size (about 100 kB
  at most). A journal over ``READ_LIMIT`` is not one this code wrote and is refused.
* **A cut last line** (the process died in the middle of a write: no newline at the end) is dropped and
  said in the ledger's notes; any other line that is not a record is a corrupt journal: :class:`JournalError`
  names the file, the line and what is wrong.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tpuctl.errors import StateError
from tpuctl.files import FileTooLarge, NotRegularFile, atomic_write, read_regular_file
from tpuctl.goodput.timeline import Timeline

JOURNAL_NAME = "goodput.jsonl"
"""The journal's name in task 0's state dir (``StateDir.goodput_journal``)."""
COMPACT_AT = 1 << 20
"""Rewrite the journal as the timeline's own lines once it grows past this many bytes."""
READ_LIMIT = 8 << 20
"""A journal larger than this is refused (this code compacts long before)."""
MARK_EVERY_S = 2.0
"""Progress figures and ``seen`` are written at most this often (a restarted coordinator's estimate of when
its predecessor stopped is at most this old)."""
CUT_SHORT = "the journal's last line was cut short (the coordinator died while writing it): dropped"


class JournalError(StateError):
    """The journal cannot be read as one (corrupt, of another cluster, not a regular file)."""


def load(path: Path) -> Timeline:
    """The timeline the journal at ``path`` holds. FileNotFoundError when there is none; JournalError when
    it is not a journal this code wrote (naming the line and what is wrong)."""
    hint = f"move {path} aside: the coordinator then starts a new ledger (the time before it is not counted)"
    try:
        data = read_regular_file(path, READ_LIMIT)
    except FileNotFoundError:
        raise
    except (NotRegularFile, FileTooLarge) as exc:
        raise JournalError(f"goodput journal {path}: {exc.strerror}", hint=hint) from None
    except OSError as exc:
        raise JournalError(f"goodput journal {path} cannot be read: {exc.strerror or exc}", hint=hint) from None
    cut = bool(data) and not data.endswith(b"\n")
    texts = data.split(b"\n")
    texts.pop()  # after the last newline: "" or a line cut short
    records: list[object] = []
    for number, text in enumerate(texts, start=1):
        try:
            records.append(json.loads(text))
        except (UnicodeDecodeError, ValueError) as exc:
            raise JournalError(f"goodput journal {path}, line {number}: not a JSON record ({exc})", hint=hint) from None
    try:
        timeline = Timeline.from_lines(records)
    except ValueError as exc:
        raise JournalError(f"goodput journal {path}, {exc}", hint=hint) from None
    if cut:
        timeline.note(CUT_SHORT)
    return timeline


class Journal:
    """The journal of one coordinator's timeline, written by :meth:`write`, compacted past ``COMPACT_AT``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.size = 0

    def rewrite(self, timeline: Timeline) -> None:
        """Replace the journal with exactly the timeline's lines (atomically); appends go to the new file."""
        self.close()
        if not self.path.parent.is_dir():  # the state dir was removed: not recreated for a journal
            raise FileNotFoundError(2, "its folder is gone", str(self.path.parent))
        text = "".join(_line(record) for record in timeline.lines())
        atomic_write(self.path, text, mode=0o600)
        self.size = len(text.encode())

    def append(self, records: list[dict[str, Any]], *, sync: bool) -> None:
        """Append ``records`` in one write (a crash leaves at most the last line cut short); fsync with ``sync``."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self.size = os.fstat(self._fd).st_size
        data = "".join(_line(record) for record in records).encode()
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        if sync:
            os.fsync(self._fd)
        self.size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
