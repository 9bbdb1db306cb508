"""TLS for the coordination service: PEM files from the spec's ``auth.tls`` to gRPC credentials.

The server (task 0) presents ``cert``/``key``; every client verifies it against ``ca`` (and, when the spec
names no ``server_name``, against the address it dials: the certificate needs that IP address or DNS
name in its subjectAltName). With ``client_cert``/``client_key`` the TLS is mutual: every host presents
its certificate and the server refuses, at the handshake, a client whose certificate ``ca`` did not sign.
The token, if any, then travels inside TLS.

Files are read once, bounded (a regular file of at most 1 MiB, PEM text); a private key readable by
group or others is refused, like the token file.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuctl.errors import InputError

MAX_PEM_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ServerTls:
    """What the coordination service serves with; ``client_ca`` set: mutual TLS (a client certificate
    signed by it is required)."""

    cert_chain: bytes
    private_key: bytes = field(repr=False)
    client_ca: bytes | None = None


@dataclass(frozen=True)
class ClientTls:
    """How a client verifies the service (``ca``, ``server_name``) and, for mutual TLS, who it is."""

    ca: bytes
    cert_chain: bytes | None = None
    private_key: bytes | None = field(default=None, repr=False)
    server_name: str | None = None
    """The name the service's certificate must carry, when not the address dialled."""


def read_pem(path: str | os.PathLike[str], what: str, *, private: bool = False) -> bytes:
    """The PEM file at ``path``; ``InputError`` naming ``what`` it is for when it is unusable."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{what} {path} is not a regular file")
    if info.st_size > MAX_PEM_BYTES:
        raise InputError(f"{what} {path} is {info.st_size:,} bytes; a PEM file of at most {MAX_PEM_BYTES:,} is expected")
    mode = stat.S_IMODE(info.st_mode)
    if private and mode & 0o077:
        raise InputError(
            f"{what} {path} is accessible by group or others (mode {mode:04o}); a private key must not be",
            hint=f"chmod 600 {path}",
        )
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from exc
    if b"-----BEGIN " not in data:
        raise InputError(f"{what} {path} is not a PEM file (no '-----BEGIN' line)")
    return data


def load_server_tls(cert: str, key: str, *, client_ca: str | None = None) -> ServerTls:
    return ServerTls(
        read_pem(cert, "TLS certificate (auth.tls.cert)"),
        read_pem(key, "TLS private key (auth.tls.key)", private=True),
        read_pem(client_ca, "TLS CA (auth.tls.ca)") if client_ca else None,
    )


def load_client_tls(
    ca: str, *, cert: str | None = None, key: str | None = None, server_name: str | None = None
) -> ClientTls:
    if (cert is None) != (key is None):
        raise InputError("mutual TLS needs both auth.tls.client_cert and auth.tls.client_key")
    return ClientTls(
        read_pem(ca, "TLS CA (auth.tls.ca)"),
        read_pem(cert, "TLS client certificate (auth.tls.client_cert)") if cert else None,
        read_pem(key, "TLS client key (auth.tls.client_key)", private=True) if key else None,
        server_name,
    )


def server_credentials(tls: ServerTls) -> Any:
    import grpc

    return grpc.ssl_server_credentials(
        [(tls.private_key, tls.cert_chain)],
        root_certificates=tls.client_ca,
        require_client_auth=tls.client_ca is not None,
    )


def channel_credentials(tls: ClientTls) -> Any:
    import grpc

    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.private_key, certificate_chain=tls.cert_chain
    )
