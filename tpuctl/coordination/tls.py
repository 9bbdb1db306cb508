"""TLS for the coordination service: PEM files from the spec's ``auth.tls`` to gRPC credentials.

The server (task 0) presents ``cert``/``key``; every client verifies it against ``ca`` (and, when the spec
names no ``server_name``, against the address it dials: the certificate needs that IP address or DNS
name in its subjectAltName). With ``client_cert``/``client_key`` the TLS is mutual: every host presents
its certificate and the server refuses, at the handshake, a client whose certificate ``ca`` did not sign.
The token, if any, then travels inside TLS.

Files are read once, bounded (a regular file of at most 1 MiB, PEM text); a private key readable by
group or others is refused, like the token file. Before anything is served or dialled, OpenSSL (the
``ssl`` module) loads them as gRPC will: a file that holds no certificate or key it can read, a key
protected by a passphrase (nobody is there to type it) or one that is not its certificate's is an
``InputError`` naming the file (``tpuctl validate`` finds the same: :func:`file_problems`).

A handshake that fails is only ``UNAVAILABLE`` to a gRPC client, as a coordinator not started yet is. So
when a registration finds nobody, the client makes one plain handshake with the same CA, name and client
certificate (:func:`handshake_refusal`): OpenSSL says exactly why it failed, and a reason waiting cannot
heal (an expired or not yet valid certificate, another name, another CA, a client certificate refused)
ends the registration at once as ``TlsRefused`` (exit 3) instead of after the register timeout.
"""

from __future__ import annotations

import os
import ssl
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tpuctl.errors import InputError, TlsRefused

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
    files: TlsFiles | None = None
    """Where they were read from (the plain handshake of :func:`handshake_refusal` loads them by path)."""


@dataclass(frozen=True)
class TlsFiles:
    ca: str
    cert: str | None = None
    key: str | None = None


def read_pem(path: str | os.PathLike[str], what: str, *, private: bool = False) -> bytes:
    """The PEM file at ``path``; ``InputError`` naming ``what`` it is for when it is unusable."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from exc
    if stat.S_ISDIR(info.st_mode):
        raise InputError(f"{what} {path} is a folder; expected a PEM file", hint="name the file itself")
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
    if private and (b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data or b"Proc-Type: 4,ENCRYPTED" in data):
        raise _passphrase(what, path)
    return data


def _passphrase(what: str, path: str | os.PathLike[str]) -> InputError:
    return InputError(
        f"{what} {path} is protected by a passphrase: the agent runs unattended and cannot ask for it",
        hint=f"store it unencrypted, owner-only: `openssl pkey -in {path} -out KEY && chmod 600 KEY`",
    )


CERT_WHAT = "TLS certificate (auth.tls.cert)"
KEY_WHAT = "TLS private key (auth.tls.key)"
CA_WHAT = "TLS CA (auth.tls.ca)"
CLIENT_CERT_WHAT = "TLS client certificate (auth.tls.client_cert)"
CLIENT_KEY_WHAT = "TLS client key (auth.tls.client_key)"


def load_server_tls(cert: str, key: str, *, client_ca: str | None = None) -> ServerTls:
    tls = ServerTls(
        read_pem(cert, CERT_WHAT),
        read_pem(key, KEY_WHAT, private=True),
        read_pem(client_ca, CA_WHAT) if client_ca else None,
    )
    check_pair(cert, key, CERT_WHAT, KEY_WHAT)
    if client_ca:
        check_ca(client_ca)
    return tls


def load_client_tls(
    ca: str, *, cert: str | None = None, key: str | None = None, server_name: str | None = None
) -> ClientTls:
    if (cert is None) != (key is None):
        raise InputError("mutual TLS needs both auth.tls.client_cert and auth.tls.client_key")
    tls = ClientTls(
        read_pem(ca, CA_WHAT),
        read_pem(cert, CLIENT_CERT_WHAT) if cert else None,
        read_pem(key, CLIENT_KEY_WHAT, private=True) if key else None,
        server_name,
        TlsFiles(ca, cert, key),
    )
    check_ca(ca)
    if cert and key:
        check_pair(cert, key, CLIENT_CERT_WHAT, CLIENT_KEY_WHAT)
    return tls


def check_ca(path: str, what: str = CA_WHAT) -> None:
    """``InputError`` unless OpenSSL reads at least one certificate from the file at ``path``."""
    try:
        ssl.create_default_context(cafile=path)
    except ssl.SSLError as exc:
        raise InputError(f"{what} {path} holds no certificate OpenSSL can read ({_reason(exc)})",
                         hint=f"`openssl x509 -in {path} -noout -subject` shows what is wrong") from exc  # fmt: skip
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc


def check_pair(cert: str, key: str, cert_what: str, key_what: str) -> None:
    """``InputError`` naming the file unless OpenSSL loads ``cert`` with ``key``: a certificate it cannot
    read, a key protected by a passphrase, a key it cannot read, or a key that is not the certificate's."""
    check_ca(cert, cert_what)  # a certificate it can read (the chain's first one is the service's)
    asked: list[bool] = []

    def no_passphrase() -> bytes:
        asked.append(True)
        return b""

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=no_passphrase)
    except ssl.SSLError as exc:
        if asked:
            raise _passphrase(key_what, key) from exc
        if getattr(exc, "reason", None) == "KEY_VALUES_MISMATCH":
            raise InputError(
                f"{key_what} {key} is not the key of {cert_what} {cert}",
                hint=f"give the key the certificate was made with: `openssl x509 -in {cert} -noout -pubkey` and "
                f"`openssl pkey -in {key} -pubout` print the same key",
            ) from exc
        raise InputError(f"{key_what} {key} holds no private key OpenSSL can read ({_reason(exc)})",
                         hint=f"`openssl pkey -in {key} -noout` shows what is wrong") from exc  # fmt: skip
    except OSError as exc:
        raise InputError(f"cannot read {key_what} {key}: {exc.strerror or exc}") from exc


