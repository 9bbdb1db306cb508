"""Test certificates made with the ``openssl`` CLI (``cryptography`` is not installed): a CA, a server
certificate for the loopback addresses, a client certificate, and a second CA that signed none of them;
:func:`make_bad_files`: certificates and keys that cannot work (expired, not yet valid, a passphrase, a
key of another certificate, no PEM inside).

Every key is EC P-256 (fast to make) and written mode 600, as ``tpuctl.coordination.tls`` requires.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

SANS = ",".join(["DNS:localhost", "DNS:coordinator.test", *(f"IP:127.0.0.{i}" for i in range(1, 21))])


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed nothing here: verifying with it must fail."""
    other_client_cert: Path
    other_client_key: Path
    """A client certificate signed by ``other_ca``."""
    dns_only_cert: Path
    """A server certificate naming only coordinator.test (no IP): needs ``server_name``."""
    dns_only_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(folder: Path, name: str) -> None:
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=tpuctl test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip


def _leaf(folder: Path, name: str, ca: str, sans: str, usage: str) -> None:
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=tpuctl test {name}", cwd=folder,
    )  # fmt: skip
    (folder / f"{name}.ext").write_text(
        f"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage={usage}\n"
        + (f"subjectAltName={sans}\n" if sans else "")
    )
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=folder,
    )  # fmt: skip


def make_pki(folder: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    folder.mkdir(parents=True, exist_ok=True)
    _ca(folder, "ca")
    _ca(folder, "other-ca")
    _leaf(folder, "server", "ca", SANS, "serverAuth")
    _leaf(folder, "client", "ca", "DNS:client.test", "clientAuth")
    _leaf(folder, "other-client", "other-ca", "DNS:client.test", "clientAuth")
    _leaf(folder, "dns-only", "ca", "DNS:coordinator.test", "serverAuth")
    for key in folder.glob("*.key"):
        os.chmod(key, 0o600)
    return Pki(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
        other_ca=folder / "other-ca.pem",
        other_client_cert=folder / "other-client.pem",
        other_client_key=folder / "other-client.key",
        dns_only_cert=folder / "dns-only.pem",
        dns_only_key=folder / "dns-only.key",
    )


@dataclass(frozen=True)
class BadFiles:
    """Files made by :func:`make_bad_files`, each wrong in one way (the rest as in the ``Pki``)."""

    expired_cert: Path
    """The server's key and names, valid from 2020-01-01 to 2020-01-02 (signed by the CA)."""
    future_cert: Path
    """The server's key and names, valid from 2090 on."""
    expired_client_cert: Path
    """The client's key, expired."""
    passphrase_key: Path
    """The server's key, encrypted with the passphrase "secret"."""
    garbage_cert: Path
    """A PEM block of something that is not base64."""
    garbage_key: Path


_CA_CONFIG = """[ca]
default_ca = this
[this]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = any
unique_subject = no
[any]
commonName = supplied
"""


def _dated(folder: Path, name: str, key: str, ext: str, start: str, end: str) -> None:
    """``name``.pem for ``key`` (its names from ``ext``), signed by the CA, valid from ``start`` to ``end``
    (``YYYYMMDDHHMMSSZ``): ``openssl x509`` of OpenSSL 3.0 cannot set the start, ``openssl ca`` can."""
    _openssl("req", "-new", "-key", key, "-out", f"{name}.csr", "-subj", f"/CN=tpuctl test {name}", cwd=folder)
    _openssl(
        "ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key", "-in", f"{name}.csr",
        "-out", f"{name}.pem", "-startdate", start, "-enddate", end, "-extfile", ext, "-notext", cwd=folder,
    )  # fmt: skip


def make_bad_files(folder: Path) -> BadFiles:
    """The bad files, in ``folder``, where :func:`make_pki` made its certificates."""
    (folder / "ca.cnf").write_text(_CA_CONFIG)
    (folder / "index.txt").write_text("")
    (folder / "serial").write_text("1000\n")
    _dated(folder, "expired", "server.key", "server.ext", "20200101000000Z", "20200102000000Z")
    _dated(folder, "future", "server.key", "server.ext", "20900101000000Z", "20910101000000Z")
    _dated(folder, "expired-client", "client.key", "client.ext", "20200101000000Z", "20200102000000Z")
    _openssl("pkey", "-in", "server.key", "-aes256", "-passout", "pass:secret", "-out", "passphrase.key", cwd=folder)
    for kind, name in (("CERTIFICATE", "garbage.pem"), ("PRIVATE KEY", "garbage.key")):
        (folder / name).write_text(f"-----BEGIN {kind}-----\nnot base64 at all!\n-----END {kind}-----\n")
    for key in folder.glob("*.key"):
        os.chmod(key, 0o600)
    return BadFiles(
        expired_cert=folder / "expired.pem",
        future_cert=folder / "future.pem",
        expired_client_cert=folder / "expired-client.pem",
        passphrase_key=folder / "passphrase.key",
        garbage_cert=folder / "garbage.pem",
        garbage_key=folder / "garbage.key",
    )
