"""Run by Python at start-up in a job ``tpuctl run`` started (this folder leads its ``PYTHONPATH``).

Installs tpuctl's JAX cluster detector (``../jaxcluster.py``, loaded by path: the job's Python may not
have tpuctl installed), then runs the ``sitecustomize`` this one shadows, if there is one further along
``sys.path`` (Debian's, a virtualenv's), so nothing of the job's own start-up is lost. Never fails the
job: a problem is one line on stderr.

Other tpuctl start-up folders further along ``sys.path`` (a nested ``tpuctl run`` of another install, this
folder under another spelling) are skipped, by real path, and a second one that runs anyway does
nothing: each would otherwise run the other again, without end.
"""

from __future__ import annotations

import os
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
    _run_shadowed()
