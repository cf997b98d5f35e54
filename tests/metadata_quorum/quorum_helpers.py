"""Shared helpers for the quorum tests (imported by path-based test modules)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

from metadata_quorum.client import ControllerClient
from proto import common_pb2
from proto import controller_pb2 as pb

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], T], timeout_s: float, what: str) -> T:
    """Poll ``condition`` until it returns something truthy; fail saying what was awaited."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last value: {last!r})")


def register_brokers(client: ControllerClient, ids: list[int], cluster_id: str, *, rack: str = "") -> dict[int, int]:
    """Register and unfence brokers; returns broker id -> broker epoch."""
    epochs = {}
    for b in ids:
        r = client.call("RegisterBroker", pb.RegisterBrokerRequest(
            node_id=b, incarnation_id=f"incarnation-{b}", cluster_id=cluster_id, rack=rack,
            endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19000 + b)]))
        epochs[b] = r.broker_epoch
        h = client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(
            node_id=b, broker_epoch=r.broker_epoch, current_metadata_version=r.broker_epoch))
        assert not h.is_fenced, f"broker {b} still fenced after catching up: {h}"
    return epochs


def heartbeat_all(client: ControllerClient, epochs: dict[int, int]) -> None:
    for b, e in epochs.items():
        client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(node_id=b, broker_epoch=e,
                                                                 current_metadata_version=1 << 40))


def create_topic(client: ControllerClient, name: str, partitions: int, rf: int, **kw: object) -> pb.TopicResult:
    r = client.call("CreateTopics", pb.CreateTopicsRequest(
        topics=[pb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf,
                                  configs=kw.get("configs") or {})]))  # type: ignore[arg-type]
    return r.results[0]
