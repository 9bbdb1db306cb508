"""Writing a file atomically: a reader sees the old file or the new one, never a part of either.

Why one module: the device mapping, a command's ``-o`` output and the agent's state are read by other
processes while they are rewritten. Each writer had its own copy of the dance (one without fsync, one
leaving the file mode 0600 from ``mkstemp`` while another forced 0644). Standard library only.

Permissions: with ``mode=None`` a replaced file keeps its permission bits and a new file gets what a
plain ``open(path, "w")`` would give (0666 less the umask, 0644 usually); pass ``mode`` to set the bits
exactly (the mapping passes 0o644 so jobs of other users can read it whatever the umask).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

__all__ = ["atomic_write"]

_TRIES = 16


def atomic_write(path: str | os.PathLike[str], data: bytes | str, *, mode: int | None = None) -> Path:
    """Replace ``path`` with ``data`` (a str is written as UTF-8) atomically and durably; returns the path.

    A temp file in the same folder (``.NAME.RANDOM.tmp``, so the rename never crosses filesystems) is
    written, flushed and fsynced, given its permission bits, then ``os.replace``d over ``path``; the
    folder is fsynced last so the rename survives a crash. Missing parent folders are created. On any
    failure (OSError, KeyboardInterrupt, ...) the temp file is removed, ``path`` is untouched, and the
    exception propagates: callers turn an OSError into their own error.
    """
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True)
    bits = mode if mode is not None else _existing_bits(target)
    fd, tmp = _create_temp(target)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        if bits is not None:
            os.chmod(tmp, bits)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(folder)
    return target


def _existing_bits(target: Path) -> int | None:
    """The permission bits of the file being replaced, or None (a new file: the umask decides)."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        return None


def _create_temp(target: Path) -> tuple[int, Path]:
    """Create the temp file exclusively with mode 0666, so the kernel applies the umask as for any file.

    (``tempfile.mkstemp`` creates 0600, which is what a replaced file used to end up with.)
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TRIES):
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {target}")


def fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable; silently skipped where folders cannot be opened or synced."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some filesystems cannot open folders; the rename itself is already atomic
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
