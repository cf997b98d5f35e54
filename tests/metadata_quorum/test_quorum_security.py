"""The quorum port: bound to the configured host only, closed to unauthenticated pickles.

pysyncobj unpickles what it reads from the Raft port. The attack test sends the frame an
attacker would (length prefix + zlib(pickle) whose unpickling creates a marker file) to
a running voter of a password-protected quorum and checks that nothing ran and the
quorum still commits. Without a password the same frame runs (shown on a throwaway
loopback voter, so the test proves it is a real exploit, not a malformed frame).
"""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from quorum_helpers import free_port
from waiting import wait_for

from metadata_quorum import commands as c
from metadata_quorum.quorum_security import check_quorum_protection, password_problem
from metadata_quorum.raft import MetadataRaft
from proto import errors


class _Exploit:
    """Unpickling this creates ``path`` (what a real attacker would replace with a shell)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, int]]:
        return (os.open, (str(self.path), os.O_CREAT | os.O_WRONLY))


def exploit_frame(marker: Path) -> bytes:
    body = zlib.compress(pickle.dumps(_Exploit(marker)), 3)
    return struct.pack("i", len(body)) + body


def send_frame(address: str, frame: bytes) -> None:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(frame)
        s.settimeout(2)
        try:
            s.recv(1024)  # wait until the voter has read it (it answers or drops us)
        except (TimeoutError, OSError):
            pass


@pytest.mark.parametrize("weak", ["", "x", "changeme", "passwordpassword", "aaaaaaaaaaaaaaaaaaaa",
                                  "abcdefgh12345678"[:15]])
def test_weak_passwords_are_refused(weak: str) -> None:
    if weak:
        assert password_problem(weak) is not None
    with pytest.raises(errors.InvalidConfigError, match="controller.quorum.password"):
        check_quorum_protection("10.0.0.1:9193", ["10.0.0.2:9193"], weak or None)


def test_strong_password_or_loopback_only_is_accepted() -> None:
    strong = secrets.token_urlsafe(24)
    assert password_problem(strong) is None
    check_quorum_protection("10.0.0.1:9193", ["10.0.0.2:9193"], strong)
    check_quorum_protection("127.0.0.1:9193", ["127.0.0.2:9193", "localhost:9194", "[::1]:9195"], None)
    with pytest.raises(errors.InvalidConfigError, match="controller-2.example:9193"):
        check_quorum_protection("127.0.0.1:9193", ["controller-2.example:9193"], None)


def test_a_voter_with_a_weak_password_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidConfigError, match="too weak"):
        MetadataRaft(f"127.0.0.1:{free_port()}", [], tmp_path, password="x")


@pytest.fixture
def protected_quorum(tmp_path: Path) -> Iterator[list[MetadataRaft]]:
    password = secrets.token_urlsafe(24)
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    rafts: list[MetadataRaft] = []
    try:
        for i, a in enumerate(addresses):
            rafts.append(MetadataRaft(a, [x for x in addresses if x != a], tmp_path / f"v{i}", password=password))
        for r in rafts:
            r.wait_bound()
        yield rafts
    finally:
        for r in rafts:
            r.destroy_synchronous()


@pytest.mark.slow
def test_the_raft_port_binds_only_the_configured_host(protected_quorum: list[MetadataRaft]) -> None:
    port = int(protected_quorum[0].self_address.rsplit(":", 1)[1])
    # Bound to 127.0.0.1 only: another loopback address of this host does not reach it
    # (with pysyncobj's default 0.0.0.0 bind it would).
    with pytest.raises(OSError), socket.create_connection(("127.0.0.2", port), timeout=2):
        pass
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


@pytest.mark.slow
def test_an_unauthenticated_pickle_frame_is_dropped_unread(tmp_path: Path,
                                                           protected_quorum: list[MetadataRaft]) -> None:
    rafts = protected_quorum
    wait_for(lambda: sum(r.leadership()[0] for r in rafts) == 1, 30, "a Raft leader")
    marker = tmp_path / "pwned"
    for raft in rafts:  # every voter, leader and followers
        send_frame(raft.self_address, exploit_frame(marker))
    assert not marker.exists(), "a voter unpickled an unauthenticated frame"
    # The quorum still works: a command commits and is applied everywhere.
    leader = next(r for r in rafts if r.leadership()[0])
    assert leader.propose(c.RegisterBroker(1, "inc-1", [["BROKER", "127.0.0.1", 9092]]), 30).ok
    wait_for(lambda: all(r.read(lambda s: 1 in s.brokers) for r in rafts), 30, "the command on every voter")
    assert not marker.exists()


@pytest.mark.slow
def test_without_a_password_the_same_frame_runs_code(tmp_path: Path) -> None:
    """Why the password (or loopback confinement) is mandatory: the exploit is real."""
    raft = MetadataRaft(f"127.0.0.1:{free_port()}", [], tmp_path / "open", password=None)
    try:
        raft.wait_bound()
        marker = tmp_path / "pwned"
        send_frame(raft.self_address, exploit_frame(marker))
        wait_for(marker.exists, 20, "the unprotected voter to unpickle the frame")
    finally:
        raft.destroy_synchronous()