def _reason(exc: Exception) -> str:
    """OpenSSL's words for ``exc`` without the source location: "[SSL] PEM lib (_ssl.c:3905)" -> "PEM lib"."""
    text = str(getattr(exc, "verify_message", None) or getattr(exc, "strerror", None) or exc)
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(" (_ssl.c:")[0].strip() or type(exc).__name__


def file_problems(
    cert: str, key: str, ca: str, client_cert: str | None = None, client_key: str | None = None
) -> list[tuple[str, str]]:
    """What ``tpuctl validate`` says about the spec's TLS files on this host: (key, problem) for each that
    cannot be used. A file that is not on this host is not checked (``cert`` and ``key`` are task 0's
    only); one that is must be a readable, bounded PEM file (a key owner-only) OpenSSL loads, each key
    its certificate's."""
    problems: list[tuple[str, str]] = []

    def fine(name: str, path: str, what: str, *, private: bool = False) -> bool:
        """The file at ``path`` is bounded PEM text (a key: owner-only); a problem for ``name`` otherwise."""
        try:
            read_pem(path, what, private=private)
            if name in ("ca", "cert", "client_cert"):
                check_ca(path, what)
        except InputError as exc:
            problems.append((f"auth.tls.{name}", exc.message + (f"; {exc.hint}" if exc.hint else "")))
            return False
        return True

    if os.path.lexists(ca):
        fine("ca", ca, CA_WHAT)
    pairs = [("cert", "key", cert, key, CERT_WHAT, KEY_WHAT)]
    if client_cert is not None and client_key is not None:
        pairs.append(("client_cert", "client_key", client_cert, client_key, CLIENT_CERT_WHAT, CLIENT_KEY_WHAT))
    for cert_name, key_name, cert_path, key_path, cert_what, key_what in pairs:
        if not os.path.lexists(cert_path) and not os.path.lexists(key_path):
            continue  # not this host's (task 0's certificate, on a worker)
        good = fine(cert_name, cert_path, cert_what)
        good = fine(key_name, key_path, key_what, private=True) and good
        if good:
            try:
                check_pair(cert_path, key_path, cert_what, key_what)
            except InputError as exc:
                problems.append((f"auth.tls.{key_name}", exc.message + (f"; {exc.hint}" if exc.hint else "")))
    return problems


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


# --- why a handshake failed ------------------------------------------------------------------------

HANDSHAKE_TIMEOUT_S = 2.0
"""How long each step of :func:`handshake_refusal`'s plain handshake may take: the connection, then the
handshake with the service's first answer."""
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
# How the service refuses this host's client certificate (mutual TLS): gRPC's server ends the connection
# right after the handshake, with no alert and no answer (TLS 1.3: the client's side of the handshake
# completed before the server verified the certificate). Other servers send an alert with these reasons.
_CLIENT_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_BAD_CERTIFICATE", "TLSV1_ALERT_UNKNOWN_CA",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED", "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_REVOKED", "TLSV1_ALERT_ACCESS_DENIED", "TLSV1_ALERT_DECRYPT_ERROR",
}  # fmt: skip
_AGAIN_S = 0.2  # the second look at a connection ended after the handshake (a stopping service refuses the next)
# X509_V_ERR_* codes (openssl/x509_vfy.h) a hint is written for.
_EXPIRED, _NOT_YET_VALID = 10, 9
_UNKNOWN_ISSUER = (2, 18, 19, 20, 21)  # unable to get issuer / self-signed / not trusted: another CA
_WRONG_NAME = (62, 64)  # hostname / IP address mismatch


