"""TLS failures waiting cannot heal end a registration at once, naming the certificate and the cause.

gRPC reports a failed handshake as UNAVAILABLE, as it does a coordinator that is not up yet, so the
registration used to retry until the register timeout (5 minutes by default). Now a failed attempt asks
why with one plain handshake (``tls.handshake_refusal``): an expired or not yet valid certificate, one
naming another host, one another CA signed, or a client certificate the coordinator refuses is
``TlsRefused`` (exit 3) within a second or two, whatever the connect timeout. A coordinator that is not
listening yet is still waited for. Files that cannot be loaded (a passphrase, another certificate's key, no
PEM inside, a folder) are ``InputError`` (exit 2) before anything is served or dialled.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from coordination_harness import make_config, run
from test_coordination_tls import client_tls, tls_server
from tls_certs import BadFiles, Pki, make_bad_files, make_pki

from tpuctl.coordination.client import CoordinationClient
from tpuctl.coordination.tls import handshake_refusal, load_client_tls, load_server_tls
from tpuctl.errors import EXIT_CLUSTER, EXIT_INPUT, CoordinatorUnreachable, InputError, TlsRefused

CONNECT_TIMEOUT_S = 60.0  # what the registration would wait without the verdict
VERDICT_WITHIN_S = 10.0  # generous for a 2-core machine shared by several test runs; it takes well under 1 s


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, BadFiles]:
    folder = tmp_path_factory.mktemp("pki")
    return make_pki(folder), make_bad_files(folder)


def _case(pki: Pki, bad: BadFiles, case: str) -> tuple[dict[str, Any], dict[str, Any], tuple[str, ...]]:
    """(server settings, client settings, words the refusal must say) of each case."""
    mutual = {"cert": str(pki.client_cert), "key": str(pki.client_key)}
    return {
        "expired": ({"cert": bad.expired_cert}, {}, ("certificate has expired", "auth.tls.cert", "renew")),
        "not yet valid": ({"cert": bad.future_cert}, {}, ("certificate is not yet valid", "clocks")),
        "another name": ({"cert": pki.dns_only_cert, "key": pki.dns_only_key}, {},
                         ("mismatch", "127.0.0.1", "auth.tls.server_name")),
        "another CA": ({}, {"ca": str(pki.other_ca)}, ("unable to get local issuer certificate", str(pki.other_ca))),
        "client cert of another CA": ({"mutual": True}, {"cert": str(pki.other_client_cert),
                                       "key": str(pki.other_client_key)}, ("refused this host's client certificate",
                                       str(pki.other_client_cert))),
        "no client cert": ({"mutual": True}, {}, ("requires a client certificate", "no auth.tls.client_cert")),
        "expired client cert": ({"mutual": True}, {**mutual, "cert": str(bad.expired_client_cert)},
                                ("client certificate", str(bad.expired_client_cert))),
    }[case]  # fmt: skip


CASES = ["expired", "not yet valid", "another name", "another CA", "client cert of another CA", "no client cert",
         "expired client cert"]  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_tls_failure_that_cannot_heal_ends_the_registration_at_once(pki: tuple[Pki, BadFiles], case: str) -> None:
    good, bad = pki
    server, client, words = _case(good, bad, case)

    async def body() -> None:
        async with tls_server(make_config(2), good, **server) as service:
            tls = client_tls(good, **client)
            async with CoordinationClient(service.target, tls=tls, rpc_timeout=5.0) as c:
                started = time.monotonic()
                with pytest.raises(TlsRefused) as excinfo:
                    await c.open_session("test", 0, connect_timeout=CONNECT_TIMEOUT_S)
                took = time.monotonic() - started
        refused = excinfo.value
        text = f"{refused.message}\nhint: {refused.hint}"
        assert took < VERDICT_WITHIN_S, f"took {took:.1f} s: {text}"
        assert refused.exit_code == EXIT_CLUSTER
        assert service.target in refused.message
        for word in words:
            assert word in text, text

    run(body(), timeout=60.0)


def test_a_coordinator_not_listening_yet_is_still_waited_for(pki: tuple[Pki, BadFiles]) -> None:
    """The plain handshake finds nobody: no verdict, the registration goes on retrying; and a healthy TLS
    coordinator gets none either."""
    good, _ = pki

    async def body() -> None:
        async with tls_server(make_config(1), good) as service:
            target = service.target
            assert handshake_refusal(target, client_tls(good)) is None  # it answers: nothing to say
        assert handshake_refusal(target, client_tls(good)) is None  # gone: refused connection, not a verdict
        async with CoordinationClient(target, tls=client_tls(good), rpc_timeout=2.0) as c:
            started = time.monotonic()
            with pytest.raises(CoordinatorUnreachable, match="kept trying for"):
                await c.register("test", 0, connect_timeout=2.5)
            assert time.monotonic() - started >= 2.4

    run(body(), timeout=60.0)


@pytest.mark.parametrize(
    ("load", "words"),
    [
        (lambda g, b: load_server_tls(str(g.server_cert), str(b.passphrase_key)),
         ("TLS private key (auth.tls.key)", "passphrase.key", "protected by a passphrase")),
        (lambda g, b: load_server_tls(str(g.server_cert), str(g.client_key)),
         ("TLS private key (auth.tls.key)", "client.key", "is not the key of TLS certificate (auth.tls.cert)")),
        (lambda g, b: load_server_tls(str(b.garbage_cert), str(g.server_key)),
         ("TLS certificate (auth.tls.cert)", "garbage.pem", "holds no certificate OpenSSL can read")),
        (lambda g, b: load_server_tls(str(g.server_cert), str(b.garbage_key)),
         ("TLS private key (auth.tls.key)", "garbage.key", "holds no private key OpenSSL can read")),
        (lambda g, b: load_client_tls(str(g.ca), cert=str(g.client_cert), key=str(g.server_key)),
         ("TLS client key (auth.tls.client_key)", "server.key", "is not the key of TLS client certificate")),
        (lambda g, b: load_client_tls(str(b.garbage_cert)),
         ("TLS CA (auth.tls.ca)", "garbage.pem", "holds no certificate")),
        (lambda g, b: load_client_tls(str(g.ca.parent)), ("TLS CA (auth.tls.ca)", "is a folder; expected a PEM file")),
    ],
    ids=["passphrase", "another certificate's key", "garbage certificate", "garbage key", "client key mismatch",
         "garbage CA", "CA folder"],
)  # fmt: skip
def test_tls_files_that_cannot_work_are_input_errors_naming_the_file(pki: tuple[Pki, BadFiles], load: Any,
                                                                     words: tuple[str, ...]) -> None:  # fmt: skip
    good, bad = pki
    with pytest.raises(InputError) as excinfo:
        load(good, bad)
    assert excinfo.value.exit_code == EXIT_INPUT
    text = str(excinfo.value)
    for word in words:
        assert word in text, text


def test_tls_files_that_work_load(pki: tuple[Pki, BadFiles], tmp_path: Path) -> None:
    good, _ = pki
    assert load_server_tls(str(good.server_cert), str(good.server_key), client_ca=str(good.ca)).client_ca
    assert load_client_tls(str(good.ca), cert=str(good.client_cert), key=str(good.client_key)).files is not None
