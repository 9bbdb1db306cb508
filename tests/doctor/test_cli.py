"""``tpuctl doctor`` through the real entry point, on this machine's real /dev, /proc and /sys: the text
report, the JSON document, the exit code, and a state dir whose agent answers (a stand-in speaking the
control socket's JSON lines) or does not."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.cli import main
from tpuctl.doctor.checks import SCHEMA
from tpuctl.errors import EXIT_CLUSTER

NAMES = [
    "cluster-spec",
    "tpu-devices",
    "tpu-holders",
    "libtpu-lockfile",
    "transparent-hugepages",
    "state-dir",
    "coordinator-port",
    "peer-names",
    "peer-reachable",
    "clock-skew",
]


def run(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


@pytest.fixture
def spec(tmp_path: Path) -> Path:
    """A simulated v4-32 on 127.0.0.2-5 with a coordinator port free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "cluster: doc-test\naccelerator: v4-32\nbackend: sim\n"
        "hosts: [127.0.0.2, 127.0.0.3, 127.0.0.4, 127.0.0.5]\n"
        f"coordinator:\n  port: {port}\n"
    )
    return path


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "st"
    path.mkdir(mode=0o700)
    return path


@pytest.fixture
def answering_agent(state: Path) -> Iterator[Path]:
    """This test process holds agent.lock and answers one `info` request on agent.sock, as an agent would."""
    (state / "agent.pid").write_text(f"{os.getpid()}\n")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(state / "agent.sock"))
    server.listen(4)
    server.settimeout(10)

    def answer() -> None:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(10)
            request = b""
            while not request.endswith(b"\n"):
                chunk = conn.recv(4096)
                if not chunk:
                    return
                request += chunk
            assert json.loads(request)["op"] == "info"
            conn.sendall(json.dumps({"ok": True, "result": {"cluster": "doc-test"}}).encode() + b"\n")

    worker = threading.Thread(target=answer, daemon=True)
    worker.start()
    with open(state / "agent.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield state
        finally:
            server.close()
            worker.join(10)


def test_text_report_a_line_per_check_and_exit_0(spec: Path, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run("doctor", "--config", str(spec), "--task-id", "0", "--state-dir", str(state), capsys=capsys)
    assert code == 0, out
    lines = out.splitlines()
    for name in NAMES:
        assert any(line.split()[1:2] == [name] for line in lines if line[:4] in ("OK  ", "WARN", "FAIL", "SKIP")), name
    assert any(line.startswith("OK    cluster-spec") and "this host is task 0 (--task-id)" in line for line in lines)
    assert any(line.startswith("SKIP  tpu-devices") and "backend sim" in line for line in lines)
    assert any(line.startswith("OK    coordinator-port") for line in lines)
    assert lines[-1].endswith("skip") and " fail" in lines[-1]


def test_json_document_schema_and_checks(spec: Path, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run("doctor", "-c", str(spec), "--task-id", "1", "--state-dir", str(state), "--json", capsys=capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == SCHEMA
    assert [c["name"] for c in doc["checks"]] == NAMES
    assert doc["cluster"]["task"] == 1 and doc["cluster"]["num_hosts"] == len(doc["cluster"]["hosts"]) == 4 and doc["cluster"]["backend"] == "sim"
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["coordinator-port"]["verdict"] == "skip"  # task 1: the coordinator is task 0's
    # nothing listens on 127.0.0.2 yet: a warning before a start, not a failure
    assert (
        checks["peer-reachable"]["verdict"] == "warn"
        and "nothing listens on the coordinator" in checks["peer-reachable"]["saw"]
    )
    code, again, _ = run(
        "doctor", "-c", str(spec), "--task-id", "1", "--state-dir", str(state), "--format", "json", capsys=capsys
    )
    assert [c["name"] for c in json.loads(again)["checks"]] == NAMES


def test_a_failed_check_exits_3_and_names_it(spec: Path, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state.chmod(0o777)
    code, out, _ = run("doctor", "--config", str(spec), "--task-id", "0", "--state-dir", str(state), capsys=capsys)
    assert code == EXIT_CLUSTER
    failed = [line for line in out.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1 and failed[0].split()[1] == "state-dir" and "mode 0777" in failed[0]


def test_the_coordinator_port_taken_fails_on_task_0(
    spec: Path, state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another process listens on task 0's coordinator port: the check fails naming its pid and command."""
    port = int(spec.read_text().split("port: ")[1])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,sys,time\ns=socket.socket()\ns.bind(('127.0.0.2',int(sys.argv[1])))\n"
            "s.listen(1)\nprint('listening',flush=True)\ntime.sleep(30)",
            str(port),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "listening"
        code, out, _ = run(
            "doctor", "-c", str(spec), "--task-id", "0", "--state-dir", str(state), "--json", capsys=capsys
        )
    finally:
        holder.kill()
        holder.wait(10)
    assert code == EXIT_CLUSTER
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "coordinator-port")
    assert check["verdict"] == "fail" and check["saw"].startswith(f"127.0.0.2:{port} is already in use")
    if os.geteuid() == 0 or Path(f"/proc/{holder.pid}/fd").stat().st_uid == os.geteuid():
        assert f"by pid {holder.pid} ({sys.executable} -c import socket" in check["saw"]


def test_an_answering_agent_is_healthy(spec: Path, answering_agent: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        "doctor", "-c", str(spec), "--task-id", "2", "--state-dir", str(answering_agent), "--json", capsys=capsys
    )
    assert code == 0, out
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "state-dir")
    assert check["verdict"] == "ok", check
    assert f"agent pid {os.getpid()} holds the lock and answers on agent.sock" in check["saw"]


def test_an_unreadable_spec_is_a_failed_check(tmp_path: Path, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        "doctor", "-c", str(tmp_path / "missing.yaml"), "--state-dir", str(state), "--json", capsys=capsys
    )
    assert code == EXIT_CLUSTER
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["cluster-spec"]["verdict"] == "fail" and "cannot read cluster spec" in checks["cluster-spec"]["saw"]
    assert checks["peer-names"]["verdict"] == "skip"


def test_without_a_spec_the_cluster_checks_skip(
    state: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith(("TPU_", "TPUCTL_", "MEGASCALE_", "JOBSET_", "LWS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "1")  # no metadata server is asked
    code, out, _ = run("doctor", "--state-dir", str(state), "--json", capsys=capsys)
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["cluster-spec"]["verdict"] == "skip"
    assert checks["coordinator-port"]["verdict"] == checks["peer-names"]["verdict"] == "skip"
    assert code in (0, EXIT_CLUSTER)  # this machine's own devices and lock file decide


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run("doctor", "--help", capsys=capsys)
    assert code == 0 and "3 a check failed" in out and "-f, -o, --format, --output FORMAT" in out and "text|json" in out
    code, out, _ = run("--help", capsys=capsys)
    assert "doctor" in out


@pytest.mark.parametrize("recorded", ["backend", "spec"])
def test_the_running_agents_backend_decides_the_device_checks(
    spec: Path, answering_agent: Path, recorded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # No --config: doctor checks against the running agent. Its backend is sim (recorded in agent.json, or
    # only in the spec it names, as an agent.json from before the field has it), so no TPU is a skip, not
    # a warning suggesting `backend sim` (issue 24).
    from tpuctl.agent.protocol import AgentInfo, JobPorts
    from tpuctl.agent.statedir import StateDir

    hosts = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
    info = AgentInfo(
        cluster="doc-test", task=1, num_tasks=4, coordinator="127.0.0.2:1", mapping="/nonexistent/mapping.json",
        job_ports=JobPorts(dtensor=(2, 3, 4, 5), jax=6, torch=7), pid=os.getpid(), hosts=hosts, config=str(spec),
        backend="sim" if recorded == "backend" else "",
    )  # fmt: skip
    StateDir(answering_agent).write_info(info)
    _, out, _ = run("doctor", "--state-dir", str(answering_agent), "--json", capsys=capsys)
    doc = json.loads(out)
    assert doc["cluster"]["backend"] == "sim"
    checks = {c["name"]: c for c in doc["checks"]}
    if not any(Path("/dev").glob("accel*")) and not Path("/dev/vfio").exists():
        assert checks["tpu-devices"]["verdict"] == "skip", checks["tpu-devices"]
        assert "backend sim" in checks["tpu-devices"]["saw"]
