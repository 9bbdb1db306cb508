"""This host's names and addresses, with the resolver faked: loopback never counts."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tpuctl.spec import hostenv


def fake_resolver(monkeypatch: pytest.MonkeyPatch, hostname: str, fqdn: str, table: dict[str, list[str]]) -> None:
    def getaddrinfo(name: str, *args: Any, **kwargs: Any) -> list[tuple[Any, ...]]:
        if name not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in table[name]
        ]

    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    monkeypatch.setattr(socket, "getfqdn", lambda: fqdn)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_tpu_vm_names_and_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_resolver(
        monkeypatch, "t1v-n-4f1c-w-2", "t1v-n-4f1c-w-2.us-central2-b.c.proj.internal",
        {"t1v-n-4f1c-w-2": ["10.130.0.28"], "t1v-n-4f1c-w-2.us-central2-b.c.proj.internal": ["10.130.0.28"]},
    )  # fmt: skip
    assert hostenv.local_names() == {
        "t1v-n-4f1c-w-2", "t1v-n-4f1c-w-2.us-central2-b.c.proj.internal", "10.130.0.28",
    }  # fmt: skip


def test_loopback_is_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    # Debian maps the hostname to 127.0.1.1; some containers call themselves localhost.
    fake_resolver(
        monkeypatch, "box", "localhost", {"box": ["127.0.1.1", "::1", "192.0.2.9"], "localhost": ["127.0.0.1"]}
    )
    assert hostenv.local_names() == {"box", "192.0.2.9"}


def test_unresolvable_hostname_still_counts_as_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_resolver(monkeypatch, "lonely", "lonely", {})
    assert hostenv.local_names() == {"lonely"}


def test_environ_is_a_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_WORKER_ID", "3")
    snapshot = hostenv.environ()
    monkeypatch.setenv("TPU_WORKER_ID", "4")
    assert snapshot["TPU_WORKER_ID"] == "3"
