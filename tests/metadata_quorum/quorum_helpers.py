"""Shared helpers for the quorum tests (imported by path-based test modules)."""

from __future__ import annotations

import uuid

from deploy.local.cluster import free_port  # noqa: F401  (the quorum tests pick their ports here)
from metadata_quorum.client import ControllerClient
from proto import common_pb2
from proto import controller_pb2 as pb


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
                                  configs=kw.get("configs") or {},  # type: ignore[arg-type]
                                  request_id=kw.get("request_id", uuid.uuid4().hex))]))  # type: ignore[arg-type]
    return r.results[0]
