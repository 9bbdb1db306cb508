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
    agent.out    with a JSON log (``--log-format json``): what the agent's process writes to stdout and
                 stderr itself (a C library's messages), kept out of agent.log's JSON lines
    metrics.sock  /metrics, where the spec's ``metrics: {socket: ...}`` names a relative path (its name)
    progress.sock  unix socket the job reports its steps on (``tpuctl.job.progress``; the watchdog)
    registration.json  the live registration's credential and generation (0600, never printed); removed
                 when the agent exits, so only a dead agent leaves it, for its successor to reclaim the task
    goodput.jsonl  task 0 only: the goodput ledger's journal (the cluster's timeline; ``tpuctl goodput``),
                 kept after the agent exits and reloaded by a coordinator that restarts the cluster above it

Imports only the standard library, and not pathlib (about 7 ms with what it brings: ``re``,
``urllib.parse``, ``ipaddress``): it is on the path of ``tpuctl barrier``, so a state dir's paths are
strings. The simulated clusters' helpers at the end use pathlib, imported when they run. Nor does it import
:mod:`tpuctl.errors` at the top (ten exception classes, about 0.4 ms to create): the functions that raise or
catch a ``StateError`` import it, so ``tpuctl barrier`` loads it only after its request, or to fail.
"""

# No `from __future__ import annotations` here: that statement imports the __future__ module, about
# 0.15 ms before the light path's request. Annotations naming what only the type checker imports are quoted.
import os
import stat

from tpuctl import lightjson as json

TYPE_CHECKING = False  # typing is not imported on the light path
if TYPE_CHECKING:
    from pathlib import Path
    from typing import IO

    from tpuctl.agent.protocol import AgentInfo
    from tpuctl.errors import StateError

DEFAULT_ROOT = "/run/tpuctl"
STATE_DIR_ENV = "TPUCTL_STATE_DIR"
_MAX_INFO = 16 << 20  # agent.json of a 20,000-host cluster is about 1 MB
_REINIT_HINT = "run `tpuctl down`, then `tpuctl init`"
_OWN_HINT = (
    f"remove it if you know what it is, or pass --state-dir DIR (or set {STATE_DIR_ENV}) to a folder of your own"
)


class _File:
    """One file of the state directory, as a ``StateDir`` attribute: its path in that directory."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, state: "StateDir", owner: object = None) -> str:
        return os.path.join(state.path, self.name)


