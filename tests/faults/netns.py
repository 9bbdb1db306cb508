"""Network namespaces for partition tests: one per host, each with a veth into a bridge that lives in a
namespace of its own (the hub), addresses from 10.213.0.0/24 that exist only inside these namespaces.
Nothing is added to the machine's own network namespace; deleting the namespaces deletes the veths and
the bridge with them.

A cut takes one host's port off the bridge (``nomaster``): its interface stays up with its address and
route, and its packets go nowhere, as when a switch port or a link dies. A heal puts it back.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess

SUBNET = "10.213.0"
PREFIX = f"tpf{os.getpid() % 100000}"  # names of this session's namespaces (<= 15 characters per link)
CREATED: list[str] = []


def unavailable() -> str | None:
    """Why namespace tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "network namespace tests need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) on this machine"
    probe = f"{PREFIX}probe"
    try:
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
        if made.returncode != 0:
            return f"`ip netns add` failed: {made.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30, check=False)
    return None


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class Network:
    """``hosts`` namespaces on one bridge; ``exec(i)`` is the command prefix to run inside host i's."""

    def __init__(self, hosts: int, tag: str) -> None:
        self.hub = f"{PREFIX}{tag}hub"
        self.names = [f"{PREFIX}{tag}h{i}" for i in range(hosts)]
        self.addresses = [f"{SUBNET}.{2 + i}" for i in range(hosts)]

    def __enter__(self) -> Network:
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _create(self) -> None:
        for name in [self.hub, *self.names]:
            ip("netns", "add", name)
            CREATED.append(name)
            ip("-n", name, "link", "set", "lo", "up")
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for i, (name, address) in enumerate(zip(self.names, self.addresses, strict=True)):
            ip("-n", self.hub, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", name)
            ip("-n", self.hub, "link", "set", f"p{i}", "master", "br0")
            ip("-n", self.hub, "link", "set", f"p{i}", "up")
            ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", name, "link", "set", "eth0", "up")

    def exec(self, host: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[host]]

    def cut(self, host: int) -> None:
        ip("-n", self.hub, "link", "set", f"p{host}", "nomaster")

    def heal(self, host: int) -> None:
        ip("-n", self.hub, "link", "set", f"p{host}", "master", "br0")

    def remove(self) -> None:
        for name in [*self.names, self.hub]:
            with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
                ip("netns", "del", name)
            if name in CREATED:
                CREATED.remove(name)


def remove_all_of_this_session() -> None:
    for name in list(CREATED):
        with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
            ip("netns", "del", name)
        CREATED.remove(name)
