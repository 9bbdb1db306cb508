"""``tpuctl topology show`` through click's runner and as a real process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tpuctl.cli import main


def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the real entry point (error handling included) in-process."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def test_text_shows_header_hosts_and_grid(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run("topology", "show", "--accelerator", "v5litepod-16", capsys=capsys)
    assert code == 0
    assert "accelerator   v5litepod-16  (generation v5e, device kind 'TPU v5 lite')" in out
    assert "wraparound    x=no y=no" in out
    # host table: task 0 owns ids 0 1 4 5 (ids are x-minor over the slice, not per host)
    assert "0     -        0      0 1 4 5" in out
    # the grid: row y=1 has chips (0,1) (1,1) of task 0, then (2,1) (3,1) of task 1
    assert "y=1    4 t0   5 t0   6 t1   7 t1" in out


def test_json_document_keys_and_devices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run("topology", "show", "-a", "v4-32", "--format", "json", capsys=capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["accelerator"] == "v4-32"
    assert doc["topology"] == [2, 2, 4]
    assert doc["wraparound"] == [False, False, False]
    assert len(doc["tasks"]) == 4
    assert doc["tasks"][1]["device_ids"] == [4, 5, 6, 7]
    assert doc["devices"][5] == {"id": 5, "task": 1, "slice": 0, "coords": [1, 0, 1], "core": 0, "ordinal": 1}


def test_json_multislice_ids(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        "topology",
        "show",
        "-a",
        "v5litepod-8",
        "--num-slices",
        "2",
        "--chips-per-host",
        "4",
        "-f",
        "json",
        capsys=capsys,
    )
    assert code == 0
    doc = json.loads(out)
    assert [d["id"] for d in doc["devices"]][:4] == [100000, 100001, 100002, 100003]
    assert {d["slice"] for d in doc["devices"] if d["id"] >= 200000} == {1}


def test_large_slice_is_summarised_by_host(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run("topology", "show", "-a", "v5p-2048", capsys=capsys)
    assert code == 0
    assert "too many to draw one by one" in out
    assert "(192 more hosts)" in out


def test_unknown_type_suggests_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run("topology", "show", "-a", "v5litepod-15", capsys=capsys)
    assert code == 2
    assert out == ""
    assert "tpuctl: error: 'v5litepod-15' is not a v5e slice: N counts chips and must be one of 1, 4, 8" in err
    assert "hint: did you mean 'v5litepod-16'?" in err


def test_process_errors_have_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tpuctl", "topology", "show", "--accelerator", "v5litepd-16"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "tpuctl: error: unknown accelerator type 'v5litepd-16'" in proc.stderr
    assert "hint: did you mean 'v5litepod-16'?" in proc.stderr


def test_process_rejects_two_slice_sources(capsys: pytest.CaptureFixture[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tpuctl", "topology", "show"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "name exactly one slice" in proc.stderr


def test_output_file_written_atomically(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "sub" / "slice.json"
    code, out, err = run("topology", "show", "-a", "v6e-16", "-f", "json", "--out", str(target), capsys=capsys)
    assert code == 0
    assert out == ""  # data went to the file; stdout stays clean
    assert json.loads(target.read_text())["accelerator"] == "v6e-16"
    assert f"wrote {target}" in err
    assert [p.name for p in target.parent.iterdir()] == ["slice.json"]


def test_output_file_gets_the_mappings_mode(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import os
    import stat

    target = tmp_path / "slice.json"
    old = os.umask(0o077)
    try:
        assert run("topology", "show", "-a", "v4-8", "-f", "json", "--out", str(target), capsys=capsys)[0] == 0
        assert stat.S_IMODE(target.stat().st_mode) == 0o644  # not the 0600 of a temp file, nor the umask's
        target.chmod(0o600)
        assert run("topology", "show", "-a", "v4-8", "-f", "json", "--out", str(target), capsys=capsys)[0] == 0
        assert stat.S_IMODE(target.stat().st_mode) == 0o644  # as the device mapping: 0644 whatever it was
    finally:
        os.umask(old)


@pytest.mark.parametrize(("name", "starts"), [("slice.svg", "<?xml"), ("slice.JSON", "{"), ("slice.txt", "accelerator")])
def test_the_out_files_ending_chooses_the_format_when_none_is_given(
    tmp_path, name: str, starts: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 24: `--out x.svg` without --format svg wrote the text picture into the .svg
    target = tmp_path / name
    code, _, err = run("topology", "show", "-a", "v4-8", "--out", str(target), capsys=capsys)
    assert code == 0, err
    assert target.read_text().startswith(starts)


@pytest.mark.parametrize(("given", "name"), [(["--format", "text"], "x.svg"), (["--json"], "x.svg"), (["-o", "svg"], "x.json")])
def test_a_format_the_out_files_ending_contradicts_is_refused(
    tmp_path, given: list[str], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / name
    code, _, err = run("topology", "show", "-a", "v4-8", *given, "--out", str(target), capsys=capsys)
    assert code == 2
    asked = {"--json": "json"}.get(given[0], given[-1])
    ending = target.suffix
    assert f"tpuctl: error: tpuctl topology show: --out {target} ends in {ending} ({ending[1:]}), but the format asked for is {asked}" in err
    assert f"hint: give --format {ending[1:]}, or a file name for {asked}" in err
    assert not target.exists()


def test_a_file_ending_in_a_format_the_command_cannot_write_is_refused(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "plan.svg"
    code, _, err = run("mesh", "plan", "-a", "v4-8", "--shape", "data=4", "--out", str(target), capsys=capsys)
    assert code == 2 and "ends in .svg (svg), but this command writes text, json" in err
    assert not target.exists()


def test_inits_out_is_the_mapping_and_chooses_no_format(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    # `init --out mapping.json` names the mapping file, not where its summary goes: the summary stays text
    from tpuctl.cli.output import format_for_file

    assert format_for_file("topology show", "x.svg", "text", False, ("text", "json", "svg")) == "svg"
    spec = tmp_path / "c.yaml"
    spec.write_text("cluster: c\naccelerator: v4-8\nbackend: sim\nhosts: [127.0.0.2]\nbarrier_timeout: nan\n")
    code, out, err = run("init", "-c", str(spec), "--out", str(tmp_path / "m.json"), "--state-dir", str(tmp_path / "s"), capsys=capsys)
    assert code == 2 and out == "" and "barrier_timeout" in err and "ends in .json" not in err
