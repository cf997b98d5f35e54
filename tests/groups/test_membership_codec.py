"""The consumer protocol's member metadata and assignment bytes, and membership config checks."""

from __future__ import annotations

import pytest

from client.assignors import Subscription
from client.cluster import ClusterClient
from client.group_membership import (
    GroupMembership,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from client.types import TopicPartition as TP
from proto import errors


def test_subscription_round_trip_is_sorted_and_deduplicated() -> None:
    raw = encode_subscription(["b", "a", "b"], [TP("a", 2), TP("a", 0)], 7, b"ud")
    assert decode_subscription(raw) == Subscription(("a", "b"), (TP("a", 0), TP("a", 2)), 7, b"ud")
    assert raw == encode_subscription(["a", "b"], [TP("a", 0), TP("a", 2)], 7, b"ud"), "not deterministic"


def test_assignment_round_trip_and_empty() -> None:
    parts = {TP("t", 1), TP("u", 0)}
    assert decode_assignment(encode_assignment(parts)) == parts
    assert decode_assignment(b"") == set()


def test_the_bytes_are_kafkas_consumer_protocol_as_kafka_clients_read_it() -> None:
    """What Brook's member writes is what Kafka's clients decode (kafka-python's decoder here), so a
    group may mix Brook's and Kafka's clients, either leading, and Kafka's tools can describe it."""
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

    sub = ConsumerProtocolSubscription.decode(encode_subscription(["b", "a"], [TP("a", 2), TP("a", 0)], 7, b"ud"))
    assert (sub.version, list(sub.topics), sub.user_data, sub.generation_id) == (3, ["a", "b"], b"ud", 7)
    assert [(o.topic, list(o.partitions)) for o in sub.owned_partitions] == [("a", [0, 2])]
    got = ConsumerProtocolAssignment.decode(encode_assignment({TP("u", 0), TP("t", 1), TP("t", 0)}))
    assert [(a.topic, list(a.partitions)) for a in got.assigned_partitions] == [("t", [0, 1]), ("u", [0])]
    # And what Kafka's clients write is read back.
    kafka_sub = ConsumerProtocolSubscription(version=1, topics=["x"], user_data=None,
                                             owned_partitions=[ConsumerProtocolSubscription.TopicPartition(
                                                 topic="x", partitions=[3])]).encode(version=1)
    assert decode_subscription(kafka_sub) == Subscription(("x",), (TP("x", 3),), -1, b"")


def test_the_older_protobuf_bytes_of_brook_members_are_still_read() -> None:
    """A member of an older Brook client writes protobuf: a group keeps working while it is upgraded."""
    from proto import group_pb2

    old_sub = group_pb2.ConsumerSubscription(topics=["a"], generation_id=4, owned_partitions=[
        group_pb2.TopicPartitionRef(topic="a", partition=1)]).SerializeToString()
    assert decode_subscription(old_sub) == Subscription(("a",), (TP("a", 1),), 4, b"")
    old_assignment = group_pb2.ConsumerAssignment(partitions=[group_pb2.TopicPartitionRef(topic="t", partition=2)])
    assert decode_assignment(old_assignment.SerializeToString()) == {TP("t", 2)}


def test_membership_refuses_bad_timeouts_and_assignors() -> None:
    cluster = ClusterClient("127.0.0.1:1")  # never contacted: construction only
    try:
        with pytest.raises(errors.InvalidConfigError):
            GroupMembership(cluster, "g", session_timeout_ms=1000, heartbeat_interval_ms=1000)
        with pytest.raises(errors.InvalidConfigError):
            GroupMembership(cluster, "g", assignors="nope")
        m = GroupMembership(cluster, "g", assignors="cooperative-sticky")
        assert m.protocol == "cooperative" and m.needs_rejoin()
        with pytest.raises(errors.InvalidConfigError):
            m.subscribe()
        with pytest.raises(errors.InvalidTopicException):
            m.subscribe(topics=[""])
        m.close(leave=False)
    finally:
        cluster.close()
