"""A follower whose node certificate the leader's CA bundle no longer trusts is cut from the replication listener.

The real ReplicationListener (mTLS, with the ConnectionTrust the broker gives it) in front of a stand-in service,
on a real socket; a follower's fetch session over a real TLS connection; the listener's CA bundle replaced on
disk, as an operator revoking a node's CA would. Before, the session went on for as long as the follower kept
its connection.
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

from test_listener_fallback import ListenerService
from waiting import wait_for

from broker.cert_revocation import ConnectionTrust, TrustAnchors
from broker.kafka_wire.server import server_ssl_context
from broker.replication_listener import ReplicationListener
from deploy.local.certs import CertificateAuthority
from proto import broker_pb2
from replication import fetcher as fetcher_module
from replication.fetcher import REPLICATION_FRAME as FRAME
from replication.fetcher import REPLICATION_MAGIC as MAGIC


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".new")
    tmp.write_bytes(data)
    tmp.replace(path)


class Follower:
    """A fetch session over TLS with a node certificate: ``fetch()`` is one request and its answer, or None
    once the listener has closed the connection."""

    def __init__(self, port: int, ca: Path, cert: Path, key: Path) -> None:
        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.load_cert_chain(str(cert), str(key))
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = ctx.wrap_socket(raw, server_hostname="localhost")
        self.sock.sendall(MAGIC)

    def fetch(self) -> broker_pb2.FetchResponse | None:
        body = broker_pb2.FetchRequest(replica_id=2, max_wait_ms=0, partitions=[
            broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=0)]).SerializeToString()
        try:
            self.sock.sendall(FRAME.pack(len(body)) + body)
            head = self._read(FRAME.size)
            if head is None:
                return None
            (size,) = FRAME.unpack(head)
            data = self._read(size)
        except (ConnectionError, ssl.SSLError, OSError):
            return None
        return None if data is None else broker_pb2.FetchResponse.FromString(data)

    def _read(self, n: int) -> bytes | None:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                return None
            out += chunk
        return out

    def close(self) -> None:
        self.sock.close()


def test_a_follower_whose_ca_leaves_the_bundle_is_cut(tmp_path: Path) -> None:
    nodes = CertificateAuthority.create(tmp_path / "nodes", "Nodes CA")
    other = CertificateAuthority.create(tmp_path / "other", "Other CA")
    leader_cert = nodes.issue(tmp_path / "leader", "node-1")
    follower_cert = nodes.issue(tmp_path / "follower", "node-2")
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(nodes.path.read_bytes() + other.path.read_bytes())
    revoked: list[int] = []
    loop = fetcher_module._FetchLoop("test-listener-revocation")
    listener = ReplicationListener(
        ListenerService(), 1, "127.0.0.1", 0,
        server_ssl_context(str(leader_cert.cert), str(leader_cert.key), str(bundle), client_auth_required=True),
        {}, ConnectionTrust(TrustAnchors(bundle, "test replication listener"), lambda: revoked.append(1)))
    loop.submit(listener.start()).result(10)
    follower = Follower(listener.port, nodes.path, follower_cert.cert, follower_cert.key)
    try:
        first = follower.fetch()
        assert first is not None and first.partitions[0].high_watermark == 1, first

        _replace(bundle, other.path.read_bytes())  # the nodes' CA is out

        # The bundle is looked at once a second: the session is cut at its first fetch after that.
        wait_for(lambda: follower.fetch() is None, 20, "the follower's session to be cut")
        assert revoked == [1], revoked
        assert listener.stats.closed_for_errors_total == 1
    finally:
        follower.close()
        loop.submit(listener.stop()).result(10)
        loop.stop()
