"""The one edge that reads this host's environment variables and its own names and addresses, and that
asks the metadata server (:func:`detect_cluster`: the pure :func:`tpuctl.spec.detect.detect` with a real client).

Loopback is left out on purpose: ``localhost``, ``127.x`` and ``::1`` name every machine, so matching
them against a spec's hosts would pick a task on the wrong host of a real pod (and on one machine
running a simulated cluster, every 127.0.0.x task would match). Simulated clusters pass ``--task-id``.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: jobs import this module for environ() alone
    from tpuctl.spec.detect import Detection
    from tpuctl.spec.metadata import MetadataClient

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def environ() -> dict[str, str]:
    """A snapshot of this process's environment variables."""
    return dict(os.environ)


def _is_loopback(name: str) -> bool:
    if name.lower().rstrip(".") in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _addresses(name: str) -> set[str]:
    """The addresses ``name`` resolves to (none when it does not resolve)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return set()
    return {str(info[4][0]) for info in infos}


def local_names() -> frozenset[str]:
    """This host's names and addresses: hostname, FQDN, and what they resolve to, without loopback."""
    names = {n for n in (socket.gethostname(), socket.getfqdn()) if n}
    for name in list(names):
        names |= _addresses(name)
    return frozenset(n for n in names if not _is_loopback(n))


def metadata_client(env: dict[str, str] | None = None) -> MetadataClient:
    """The GCE metadata server client this host's environment names (``GCE_METADATA_HOST``, ...).

    InputError naming the variable when an override is malformed.
    """
    from tpuctl.errors import InputError
    from tpuctl.spec.metadata import MetadataClient

    try:
        return MetadataClient.from_environ(environ() if env is None else env)
    except ValueError as exc:
        raise InputError(str(exc), hint="unset it to use metadata.google.internal") from None


def detect_cluster() -> Detection:
    """The spec this host's environment and (on a Cloud TPU VM) its metadata server describe."""
    from tpuctl.spec.detect import detect

    env = environ()
    return detect(env, metadata_client(env))
