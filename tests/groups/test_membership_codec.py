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
