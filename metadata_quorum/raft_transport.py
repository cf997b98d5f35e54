"""The quorum port's transport: pysyncobj's TCP transport, with bounds on what a stranger can hold.

pysyncobj reads a frame (a 4-byte length, then the body) into one buffer before anything checks
it: the password's HMAC is verified only once the whole declared length has arrived. Anyone who
can reach a voter's Raft port could therefore declare a 2 GiB frame and stream it, and the voter
buffered every byte, growing by ``bytes +=`` on its Raft tick thread (quadratic copying: the
thread that sends heartbeats and answers votes), without the password. Connections were not
bounded either: each held a descriptor of the process, which on a combined node also holds the
partition logs, and a connection that sends nothing was never timed out.

``BoundedTCPTransport`` (the ``transportClass`` given to SyncObj) closes both:

- a connection not yet known as a voter (it has not passed the password's key exchange and named
  itself) may declare frames of at most ``UNKNOWN_FRAME_MAX_BYTES``; a voter's connection, of at most
  ``PEER_FRAME_MAX_BYTES`` (pysyncobj sends log entries in batches of 64 KiB and larger entries and
  snapshots in 64 KiB chunks; one batch may end with an entry past that, our largest commands
  are a few hundred KiB). A larger declaration closes the connection before its body is read;
- at most ``UNKNOWN_CONNECTIONS_MAX`` unknown connections are kept: a new one closes the oldest
  (a voter identifies itself within milliseconds, so a flood of strangers evicts strangers), and
  one still unknown after ``UNKNOWN_MAX_AGE_S`` is closed.
"""

from __future__ import annotations

import logging
import struct
import time
from typing import Any

from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.transport import TCPTransport

log = logging.getLogger(__name__)

UNKNOWN_FRAME_MAX_BYTES = 64 * 1024
PEER_FRAME_MAX_BYTES = 16 * 1024 * 1024
UNKNOWN_CONNECTIONS_MAX = 32
UNKNOWN_MAX_AGE_S = 5.0

_LENGTH = struct.Struct("i")  # pysyncobj's frame prefix: native-endian signed int


class BoundedTcpConnection(TcpConnection):  # type: ignore[misc]
    """A TcpConnection that refuses a frame declared larger than ``frame_max_bytes`` before reading it.

    pysyncobj builds its connections itself (TcpServer, TCPTransport.addNode); the transport turns
    them into this class as it takes them (``adopt``). The overrides replace pysyncobj's private
    read step (name-mangled ``__processRead``), which its own read loop calls.
    """

    frame_max_bytes = UNKNOWN_FRAME_MAX_BYTES
    accepted_at = 0.0

    @classmethod
    def adopt(cls, conn: TcpConnection, frame_max_bytes: int) -> BoundedTcpConnection:
        conn.__class__ = cls
        conn.frame_max_bytes = frame_max_bytes
        conn.accepted_at = time.monotonic()
        return conn  # type: ignore[return-value]

    def _TcpConnection__processRead(self) -> bool:  # noqa: N802 - pysyncobj's mangled name
        buffered: bytes = self._TcpConnection__readBuffer
        if len(buffered) >= _LENGTH.size:
            declared = _LENGTH.unpack_from(buffered)[0]
            if not 0 <= declared <= self.frame_max_bytes:
                log.warning("quorum port: a frame of %d bytes declared (at most %d here): connection closed "
                            "before its body is read", declared, self.frame_max_bytes)
                self.disconnect()
                return False
            if len(buffered) >= _LENGTH.size + declared:
                return False  # a whole frame is here: parse it before reading more
        return bool(TcpConnection._TcpConnection__processRead(self))


class BoundedTCPTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's TCPTransport whose connections are BoundedTcpConnections (see the module doc)."""

    def addNode(self, node: Any) -> None:  # noqa: N802 - pysyncobj's name
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None:  # a connection this voter dials to a configured voter
            BoundedTcpConnection.adopt(conn, PEER_FRAME_MAX_BYTES)

    def _onNewIncomingConnection(self, conn: TcpConnection) -> None:  # noqa: N802 - pysyncobj's name
        BoundedTcpConnection.adopt(conn, UNKNOWN_FRAME_MAX_BYTES)
        self._close_stale_unknown(time.monotonic())
        while len(self._unknownConnections) >= UNKNOWN_CONNECTIONS_MAX:
            oldest = min(self._unknownConnections, key=lambda c: c.accepted_at)
            self._unknownConnections.discard(oldest)
            oldest.disconnect()
        super()._onNewIncomingConnection(conn)

    def _onIncomingMessageReceived(self, conn: TcpConnection, message: Any) -> None:  # noqa: N802
        super()._onIncomingMessageReceived(conn, message)
        if conn not in self._unknownConnections and self._connToNode(conn) is not None:
            conn.frame_max_bytes = PEER_FRAME_MAX_BYTES  # passed the key exchange and named itself

    def _onTick(self) -> None:  # noqa: N802 - pysyncobj's name
        super()._onTick()
        self._close_stale_unknown(time.monotonic())

    def _close_stale_unknown(self, now: float) -> None:
        for conn in [c for c in self._unknownConnections if now - c.accepted_at > UNKNOWN_MAX_AGE_S]:
            self._unknownConnections.discard(conn)
            conn.disconnect()
