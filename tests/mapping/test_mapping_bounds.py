"""The mapping loader's bounds (issue 9): only a regular file, at most 64 MiB, numbers and nesting bounded.

``tpuctl.load_mapping('/dev/zero')`` and ``--mapping /dev/zero`` read until the OOM killer; a FIFO hung; a
100,000-digit number or deep nesting escaped as ValueError / RecursionError (exit 1 in the CLI);
``tpuctl.MappingError`` did not exist. Each is now a MappingError (exit 7) naming the file, at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time  # bounds below are this process's CPU time: other load on the machine does not count
from pathlib import Path

import pytest
from mapping_cases import sim_mapping

import tpuctl
from tpuctl.errors import MappingError
from tpuctl.mapping.file import MAX_MAPPING_BYTES, MAX_NUMBER_CHARS, from_json, read_mapping, to_json

GOOD_TEXT = to_json(sim_mapping(accelerator="v5litepod-16"))


def refused(path: Path | str) -> str:
    started = time.process_time()
    with pytest.raises(MappingError) as info:
        tpuctl.load_mapping(path, task=0)
    assert time.process_time() - started < 2
    assert info.value.exit_code == 7 and str(path) in info.value.message
    return info.value.message


def test_mapping_error_is_exported_lazily() -> None:
    assert tpuctl.MappingError is MappingError
    code = "import sys, tpuctl; tpuctl.MappingError; print(sorted(m for m in sys.modules if m.startswith('tpuctl')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.strip() == "['tpuctl', 'tpuctl.errors']"  # no job API, no protobuf


@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_devices_are_refused_unread(path: str, kind: str) -> None:
    assert refused(path) == f"cannot read device mapping {path}: it is {kind}, not a regular file"


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "mapping.json"
    os.mkfifo(fifo)
    assert refused(fifo) == f"cannot read device mapping {fifo}: it is a FIFO (named pipe), not a regular file"


def test_a_folder_is_refused(tmp_path: Path) -> None:
    assert refused(tmp_path) == f"cannot read device mapping {tmp_path}: it is a folder, not a regular file"


def test_an_oversized_file_is_refused_by_its_size(tmp_path: Path) -> None:
    big = tmp_path / "mapping.json"
    with big.open("wb") as handle:
        handle.truncate(MAX_MAPPING_BYTES + 1)  # sparse
    assert refused(big) == f"cannot read device mapping {big}: it is over 64 MiB: not a device mapping file"


def test_topology_show_of_dev_zero_exits_7_at_once() -> None:
    proc = subprocess.run([sys.executable, "-m", "tpuctl", "topology", "show", "--mapping", "/dev/zero"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 7, proc.stderr
    assert "cannot read device mapping /dev/zero: it is a character device, not a regular file" in proc.stderr


@pytest.mark.parametrize(
    "number", ["9" * 100_000, "1" + "0" * (MAX_NUMBER_CHARS + 1), "1." + "5" * 100_000, "1e" + "9" * 100_000]
)
def test_huge_numbers_are_a_mapping_error(number: str, tmp_path: Path) -> None:
    path = tmp_path / "mapping.json"
    path.write_text(GOOD_TEXT.replace('"schema_version": 1', f'"schema_version": {number}'))
    message = refused(path)
    assert message == f"{path}: a number {len(number):,} characters long; expected at most {MAX_NUMBER_CHARS} characters"


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_non_json_constants_are_refused(constant: str, tmp_path: Path) -> None:
    path = tmp_path / "mapping.json"
    path.write_text(GOOD_TEXT.replace('"schema_version": 1', f'"schema_version": {constant}'))
    assert refused(path).endswith("is not JSON (JSON numbers are finite)")


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        "{" + '"a": {' * 50_000,
        GOOD_TEXT.replace('"cluster"', '"cluster_x": ' + "[" * 50_000 + "]" * 50_000 + ', "cluster"', 1),
    ],
)
def test_deep_nesting_is_a_mapping_error_naming_the_file(text: str, tmp_path: Path) -> None:
    path = tmp_path / "mapping.json"
    path.write_text(text)
    message = refused(path)
    assert message.startswith(f"{path}: ") or message.startswith(f"{path}:1:")


def test_value_and_recursion_errors_never_escape_from_json() -> None:
    for text in ("[" * 100_000, '{"schema_version": ' + "9" * 10_000 + "}", GOOD_TEXT.replace("1", "1" * 5000)):
        with pytest.raises(MappingError) as info:
            from_json(text, "m.json")
        assert info.value.message.startswith("m.json")


def test_a_good_mapping_still_reads(tmp_path: Path) -> None:
    path = tmp_path / "mapping.json"
    path.write_text(GOOD_TEXT)
    assert read_mapping(path).cluster == sim_mapping(accelerator="v5litepod-16").cluster


def test_a_lone_surrogate_escape_is_a_mapping_error(tmp_path: Path) -> None:
    """Found by the fuzzer: protobuf raised SystemError on ``"\\ud800"`` where a device was expected."""
    path = tmp_path / "mapping.json"
    path.write_text(GOOD_TEXT.replace('{"id": 1, "coords"', '"\\ud800", {"id": 1, "coords"', 1))
    assert refused(path).startswith(f"{path}: a string is not valid Unicode")
