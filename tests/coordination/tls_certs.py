"""Test certificates made with the ``openssl`` CLI (``cryptography`` is not installed): a CA, a server
certificate for the loopback addresses, a client certificate, and a second CA that signed none of them.

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
