"""tpuctl's JAX cluster detector (``tpuctl/job/jaxcluster.py``) and the start-up that installs it.

Each case runs a real Python child with the ``PYTHONPATH`` ``tpuctl run`` gives a job
(:func:`tpuctl.job.runner.with_python_startup`) and asks JAX's own detection
(``ClusterEnv.auto_detect_unset_distributed_params``, what ``jax.distributed.initialize()`` calls) what it
finds. No distributed service is started here (the slow all-gather is ``tests/sim/test_sim_jax.py``).

jax is the dev extra's: the child imports it (and ``jax._src.clusters``, the module tpuctl's detector
hooks) without a skip, so a missing or changed jax fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tpuctl.job import jaxcluster
from tpuctl.job.runner import STARTUP_DIR, with_python_startup

TPUCTL_VARS = {
    "JAX_COORDINATOR_ADDRESS": "127.0.0.2:41000",
    "JAX_NUM_PROCESSES": "4",
    "JAX_PROCESS_ID": "2",
    "TPUCTL_TASK_ID": "2",
}
DETECT = r"""
import json, sys
report = {"tpuctl_imported_at_start": any(m == "tpuctl" or m.startswith("tpuctl.") for m in sys.modules),
          "hooks": [type(f).__name__ for f in sys.meta_path if type(f).__name__ == "_Finder"]}
if "jax" in sys.argv:
    from jax._src import clusters
    report["detected"] = list(clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 10))
    report["names"] = [c.name for c in clusters.ClusterEnv._cluster_types]
print(json.dumps(report))
"""


def _child(env: dict[str, str], *args: str, extra_path: str = "") -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if k not in TPUCTL_VARS and not k.startswith(("JAX_", "TPU_"))}
    base["JAX_PLATFORMS"] = "cpu"
    base["PYTHONPATH"] = extra_path
    environ = with_python_startup({**base, **env})
    done = subprocess.run(
        [sys.executable, "-c", DETECT, *args], env=environ, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    return {"report": json.loads(lines[-1]), "stdout": lines[:-1], "stderr": done.stderr}


def test_the_job_environment_puts_the_start_up_folder_first_once() -> None:
    env = with_python_startup({"PYTHONPATH": f"/a{os.pathsep}{STARTUP_DIR}{os.pathsep}/b", "X": "1"})
    assert env["PYTHONPATH"].split(os.pathsep) == [STARTUP_DIR, "/a", "/b"]
    assert with_python_startup({})["PYTHONPATH"] == STARTUP_DIR
    assert (Path(STARTUP_DIR) / "sitecustomize.py").is_file()


def test_present_needs_every_variable_and_a_process_of_the_cluster() -> None:
    assert jaxcluster.present(TPUCTL_VARS)
    for name in TPUCTL_VARS:
        assert not jaxcluster.present({k: v for k, v in TPUCTL_VARS.items() if k != name}), name
    assert not jaxcluster.present({**TPUCTL_VARS, "JAX_PROCESS_ID": "4"})
    assert not jaxcluster.present({**TPUCTL_VARS, "JAX_NUM_PROCESSES": "four"})
    assert jaxcluster.coordinator(None, TPUCTL_VARS) == "127.0.0.2:41000"
    assert jaxcluster.coordinator("9999", TPUCTL_VARS) == "127.0.0.2:9999"
    assert jaxcluster.coordinator("9999", {"JAX_COORDINATOR_ADDRESS": "[fd00::1]:41000"}) == "[fd00::1]:9999"


def test_jax_detects_the_tpuctl_cluster_from_the_variables_tpuctl_run_sets() -> None:
    out = _child(TPUCTL_VARS, "jax")
    report = out["report"]
    assert report["detected"] == ["127.0.0.2:41000", 4, 2, None]  # what initialize() gets
    assert report["names"][-1] == "tpuctl"  # after JAX's own detectors
    assert report["tpuctl_imported_at_start"] is False  # loaded by path: no tpuctl needed in the job's Python


def test_without_tpuctl_variables_nothing_is_installed_and_jax_finds_nothing() -> None:
    report = _child({}, "jax")["report"]
    assert report["hooks"] == []
    assert "tpuctl" not in report["names"]
    assert report["detected"] == [None, None, None, None]


def test_the_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('the job environments own sitecustomize ran')\n")
    out = _child(TPUCTL_VARS, extra_path=str(tmp_path))
    assert out["stdout"] == ["the job environments own sitecustomize ran"]
    assert out["report"]["hooks"] == ["_Finder"]  # installed, waiting for jax._src.clusters
    assert out["stderr"] == ""


def test_other_tpuctl_start_up_folders_on_the_path_do_not_recurse_and_the_foreign_one_runs_once(tmp_path: Path) -> None:
    """Two more copies of tpuctl's start-up (another install's nested `tpuctl run`, one through a symlinked
    prefix) after the job's own: each used to run the other again until RecursionError."""
    import shutil

    folders = []
    for name in ("a", "b"):
        job = tmp_path / name / "job"
        shutil.copytree(STARTUP_DIR, job / "startup")
        shutil.copy(Path(STARTUP_DIR).parent / "jaxcluster.py", job / "jaxcluster.py")
        folders.append(str(job / "startup"))
    (tmp_path / "linked").symlink_to(Path(STARTUP_DIR).parent.parent)
    folders.append(str(tmp_path / "linked" / "job" / "startup"))  # this one, by another spelling
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "sitecustomize.py").write_text("print('the foreign sitecustomize ran')\n")
    out = _child(TPUCTL_VARS, extra_path=os.pathsep.join([*folders, str(foreign)]))
    assert out["stderr"] == ""
    assert out["stdout"] == ["the foreign sitecustomize ran"]
    assert out["report"]["hooks"] == ["_Finder"]  # one detector


def test_the_job_path_keeps_empty_entries_and_drops_the_start_up_folder_by_real_path(tmp_path: Path) -> None:
    (tmp_path / "linked").symlink_to(Path(STARTUP_DIR).parent.parent)
    again = str(tmp_path / "linked" / "job" / "startup")
    env = with_python_startup({"PYTHONPATH": os.pathsep.join(["", "/a", again, ""])})
    assert env["PYTHONPATH"].split(os.pathsep) == [STARTUP_DIR, "", "/a", ""]  # "": the working directory
