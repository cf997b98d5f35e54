"""Raw-socket helpers for tests that play a hostile client: connect from another loopback address,
see whether the server closed a connection, and whether a listening port has drained its backlog."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

ATTACKER = "127.0.0.2"  # another loopback address: the server sees a client address of its own


def connect_from(source: str | None, port: int, timeout_s: float = 10.0, target: str = "127.0.0.1") -> socket.socket:
    """A TCP connection from ``source`` (None: any) to ``target``:``port``."""
    s = socket.socket(socket.AF_INET6 if ":" in target else socket.AF_INET)
    try:
        if source is not None:
            s.bind((source, 0))
        s.settimeout(timeout_s)
        s.connect((target, port))
    except BaseException:
        s.close()
        raise
    return s


def connects_within(source: str | None, port: int, timeout_s: float, target: str = "127.0.0.1") -> bool:
    """Does a connection from ``source`` (None: any) to ``target``:``port`` complete within ``timeout_s``? False
    when its SYN got no answer in time (dropped by a filter, or a full accept queue). It is closed at once."""
    try:
        connect_from(source, port, timeout_s, target).close()
    except TimeoutError:
        return False
    return True


def read_exactly(s: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``s``; fails the test, saying how many came, if the peer closes first."""
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, f"the broker closed the connection after {len(out)} of {n} bytes"
        out += chunk
    return out


def closed_by_peer(s: socket.socket, timeout_s: float = 10.0) -> bool:
    """Did the server close (or reset) ``s``? Waits up to ``timeout_s`` for it (socket.timeout after)."""
    s.settimeout(timeout_s)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def still_open(s: socket.socket, wait_s: float = 0.0) -> bool:
    """Has the server not closed ``s``? Looks at once, or waits up to ``wait_s`` for its end; what the server
    sent meanwhile (an HTTP/2 SETTINGS frame) is read and dropped."""
    if wait_s > 0:
        s.settimeout(wait_s)
    else:
        s.setblocking(False)
    try:
        return s.recv(65536) != b""
    except (BlockingIOError, TimeoutError):
        return True
    except ConnectionResetError:
        return False


def open_past_the_bound(port: int, bound: int, extra: int = 3) -> list[socket.socket]:
    """``bound + extra`` connections from ATTACKER that send nothing: the ``extra`` past the address's
    bound must be closed by the server unread, the first ``bound`` kept open. Returns them all (the
    caller closes them)."""
    held: list[socket.socket] = []
    try:
        for _ in range(bound + extra):
            held.append(connect_from(ATTACKER, port))
        for s in held[bound:]:
            assert closed_by_peer(s), f"a connection past the address's {bound} was kept"
        for s in held[:bound]:
            s.settimeout(0.2)
            try:
                s.recv(1)
            except TimeoutError:
                continue  # open, waiting for the client
            raise AssertionError(f"one of the address's first {bound} connections was closed")
    except BaseException:
        for s in held:
            s.close()
        raise
    return held


def accept_backlog(port: int) -> int:
    """Connections waiting in 127.0.0.1:``port``'s listen queue, not accepted yet (/proc/net/tcp; or
    /proc/net/tcp6 for a server listening on an IPv6 socket that maps 127.0.0.1, as gRPC's do)."""
    for table, local in (("tcp", f"0100007F:{port:04X}"), ("tcp6", f"0000000000000000FFFF00000100007F:{port:04X}")):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[3] == "0A":  # LISTEN: rx_queue is the accept backlog
                return int(fields[4].split(":")[1], 16)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


@contextlib.contextmanager
def relayed_from(source: str, port: int) -> Iterator[int]:
    """A local port whose connections are carried to 127.0.0.1:``port`` from ``source``: a real gRPC or
    Kafka client connected to it is, to the server, a client at ``source``. Every connection is closed on
    exit."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    lock = threading.Lock()

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def accept() -> None:
        while True:
            try:
                near, _ = listener.accept()
                far = connect_from(source, port)
            except OSError:
                return  # the listener was closed (or the server refused): the relay is over
            far.settimeout(None)
            with lock:
                held.extend((near, far))
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        # shutdown, not close alone: it wakes the threads blocked in accept and recv.
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        acceptor.join(10)
        listener.close()
        with lock:
            for s in held:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
