"""The coordination service over TLS and mutual TLS, with certificates the tests make (``tls_certs``).

A TLS cluster registers and meets at a barrier; the token rides inside TLS; a plaintext client, a client
trusting another CA, and (mutual TLS) a client without a certificate or with one another CA signed are
all refused at the handshake, and the service's state is unchanged by them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from coordination_harness import make_config, run
from tls_certs import Pki, make_pki

from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.server import CoordinationServer, start_server
from tpuctl.coordination.tls import ClientTls, load_client_tls, load_server_tls, read_pem
from tpuctl.coordination.values import ServiceConfig, TaskState
from tpuctl.errors import ClusterError, CoordinatorUnreachable, InputError, TlsRefused


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextlib.asynccontextmanager
async def tls_server(config: ServiceConfig, pki: Pki, *, mutual: bool = False, **tls: Any) -> AsyncIterator[CoordinationServer]:
    server_tls = load_server_tls(
        str(tls.get("cert", pki.server_cert)), str(tls.get("key", pki.server_key)),
        client_ca=str(pki.ca) if mutual else None,
    )  # fmt: skip
    server = await start_server(config, host="127.0.0.1", port=0, tls=server_tls)
    try:
        yield server
    finally:
        await server.stop(grace=None)


def client_tls(pki: Pki, *, mutual: bool = False, **overrides: Any) -> ClientTls:
    settings: dict[str, Any] = {"ca": str(pki.ca)}
    if mutual:
        settings.update(cert=str(pki.client_cert), key=str(pki.client_key))
    settings.update(overrides)
    return load_client_tls(settings.pop("ca"), **settings)


async def meet(target: str, tls: ClientTls, *, token: str | None = None, tasks: int = 2) -> list[int]:
    """Every task registers over ``tls`` and passes one barrier; each one's instance."""
    clients = [CoordinationClient(target, tls=tls, token=token, rpc_timeout=20.0) for _ in range(tasks)]
    try:
        members = [await c.register("test", t, connect_timeout=10.0) for t, c in enumerate(clients)]
        import asyncio

        return list(
            await asyncio.gather(*(c.barrier(m.task, "tls", timeout=20.0) for c, m in zip(clients, members, strict=True)))
        )
    finally:
        for c in clients:
            await c.close()


async def registered(target: str, tls: ClientTls) -> list[TaskState]:
    async with CoordinationClient(target, tls=tls) as client:
        return [t.state for t in (await client.status()).tasks]


def test_a_tls_cluster_registers_and_meets(pki: Pki) -> None:
    async def body() -> None:
        async with tls_server(make_config(2), pki) as server:
            assert await meet(server.target, client_tls(pki)) == [1, 1]

    run(body(), timeout=60.0)


def test_the_token_rides_inside_tls_and_is_still_checked(pki: Pki) -> None:
    async def body() -> None:
        async with tls_server(make_config(2, token="secret-token"), pki) as server:
            assert await meet(server.target, client_tls(pki), token="secret-token") == [1, 1]
            async with CoordinationClient(server.target, tls=client_tls(pki), token="wrong") as intruder:
                with pytest.raises(ClusterError, match="does not match"):
                    await intruder.register("test", 0)

    run(body(), timeout=60.0)


def test_a_plaintext_client_is_refused_by_a_tls_service(pki: Pki) -> None:
    async def body() -> None:
        async with tls_server(make_config(2), pki) as server:
            async with CoordinationClient(server.target, rpc_timeout=5.0) as plain:
                with pytest.raises(CoordinatorUnreachable):
                    await plain.register("test", 0)
            assert await registered(server.target, client_tls(pki)) == [TaskState.WAITING] * 2

    run(body(), timeout=60.0)


def test_a_client_trusting_another_ca_is_refused_with_a_tls_hint(pki: Pki) -> None:
    async def body() -> None:
        async with tls_server(make_config(2), pki) as server:
            async with CoordinationClient(server.target, tls=client_tls(pki, ca=str(pki.other_ca)), rpc_timeout=5.0) as c:
                with pytest.raises(TlsRefused, match="unable to get local issuer certificate") as excinfo:
                    await c.register("test", 0)
            assert "auth.tls.ca" in (excinfo.value.hint or "")
            assert await registered(server.target, client_tls(pki)) == [TaskState.WAITING] * 2

    run(body(), timeout=60.0)


def test_mutual_tls_needs_a_client_certificate_signed_by_the_ca(pki: Pki) -> None:
    async def body() -> None:
        async with tls_server(make_config(2), pki, mutual=True) as server:
            assert await meet(server.target, client_tls(pki, mutual=True)) == [1, 1]
            for tls in (
                client_tls(pki),  # no client certificate
                client_tls(pki, cert=str(pki.other_client_cert), key=str(pki.other_client_key)),  # another CA's
            ):
                async with CoordinationClient(server.target, tls=tls, rpc_timeout=5.0) as stranger:
                    with pytest.raises(CoordinatorUnreachable):
                        await stranger.status()

    run(body(), timeout=60.0)


def test_a_certificate_for_another_name_needs_server_name(pki: Pki) -> None:
    async def body() -> None:
        async with tls_server(make_config(1), pki, cert=pki.dns_only_cert, key=pki.dns_only_key) as server:
            async with CoordinationClient(server.target, tls=client_tls(pki), rpc_timeout=5.0) as by_address:
                with pytest.raises(CoordinatorUnreachable):
                    await by_address.status()
            named = client_tls(pki, server_name="coordinator.test")
            assert await registered(server.target, named) == [TaskState.WAITING]

    run(body(), timeout=60.0)


def test_unusable_pem_files_are_refused_before_serving(pki: Pki, tmp_path: Path) -> None:
    loose = tmp_path / "loose.key"
    loose.write_bytes(pki.server_key.read_bytes())
    loose.chmod(0o644)
    with pytest.raises(InputError, match=r"accessible by group or others \(mode 0644\)") as excinfo:
        load_server_tls(str(pki.server_cert), str(loose))
    assert excinfo.value.hint == f"chmod 600 {loose}"
    (tmp_path / "text.pem").write_text("not a certificate")
    with pytest.raises(InputError, match="is not a PEM file"):
        read_pem(tmp_path / "text.pem", "TLS CA (auth.tls.ca)")
    with pytest.raises(InputError, match="does not exist"):
        load_client_tls(str(tmp_path / "missing.pem"))
    with pytest.raises(InputError, match="is a folder; expected a PEM file"):
        read_pem(tmp_path, "TLS CA (auth.tls.ca)")
    with pytest.raises(InputError, match="needs both"):
        load_client_tls(str(pki.ca), cert=str(pki.client_cert))
