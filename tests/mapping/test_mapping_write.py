"""write_mapping is atomic: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest
from mapping_cases import sim_mapping

import tpuctl.files as files
import tpuctl.mapping.file as mappingfile
from tpuctl.errors import StateError
from tpuctl.mapping.file import read_mapping, to_json, write_mapping

OLD = sim_mapping(cluster="old", accelerator="v4-8")
NEW = sim_mapping(cluster="new", accelerator="v4-32")


@pytest.fixture
def target(tmp_path: Path) -> Path:
    path = tmp_path / "run" / "mapping.json"
    write_mapping(path, OLD)
    return path


def assert_old_intact(target: Path) -> None:
    assert target.read_text() == to_json(OLD)
    assert read_mapping(target) == OLD
    assert sorted(p.name for p in target.parent.iterdir()) == ["mapping.json"]  # no temp file left


def test_write_creates_parents_and_replaces(target: Path) -> None:
    assert read_mapping(target) == OLD
    write_mapping(target, NEW)
    assert read_mapping(target) == NEW
    assert sorted(p.name for p in target.parent.iterdir()) == ["mapping.json"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_the_mapping_is_0644_whatever_the_umask_or_the_old_mode(target: Path) -> None:
    target.chmod(0o600)
    old = os.umask(0o077)
    try:
        write_mapping(target, NEW)
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_replace_failure_leaves_the_old_file(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(StateError, match=f"cannot write device mapping {target}: No space left on device"):
        write_mapping(target, NEW)
    assert_old_intact(target)


def test_failure_mid_write_leaves_the_old_file(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_fsync = os.fsync

    def fail_after_partial_write(fd: int) -> None:
        real_fsync(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fail_after_partial_write)
    with pytest.raises(StateError, match="Input/output error"):
        write_mapping(target, NEW)
    assert_old_intact(target)


def test_serialization_failure_touches_nothing(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(mapping: Any) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(mappingfile, "to_json", fail)
    with pytest.raises(RuntimeError, match="boom"):
        write_mapping(target, NEW)
    assert_old_intact(target)


def test_interrupt_mid_write_cleans_up_and_propagates(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", interrupt)
    with pytest.raises(KeyboardInterrupt):
        write_mapping(target, NEW)
    assert_old_intact(target)


def test_the_folder_is_fsynced_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_replace, real_fsync_dir = os.replace, files.fsync_dir

    def replace(src: Any, dst: Any) -> None:
        events.append("replace")
        real_replace(src, dst)

    def fsync_dir(folder: Path) -> None:
        events.append(f"fsync {folder.name}")
        real_fsync_dir(folder)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(files, "fsync_dir", fsync_dir)
    write_mapping(tmp_path / "out" / "m.json", NEW)
    assert events == ["replace", "fsync out"]


def test_unwritable_folder_is_a_state_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StateError, match=f"cannot write device mapping {blocker / 'm.json'}"):
        write_mapping(blocker / "m.json", NEW)
