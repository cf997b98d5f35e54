"""Server-side TLS: bind a gRPC port as PLAINTEXT, SSL or mTLS, with certificate reload.

``bind_port(server, host, port, tls)`` is the one place a Brook gRPC server (broker,
controller; sync ``grpc`` or ``grpc.aio``) opens a port. With TLS it uses gRPC's
dynamic server credentials: before each new handshake gRPC asks ``ReloadingCertificates``
for the current configuration, which re-reads the PEM files only when their size or
mtime changed. So an operator (or cert-manager) replacing the files rotates the
certificate or CA without a restart; connections already open keep their session.
A half-written or mismatched new pair is logged and the previous one kept serving.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from client.security import check_pems, read_pem
from proto import errors

log = logging.getLogger(__name__)

# How long a TLS handshake on a gRPC port (broker and controller) may take (gRPC's default is 120 s):
# a connection that never sends its ClientHello holds one of the port's connections that long, as
# kafka.authentication.timeout.ms bounds the Kafka listener's.
HANDSHAKE_TIMEOUT_MS = 10_000

CLIENT_AUTH_REQUIRED = "required"
CLIENT_AUTH_NONE = "none"


@dataclass(frozen=True)
class ServerTls:
    """PEM locations of one listener's certificate, key and the CA that client certificates must chain to."""

    cert: Path
    key: Path
    ca: Path | None = None
    client_auth: str = CLIENT_AUTH_REQUIRED  # "required" (mTLS) or "none" (server-only TLS)

    def __post_init__(self) -> None:
        if self.client_auth not in (CLIENT_AUTH_REQUIRED, CLIENT_AUTH_NONE):
            raise errors.InvalidConfigError(f"ssl.client.auth {self.client_auth!r} must be required or none")
        if self.client_auth == CLIENT_AUTH_REQUIRED and self.ca is None:
            raise errors.InvalidConfigError("ssl.client.auth=required needs ssl.ca.location (the client CA)")


def _stamp(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_mtime_ns, st.st_size


class ReloadingCertificates:
    """gRPC certificate-configuration fetcher that follows the PEM files on disk."""

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        self._stamps = self._current_stamps()
        self.loads = 0
        self.initial = self._load()

    def _paths(self) -> list[tuple[Path, str]]:
        return [(p, key) for p, key in ((self.tls.cert, "ssl.certificate.location"), (self.tls.key, "ssl.key.location"),
                                        (self.tls.ca, "ssl.ca.location")) if p is not None]

    def _current_stamps(self) -> tuple[tuple[int, int], ...]:
        stamps = []
        for path, key in self._paths():
            try:
                stamps.append(_stamp(path))
            except OSError as e:
                raise errors.InvalidConfigError(f"{key} {path}: cannot read it: {e.strerror or e}") from None
        return tuple(stamps)

    def _load(self) -> Any:
        # Bounded reads, not a stat: a pipe or a device (/dev/zero) reports size 0 and was read whole.
        cert, key = read_pem(self.tls.cert, "ssl.certificate.location"), read_pem(self.tls.key, "ssl.key.location")
        ca = read_pem(self.tls.ca, "ssl.ca.location") if self.tls.ca is not None else None
        check_pems(cert, key, ca, cert_name=f"ssl.certificate.location {self.tls.cert}",
                   key_name=f"ssl.key.location {self.tls.key}", ca_name=f"ssl.ca.location {self.tls.ca}")
        self.loads += 1
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def __call__(self) -> Any:
        """None keeps the current configuration (gRPC's contract); a new one is used from this handshake on."""
        with self._lock:
            try:
                stamps = self._current_stamps()
                if stamps == self._stamps:
                    return None
                config = self._load()
            except (OSError, ValueError, errors.BrookError) as e:
                log.warning("TLS files of %s unusable (%s); keeping the previous certificate", self.tls.cert, e)
                return None
            self._stamps = stamps
            log.info("reloaded TLS certificate %s", self.tls.cert)
            return config


def server_credentials(tls: ServerTls) -> grpc.ServerCredentials:
    try:
        fetcher = ReloadingCertificates(tls)
    except errors.BrookError:
        raise  # names the key and the file
    except (OSError, ValueError) as e:
        raise errors.InvalidConfigError(f"cannot read TLS files for {tls.cert}: {e}") from None
    return grpc.dynamic_ssl_server_credentials(
        fetcher.initial, fetcher, require_client_authentication=tls.client_auth == CLIENT_AUTH_REQUIRED)


def bind_port(server: Any, host: str, port: int, tls: ServerTls | None) -> int:
    """Open ``host:port`` on a grpc or grpc.aio server; the bound port (0 if gRPC could not bind)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if tls is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, server_credentials(tls)))
