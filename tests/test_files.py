"""tpuctl.files.atomic_write on real files: replaced whole, durable, permissions kept, no temp left."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

import tpuctl.files as files
from tpuctl.files import atomic_write


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def only(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_writes_text_and_bytes_and_creates_parents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "out.json"
    assert atomic_write(target, "héllo\n") == target
    assert target.read_bytes() == "héllo\n".encode()
    atomic_write(str(target), b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert only(target.parent) == ["out.json"]


def test_a_new_file_gets_the_umask_like_open(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "new", "x")
        os.umask(0o077)
        atomic_write(tmp_path / "private", "x")
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "new") == 0o644  # not mkstemp's 0600
    assert mode_of(tmp_path / "private") == 0o600


def test_a_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    target = tmp_path / "kept"
    target.write_text("old")
    target.chmod(0o640)
    atomic_write(target, "new")
    assert target.read_text() == "new" and mode_of(target) == 0o640
    target.chmod(0o755)
    atomic_write(target, "newer")
    assert mode_of(target) == 0o755


def test_an_explicit_mode_wins_over_umask_and_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.write_text("old")
    target.chmod(0o600)
    old = os.umask(0o077)
    try:
        atomic_write(target, "new", mode=0o644)
    finally:
        os.umask(old)
    assert mode_of(target) == 0o644


@pytest.mark.parametrize("fail_in", ["write", "fsync", "chmod", "replace"])
def test_a_failure_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_in: str
) -> None:
    target = tmp_path / "f"
    target.write_text("old")

    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    if fail_in == "write":
        monkeypatch.setattr(files, "_existing_bits", lambda t: 0o644)
        real_fdopen = os.fdopen

        class Broken:
            def __init__(self, fd: int, *a: Any, **k: Any) -> None:
                self.inner = real_fdopen(fd, "wb")

            def __enter__(self) -> Broken:
                return self

            def __exit__(self, *exc: object) -> None:
                self.inner.close()

            def write(self, data: bytes) -> None:
                self.inner.write(data[:1])
                fail()

        monkeypatch.setattr(os, "fdopen", Broken)
    else:
        monkeypatch.setattr(os, fail_in, fail)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(target, "new", mode=0o644)
    assert target.read_text() == "old"
    assert only(tmp_path) == ["f"]


def test_an_interrupt_cleans_up_and_propagates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "f", "new")
    assert only(tmp_path) == []


def test_the_data_is_fsynced_before_the_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: Any, dst: Any) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic_write(tmp_path / "out" / "m.json", "{}")
    assert events == ["fsync file", "replace", "fsync folder"]


def test_the_temp_file_sits_beside_the_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Path] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        seen.append(Path(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    atomic_write(tmp_path / "t.json", "{}")
    assert seen[0].parent == tmp_path and seen[0].name.startswith(".t.json.") and seen[0].name.endswith(".tmp")


def test_an_unwritable_place_raises_oserror(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError):
        atomic_write(blocker / "m.json", "x")
    assert only(tmp_path) == ["file"]


def test_a_folder_that_is_a_file_is_named_as_the_cause(tmp_path: Path) -> None:
    """``mkdir`` says only "File exists" about the folder it was asked for; the cause is the part of the
    path that is a regular file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    for target in (blocker / "out.json", blocker / "deeper" / "out.json"):
        with pytest.raises(NotADirectoryError) as excinfo:
            atomic_write(target, "x")
        assert excinfo.value.strerror == f"Not a directory: {blocker} is a regular file"
    assert blocker.read_text() == "not a folder\n"
    assert only(tmp_path) == ["a-file"]


def test_read_regular_file_bounds(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.write_bytes(b"abc")
    assert files.read_regular_file(small, 3) == b"abc"
    with pytest.raises(files.FileTooLarge) as too_big:
        files.read_regular_file(small, 2)
    assert (too_big.value.size, too_big.value.limit) == ("3 bytes", 2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO (named pipe)"), (tmp_path, "a folder"), ("/dev/zero", "a character device")):
        with pytest.raises(files.NotRegularFile) as refused:
            files.read_regular_file(path, 1 << 20)
        assert refused.value.kind == kind and refused.value.strerror == f"it is {kind}, not a regular file"
    seen: list[int] = []
    assert files.read_regular_file(small, 10, check=lambda info: seen.append(info.st_size)) == b"abc"
    assert seen == [3]
    with pytest.raises(FileNotFoundError):
        files.read_regular_file(tmp_path / "nope", 10)
