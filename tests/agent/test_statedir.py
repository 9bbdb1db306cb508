"""State dirs are trusted only when they are ours, and an agent is alive only while it holds the lock."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuctl.agent.statedir import StateDir, lock_holder, resolve_state_dir
from tpuctl.errors import StateError


def own_dir(path: Path) -> StateDir:
    path.mkdir(mode=0o700)
    return StateDir(path)


def test_a_folder_open_to_others_is_refused_before_anything_in_it_is_read(tmp_path: Path) -> None:
    state = own_dir(tmp_path / "s")
    Path(state.info_file).write_text('{"planted": true}')
    os.chmod(state.path, 0o777)
    for use in (state.ensure, state.live_pid, state.read_info):
        with pytest.raises(StateError, match=r"has mode 0777: others may write in it; expected 0700") as info:
            use()
        assert "--state-dir" in str(info.value.hint)


def test_a_folder_of_ours_that_others_may_only_read_is_closed_by_init(tmp_path: Path) -> None:
    state = own_dir(tmp_path / "s")
    os.chmod(state.path, 0o755)
    assert state.live_pid() is None  # readable by others, but nobody else could have written in it
    state.ensure()
    assert os.stat(state.path).st_mode & 0o777 == 0o700


def test_a_folder_of_another_user_or_a_symlink_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a folder's owner needs root (CI runs as root)")
    theirs = own_dir(tmp_path / "theirs")
    os.chown(theirs.path, 1001, 1001)
    with pytest.raises(StateError, match=r"belongs to uid 1001, not to this user \(uid 0\)"):
        theirs.ensure()
    link = tmp_path / "link"
    link.symlink_to(own_dir(tmp_path / "real").path)
    with pytest.raises(StateError, match="is a symbolic link"):
        StateDir(link).live_pid()


def test_a_missing_folder_is_simply_not_running(tmp_path: Path) -> None:
    assert StateDir(tmp_path / "never").live_pid() is None


def test_liveness_comes_from_the_lock_not_from_a_stale_pid_file(tmp_path: Path) -> None:
    state = own_dir(tmp_path / "s")
    # a killed agent's pid file now names a live process that is not an agent (this test's own)
    Path(state.pid_file).write_text(f"{os.getpid()}\n")
    Path(state.lock_file).touch()
    assert state.live_pid() is None
    # a process holding the lock is the agent, whatever the pid file says
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\n"
         f"h = open({str(state.lock_file)!r}, 'a+'); fcntl.flock(h, fcntl.LOCK_EX)\n"
         "print('locked', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert lock_holder(state.lock_file) == holder.pid
        assert state.live_pid() == holder.pid
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert state.live_pid() is None  # the kernel released the lock with the process


def test_a_lock_held_in_this_process_is_seen(tmp_path: Path) -> None:
    state = own_dir(tmp_path / "s")
    with open(state.lock_file, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert lock_holder(state.lock_file) == os.getpid()
    assert lock_holder(state.lock_file) is None


@pytest.mark.parametrize("given", ["", " ", "\n"])
def test_an_empty_state_dir_option_is_refused_naming_it_not_the_default(
    given: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 24: `tpuctl run --state-dir ""` said "no tpuctl agent is running for state dir /run/tpuctl"
    from tpuctl.cli import main

    monkeypatch.delenv("TPUCTL_STATE_DIR", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--state-dir", given, "--", "true"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert err.startswith(f"tpuctl: error: --state-dir (or $TPUCTL_STATE_DIR) is {given!r}: it names no folder\n")


def test_the_state_dir_click_reads_from_the_environment_loses_its_newline(tmp_path: Path) -> None:
    # click fills --state-dir from TPUCTL_STATE_DIR as it is; `$(...)`-style whitespace names the same folder
    assert resolve_state_dir(f"{tmp_path}\n").path == str(tmp_path)
    assert resolve_state_dir(f"  {tmp_path} ").path == str(tmp_path)
