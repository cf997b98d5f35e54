"""A small certificate authority for local and test clusters (``cryptography``).

``python -m deploy.local start`` makes one under ``<cluster dir>/tls``: a CA, one
certificate per node (``CN=node-<id>``, so it maps to the broker principal
``User:node-<id>``) and one client certificate (``CN=<client name>``). Every server
certificate names ``localhost``, ``127.0.0.1`` and the node's host in its SAN, so
clients verify the host as ``ssl.endpoint.identification.algorithm=https`` demands.
Production deployments should bring their own PKI; for small ones and examples:

    python -m deploy.local.certs --dir /etc/brook/tls --node 1=brook-1 --node 2=brook-2 --client admin
    python -m deploy.local.certs --dir /etc/brook/tls --node 1=broker-1.example,10.0.0.5 --out-name node

makes (or reuses) ``ca.pem``/``ca.key`` in DIR and issues ``node-<id>.pem``/``.key``
(``CN=node-<id>``, SAN: the given hosts plus localhost) and ``<client>.pem``/``.key``.
``--out-name node`` writes a single node's files as ``node.pem``/``node.key`` (what
the example configs read).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 825


@dataclass(frozen=True)
class CertFiles:
    """PEM paths of one identity: its certificate, its key and the CA that signed it."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class CertificateAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    path: Path  # the CA certificate PEM

    @classmethod
    def create(cls, directory: Path, name: str = "Brook local CA") -> CertificateAuthority:
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        path = directory / "ca.pem"
        _write(path, cert.public_bytes(serialization.Encoding.PEM))
        _write(directory / "ca.key", _key_pem(key), private=True)
        return cls(cert, key, path)

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cls(cert, key, directory / "ca.pem")

    @classmethod
    def load_or_create(cls, directory: Path) -> CertificateAuthority:
        if (directory / "ca.pem").exists() and (directory / "ca.key").exists():
            return cls.load(directory)
        return cls.create(directory)

    def issue(self, directory: Path, name: str, *, common_name: str | None = None,
              hosts: Iterable[str] = ("localhost", "127.0.0.1"), server: bool = True, client: bool = True,
              not_before: datetime.datetime | None = None, not_after: datetime.datetime | None = None,
              organization: str | None = "Brook") -> CertFiles:
        """Write ``<name>.pem`` / ``<name>.key`` signed by this CA and return their paths."""
        directory.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        # Most general first, so the RFC 2253 subject reads "CN=<name>,O=Brook" as Kafka prints it.
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization)] if organization else []
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name or name))
        now = _now()
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        builder = (x509.CertificateBuilder().subject_name(x509.Name(attrs)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
                   .not_valid_after(not_after or now + datetime.timedelta(days=LEAF_DAYS))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        sans = _sans(hosts)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        _write(key_path, _key_pem(key), private=True)
        return CertFiles(cert_path, key_path, self.path)


def node_cert_name(node_id: int) -> str:
    return f"node-{node_id}"


def _sans(hosts: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    seen: set[str] = set()
    for host in hosts:
        if not host or host in seen or host in ("0.0.0.0", "::"):
            continue
        seen.add(host)
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Atomic replace, so a server reloading certificates never reads half a file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m deploy.local.certs", description="Issue Brook node and client "
                                "certificates from a local CA (made on first use).")
    p.add_argument("--dir", type=Path, required=True, help="where ca.pem/ca.key live and certificates go")
    p.add_argument("--node", action="append", default=[], metavar="ID=HOST[,HOST...]",
                   help="a node certificate CN=node-<ID> for these host names / IPs")
    p.add_argument("--client", action="append", default=[], metavar="NAME", help="a client certificate CN=NAME")
    p.add_argument("--out-name", default=None, help="file name for a single --node (e.g. node)")
    args = p.parse_args(argv)
    if args.out_name and len(args.node) != 1:
        p.error("--out-name goes with exactly one --node")
    ca = CertificateAuthority.load_or_create(args.dir)
    for spec in args.node:
        node_id, sep, hosts = spec.partition("=")
        if not sep or not node_id.isdigit():
            p.error(f"--node {spec!r} must look like ID=HOST[,HOST...]")
        names = [h.strip() for h in hosts.split(",") if h.strip()] + ["localhost", "127.0.0.1"]
        files = ca.issue(args.dir, args.out_name or node_cert_name(int(node_id)),
                         common_name=node_cert_name(int(node_id)), hosts=names)
        print(f"node {node_id}: {files.cert} {files.key}")
    for name in args.client:
        files = ca.issue(args.dir, name, hosts=(), server=False)
        print(f"client {name}: {files.cert} {files.key}")
    print(f"CA: {ca.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
