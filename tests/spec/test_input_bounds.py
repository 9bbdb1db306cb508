"""Every input has bounds (issue 9, "Bounded inputs"): durations, names, spec files, numbers, nesting.

Each finding of the issue is a test here: ``barrier_timeout: 1e99`` passed ``validate`` and then killed
``init`` with an OverflowError; ``heartbeat_interval: 1ms`` burnt a core; ``--timeout 9e9`` exited 4 at once;
a FIFO given as ``--config`` hung, ``/dev/zero`` read until the OOM killer; a 50 MB YAML list took minutes
and gigabytes; a huge number or deep nesting was an internal error. Now each is exit 2 with a message that
names the value (and, in a spec, FILE:LINE:COL), the bounds and what to write instead, at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time  # bounds below are this process's CPU time: other load on the machine does not count
from pathlib import Path

import pytest
from click.testing import CliRunner

from tpuctl.cli import main
from tpuctl.cli.light import MAX_BARRIER_NAME, barrier_name_problem
from tpuctl.cli.validate import validate
from tpuctl.coordination.values import MAX_NAME_CHARS
from tpuctl.durations import (
    BARRIER_TIMEOUT,
    GRACE,
    HEARTBEAT_INTERVAL,
    HEARTBEAT_TIMEOUT,
    NOTICE,
    OPTION_BOUNDS,
    REGISTER_TIMEOUT,
    Bounds,
    parse_duration,
)
from tpuctl.errors import InputError
from tpuctl.spec.yamlfile import MAX_NODES, MAX_SPEC_BYTES, check_spec_file, check_spec_text

BASE = "cluster: a\naccelerator: v4-8\nbackend: sim\nhosts: [h]\n"
TPUCTL = [sys.executable, "-m", "tpuctl"]


def problems(text: str) -> list[str]:
    return check_spec_text(text, "c.yaml").formatted()


def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


# --- durations in the spec -------------------------------------------------------------------------


def test_a_huge_barrier_timeout_is_refused_by_validate_not_an_overflow_in_init() -> None:
    assert problems(BASE + "barrier_timeout: 1e99\n") == [
        "c.yaml:5:18: barrier_timeout: '1e99' is longer than 168h; expected a duration from 1s to 168h (7 days)"
    ]  # YAML 1.1 reads 1e99 (no dot, no sign) as text; 1.0e+99 is a number
    assert problems(BASE + "barrier_timeout: 1.0e+99\n") == [
        "c.yaml:5:18: barrier_timeout: 1.0e+99 is longer than 168h; expected a duration from 1s to 168h (7 days)"
    ]


def test_a_one_millisecond_heartbeat_is_refused() -> None:
    assert problems(BASE + "coordinator: {heartbeat_interval: 1ms}\n") == [
        "c.yaml:5:35: coordinator.heartbeat_interval: '1ms' is shorter than 100ms (more often only burns CPU and "
        "network); expected a duration from 100ms to 1h"
    ]


@pytest.mark.parametrize(
    ("key", "bounds"),
    [
        ("coordinator.heartbeat_interval", HEARTBEAT_INTERVAL),
        ("coordinator.heartbeat_timeout", HEARTBEAT_TIMEOUT),
        ("coordinator.register_timeout", REGISTER_TIMEOUT),
        ("barrier_timeout", BARRIER_TIMEOUT),
    ],
)
def test_every_spec_duration_is_bounded_both_ways(key: str, bounds: Bounds) -> None:
    def spec(seconds: float) -> str:
        if key.startswith("coordinator."):
            name = key.removeprefix("coordinator.")
            waits = {"heartbeat_interval": 0.1, "heartbeat_timeout": 86400, name: seconds}  # interval < timeout
            if name == "heartbeat_timeout":
                waits["heartbeat_interval"] = min(0.1, seconds / 2)
            return BASE + "coordinator: {" + ", ".join(f"{k}: {v!r}" for k, v in waits.items()) + "}\n"
        return BASE + f"{key}: {seconds!r}\n"

    assert problems(spec(bounds.low)) == [] and problems(spec(bounds.high)) == []
    (low,) = problems(spec(bounds.low / 2))
    (high,) = problems(spec(bounds.high * 2))
    assert f": {key}: " in low and "is shorter than" in low and bounds.span() in low
    assert f": {key}: " in high and "is longer than" in high and bounds.span() in high


@pytest.mark.parametrize("text", ["9" * 60, "9" * 5000, "1" + "0" * 400, "1e308", "1e400", "99999999999h"])
def test_huge_durations_are_a_problem_not_a_traceback(text: str) -> None:
    found = problems(BASE + f"barrier_timeout: {text}\n")
    assert len(found) == 1 and found[0].startswith("c.yaml:5:18: "), found


def test_validate_exits_2_on_an_unbounded_duration(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(BASE + "barrier_timeout: 1e99\ncoordinator: {heartbeat_interval: 1ms}\n")
    result = CliRunner().invoke(validate, ["--config", str(spec)])
    assert result.exit_code == 2
    assert f"{spec}:5:18: barrier_timeout: '1e99' is longer than 168h" in result.stderr
    assert f"{spec}:6:35: coordinator.heartbeat_interval: '1ms' is shorter than 100ms" in result.stderr


def test_init_refuses_a_huge_barrier_timeout_before_it_starts_an_agent(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_text(BASE + "barrier_timeout: 1e99\n")
    state = tmp_path / "state"
    proc = subprocess.run(
        [*TPUCTL, "init", "--config", str(spec), "--task-id", "0", "--state-dir", str(state)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "barrier_timeout: '1e99' is longer than 168h" in proc.stderr and "internal error" not in proc.stderr
    assert not (state / "agent.pid").exists()


# --- durations on the command line -----------------------------------------------------------------


def test_the_option_bounds_are_the_spec_bounds() -> None:
    assert OPTION_BOUNDS == {"--timeout": BARRIER_TIMEOUT, "--grace": GRACE, "--in": NOTICE}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["barrier", "step", "--timeout", "9e9"],
         "--timeout: '9e9' is longer than 168h; expected a duration from 1s to 168h (7 days)"),
        (["barrier", "step", "--timeout=1ms"],
         "--timeout: '1ms' is shorter than 1s (hosts need time to arrive); expected a duration from 1s to 168h"),
        (["barrier", "step", "--timeout", "1" * 500], "--timeout: '11111111111111111111'... (500 characters) is not"),
        (["run", "--grace", "2h", "--", "true"], "--grace: '2h' is longer than 1h; expected a duration from 100ms to 1h"),
        (["run", "--grace", "1ms", "--", "true"], "--grace: '1ms' is shorter than 100ms"),
    ],
)  # fmt: skip
def test_command_line_durations_out_of_bounds_exit_2_with_the_value_and_the_bounds(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(*args, "--state-dir", str(tmp_path), capsys=capsys) if args[0] == "barrier" else run(
        args[0], "--state-dir", str(tmp_path), *args[1:], capsys=capsys
    )
    assert code == 2, err
    assert message in err
    assert "hint: " in err


def test_barrier_timeout_9e9_is_exit_2_as_a_process(tmp_path: Path) -> None:
    proc = subprocess.run([*TPUCTL, "barrier", "x", "--timeout", "9e9", "--state-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "is longer than 168h" in proc.stderr


def test_parse_duration_refuses_long_text_before_parsing_it() -> None:
    started = time.process_time()
    with pytest.raises(InputError, match=r"\(1,000,000 characters\) is not a duration"):
        parse_duration("1h" * 500_000, what="--timeout")
    assert time.process_time() - started < 1


# --- names -------------------------------------------------------------------------------------------


def test_barrier_names_are_bounded_as_the_service_bounds_them() -> None:
    assert MAX_BARRIER_NAME == MAX_NAME_CHARS
    assert barrier_name_problem("a" * MAX_BARRIER_NAME) is None
    assert barrier_name_problem("a" * (MAX_BARRIER_NAME + 1)) == (
        f"{'a' * 40!r}... is 1,025 characters long; at most 1,024 are allowed"
    )
    assert barrier_name_problem("") == "is empty"
    assert "reserved" in (barrier_name_problem("tpuctl/init") or "")


def test_a_long_barrier_name_is_refused_before_any_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run("barrier", "n" * 5000, "--state-dir", str(tmp_path / "none"), capsys=capsys)
    assert code == 2 and "barrier name 'nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn'... is 5,000 characters long" in err
    assert "no tpuctl agent" not in err  # refused before the state dir is even looked at


def test_a_barrier_name_that_is_not_utf8_is_bad_input(tmp_path: Path) -> None:
    # issue 24: `tpuctl barrier $'\xff'` reached the agent, which closed the connection: exit 5, "the agent
    # ... may have exited". The shell's bytes as they come, through a real process (argv's surrogateescape).
    assert barrier_name_problem("\udcff") == "b'\\xff' is not UTF-8 text"
    assert barrier_name_problem("\u00e9t\u00e9") is None
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    proc = subprocess.run(
        [*TPUCTL, "barrier", b"ab\xffc", "--state-dir", str(state)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "tpuctl: error: barrier name b'ab\\xffc' is not UTF-8 text\n"
        "hint: use a short UTF-8 name that does not start with tpuctl/\n"
    )


def test_a_long_cluster_name_is_refused_and_not_quoted_in_full() -> None:
    (problem,) = problems(BASE.replace("cluster: a", "cluster: " + "a" * 1_000_000))
    assert problem.startswith("c.yaml:1:10: cluster: 'aaaa") and "characters)..." in problem
    assert len(problem) < 1200


def test_status_with_dev_null_as_state_dir_is_a_state_error_not_internal(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run("status", "--state-dir", "/dev/null", capsys=capsys)
    assert code == 5 and "state dir /dev/null is not a folder" in err and "internal error" not in err


# --- spec files ------------------------------------------------------------------------------------


def refused_at_once(path: Path | str) -> str:
    started = time.process_time()
    with pytest.raises(InputError) as info:
        check_spec_file(path)
    assert time.process_time() - started < 2
    assert info.value.exit_code == 2 and str(path) in info.value.message
    return info.value.message


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    assert refused_at_once(fifo) == f"cannot read cluster spec {fifo}: it is a FIFO (named pipe), not a regular file"


def test_a_fifo_given_to_validate_as_a_process_exits_2_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    proc = subprocess.run([*TPUCTL, "validate", "--config", str(fifo)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "it is a FIFO (named pipe), not a regular file" in proc.stderr


@pytest.mark.parametrize(("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device")])
def test_devices_are_refused_unread(path: str, kind: str) -> None:
    assert refused_at_once(path) == f"cannot read cluster spec {path}: it is {kind}, not a regular file"


def test_a_folder_is_refused(tmp_path: Path) -> None:
    assert refused_at_once(tmp_path) == f"cannot read cluster spec {tmp_path}: it is a folder, not a regular file"


def test_an_oversized_spec_is_refused_by_its_size_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as handle:
        handle.truncate(MAX_SPEC_BYTES + 1)  # sparse: nothing to read, the size says it all
    assert refused_at_once(big) == f"cannot read cluster spec {big}: it is over 4 MiB ({MAX_SPEC_BYTES + 1:,} bytes)"


def test_a_spec_of_exactly_the_limit_is_read(tmp_path: Path) -> None:
    spec = tmp_path / "c.yaml"
    spec.write_bytes(BASE.encode() + b"#" * (MAX_SPEC_BYTES - len(BASE)))
    assert check_spec_file(spec).ok


# --- the YAML parse ----------------------------------------------------------------------------------


def test_a_long_list_stops_at_the_node_limit_quickly() -> None:
    started = time.process_time()
    (problem,) = problems("hosts:\n" + "  - h\n" * (MAX_NODES + 10))
    assert problem.endswith(f"YAML error: more than {MAX_NODES:,} values; expected a cluster spec")
    assert time.process_time() - started < 30  # the 50 MB list took 221 s and 5.2 GB


def test_a_billion_laughs_is_one_problem() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        name, previous = chr(97 + i), chr(96 + i)
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    started = time.process_time()
    (problem,) = problems("\n".join(lines) + "\n")
    assert problem == (
        f"c.yaml:6:4: YAML error: aliases here expand to more than {MAX_NODES:,} values; expected a cluster spec"
    )
    assert time.process_time() - started < 2


def test_a_chain_of_deep_aliases_is_built_once_without_recursion() -> None:
    lines = ["a0: &a0 " + "[" * 60 + "x" + "]" * 60]  # 2,400 levels once expanded, each anchor built once
    lines += [f"a{i}: &a{i} " + "[" * 60 + f"*a{i - 1}" + "]" * 60 for i in range(1, 40)]
    started = time.process_time()
    found = problems("\n".join(lines) + "\n")
    assert found and all(p.startswith("c.yaml:") for p in found)
    assert time.process_time() - started < 2


@pytest.mark.parametrize(
    "value", ["9" * 100_000, "0x" + "f" * 10_000, ":".join(["1"] + ["59"] * 20_000), "1" + "_0" * 50_000, "1.0e+" + "9" * 70]
)
def test_huge_numbers_are_refused_before_conversion(value: str) -> None:
    started = time.process_time()
    (problem,) = problems(BASE + f"coordinator: {{port: {value}}}\n")
    assert problem == f"c.yaml:5:21: a number {len(value):,} characters long; expected at most 64 characters"
    assert time.process_time() - started < 2


@pytest.mark.parametrize("text", ["[" * 100_000, "{a: " * 10_000, "- " * 10_000 + "x", "a:\n" + "".join(
    " " * i + f"k{i}:\n" for i in range(1, 200))])  # fmt: skip
def test_deep_nesting_is_one_problem_with_its_position(text: str) -> None:
    (problem,) = problems(text)
    assert problem.startswith("c.yaml:") and "nested deeper than 64 levels" in problem


@pytest.mark.parametrize(
    ("text", "key"),
    [("accelerator: v4-" + "9" * 5000, "accelerator"), ("generation: v4\ntopology: " + "9" * 5000 + "x2x2", "topology")],
)
def test_a_slice_with_a_5000_digit_count_is_a_problem_not_a_traceback(text: str, key: str) -> None:
    """Found by probing: int() refuses over 4,300 digits with a ValueError, which escaped validate (exit 1)."""
    (problem,) = problems("cluster: a\nbackend: sim\nhosts: [h]\n" + text + "\n")
    assert f": {key}: " in problem and "characters long; expected" in problem
