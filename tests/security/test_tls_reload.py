"""Server TLS reload through broker.tls.bind_port, on real sockets.

Replacing the CA bundle revokes every client certificate of the old CA for new
connections (no restart, no CRL needed); a garbage or half-written certificate file is
ignored and the previous certificate keeps serving; the principal of a verified client
certificate follows the mapping rules.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from waiting import wait_for

from broker import principal
from broker.tls import ReloadingCertificates, ServerTls, bind_port
from client.security import SecurityConfig, make_channel, read_pem
from deploy.local.certs import CertificateAuthority
from proto.errors import InvalidConfigError

# A fresh connection per call: gRPC would otherwise reuse a subchannel (and its old handshake).
FRESH = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture()
def pki(tmp_path: Path) -> dict[str, object]:
    ca1 = CertificateAuthority.create(tmp_path / "ca1", "CA one")
    ca2 = CertificateAuthority.create(tmp_path / "ca2", "CA two")
    server_dir = tmp_path / "server"
    server = ca1.issue(server_dir, "node-1")
    shutil.copy(ca1.path, server_dir / "clients-ca.pem")
    return {"ca1": ca1, "ca2": ca2, "server": server, "clients_ca": server_dir / "clients-ca.pem",
            "alice": ca1.issue(tmp_path / "alice", "alice", hosts=(), server=False),
            "bob": ca2.issue(tmp_path / "bob", "bob", hosts=(), server=False)}


@pytest.fixture()
def server(pki: dict) -> Iterator[int]:
    def whoami(request: bytes, context: grpc.ServicerContext) -> bytes:
        return str(principal.principal_of(context)).encode()

    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    srv.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "test.Who", {"Am": grpc.unary_unary_rpc_method_handler(whoami)}),))
    files = pki["server"]
    port = bind_port(srv, "127.0.0.1", 0, ServerTls(files.cert, files.key, pki["clients_ca"]))
    srv.start()
    try:
        yield port
    finally:
        srv.stop(0)


def _call(port: int, client, ca1: CertificateAuthority) -> str | grpc.StatusCode:  # type: ignore[no-untyped-def]
    sec = SecurityConfig(protocol="SSL", ssl_ca_location=str(ca1.path), ssl_certificate_location=str(client.cert),
                         ssl_key_location=str(client.key))
    channel = make_channel(f"localhost:{port}", sec, options=FRESH)
    try:
        return channel.unary_unary("/test.Who/Am")(b"", timeout=5).decode()
    except grpc.RpcError as e:
        return e.code()
    finally:
        channel.close()


def test_principal_of_a_verified_client_certificate(server: int, pki: dict) -> None:
    assert _call(server, pki["alice"], pki["ca1"]) == "User:alice"
    assert _call(server, pki["bob"], pki["ca1"]) == grpc.StatusCode.UNAVAILABLE  # another CA


def test_replacing_the_ca_bundle_revokes_old_clients_without_restart(server: int, pki: dict) -> None:
    assert _call(server, pki["alice"], pki["ca1"]) == "User:alice"
    tmp = pki["clients_ca"].with_suffix(".tmp")
    shutil.copy(pki["ca2"].path, tmp)
    tmp.replace(pki["clients_ca"])  # only CA two's clients from now on
    wait_for(lambda: _call(server, pki["bob"], pki["ca1"]) == "User:bob", 30, "bob accepted")
    assert _call(server, pki["alice"], pki["ca1"]) == grpc.StatusCode.UNAVAILABLE


def test_a_broken_certificate_file_keeps_the_previous_one(server: int, pki: dict) -> None:
    pki["server"].cert.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n")
    for _ in range(3):
        assert _call(server, pki["alice"], pki["ca1"]) == "User:alice"


def test_fetcher_reloads_only_when_files_change(pki: dict) -> None:
    files = pki["server"]
    fetcher = ReloadingCertificates(ServerTls(files.cert, files.key, pki["clients_ca"]))
    assert fetcher() is None and fetcher.loads == 1
    pki["ca1"].issue(files.cert.parent, "node-1")
    assert fetcher() is not None and fetcher.loads == 2
    assert fetcher() is None


def test_half_rotated_pair_is_not_loaded_until_complete(pki: dict, tmp_path: Path) -> None:
    files = pki["server"]
    fetcher = ReloadingCertificates(ServerTls(files.cert, files.key, pki["clients_ca"]))
    fresh = pki["ca1"].issue(tmp_path / "next", "node-1")
    shutil.copy(fresh.cert, files.cert)  # new certificate, old key: mid-rotation
    assert fetcher() is None and fetcher.loads == 1
    shutil.copy(fresh.key, files.key)  # rotation complete
    assert fetcher() is not None and fetcher.loads == 2


def test_a_certificate_path_that_is_a_device_is_read_bounded(tmp_path: Path) -> None:
    """PEM files were checked with stat() before a whole read: /dev/zero (size 0) was read without end."""
    with pytest.raises(InvalidConfigError, match="ssl.certificate.location /dev/zero is larger than"):
        read_pem(Path("/dev/zero"), "ssl.certificate.location")
    small = tmp_path / "ok.pem"
    small.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    assert read_pem(small, "ssl.certificate.location") == b"-----BEGIN CERTIFICATE-----\n"


@pytest.mark.parametrize("broken", ["key", "other-key", "ca"])
def test_unusable_tls_files_are_named_by_their_key_on_both_sides(pki: dict, tmp_path: Path, broken: str) -> None:
    """A key file that holds no key, another certificate's key, a CA file of garbage: the server's listener named
    the certificate whatever was wrong; a client waited 16-18 s through gRPC's handshake failures (and its C-core
    logging) before "cannot reach the cluster". Both now refuse at once, naming the key and the file."""
    files, alice = pki["server"], pki["alice"]
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("a-host-name\n")
    key = {"key": garbage, "other-key": pki["bob"].key}.get(broken)
    ca = garbage if broken == "ca" else pki["clients_ca"]
    named = "ssl.ca.location" if broken == "ca" else "ssl.key.location"
    with pytest.raises(InvalidConfigError, match=named):
        ReloadingCertificates(ServerTls(files.cert, key or files.key, ca))
    sec = SecurityConfig(protocol="SSL", ssl_ca_location=str(ca), ssl_certificate_location=str(alice.cert),
                         ssl_key_location=str(key or alice.key))
    with pytest.raises(InvalidConfigError, match=named):
        sec.channel_credentials()
