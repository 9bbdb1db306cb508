"""Run by Python at start-up in a job ``tpuctl run`` started (this folder leads its ``PYTHONPATH``).

Installs tpuctl's JAX cluster detector (``../jaxcluster.py``, loaded by path: the job's Python may not
have tpuctl installed) and the black box's stack dump handler (``_install_stack_hook``), then runs the ``sitecustomize`` this one shadows, if there is one further along
``sys.path`` (Debian's, a virtualenv's), so nothing of the job's own start-up is lost. Never fails the
job: a problem is one line on stderr.

Other tpuctl start-up folders further along ``sys.path`` (a nested ``tpuctl run`` of another install, this
folder under another spelling) are skipped, by real path, and a second one that runs anyway does
nothing: each would otherwise run the other again, without end.
"""

from __future__ import annotations

import os
import signal
import sys


def _install_detector() -> None:
    from importlib.util import module_from_spec, spec_from_file_location

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxcluster.py")
    spec = spec_from_file_location("_tpuctl_jaxcluster", path)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.install()


STACK_SIGNAL_OFFSET = 6
"""The job's stacks are dumped on SIGRTMIN + this (``tpuctl.agent.stacks``; not one ``tpuctl run`` forwards)."""


def _install_stack_hook() -> None:
    """The black box's fallback where py-spy cannot read this process: on SIGRTMIN + 6, faulthandler
    writes every thread's stack to ``STATE_DIR/blackbox/stacks-PID`` (opened now, in C, without the GIL:
    it works while Python code is stuck). The file starts with a line naming the signal and the main thread."""
    state_dir = os.environ.get("TPUCTL_STATE_DIR", "")
    if not state_dir or not hasattr(signal, "SIGRTMIN"):
        return
    import _thread
    import faulthandler

    folder = os.path.join(state_dir, "blackbox")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    pid = os.getpid()
    sig = signal.SIGRTMIN + STACK_SIGNAL_OFFSET
    fd = os.open(os.path.join(folder, f"stacks-{pid}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    os.write(fd, f"# tpuctl stacks: pid {pid} signal {int(sig)} main {_thread.get_ident():#x}\n".encode())
    faulthandler.register(sig, file=fd, all_threads=True, chain=False)
    global _stack_fd
    _stack_fd = fd  # open for the process's life (not inherited by what it executes)


_stack_fd = -1


def _is_startup(folder: str) -> bool:
    """A tpuctl start-up folder: ``job/startup/sitecustomize.py`` beside ``job/jaxcluster.py``."""
    return (
        os.path.basename(folder) == "startup"
        and os.path.isfile(os.path.join(folder, "sitecustomize.py"))
        and os.path.isfile(os.path.join(os.path.dirname(folder), "jaxcluster.py"))
    )


def _run_shadowed() -> None:
    from importlib.machinery import PathFinder
    from importlib.util import module_from_spec

    rest = [p for p in sys.path if not _is_startup(os.path.realpath(p or os.curdir))]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


if "_tpuctl_startup" not in sys.modules:  # the first tpuctl start-up of this process, the only one
    sys.modules["_tpuctl_startup"] = sys.modules[__name__]
    try:
        _install_detector()
    except Exception as exc:
        sys.stderr.write(f"tpuctl: the JAX cluster detector was not installed: {type(exc).__name__}: {exc}\n")
    try:
        _install_stack_hook()
    except Exception as exc:
        sys.stderr.write(f"tpuctl: the stack dump hook was not installed: {type(exc).__name__}: {exc}\n")
    _run_shadowed()
