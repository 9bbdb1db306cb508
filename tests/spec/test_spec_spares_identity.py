"""Which task a spare is (address match, --task-id, TPUCTL_TASK_ID over hosts then spares), and
``tpuctl init --spare`` on a host that is not one: exit 2 naming the ranges, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.cli import main
from tpuctl.errors import InputError
from tpuctl.spec.detect import check_spare, identify
from tpuctl.spec.yamlfile import check_spec_text

SPEC = """\
cluster: pod-a
accelerator: v4-16
num_slices: 2
backend: sim
hosts: [10.0.0.1, 10.0.0.2, 10.0.0.3, 10.0.0.4]
spares: [10.0.1.1, 10.0.1.2]
restart: {policy: rejoin}
"""


def test_a_spare_is_found_by_its_address_and_by_its_task_id() -> None:
    spec = check_spec_text(SPEC, "c.yaml").unwrap()
    found = identify(spec, task_id=None, environ={}, local_names=frozenset({"10.0.1.2"}))
    assert (found.task_id, found.reason) == (5, "this host is spares[1] (10.0.1.2)")
    assert identify(spec, task_id=4, environ={}, local_names=frozenset()).task_id == 4
    assert identify(spec, task_id=None, environ={"TPUCTL_TASK_ID": "5"}, local_names=frozenset()).task_id == 5
    with pytest.raises(InputError, match=r"--task-id 6 is out of range: c\.yaml has 4 hosts and 2 spares, tasks 0 to 5"):
        identify(spec, task_id=6, environ={}, local_names=frozenset())
    check_spare(spec, 4)  # a spare: fine


def test_spare_flag_on_a_host_is_refused_naming_the_ranges() -> None:
    spec = check_spec_text(SPEC, "c.yaml").unwrap()
    with pytest.raises(InputError) as caught:
        check_spare(spec, 2)
    assert caught.value.message == (
        "--spare, but this host is task 2 (10.0.0.3), one of the cluster's hosts (tasks 0 to 3); its spares are "
        "tasks 4 to 5 (10.0.1.1, ...)"
    )


def test_init_spare_exits_2_before_anything_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(SPEC)
    with pytest.raises(SystemExit) as exit_info:
        main(["init", "-c", str(config), "--task-id", "1", "--spare", "--state-dir", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "--spare, but this host is task 1 (10.0.0.2), one of the cluster's hosts (tasks 0 to 3)" in err
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())


def test_init_says_a_spare_stands_by() -> None:
    from tpuctl.cli.init import _summary_line

    summary = {"cluster": "pod-a", "task": 6, "address": "10.0.1.1", "pid": 42, "role": "standby", "generation": 3}
    assert _summary_line(summary) == (
        "tpuctl: cluster 'pod-a': task 6 (10.0.1.1) standing by in generation 3: it takes a lost slice's place when "
        "the cluster needs it; agent pid 42"
    )
