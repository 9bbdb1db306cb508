"""``tpuctl validate`` through click's runner: exit codes, stdout/stderr, the --json document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpuctl.cli.validate import validate
from tpuctl.errors import InputError

GOOD = "cluster: pod-a\naccelerator: v4-32\nbackend: sim\nhosts: [h0, h1, h2, h3]\n"
BAD = "cluster: pod-a\naccelerator: v4-32\nbackend: tf\nhosts: [h0, h1, h2]\n"


def run(*args: str) -> tuple[int, str, str, BaseException | None]:
    result = CliRunner().invoke(validate, list(args))
    return result.exit_code, result.stdout, result.stderr, result.exception


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    return tmp_path / "cluster.yaml"


def test_valid_spec(spec: Path) -> None:
    spec.write_text(GOOD)
    code, out, err, _ = run("--config", str(spec))
    assert (code, out, err) == (0, f"{spec}: ok: pod-a v4-32 (2x2x4), 4 hosts, backend sim\n", "")


def test_every_problem_on_stderr_and_exit_2(spec: Path) -> None:
    spec.write_text(BAD)
    code, out, err, _ = run("--config", str(spec))
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"{spec}:3:10: backend: 'tf' is not a backend; did you mean 'tensorflow'?",
        f"{spec}:4:8: hosts: 3 entries, but v4-32 has 4 hosts (2x2x4 chips, 4 chips per host); expected one host per task",
        f"{spec}: 2 problems",
    ]


def test_json_valid(spec: Path) -> None:
    spec.write_text(GOOD + "meshes:\n  - {name: dp, shape: {data: 4, model: 4}}\n")
    code, out, err, _ = run("--config", str(spec), "--json")
    assert code == 0 and err == ""
    assert json.loads(out) == {
        "schema": "tpuctl.validate/v1",
        "ok": True,
        "file": str(spec),
        "problems": [],
        "cluster": {
            "name": "pod-a",
            "accelerator": "v4-32",
            "generation": "v4",
            "topology": [2, 2, 4],
            "topology_name": "2x2x4",
            "num_slices": 1,
            "chips_per_host": 4,
            "num_hosts": 4,
            "num_devices": 16,
            "device_kind": "TPU v4",
            "backend": "sim",
            "hosts": ["h0", "h1", "h2", "h3"],
            "coordinator": "h0:8490",
            "meshes": [{"name": "dp", "shape": {"data": 4, "model": 4}, "mode": "ring"}],
            "output": "/run/tpuctl/mapping.json",
        },
    }


def test_json_problems_still_exit_2(spec: Path) -> None:
    spec.write_text(BAD)
    code, out, err, _ = run("--json", "--config", str(spec))
    assert code == 2 and err == ""
    doc = json.loads(out)
    assert list(doc) == ["schema", "ok", "file", "problems", "cluster"]
    assert doc["ok"] is False and doc["cluster"] is None
    assert doc["problems"][0] == {
        "line": 3, "column": 10, "path": "backend", "message": "'tf' is not a backend; did you mean 'tensorflow'?",
    }  # fmt: skip
    assert [p["path"] for p in doc["problems"]] == ["backend", "hosts"]


@pytest.mark.parametrize(
    ("content", "first"),
    [
        (b"cluster: [unclosed\n", ":2:1: YAML syntax error: expected ',' or ']', but got '<stream end>'"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ":1:1: not UTF-8 text: byte 0x89 cannot be decoded"),
        (b"\x7fELF\x02\x01\x01\x00", ":1:1: YAML syntax error: character #x007f is not allowed in YAML text"),
        (b"cluster: a\x00b\n", ":1:11: YAML syntax error: character #x0000 is not allowed in YAML text"),
        (b"", ":1:1: the spec is empty"),
        (b"[" * 5000, ":1:65: YAML error: nested deeper than 64 levels"),
    ],
    ids=["unclosed", "png", "elf", "nul", "empty", "deep"],
)
def test_garbage_is_a_problem_not_a_traceback(spec: Path, content: bytes, first: str) -> None:
    spec.write_bytes(content)
    code, out, err, exc = run("--config", str(spec))
    assert code == 2 and out == "" and exc is not None and isinstance(exc, SystemExit)
    assert err.startswith(f"{spec}{first}"), err
    assert "Traceback" not in err
    code, out, _, _ = run("--config", str(spec), "--json")
    assert code == 2 and json.loads(out)["ok"] is False


def test_unreadable_file_is_an_input_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    code, _, _, exc = run("--config", str(missing))
    assert isinstance(exc, InputError) and exc.exit_code == 2  # the CLI group prints it and exits 2
    assert exc.message == f"cannot read cluster spec {missing}: No such file or directory"
    code, out, _, _ = run("--config", str(tmp_path), "--json")
    doc = json.loads(out)
    assert code == 2 and doc["ok"] is False and doc["cluster"] is None
    assert doc["problems"][0]["line"] is None
    assert doc["problems"][0]["message"].startswith(f"cannot read cluster spec {tmp_path}: it is a folder, not a regular file")


def test_config_is_required() -> None:
    code, _, err, _ = run()
    assert code == 2 and "Missing option '--config'" in err


def test_through_the_real_entry_point(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tpuctl.cli import main

    spec.write_text(BAD)
    with pytest.raises(SystemExit) as info:
        main(["validate", "--config", str(spec)])
    assert info.value.code == 2
    assert capsys.readouterr().err.endswith(f"{spec}: 2 problems\n")
    with pytest.raises(SystemExit) as info:
        main(["validate", "--config", str(spec.parent / "missing.yaml")])
    assert info.value.code == 2
    assert "tpuctl: error: cannot read cluster spec" in capsys.readouterr().err


def test_spares_and_elastic(spec: Path) -> None:
    """A spec with spares and policy elastic says so; its mistakes are problems with their positions."""
    head = "cluster: pod-a\naccelerator: v4-16\nnum_slices: 3\nbackend: sim\nhosts: [h0, h1, h2, h3, h4, h5]\n"
    spec.write_text(head + "spares: [s0, s1]\nrestart: {policy: elastic, min_slices: 2}\n")
    code, out, err, _ = run("--config", str(spec))
    assert (code, out, err) == (0, f"{spec}: ok: pod-a v4-16 (2x2x2) x 3 slices, 6 hosts + 2 spares, backend sim\n", "")
    spec.write_text(head + "spares: [s0]\nrestart: {policy: elastic, min_slices: 5}\n")
    code, out, err, _ = run("--config", str(spec))
    assert code == 2 and out == ""
    assert [line.split(": ")[1] for line in err.splitlines()[:2]] == ["spares", "restart.min_slices"]
    assert err.splitlines()[2] == f"{spec}: 2 problems"
