"""Files tpuctl writes and reads: written atomically (a reader sees the old file or the new one, never a
part of either), read bounded (only a regular file, at most so many bytes, never blocking).

Why one module: the device mapping, a command's ``-o`` output and the agent's state are read by other
processes while they are rewritten. Each writer had its own copy of the dance (one without fsync, one
leaving the file mode 0600 from ``mkstemp`` while another forced 0644). The spec, the mapping and the
token are files a user names: each reader had its own copy of the bounded read. Standard library only.

Permissions: with ``mode=None`` a replaced file keeps its permission bits and a new file gets what a
plain ``open(path, "w")`` would give (0666 less the umask, 0644 usually); pass ``mode`` to set the bits
exactly. The device mapping and every file a command writes with ``--out`` get :data:`SHARED_MODE`
(0644: jobs and tools of other users read them whatever the umask).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

__all__ = ["SHARED_MODE", "FileTooLarge", "NotRegularFile", "atomic_write", "file_kind", "read_regular_file"]

SHARED_MODE = 0o644
"""The mode of the files tpuctl writes for others to read: the mapping, ``--out FILE``."""

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
    _make_folder(folder)
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


def _make_folder(folder: Path) -> None:
    """``folder`` and its missing parents; a part of the path that is a file is ``NotADirectoryError``
    naming that part (``mkdir`` says only "File exists" or "Not a directory", about the folder it was asked
    for)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        for part in (folder, *folder.parents):
            if part.exists() and not part.is_dir():
                raise NotADirectoryError(
                    errno.ENOTDIR, f"Not a directory: {part} is {file_kind(part.stat().st_mode)}", str(folder)
                ) from None
        raise


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


# --- reading a file a user names -------------------------------------------------------------------------


class NotRegularFile(OSError):
    """``kind``: ``a folder``, ``a FIFO (named pipe)``, ``a character device`` ..."""

    def __init__(self, kind: str) -> None:
        super().__init__(0, f"it is {kind}, not a regular file")
        self.kind = kind


class FileTooLarge(OSError):
    """``size``: how big it is (``"5,000,000 bytes"``) or how much was read before giving up."""

    def __init__(self, size: str, limit: int) -> None:
        super().__init__(0, f"it is over {limit:,} bytes ({size})")
        self.size = size
        self.limit = limit


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISREG, "a regular file"),
)


def file_kind(mode: int) -> str:
    """What a ``st_mode`` is, as a message says it: ``a folder``, ``a FIFO (named pipe)`` ..."""
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def read_regular_file(
    path: str | os.PathLike[str], limit: int, *, check: Callable[[os.stat_result], None] | None = None
) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, without ever blocking.

    Opened with O_NONBLOCK (a FIFO opens at once instead of waiting for a writer), then fstat: anything but
    a regular file is ``NotRegularFile``, unread; a file over ``limit`` bytes (by its size or, for files
    that do not know it, as read) is ``FileTooLarge``. ``check`` is called with the open file's fstat
    before a byte is read (the token's mode check: on the file read, not on a name that may change).
    Other failures are the OSError of open or read.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        try:  # a socket cannot be opened (ENXIO): say what it is
            mode = os.stat(path).st_mode
        except OSError:
            raise exc from None
        if not stat.S_ISREG(mode):
            raise NotRegularFile(file_kind(mode)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(file_kind(info.st_mode))
        if info.st_size > limit:
            raise FileTooLarge(f"{info.st_size:,} bytes", limit)
        if check is not None:
            check(info)
        chunks: list[bytes] = []
        total = 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise FileTooLarge(f"more than {limit:,} bytes read", limit)
        return b"".join(chunks)
    finally:
        os.close(fd)
