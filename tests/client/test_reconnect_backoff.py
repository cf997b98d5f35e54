"""Clients, and brokers' controller clients, try a peer that refuses them at least once a second.

gRPC's default reconnect backoff grows by 1.6x up to 120 s. A probe found its cost: after the controllers
had been down for 200-300 s, the brokers' controller clients made their next attempt 76-126 s after the
controllers were back, and the new active controller fenced every broker meanwhile; a Brook consumer read
again 95 s after brokers down for 300 s came back, where confluent-kafka took 3 s. Brook's channels now cap
the backoff at 1 s, Kafka's reconnect.backoff.max.ms.

A real peer that drops every connection at once (accepted, then closed: the HTTP/2 handshake fails) and
a caller that keeps calling, as a client's retry loop does; the peer counts the attempts.
"""

from __future__ import annotations

import socket
import threading
import time

import grpc

from client.cluster import CHANNEL_OPTIONS
from metadata_quorum.client import _CHANNEL_OPTIONS as CONTROLLER_CHANNEL_OPTIONS

FAILING_FOR_S = 6.0  # gRPC's default backoff has grown past 4 s per attempt by then
WINDOW_S = 3.0  # then attempts are counted for this long: about one a second is expected


class DroppingPeer:
    """Accepts connections and closes each at once, noting when."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.attempts: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.attempts.append(time.monotonic())
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_channels_try_a_refusing_peer_at_least_once_a_second() -> None:
    # Both kinds of channel at once (the clients' and the brokers' controller client's), each to its own peer.
    kinds = {"client": CHANNEL_OPTIONS, "controller client": CONTROLLER_CHANNEL_OPTIONS}
    peers = {kind: DroppingPeer() for kind in kinds}
    channels = {kind: grpc.insecure_channel(peers[kind].address, options=options) for kind, options in kinds.items()}
    calls = [channel.unary_unary("/brook.test/Nothing") for channel in channels.values()]
    try:
        started = time.monotonic()
        while time.monotonic() - started < FAILING_FOR_S + WINDOW_S:
            for call in calls:
                try:
                    call(b"", timeout=0.1)
                except grpc.RpcError:
                    pass  # UNAVAILABLE (or DEADLINE_EXCEEDED while it connects): the caller tries again
            time.sleep(0.1)
        for kind, peer in peers.items():
            late = [t - started for t in peer.attempts if t - started >= FAILING_FOR_S]
            assert len(late) >= WINDOW_S - 1, (
                f"{kind}: {len(late)} connection attempts in the {WINDOW_S:.0f} s after {FAILING_FOR_S:.0f} s of "
                f"failures (all attempts at {[round(t - started, 1) for t in peer.attempts]}): a peer back after "
                "an outage waits as long to be tried again")
    finally:
        for channel in channels.values():
            channel.close()
        for peer in peers.values():
            peer.close()