class StateDir:
    """One host's state directory and the files in it, as path strings (``StateDir(Path(...))`` works too)."""

    __slots__ = ("path",)

    # The files (the module's docstring says what each holds), as path strings.
    socket = _File("agent.sock")
    pid_file = _File("agent.pid")
    lock_file = _File("agent.lock")
    info_file = _File("agent.json")
    log_file = _File("agent.log")
    output_file = _File("agent.out")
    registration_file = _File("registration.json")
    progress_socket = _File("progress.sock")  # tpuctl.job.steps.SOCKET_NAME: the job side finds it by name
    goodput_journal = _File("goodput.jsonl")  # tpuctl.goodput.journal.JOURNAL_NAME: task 0's timeline

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path: str = os.fspath(path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __repr__(self) -> str:
        return f"StateDir({self.path!r})"

    def write_registration(self, cluster: str, task: int, generation: int, credential: bytes) -> None:
        """Keep this host's registration (owner-only, atomically): what a new process on this state dir
        shows the service to replace it, should this agent die. ``StateError`` naming the file when it
        cannot be written (a full disk)."""
        doc = {"cluster": cluster, "task": task, "generation": generation, "credential": credential.hex()}
        self._write(self.registration_file, json.dumps(doc) + "\n")

    def write_pid(self, pid: int) -> None:
        """``agent.pid`` (once the agent holds the lock); ``StateError`` naming it when it cannot be written."""
        self._write(self.pid_file, f"{pid}\n", atomic=False)

    def _write(self, path: str, text: str, *, atomic: bool = True) -> None:
        """Write one of this state dir's files, owner-only; an OSError (a full disk, a read-only or vanished
        folder) as ``StateError`` naming the file and the cause."""
        from tpuctl.files import atomic_write

        try:
            if atomic:
                atomic_write(path, text, mode=0o600)
            else:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "w") as handle:
                    handle.write(text)
        except OSError as exc:
            raise write_error(self, path, exc) from exc

    def read_registration(self, cluster: str, task: int) -> tuple[int, bytes] | None:
        """(generation, credential) a dead agent of this cluster and task left; None if none or not ours."""
        self.check()
        try:
            fd = os.open(self.registration_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                return None  # not one this user's agent wrote
            data = json.loads(os.read(fd, 4096))
            generation, credential = data["generation"], bytes.fromhex(data["credential"])
        except (OSError, ValueError, TypeError, KeyError):
            return None
        finally:
            os.close(fd)
        if data.get("cluster") != cluster or data.get("task") != task or not isinstance(generation, int):
            return None
        return max(0, generation), credential

    def ensure(self) -> None:
        """Create the directory (owner-only: it holds a socket that can stop the cluster), then check it."""
        from tpuctl.errors import StateError

        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise StateError(
                f"cannot create state dir {self.path}: {exc.strerror}",
                hint=f"pass --state-dir DIR (or set {STATE_DIR_ENV}) to a writable folder",
            ) from exc
        self.check()
        if stat.S_IMODE(os.stat(self.path).st_mode) & 0o077:  # ours, but readable by others: close it
            os.chmod(self.path, 0o700)
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise StateError(
                f"state dir {self.path} is not writable",
                hint=f"pass --state-dir DIR (or set {STATE_DIR_ENV}) to a writable folder",
            )

    def check(self) -> None:
        """Refuse a state dir this user did not make: a symlink, another owner, or writable by others.

        Everything in it is trusted (the socket that stops the cluster, the description jobs take their
        environment from), so a folder another local user could have prepared or can write is refused
        before anything in it is read or signalled. A missing folder passes (no agent runs there).
        """
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            from tpuctl.errors import StateError  # here, not at the top: only a failing check loads it

            raise StateError(f"cannot inspect state dir {self.path}: {exc.strerror or exc}", hint=_OWN_HINT) from exc
        problem = None
        if stat.S_ISLNK(st.st_mode):
            problem = "is a symbolic link"
        elif not stat.S_ISDIR(st.st_mode):
            problem = "is not a folder"
        elif st.st_uid != os.geteuid():
            problem = f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
        elif st.st_mode & 0o022:
            problem = f"has mode {stat.S_IMODE(st.st_mode):04o}: others may write in it; expected 0700"
        if problem is not None:
            from tpuctl.errors import StateError

            raise StateError(f"state dir {self.path} {problem}: not one tpuctl made for this user", hint=_OWN_HINT)

    def read_pid(self) -> int | None:
        try:
            with open(self.pid_file) as handle:
                return int(handle.read().strip())
        except (OSError, ValueError):
            return None

    def take_lock(self) -> "IO[str]":
        """Create the folder and take its agent lock, held while the returned file stays open (the agent's
        life); ``StateError`` naming the running agent when another holds it."""
        import fcntl  # here: not on the light path

        from tpuctl.errors import StateError

        self.ensure()
        try:
            handle = open(self.lock_file, "a+")  # noqa: SIM115  # held open: the lock lives as long as the agent
        except OSError as exc:
            raise write_error(self, self.lock_file, exc) from exc
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            pid = self.live_pid()
            raise StateError(
                f"a tpuctl agent is already running for state dir {self.path}" + (f" (pid {pid})" if pid else ""),
                hint="`tpuctl status` shows it; `tpuctl down` stops it; use another --state-dir for another host",
            ) from None
        return handle

    def live_pid(self) -> int | None:
        """The agent's pid while an agent holds this state dir's lock, else None.

        Liveness comes from the lock (``flock``, released by the kernel when its holder dies, even
        unreaped), never from the pid file alone: a pid left by a killed agent may name another process
        by now, and nothing is ever signalled on its word. Where ``/proc/locks`` says which process
        holds the lock, that is the pid; otherwise the pid file's, once the lock is seen held.
        """
        self.check()
        holder = lock_holder(self.lock_file)
        if holder is None:
            return None
        if holder > 0:
            return holder
        from tpuctl.processes import pid_alive  # here: barrier, status and env never check liveness

        pid = self.read_pid()
        return pid if pid is not None and pid_alive(pid) else None

    def read_info(self) -> "AgentInfo":
        """The running agent's description; StateError when no agent ever ran here or the file is bad."""
        from tpuctl.errors import StateError

        self.check()
        try:
            with open(self.info_file, "rb") as handle:
                raw = handle.read(_MAX_INFO + 1)
        except FileNotFoundError:
            raise not_running(self) from None
        except OSError as exc:
            raise StateError(f"cannot read {self.info_file}: {exc.strerror or exc}", hint=_REINIT_HINT) from exc
        if len(raw) > _MAX_INFO:
            raise StateError(
                f"{self.info_file} is over {_MAX_INFO:,} bytes: not an agent description", hint=_REINIT_HINT
            )
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise StateError(f"{self.info_file} is not JSON: {exc}", hint=_REINIT_HINT) from exc
        from tpuctl.agent.protocol import AgentInfo

        return AgentInfo.from_json(data, str(self.info_file))

    def write_info(self, info: "AgentInfo") -> None:
        """Write ``agent.json`` atomically (owner-only, like the rest of the state dir); ``StateError`` naming
        it when it cannot be written."""
        self._write(self.info_file, json.dumps(info.to_json(), indent=2, sort_keys=True) + "\n")


def write_error(state: StateDir, path: str, exc: OSError) -> "StateError":
    """A state dir's file that could not be written (or made: a socket, a lock), as a ``StateError`` naming
    it and the cause; a full disk says so."""
    import errno  # here: only a failing write needs it

    from tpuctl.errors import StateError

    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    reason = exc.strerror or type(exc).__name__
    folder = os.path.dirname(path) or "."
    return StateError(
        f"cannot write {path}: {reason}" + (" (its file system is full)" if full else ""),
        hint=(f"free space there (`df -h {folder}`), or " if full else "")
        + f"pass --state-dir DIR (or set {STATE_DIR_ENV}) to a writable folder with room",
    )


def lock_holder(lock_file: str | os.PathLike[str]) -> int | None:
    """Who holds ``lock_file``'s flock: its pid (from ``/proc/locks``), 0 when held by a process this
    cannot name, None when nobody holds it (or the file does not exist)."""
    import fcntl  # here: the light path (tpuctl barrier, status, env) never takes or tests a lock

    try:
        fd = os.open(lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder_from_proc(os.fstat(fd)) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def live_pids(states: list[StateDir]) -> list[int | None]:
    """:meth:`StateDir.live_pid` of each state dir, reading ``/proc/locks`` once for all of them (linear in
    their number, where one call each would read the whole lock table each time)."""
    import fcntl

    held: list[tuple[int, str] | None] = []
    for i, state in enumerate(states):
        state.check()
        try:
            fd = os.open(state.lock_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            held.append(None)
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append((i, _lock_key(os.fstat(fd))))
                continue
            fcntl.flock(fd, fcntl.LOCK_UN)
            held.append(None)
        finally:
            os.close(fd)
    from tpuctl.processes import pid_alive

    holders = _flock_holders()
    out: list[int | None] = []
    for state, lock in zip(states, held, strict=True):
        if lock is None:
            out.append(None)
        elif holders.get(lock[1]):
            out.append(holders[lock[1]])
        else:
            pid = state.read_pid()
            out.append(pid if pid is not None and pid_alive(pid) else None)
    return out


def _lock_key(st: os.stat_result) -> str:
    return f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"


def _flock_holders() -> dict[str, int]:
    """Every FLOCK in ``/proc/locks``: ``MAJ:MIN:INODE`` -> pid (empty when the file cannot be read)."""
    lines = _proc_locks()
    if lines is None:
        return {}
    out: dict[str, int] = {}
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[4].isdigit():
            out.setdefault(fields[5], int(fields[4]))
    return out


def _holder_from_proc(st: os.stat_result) -> int | None:
    """The pid ``/proc/locks`` gives for a FLOCK on this inode (``1: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE ...``)."""
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in _proc_locks() or ():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == want and fields[4].isdigit():
            return int(fields[4])
    return None


def _proc_locks() -> list[str] | None:
    """The lines of ``/proc/locks``; None when it cannot be read."""
    try:
        with open("/proc/locks") as handle:
            return handle.read().splitlines()
    except OSError:
        return None


def not_running(state: StateDir) -> "StateError":
    """No agent for ``state``; the hint names a running simulated cluster (its exact commands) if there is one."""
    from tpuctl.errors import StateError

    hint = "run `tpuctl init --config FILE` first, with the same --state-dir"
    sims = [(root, hosts) for root, hosts in running_sims() if os.path.dirname(state.path) != str(root)]
    if sims:
        root, hosts = sims[0]
        flag = "" if root == default_sim_root() else f" --root {root}"
        more = f" ({len(sims) - 1} more: `tpuctl sim status --root DIR`)" if len(sims) > 1 else ""
        hint = (
            f"a simulated cluster of {hosts} hosts is running under {root}{more}: "
            f"`tpuctl status --state-dir {root / 'host-0'}`, or `tpuctl sim status{flag}`; " + hint
        )
    return StateError(f"no tpuctl agent is running for state dir {state.path}", hint=hint)


# --- simulated clusters' state dirs ----------------------------------------------------------------
# `tpuctl sim up` gives each host the state dir ROOT/host-N. Roots other than the default are recorded in
# DEFAULT_SIM_ROOT/roots (owner-only, like a state dir) so that a command run without --state-dir can point
# at a running simulated cluster wherever it is.

SIM_ROOTS_FILE = "roots"
MAX_SIM_ROOTS = 32  # recorded roots kept (the oldest dropped first); each is one line


def default_sim_root(environ: dict[str, str] | os._Environ[str] | None = None, uid: int | None = None) -> "Path":
    """Where ``tpuctl sim up`` puts its hosts' state dirs: ``$TPUCTL_STATE_DIR/sim``, else /tmp/tpuctl-sim-UID."""
    from pathlib import Path

    env = os.environ if environ is None else environ
    base = env.get(STATE_DIR_ENV)
    return Path(base) / "sim" if base else Path(f"/tmp/tpuctl-sim-{os.getuid() if uid is None else uid}")


def sim_host_count(root: "Path") -> int:
    """How many hosts of a simulated cluster run under ``root``: 0 unless host-0's agent is alive (then the
    number of ``host-N`` folders). One liveness check, so this costs the same for any size."""
    from tpuctl.errors import StateError

    try:
        alive = StateDir(root / "host-0").live_pid() is not None
    except StateError:
        return 0
    return sum(1 for _ in root.glob("host-*")) if alive else 0


def recorded_sim_roots() -> "list[Path]":
    """The roots ``tpuctl sim up`` recorded, oldest first; empty when the registry is missing or not ours."""
    from pathlib import Path

    from tpuctl.errors import StateError

    registry = StateDir(default_sim_root())
    try:
        registry.check()
        lines = (Path(registry.path) / SIM_ROOTS_FILE).read_text(errors="replace").splitlines()[:MAX_SIM_ROOTS]
    except (StateError, OSError):
        return []
    return [Path(line) for line in lines if line.startswith("/")]


def running_sims() -> "list[tuple[Path, int]]":
    """(root, hosts) of every simulated cluster running for this user: the default root, then the recorded ones."""
    roots = [default_sim_root(), *recorded_sim_roots()]
    out = []
    for root in dict.fromkeys(roots):
        hosts = sim_host_count(root)
        if hosts:
            out.append((root, hosts))
    return out


def record_sim_root(root: "Path", *, keep: bool = True) -> None:
    """Add ``root`` to the registry (``keep=False``: remove it), dropping roots with no cluster running."""
    from tpuctl.errors import StateError

    registry = StateDir(default_sim_root())
    if str(root) == registry.path:
        return
    roots = [r for r in recorded_sim_roots() if r != root and sim_host_count(r)]
    if keep:
        roots.append(root)
    from tpuctl.files import atomic_write

    try:
        registry.ensure()
        atomic_write(
            os.path.join(registry.path, SIM_ROOTS_FILE), "".join(f"{r}\n" for r in roots[-MAX_SIM_ROOTS:]), mode=0o600
        )
    except (StateError, OSError):
        pass  # only the hint of a command without --state-dir depends on it


def default_state_dir(environ: dict[str, str] | os._Environ[str], uid: int) -> str:
    """``TPUCTL_STATE_DIR``, else /run/tpuctl for root, else $XDG_RUNTIME_DIR/tpuctl or /tmp/tpuctl-UID."""
    explicit = (environ.get(STATE_DIR_ENV) or "").strip()  # `$(...)` can leave a trailing newline
    if explicit:
        return explicit
    if uid == 0:
        return DEFAULT_ROOT
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "tpuctl")
    return f"/tmp/tpuctl-{uid}"


def resolve_state_dir(option: str | None) -> StateDir:
    """The state dir a command uses: ``--state-dir`` (click also fills it from ``TPUCTL_STATE_DIR``,
    unstripped), else the environment's default. Surrounding whitespace is dropped, as
    :func:`default_state_dir` drops it; a value that is nothing else (``--state-dir "$UNSET"``) is an
    InputError naming it, never a silent fall back to the default dir."""
    if option is None:
        return StateDir(default_state_dir(os.environ, os.getuid()))
    path = option.strip()
    if not path:
        from tpuctl.errors import InputError  # here, not at the top: only a bad value loads it

        raise InputError(
            f"--state-dir (or ${STATE_DIR_ENV}) is {option!r}: it names no folder",
            hint=f"pass the folder tpuctl init used, or leave both out for the default ({_default_hint()})",
        )
    return StateDir(path)


def _default_hint() -> str:
    return default_state_dir({k: v for k, v in os.environ.items() if k != STATE_DIR_ENV}, os.getuid())
