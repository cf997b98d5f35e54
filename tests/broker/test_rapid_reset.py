"""HTTP/2 rapid reset (CVE-2023-44487): connections that open calls and reset them at once, as fast
as the node takes the bytes, do not take the node from other clients.

gRPC counts a stream reset before the server handled it against the connection's
max_concurrent_streams until it has, and sheds calls at random (CANCELLED) once its backlog of
unhandled ones is long. The controller's server had no per-connection bound: during such a flood a
third to half of other clients' DescribeCluster calls were cancelled and the rest took hundreds of
milliseconds. The broker's bound was ``max.inflight.requests.per.ip`` (2,000): it lost calls the same
way in some runs only. Both now allow 100 streams per connection (the controller's
``MAX_STREAMS_PER_CONNECTION``, the broker's ``max.streams.per.connection``); the controller's test
fails without the bound in every run, the broker's is a guard.

Real node processes, real sockets. The attackers run in processes of their own (full speed beside
the test's client); the broker's connect from the well-behaved client's own address (127.0.0.1,
which shares its per-address bounds), the controller's from 127.0.0.2.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from brokerkit import Kit, make_batch, running_kit
from waiting import wait_for

from proto import broker_pb2, controller_pb2, controller_pb2_grpc
from proto.errors import ErrorCode

pytest.importorskip("h2.connection")
from h2client import ATTACKER, RapidResetter  # noqa: E402  (after the skip: h2 is a test dependency)

pytestmark = pytest.mark.slow

CALLS = 60  # well-behaved calls made during the attack, one after another
ATTACK_CONNECTIONS = 2  # each in a process of its own: enough to flood, little CPU taken from tests beside it
WARM_STREAMS = 2_000  # per connection: the attack is under way (the node's queues full) before the calls start
LIVENESS_S = 60.0  # a generous bound per call on a loaded machine, not a speed assert


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    base: Path = tmp_path_factory.mktemp("rapid-reset")
    with running_kit(base, nodes=3) as k:
        yield k


def calls_under_attack(port: int, path: str, call: Callable[[], Any], source: str = ATTACKER
                       ) -> collections.Counter[str]:
    """``CALLS`` calls by ``call`` while ``ATTACK_CONNECTIONS`` RapidResetters send to ``path`` on
    ``port``, each call once every attacker has sent more since the call before: the calls' outcomes by status."""
    attackers: list[RapidResetter] = []
    outcomes: collections.Counter[str] = collections.Counter()
    try:
        attackers.extend(RapidResetter(port, path, source) for _ in range(ATTACK_CONNECTIONS))

        def ended() -> list[str]:
            return [a.error for a in attackers if a.error is not None]
        wait_for(lambda: all(a.streams >= WARM_STREAMS for a in attackers) or ended(), LIVENESS_S,
                 lambda: f"the attack under way ({[a.streams for a in attackers]} streams sent)")
        assert not ended(), f"the node ended attacking connections: {ended()}"
        last = [a.streams for a in attackers]
        for i in range(CALLS):
            # Each call waits until every attacker has sent more since the last one: the flood is on for
            # every call. (Measured only across all calls, a busy machine could serve the 60 calls in
            # 0.1 s while an attacker process waited for a CPU, and the test said it had not tested.)
            wait_for(lambda last=last: all(a.streams > n for a, n in zip(attackers, last, strict=True)) or ended(),
                     LIVENESS_S, lambda i=i, last=last: f"the attack going on before call {i} "
                     f"({[a.streams for a in attackers]} streams sent, {last} at the call before)", poll_s=0.005)
            assert not ended(), f"the node ended attacking connections: {ended()}"
            last = [a.streams for a in attackers]
            try:
                call()
                outcomes["OK"] += 1
            except grpc.RpcError as e:
                outcomes[f"{e.code().name}: {e.details()}"] += 1
        assert not ended(), f"the node ended attacking connections: {ended()}"
    finally:
        for a in attackers:
            a.stop()
    return outcomes


def test_a_broker_serves_other_clients_through_a_rapid_reset_flood(kit: Kit) -> None:
    port = int(kit.cluster.broker_address(1).rsplit(":", 1)[1])
    stub = kit.stub(1)
    outcomes = calls_under_attack(port, "/brook.BrokerService/Metadata",
                                  lambda: stub.Metadata(broker_pb2.MetadataRequest(), timeout=LIVENESS_S),
                                  source="127.0.0.1")
    assert outcomes == {"OK": CALLS}, f"well-behaved Metadata calls during the flood: {dict(outcomes)}"
    # And the node is whole afterwards: a topic is created and written to.
    kit.create_topic("after-rapid-reset", partitions=1, rf=3)
    r = kit.produce("after-rapid-reset", 0, make_batch(b"still here"), acks=-1, timeout_ms=30_000)
    assert r.error_code == ErrorCode.NONE, r


def test_a_controller_serves_other_clients_through_a_rapid_reset_flood(kit: Kit) -> None:
    host, port = kit.cluster.controller_endpoints[0]
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        stub = controller_pb2_grpc.ControllerServiceStub(channel)
        outcomes = calls_under_attack(
            port, "/brook.ControllerService/DescribeCluster",
            lambda: stub.DescribeCluster(controller_pb2.DescribeClusterRequest(), timeout=LIVENESS_S))
    assert outcomes == {"OK": CALLS}, f"well-behaved DescribeCluster calls during the flood: {dict(outcomes)}"
