"""ClusterClient behaviour that needs no cluster: config parsing and bounded failure."""

from __future__ import annotations

import socket
import time

import grpc
import pytest

from client import errors
from client.cluster import Backoff, ClusterClient, parse_bootstrap, rpc_error
from client.types import TopicPartition


def test_parse_bootstrap_forms() -> None:
    assert parse_bootstrap("127.0.0.1:9092, localhost:9093") == ["127.0.0.1:9092", "localhost:9093"]
    assert parse_bootstrap(["a:1", ("b", 2)]) == ["a:1", "b:2"]
    with pytest.raises(errors.InvalidConfigError):
        parse_bootstrap("no-port")
    with pytest.raises(errors.InvalidConfigError):
        parse_bootstrap("")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_cluster_fails_typed_within_deadline() -> None:
    client = ClusterClient(f"127.0.0.1:{_closed_port()}", request_timeout_ms=600, retry_backoff_ms=20)
    start = time.monotonic()
    with pytest.raises(errors.BrookError) as info:
        client.metadata()
    elapsed = time.monotonic() - start
    client.close()
    assert info.value.retriable, f"transport failure should be retriable, got {info.value!r}"
    assert elapsed < 5, f"metadata() took {elapsed:.1f}s with a 0.6s timeout"


def test_backoff_is_bounded_by_deadline() -> None:
    backoff = Backoff(10, 40, time.monotonic() + 0.2)
    sleeps = 0
    while backoff.sleep():
        sleeps += 1
        assert sleeps < 100, "backoff never hit its deadline"
    assert backoff.remaining_s() <= 0.05


def test_fetch_error_is_returned_not_raised_when_unreachable() -> None:
    client = ClusterClient(f"127.0.0.1:{_closed_port()}", request_timeout_ms=300, retry_backoff_ms=20)
    result = client.fetch(TopicPartition("t", 0), 0, 1024)
    client.close()
    assert isinstance(result.error, errors.BrookError), f"expected a typed error, got {result!r}"
    assert result.records == b""


class _Status(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


def test_a_message_over_the_brokers_size_limit_is_a_typed_error_not_retried() -> None:
    e = rpc_error(_Status(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          "Received message larger than max (9437200 vs. 8388608)"), "Produce to broker 1")
    assert isinstance(e, errors.MessageTooLargeError) and not e.retriable
    assert "socket.request.max.bytes" in str(e) and "9437200" in str(e)
    throttled = rpc_error(_Status(grpc.StatusCode.RESOURCE_EXHAUSTED, "broker overloaded: client 1.2.3.4 has 4 "
                                  "requests waiting to be received"), "Fetch")
    assert throttled.code == errors.ErrorCode.THROTTLING_QUOTA_EXCEEDED and throttled.retriable
