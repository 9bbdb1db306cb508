"""Token files: what ``load_token`` accepts and how it refuses the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.coordination.auth import load_token
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
    with pytest.raises(InputError, match="is not a regular file"):
        load_token(tmp_path)
