"""The job environment (``tpuctl.job.env``): every variable, DTensor's and JAX's rules, ports, shell quoting."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from typing import Any

import pytest

from tpuctl.agent import statedir
from tpuctl.agent.protocol import AgentInfo
from tpuctl.errors import StateError
from tpuctl.job import env as job_env
from tpuctl.job.env import (
    STATE_DIR_ENV,
    TASK_ENV,
    JobEnv,
    dtensor_job_name,
    host_port,
    port_collisions,
)
from tpuctl.mapping.model import DeviceMapping
from tpuctl.spec import detect as identity

from .mappings import agent_info, sim_mapping

V4_32 = sim_mapping()  # 4 hosts 10.0.0.1-4, 4 devices each


def job_environment(info: dict[str, Any], mapping: DeviceMapping, **kwargs: Any) -> JobEnv:
    """The environment for the agent description ``info`` as ``agent.json`` holds it (typed on the way in)."""
    return job_env.job_environment(AgentInfo.from_json(info), mapping, **kwargs)


def test_every_variable_for_task_2_of_a_v4_32() -> None:
    env = job_environment(agent_info(V4_32, 2), V4_32, state_dir="/run/tpuctl")
    assert env.set == {
        "TPUCTL_MAPPING": "/run/tpuctl/mapping.json",
        "TPUCTL_TASK_ID": "2",
        "TPUCTL_RANK": "2",
        "TPUCTL_CLUSTER": "pod-a",
        "TPUCTL_GENERATION": "1",
        "TPUCTL_STATE_DIR": "/run/tpuctl",
        "DTENSOR_JOBS": "10.0.0.1:9100,10.0.0.2:9101,10.0.0.3:9102,10.0.0.4:9103",
        "DTENSOR_CLIENT_ID": "2",
        "DTENSOR_NUM_CLIENTS": "4",
        "DTENSOR_JOB_NAME": "worker",
        "JAX_COORDINATOR_ADDRESS": "10.0.0.1:9002",
        "JAX_NUM_PROCESSES": "4",
        "JAX_PROCESS_ID": "2",
        "TPU_SKIP_MDS_QUERY": "true",
        "TPU_WORKER_ID": "2",
        "TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4",
        "TPU_ACCELERATOR_TYPE": "v4-32",
        "TPU_TOPOLOGY": "2x2x4",
        "TPU_HOST_BOUNDS": "1,1,4",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "TPU_TOPOLOGY_WRAP": "false,false,false",
        "PJRT_DEVICE": "TPU",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "9003",
        "WORLD_SIZE": "4",
        "RANK": "2",
        "LOCAL_WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
    }
    # one task per machine: the process variables are never inherited (torch_xla's xmp.spawn fills them itself)
    assert env.unset == (
        "TPU_PROCESS_BOUNDS",
        "TPU_CHIPS_PER_PROCESS_BOUNDS",
        "TPU_VISIBLE_CHIPS",
        "CLOUD_TPU_TASK_ID",
        "TPU_PROCESS_ADDRESSES",
        "TPU_PROCESS_PORT",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
    )
    # deterministic, including the order
    again = job_environment(agent_info(V4_32, 2), V4_32, state_dir="/run/tpuctl")
    assert list(again.set.items()) == list(env.set.items())


def test_dtensor_rules_hold_for_every_task() -> None:
    # DTensor (config.py): the task index is the position in DTENSOR_JOBS; num_clients = len(jobs);
    # client_id in 0..n-1; an explicit job name ("worker", its default for several clients).
    for task in range(4):
        env = job_environment(agent_info(V4_32, task), V4_32).set
        jobs = env["DTENSOR_JOBS"].split(",")
        assert len(jobs) == int(env["DTENSOR_NUM_CLIENTS"]) == 4
        assert jobs[int(env["DTENSOR_CLIENT_ID"])] == f"{V4_32.tasks[task].address}:{9100 + task}"
        assert all(j == j.strip() and j.count(":") == 1 for j in jobs)
        assert env["JAX_PROCESS_ID"] == env["DTENSOR_CLIENT_ID"] == env["TPU_WORKER_ID"] == str(task)


def test_one_host_runs_dtensor_in_local_mode() -> None:
    one = sim_mapping(["10.1.1.1"], accelerator="v4-8")
    env = job_environment(agent_info(one, 0, dtensor=[9100], jax=9200), one)
    assert "DTENSOR_JOBS" not in env.set
    assert env.unset[:2] == ("DTENSOR_JOBS", "TPU_PROCESS_BOUNDS")
    assert (env.set["MASTER_ADDR"], env.set["WORLD_SIZE"], env.set["RANK"]) == ("10.1.1.1", "1", "0")
    assert (env.set["DTENSOR_CLIENT_ID"], env.set["DTENSOR_NUM_CLIENTS"], env.set["DTENSOR_JOB_NAME"]) == (
        "0",
        "1",
        "localhost",
    )
    assert env.set["JAX_COORDINATOR_ADDRESS"] == "10.1.1.1:9200"
    assert dtensor_job_name(1) == "localhost" and dtensor_job_name(2) == "worker"


def test_multislice_worker_ids_and_hostnames_are_per_slice() -> None:
    two = sim_mapping(accelerator="v5litepod-8", num_slices=2, chips_per_host=4)  # 2 slices of 2 hosts
    env = job_environment(agent_info(two, 3), two).set
    assert env["TPU_WORKER_ID"] == "1"
    assert env["TPU_WORKER_HOSTNAMES"] == "10.0.0.3,10.0.0.4"
    assert (env["MEGASCALE_NUM_SLICES"], env["MEGASCALE_SLICE_ID"], env["MEGASCALE_COORDINATOR_ADDRESS"]) == (
        "2",
        "1",
        "10.0.0.1",
    )
    assert env["JAX_PROCESS_ID"] == env["DTENSOR_CLIENT_ID"] == "3"
    assert env["JAX_NUM_PROCESSES"] == "4"
    assert env["TPU_TOPOLOGY"] == "2x4"
    assert env["TPU_CHIPS_PER_HOST_BOUNDS"] == "2,2,1"
    assert env["TPU_HOST_BOUNDS"] == "1,2,1"


def test_ipv6_hosts_are_bracketed() -> None:
    v6 = sim_mapping(["fd00::1", "fd00::2"], accelerator="v4-16")
    env = job_environment(agent_info(v6, 1), v6).set
    assert env["DTENSOR_JOBS"] == "[fd00::1]:9100,[fd00::2]:9101"
    assert env["JAX_COORDINATOR_ADDRESS"] == "[fd00::1]:9002"
    assert env["TPU_WORKER_HOSTNAMES"] == "fd00::1,fd00::2"
    assert host_port("h", 1) == "h:1"


def test_ports_that_collide_on_one_machine_are_refused() -> None:
    # every loopback address is this machine: a simulated cluster's hosts share its ports
    sim = sim_mapping(["127.0.0.2", "127.0.0.3"], accelerator="v4-16")
    with pytest.raises(StateError, match=r"job ports collide: the DTensor server of task 1 and the DTensor server "):
        job_environment(agent_info(sim, 0, dtensor=[9100, 9100]), sim)
    with pytest.raises(StateError, match=r"the JAX coordinator and the DTensor server of task 0 both use port 9100"):
        job_environment(agent_info(sim, 0, dtensor=[9100, 9101], jax=9100), sim)
    with pytest.raises(StateError, match=r"the tpuctl coordinator and the DTensor server of task 1 both use port"):
        job_environment(agent_info(sim, 0, dtensor=[9100, 9101], coordinator_port=9101), sim)
    with pytest.raises(StateError, match=r"the torch.distributed store and the JAX coordinator both use port 9002"):
        job_environment(agent_info(sim, 0, dtensor=[9100, 9101], torch=9002), sim)
    # separate machines may use the same port number
    real = sim_mapping(["10.0.0.1", "10.0.0.2"], accelerator="v4-16")
    assert job_environment(agent_info(real, 0, dtensor=[9100, 9100], jax=9101), real).set["DTENSOR_JOBS"] == (
        "10.0.0.1:9100,10.0.0.2:9100"
    )
    assert port_collisions([("a", "localhost", 1), ("b", "::1", 1)]) == ["b and a both use port 1 on ::1"]


def test_an_agent_without_job_ports_or_of_another_cluster_is_refused() -> None:
    info = agent_info(V4_32, 0)
    del info["job_ports"]
    with pytest.raises(StateError, match="no usable job ports") as caught:
        job_environment(info, V4_32)
    assert "tpuctl init" in str(caught.value.hint)
    older = agent_info(V4_32, 0)
    del older["job_ports"]["torch"]  # an agent of a tpuctl without torch.distributed's port
    with pytest.raises(StateError, match="no usable job ports"):
        job_environment(older, V4_32)
    with pytest.raises(StateError, match="no usable job ports"):
        job_environment(agent_info(V4_32, 0, dtensor=[9100, 9101]), V4_32)  # 2 ports for 4 tasks
    other = {**agent_info(V4_32, 0), "cluster": "pod-b"}
    with pytest.raises(StateError, match=r"is of cluster 'pod-a'.*the agent runs cluster 'pod-b'"):
        job_environment(other, V4_32)
    with pytest.raises(StateError, match=r"task 4 is not one of 0..3"):
        job_environment({**agent_info(V4_32, 0), "task": 4}, V4_32)


ODD = [
    "plain",
    "",
    "two words",
    "it's",
    'say "hi"',
    "$HOME `id` $(id) \\ !x",
    "line one\nline two",
    "tab\there; rm -rf /tmp/nothing &",
    "ünïcødé ☃",
    "-n",
    "*",
]


@pytest.mark.parametrize("shell", ["bash", "sh"])
def test_sh_output_round_trips_odd_values_through_eval(shell: str) -> None:
    env = JobEnv({f"TPUCTL_ODD_{i}": value for i, value in enumerate(ODD)}, ("DTENSOR_JOBS",))
    script = (
        'eval "$(cat)"\n'
        'if [ -n "${DTENSOR_JOBS+set}" ]; then echo "DTENSOR_JOBS still set"; exit 1; fi\n'
        f"{shlex.quote(sys.executable)} -c 'import json, os; print(json.dumps({{k: v for k, v in os.environ.items() "
        'if k.startswith("TPUCTL_ODD_")}))\'\n'
    )
    done = subprocess.run(
        [shell, "-c", script],
        input=env.to_sh(),
        capture_output=True,
        text=True,
        timeout=30,
        env={"DTENSOR_JOBS": "stale:1", "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "HOME": "/nonexistent"},
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert json.loads(done.stdout) == env.set


def test_json_and_apply() -> None:
    env = JobEnv({"A": "1", "B": "x y"}, ("C",))
    assert json.loads(env.to_json()) == {"schema": "tpuctl.env/v1", "set": {"A": "1", "B": "x y"}, "unset": ["C"]}
    assert env.apply({"A": "0", "C": "stale", "D": "kept"}) == {"A": "1", "B": "x y", "D": "kept"}
    assert env.to_sh() == "unset C\nexport A=1\nexport B='x y'\n"


def test_variable_names_match_the_readers() -> None:
    assert identity.TASK_ID_ENV == TASK_ENV
    assert statedir.STATE_DIR_ENV == STATE_DIR_ENV


def test_tpu_process_variables_for_several_processes_per_machine() -> None:
    # two 8-chip v5e machines, each running two 4-chip TPU processes (LeaderWorkerSet / 7x style)
    shared = sim_mapping(["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"], accelerator="v5litepod-16", chips_per_host=4)
    env = job_environment(agent_info(shared, 3), shared)
    assert env.set["TPU_PROCESS_ADDRESSES"] == "10.0.0.1:8476,10.0.0.1:8477,10.0.0.2:8476,10.0.0.2:8477"
    assert env.set["TPU_PROCESS_PORT"] == "8477"
    assert "TPU_PROCESS_ADDRESSES" not in env.unset
    assert job_env.tpu_process_ports(["a", "b"]) is None
    # a job port on a TPU process port of the same machine is refused
    with pytest.raises(StateError, match=r"the TPU process of task 1 .* both use port 8477 on 10\.0\.0\.1"):
        job_environment(agent_info(shared, 0, dtensor=[9100, 8477, 9102, 9103]), shared)
    # a stale inherited list never reaches a job on one-process-per-machine hosts
    plain = job_environment(agent_info(V4_32, 0), V4_32)
    assert (
        plain.apply({"TPU_PROCESS_ADDRESSES": "stale:8476", "TPU_PROCESS_PORT": "1"})
        .keys()
        .isdisjoint({"TPU_PROCESS_ADDRESSES", "TPU_PROCESS_PORT"})
    )


def test_sh_quote_is_shlex_quote() -> None:
    import random
    import shlex

    from tpuctl.job.env import sh_quote

    rng = random.Random(3)
    alphabet = "ab_Z09@%+=:,./-'\" $\\\n\té*!~#&;|<>()[]{}?"
    for _ in range(5000):
        value = "".join(rng.choice(alphabet) for _ in range(rng.randrange(7)))
        assert sh_quote(value) == shlex.quote(value), value


# --- several TPU processes per machine, and PyTorch ----------------------------------------------------------

LWS = sim_mapping(
    ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"], accelerator="tpu7x-16", chips_per_process_bounds=(1, 2, 1)
)  # the recorded tpu7x-16 LeaderWorkerSet pod: two 1x2x1 processes on each 2x2x1 machine


def test_each_process_of_a_machine_gets_its_bounds_and_chips() -> None:
    rows = []
    for task in range(4):
        env = job_environment(agent_info(LWS, task), LWS)
        got = env.set
        rows.append(
            (got["CLOUD_TPU_TASK_ID"], got["TPU_VISIBLE_CHIPS"], got["TPU_PROCESS_PORT"], got["LOCAL_RANK"], got["RANK"])
        )
        assert (got["TPU_PROCESS_BOUNDS"], got["TPU_CHIPS_PER_PROCESS_BOUNDS"]) == ("2,1,2", "1,2,1")
        assert (got["TPU_HOST_BOUNDS"], got["TPU_CHIPS_PER_HOST_BOUNDS"]) == ("1,1,2", "2,2,1")
        assert got["TPU_PROCESS_ADDRESSES"] == "10.0.0.1:8476,10.0.0.1:8477,10.0.0.2:8476,10.0.0.2:8477"
        assert (got["LOCAL_WORLD_SIZE"], got["WORLD_SIZE"], got["TPU_WORKER_ID"]) == ("2", "4", str(task))
        assert not {"TPU_PROCESS_BOUNDS", "TPU_VISIBLE_CHIPS", "CLOUD_TPU_TASK_ID"} & set(env.unset)
    assert rows == [
        ("0", "0,2", "8476", "0", "0"),
        ("1", "1,3", "8477", "1", "1"),
        ("2", "0,2", "8476", "0", "2"),
        ("3", "1,3", "8477", "1", "3"),
    ]


def test_the_model_not_the_names_says_which_tasks_share_a_machine() -> None:
    """A simulated cluster may give every process its own loopback address: the bounds still pair them."""
    sim = sim_mapping(["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"], accelerator="tpu7x-16",
                      chips_per_process_bounds=(1, 2, 1))  # fmt: skip
    got = job_environment(agent_info(sim, 1), sim).set
    assert (got["LOCAL_RANK"], got["LOCAL_WORLD_SIZE"], got["TPU_PROCESS_PORT"], got["TPU_VISIBLE_CHIPS"]) == (
        "1",
        "2",
        "8477",
        "1,3",
    )


def test_stale_torchrun_and_process_variables_never_reach_the_job() -> None:
    stale = {
        "TORCHELASTIC_RUN_ID": "old",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TPU_PROCESS_BOUNDS": "1,1,1",
        "TPU_VISIBLE_CHIPS": "0",
        "CLOUD_TPU_TASK_ID": "7",
        "MASTER_PORT": "29500",
        "PJRT_DEVICE": "CPU",
    }
    applied = job_environment(agent_info(V4_32, 1), V4_32).apply(stale)
    assert not {"TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TPU_PROCESS_BOUNDS"} & set(applied)
    assert not {"TPU_VISIBLE_CHIPS", "CLOUD_TPU_TASK_ID"} & set(applied)
    assert (applied["MASTER_PORT"], applied["PJRT_DEVICE"], applied["RANK"]) == ("9003", "TPU", "1")
