"""Where a host's agent keeps its socket, pid, log and description: the state directory.

One directory per host (several simulated hosts can share a machine with one directory each). Every
command that talks to an agent (``barrier``, ``status``, ``env``, ``run``, ``down``) takes the same
``--state-dir`` (or ``TPUCTL_STATE_DIR``) as the ``init`` that started it.

Files::

    agent.sock   unix socket the agent answers local commands on
    agent.pid    the agent's process id (written after it has the lock)
    agent.lock   held (flock) by the live agent: a second init on this directory is refused
    agent.json   what the agent is: cluster, task, address, coordinator, mapping path, incarnation
    agent.log    the agent's log (one per state dir, appended)

Imports only the standard library: it is on the path of ``tpuctl barrier``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuctl.errors import StateError

DEFAULT_ROOT = Path("/run/tpuctl")
STATE_DIR_ENV = "TPUCTL_STATE_DIR"


@dataclass(frozen=True)
class StateDir:
    path: Path

    @property
    def socket(self) -> Path:
        return self.path / "agent.sock"

    @property
    def pid_file(self) -> Path:
        return self.path / "agent.pid"

    @property
    def lock_file(self) -> Path:
        return self.path / "agent.lock"

    @property
    def info_file(self) -> Path:
        return self.path / "agent.json"

    @property
    def log_file(self) -> Path:
        return self.path / "agent.log"

    def ensure(self) -> None:
        """Create the directory (owner-only: it holds a socket that can stop the cluster)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise StateError(
                f"cannot create state dir {self.path}: {exc.strerror}",
                hint=f"pass --state-dir DIR (or set {STATE_DIR_ENV}) to a writable folder",
            ) from exc
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise StateError(
                f"state dir {self.path} is not writable",
                hint=f"pass --state-dir DIR (or set {STATE_DIR_ENV}) to a writable folder",
            )

    def read_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None

    def live_pid(self) -> int | None:
        """The agent's pid if that process is alive, else None."""
        pid = self.read_pid()
        if pid is None:
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return pid
        return pid

    def read_info(self) -> dict[str, Any]:
        """The running agent's description; StateError when no agent ever ran here."""
        try:
            data = json.loads(self.info_file.read_text())
        except FileNotFoundError:
            raise not_running(self) from None
        except (OSError, ValueError) as exc:
            raise StateError(f"cannot read {self.info_file}: {exc}", hint="run tpuctl down, then tpuctl init") from exc
        if not isinstance(data, dict):
            raise StateError(f"{self.info_file} is not an agent description", hint="run tpuctl down, then tpuctl init")
        return data

    def write_info(self, info: dict[str, Any]) -> None:
        tmp = self.info_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, self.info_file)


def not_running(state: StateDir) -> StateError:
    return StateError(
        f"no tpuctl agent is running for state dir {state.path}",
        hint="run `tpuctl init --config FILE` first, with the same --state-dir",
    )


def default_state_dir(environ: dict[str, str] | os._Environ[str], uid: int) -> Path:
    """``TPUCTL_STATE_DIR``, else /run/tpuctl for root, else $XDG_RUNTIME_DIR/tpuctl or /tmp/tpuctl-UID."""
    explicit = environ.get(STATE_DIR_ENV)
    if explicit:
        return Path(explicit)
    if uid == 0:
        return DEFAULT_ROOT
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "tpuctl"
    return Path(f"/tmp/tpuctl-{uid}")


def resolve_state_dir(option: str | None) -> StateDir:
    """The state dir a command uses: ``--state-dir``, else the environment's default."""
    if option:
        return StateDir(Path(option))
    return StateDir(default_state_dir(os.environ, os.getuid()))
