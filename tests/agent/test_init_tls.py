"""``tpuctl init`` and ``tpuctl validate`` with TLS files that cannot work.

A coordinator certificate that expired ends every host's ``init`` at once (exit 3, the certificate and
the cause named), not after the register timeout; a key protected by a passphrase, a key of another
certificate, a file with no PEM inside are input errors (exit 2) naming the file, found by ``validate``
too, with a CA path that is a folder and a key readable by others.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "coordination"))
from tls_certs import BadFiles, Pki, make_bad_files, make_pki

from tpuctl.cli.validate import validate
from tpuctl.errors import EXIT_CLUSTER, EXIT_INPUT

REGISTER_TIMEOUT_S = 60.0
AT_ONCE_S = 20.0  # far below the register timeout; the verdict itself takes under a second


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, BadFiles]:
    folder = tmp_path_factory.mktemp("pki")
    return make_pki(folder), make_bad_files(folder)


def tls_spec(*, cert: Path, key: Path, ca: Path, client_cert: Path | None = None, client_key: Path | None = None
             ) -> str:  # fmt: skip
    client = f", client_cert: {client_cert}, client_key: {client_key}" if client_cert else ""
    return f"auth:\n  tls: {{cert: {cert}, key: {key}, ca: {ca}{client}}}\n"


@pytest.mark.slow
def test_an_expired_coordinator_certificate_ends_every_init_at_once(make_cluster, pki: tuple[Pki, BadFiles]) -> None:
    good, bad = pki
    c = make_cluster("v4-16", register_timeout=f"{REGISTER_TIMEOUT_S:g}s",
                     extra=tls_spec(cert=bad.expired_cert, key=good.server_key, ca=good.ca))  # fmt: skip
    worker = c.start_init(1)  # first: it retries, finding nobody, until task 0 serves the expired certificate
    c.wait_for_log(1, "not answering yet", timeout=30)
    coordinator = c.start_init(0)
    started = time.monotonic()
    done = c.processes.wait_all([coordinator, worker], AT_ONCE_S)
    took = time.monotonic() - started
    for finished in done:
        assert finished.code == EXIT_CLUSTER, finished
        assert "certificate has expired" in finished.err and "auth.tls.cert" in finished.err, finished.err
        assert "renew" in finished.err, finished.err
    assert took < AT_ONCE_S


@pytest.mark.slow
def test_a_passphrase_key_is_an_input_error_before_anything_starts(make_cluster, pki: tuple[Pki, BadFiles]) -> None:
    good, bad = pki
    c = make_cluster("v4-16", extra=tls_spec(cert=good.server_cert, key=bad.passphrase_key, ca=good.ca))
    done = c.wait_init(c.start_init(0).label, timeout=30)
    assert done.code == EXIT_INPUT, done
    assert f"TLS private key (auth.tls.key) {bad.passphrase_key} is protected by a passphrase" in done.err, done.err
    assert not (c.state(0) / "agent.log").exists()  # refused before the agent started


def _validate(tmp_path: Path, tls: str) -> tuple[int, str]:
    spec = tmp_path / "cluster.yaml"
    spec.write_text("cluster: pod-a\naccelerator: v4-16\nbackend: sim\nhosts: [h0, h1]\n" + tls)
    result = CliRunner().invoke(validate, ["--config", str(spec)])
    return result.exit_code, result.stderr


def test_validate_checks_the_tls_files_this_host_has(pki: tuple[Pki, BadFiles], tmp_path: Path) -> None:
    good, bad = pki
    loose = tmp_path / "loose.key"
    shutil.copy(good.client_key, loose)
    loose.chmod(0o644)
    code, err = _validate(tmp_path, tls_spec(cert=bad.garbage_cert, key=bad.passphrase_key, ca=good.ca.parent,
                                             client_cert=good.client_cert, client_key=loose))  # fmt: skip
    assert code == EXIT_INPUT
    lines = err.splitlines()
    assert lines[-1].endswith(": 4 problems"), err
    expected = [
        f":6:9: auth.tls.cert: TLS certificate (auth.tls.cert) {bad.garbage_cert} holds no certificate OpenSSL can read",
        f":6:9: auth.tls.key: TLS private key (auth.tls.key) {bad.passphrase_key} is protected by a passphrase",
        f":6:9: auth.tls.ca: TLS CA (auth.tls.ca) {good.ca.parent} is a folder; expected a PEM file",
        f":6:9: auth.tls.client_key: TLS client key (auth.tls.client_key) {loose} is accessible by group or others "
        "(mode 0644)",
    ]
    for want in expected:
        assert any(want.split(": ", 1)[1] in line for line in lines), f"{want}\n{err}"


def test_validate_names_a_key_of_another_certificate(pki: tuple[Pki, BadFiles], tmp_path: Path) -> None:
    good, _ = pki
    code, err = _validate(tmp_path, tls_spec(cert=good.server_cert, key=good.client_key, ca=good.ca))
    assert code == EXIT_INPUT
    assert f"auth.tls.key: TLS private key (auth.tls.key) {good.client_key} is not the key of TLS certificate" in err


def test_validate_passes_good_files_and_skips_those_not_on_this_host(pki: tuple[Pki, BadFiles], tmp_path: Path) -> None:
    good, _ = pki
    code, err = _validate(tmp_path, tls_spec(cert=good.server_cert, key=good.server_key, ca=good.ca,
                                             client_cert=good.client_cert, client_key=good.client_key))  # fmt: skip
    assert (code, err) == (0, "")
    code, err = _validate(tmp_path, tls_spec(cert=tmp_path / "task0-only.pem", key=tmp_path / "task0-only.key",
                                             ca=good.ca))  # fmt: skip
    assert (code, err) == (0, "")