def split_target(target: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"."""
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def handshake_refusal(target: str, tls: ClientTls, timeout: float = HANDSHAKE_TIMEOUT_S) -> TlsRefused | None:
    """Plain TLS handshakes with the coordinator at ``target``, as this host's gRPC channel makes them (the
    same CA, server name and client certificate): ``TlsRefused`` naming the certificate and what is wrong
    with it when the failure is one waiting cannot heal; None when the handshake succeeds or fails
    otherwise (nobody listening yet, a timeout: the caller retries). A connection the service ends right
    after the handshake (how it refuses a client certificate) is looked at twice, ``_AGAIN_S`` apart: a
    service that is stopping does not accept the second. Blocking: ``4 * timeout + _AGAIN_S`` s at most."""
    if tls.files is None:
        return None  # made from bytes (tests): nothing to load by path
    host, port = split_target(target)
    name = tls.server_name or host
    try:
        context = ssl.create_default_context(cafile=tls.files.ca)
        if tls.files.cert and tls.files.key:
            context.load_cert_chain(tls.files.cert, tls.files.key)
        context.set_alpn_protocols(["h2"])
    except (ssl.SSLError, OSError):
        return None  # checked when loaded; changed since: the channel's own error says it
    for look in range(2):
        try:
            outcome = _handshake(context, host, port, name, timeout)
        except ssl.SSLCertVerificationError as exc:
            return _server_refused(target, name, tls, exc)
        if outcome != "ended" or look:
            return _client_refused(target, tls) if outcome in ("ended", "alert") else None
        time.sleep(_AGAIN_S)
    return None


def _handshake(context: ssl.SSLContext, host: str, port: int, name: str, timeout: float) -> str:
    """One handshake and the service's first answer: "answered", "ended" (closed with no word after the
    handshake), "alert" (an alert refusing this host's certificate) or "other" (not there, a timeout, ...);
    ``SSLCertVerificationError`` when this host refuses the service's certificate."""
    import socket

    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return "other"
    try:
        with context.wrap_socket(raw, server_hostname=name, suppress_ragged_eofs=False) as conn:
            conn.settimeout(timeout)
            conn.sendall(_H2_PREFACE)
            return "answered" if conn.recv(1) else "ended"
    except ssl.SSLCertVerificationError:
        raise
    except ssl.SSLEOFError:
        return "ended"
    except ssl.SSLError as exc:
        return "alert" if getattr(exc, "reason", None) in _CLIENT_ALERTS else "other"
    except (ConnectionResetError, BrokenPipeError):
        return "ended"
    except OSError:
        return "other"
    finally:
        raw.close()


def _client_refused(target: str, tls: ClientTls) -> TlsRefused:
    """The service ended the connection right after a handshake this host accepted: it refused this host's
    client certificate (or wants one and this host has none)."""
    assert tls.files is not None
    if tls.files.cert:
        what = f"refused this host's client certificate (auth.tls.client_cert {tls.files.cert})"
    else:
        what = "requires a client certificate (mutual TLS), and this host's spec has no auth.tls.client_cert"
    return TlsRefused(
        f"the coordinator at {target} {what}: it ended the connection right after the TLS handshake",
        hint="task 0 verifies client certificates with its auth.tls.ca: every host needs one that CA signed, "
        "valid now (`openssl verify -CAfile CA CERT`); task 0's agent log names the reason (Handshake failed)",
    )


def _server_refused(target: str, name: str, tls: ClientTls, exc: ssl.SSLCertVerificationError) -> TlsRefused:
    """The coordinator's certificate failed this host's verification: what is wrong with it, and a hint."""
    assert tls.files is not None
    code, why = exc.verify_code, _reason(exc)
    what = f"the coordinator's TLS certificate (task 0's auth.tls.cert) at {target}"
    look = f"`openssl s_client -connect {target} </dev/null | openssl x509 -noout -dates -subject -ext subjectAltName`"
    if code == _EXPIRED:
        hint = f"renew task 0's certificate (auth.tls.cert) and restart its init; {look} shows its dates"
    elif code == _NOT_YET_VALID:
        hint = f"its notBefore is in the future: check the clocks of task 0, this host and the CA's; {look}"
    elif code in _WRONG_NAME:
        hint = (f"the certificate must name {name!r} in its subjectAltName (the address hosts dial), or set "
                f"auth.tls.server_name to a name it carries; {look}")  # fmt: skip
    elif code in _UNKNOWN_ISSUER:
        hint = (f"this host verifies it with auth.tls.ca {tls.files.ca}: every host needs the CA that signed "
                f"task 0's certificate; {look} shows its issuer")  # fmt: skip
    else:
        hint = look
    return TlsRefused(
        f"{what} was refused by this host: {why} (verifying it with auth.tls.ca {tls.files.ca})",
        hint=hint,
        coordinator_certificate=True,
    )
