"""A broker that has not received the cluster metadata yet refuses client calls instead of denying every topic.

A real split-mode cluster (one controller, brokers 1-3) and a topic with RF 3. Broker 3 is stopped and the
controller paused (SIGSTOP): broker 3 then starts, opens its gRPC port, and cannot register or receive any
metadata. Asked for the topic in that state, it used to answer from its empty cache: UNKNOWN_TOPIC_OR_PARTITION
and no brokers, which a consumer or admin tool takes for a deleted topic. It must answer UNAVAILABLE (which
clients retry elsewhere), its Kafka listener must stay closed, and once the controller is back it must
describe the topic as it is.
"""

from __future__ import annotations

import socket
from pathlib import Path

import grpc
import pytest
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.security import make_channel
from deploy.local.cluster import LocalCluster
from proto import broker_pb2, broker_pb2_grpc

pytestmark = pytest.mark.slow

TOPIC = "gated-until-metadata"
RESTARTED = 3
BOUND_S = 60.0


def _ask(cluster: LocalCluster) -> tuple[str, str]:
    """Broker 3's answer to Metadata for the topic: ("answer", <topic error and brokers>) or
    ("status", <gRPC code and details>)."""
    with make_channel(cluster.broker_address(RESTARTED), cluster.security) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        try:
            resp = stub.Metadata(broker_pb2.MetadataRequest(topics=[TOPIC]), timeout=5)
        except grpc.RpcError as e:
            return "status", f"{e.code().name}: {e.details()}"
    t = resp.topics[0]
    return "answer", f"error {t.error_code} ({t.error_message!r}), {len(t.partitions)} partitions, " \
                     f"{len(resp.brokers)} brokers"


def _described(answer: tuple[str, str]) -> bool:
    return answer[0] == "answer" and answer[1].startswith("error 0 ") and ", 1 partitions, 3 brokers" in answer[1]


def _accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except OSError:
        return False
    return True


def test_a_broker_without_metadata_refuses_client_calls_until_it_has_them(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=3, mode="split", controllers=1) as cluster:
        with Admin(cluster.bootstrap_servers) as admin:
            admin.create_topics([NewTopic(TOPIC, 1, 3)])
        wait_for(lambda: _described(_ask(cluster)), 30, "broker 3 to describe the topic", poll_s=0.2)

        cluster.stop_node(RESTARTED)
        (controller,) = cluster.controller_ids
        cluster.pause_node(controller)
        try:
            cluster.start_node(RESTARTED)
            seen: list[tuple[str, str]] = []

            def answered() -> bool:
                seen.append(_ask(cluster))
                kind, text = seen[-1]
                # Until its port is open, the call fails to connect (UNAVAILABLE too, but not from the broker).
                return kind == "answer" or "has not received the cluster metadata" in text
            wait_for(answered, BOUND_S, "broker 3's gRPC port to answer", poll_s=0.2)
            kind, text = seen[-1]
            assert kind == "status" and text.startswith("UNAVAILABLE"), (
                f"broker 3, without any metadata, answered Metadata for an existing topic with {text}; "
                "it must refuse the call UNAVAILABLE until it has the cluster's metadata")
            host, port = cluster.kafka_address(RESTARTED).rsplit(":", 1)
            assert not _accepts(host, int(port)), "broker 3's Kafka listener opened before any metadata came"
        finally:
            cluster.resume_node(controller)

        def described() -> bool:
            seen.append(_ask(cluster))
            return _described(seen[-1])
        wait_for(described, BOUND_S, lambda: f"broker 3 to describe the topic once the controller is back "
                 f"(last answer: {seen[-1][1]})", poll_s=0.2)
        cluster.wait_ready(BOUND_S)
