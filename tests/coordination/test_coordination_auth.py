"""Token files: what ``load_token`` accepts and how it refuses the rest."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tpuctl.coordination.auth import MAX_TOKEN_BYTES, load_token
from tpuctl.errors import InputError


def token_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_private_token_is_read_and_stripped(tmp_path: Path, mode: int) -> None:
    assert load_token(token_file(tmp_path, b"  s3cret-Token_1\n\n", mode)) == "s3cret-Token_1"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_token_readable_or_writable_by_others_is_refused_with_a_chmod_hint(tmp_path: Path, mode: int) -> None:
    path = token_file(tmp_path, b"s3cret\n", mode)
    with pytest.raises(InputError) as excinfo:
        load_token(path)
    assert excinfo.value.message.startswith(f"token file {path} is accessible by group or others (mode {mode:04o})")
    assert excinfo.value.hint == f"chmod 600 {path}"


def test_missing_token_file(tmp_path: Path) -> None:
    with pytest.raises(InputError) as excinfo:
        load_token(tmp_path / "nope")
    assert excinfo.value.message == f"token file {tmp_path / 'nope'} does not exist"
    assert excinfo.value.hint is not None and "umask 077" in excinfo.value.hint


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"", "is empty"),
        (b" \n\t\n", "is empty"),
        (b"two words\n", "must hold one word of printable ASCII"),
        (b"line1\nline2\n", "must hold one word of printable ASCII"),
        ("tökén".encode(), "is not ASCII text"),
    ],
)
def test_unusable_token_content(tmp_path: Path, content: bytes, problem: str) -> None:
    path = token_file(tmp_path, content)
    with pytest.raises(InputError, match=problem) as excinfo:
        load_token(path)
    assert str(path) in excinfo.value.message


def test_a_directory_is_not_a_token_file(tmp_path: Path) -> None:
    with pytest.raises(InputError) as excinfo:
        load_token(tmp_path)
    assert excinfo.value.message == f"token file {tmp_path} is a folder, not a regular file"


def test_a_fifo_or_a_device_is_refused_at_once_unread(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)  # no writer: a plain open() would wait forever
    started = time.monotonic()
    with pytest.raises(InputError) as excinfo:
        load_token(fifo)
    assert excinfo.value.message == f"token file {fifo} is a FIFO (named pipe), not a regular file"
    with pytest.raises(InputError) as excinfo:
        load_token("/dev/zero")  # endless: read whole, it would fill the memory
    assert excinfo.value.message == "token file /dev/zero is a character device, not a regular file"
    assert time.monotonic() - started < 1.0


def test_an_oversized_token_file_is_refused_unread(tmp_path: Path) -> None:
    path = token_file(tmp_path, b"x" * (MAX_TOKEN_BYTES + 1))
    with pytest.raises(InputError) as excinfo:
        load_token(path)
    assert excinfo.value.message == (
        f"token file {path} is over {MAX_TOKEN_BYTES:,} bytes ({MAX_TOKEN_BYTES + 1:,} bytes): not a token"
    )
    assert load_token(token_file(tmp_path, b"y" * MAX_TOKEN_BYTES)) == "y" * MAX_TOKEN_BYTES


def test_the_mode_is_checked_on_the_file_opened(tmp_path: Path) -> None:
    """A symlink to a shared file: its own bits say nothing, the file read is what counts."""
    shared = token_file(tmp_path, b"s3cret\n", 0o644)
    link = tmp_path / "link"
    link.symlink_to(shared)
    with pytest.raises(InputError, match=r"accessible by group or others \(mode 0644\)"):
        load_token(link)
