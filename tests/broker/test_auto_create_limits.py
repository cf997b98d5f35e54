"""What a Metadata or Produce request's auto-creation asks of the controller, and what it may hold of the broker:
broker 1's real BrokerService in this process, with a controller that records each call.

Found by an audit: the broker asked the controller as itself, a node, which no quota limits, so a user held
to one partition mutation a second auto-created 1,000 topics in 2.4 s through Metadata requests; and every
auto-creation held a client thread for as long as the controller took, with no bound on how many did at once.
"""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import Any

from broker import principal
from broker.principal import Principal
from broker.service import AUTO_CREATE_CONCURRENCY
from proto import controller_pb2
from proto.errors import ErrorCode
from tests.broker.inprocess import InProcessBroker

MONA = Principal("User", "mona", "10.0.0.5")


class RecordingController:
    """Answers CreateTopics as the controller does; each call's request and metadata recorded. ``hold`` makes
    the calls wait until it is set; ``throttled`` names topics refused by the caller's mutation quota."""

    def __init__(self) -> None:
        self.calls: list[tuple[controller_pb2.CreateTopicsRequest, dict[str, str]]] = []
        self.started = threading.Semaphore(0)
        self.hold = threading.Event()
        self.hold.set()
        self.throttled: set[str] = set()

    def call(self, method: str, request: Any, *, timeout_s: float = 0, metadata: Any = None) -> Any:
        assert method == "CreateTopics", method
        self.calls.append((request, dict(metadata or ())))
        self.started.release()
        assert self.hold.wait(10), "the test never let the controller answer"
        out = controller_pb2.CreateTopicsResponse()
        for t in request.topics:
            if t.name in self.throttled:
                out.results.add(name=t.name, error_code=ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                                error_message="throttled: controller mutation quota of 1/s exceeded, retry after 9000 ms")
            else:
                out.results.add(name=t.name, topic_id="x" * 32, num_partitions=1, replication_factor=1)
        return out


def _broker(tmp_path: Path) -> tuple[InProcessBroker, RecordingController]:
    broker = InProcessBroker(tmp_path, {"t": {}})
    controller = RecordingController()
    broker.service.controller_client = controller
    broker.service.auto_create = True
    return broker, controller


def test_the_controller_is_asked_with_the_callers_principal(tmp_path: Path) -> None:
    broker, controller = _broker(tmp_path)
    with broker:
        assert broker.service._maybe_auto_create({"new-a", "new-b"}, caller=MONA) == {}
        [(request, metadata)] = controller.calls
        assert sorted(t.name for t in request.topics) == ["new-a", "new-b"]
        # As Kafka's envelope (KIP-590): the controller authorizes her and counts the partitions against her quota.
        assert metadata == {principal.FORWARDED_PRINCIPAL_KEY: "User:mona", principal.FORWARDED_HOST_KEY: "10.0.0.5"}


def test_topics_her_quota_refuses_are_unknown_with_the_reason(tmp_path: Path) -> None:
    broker, controller = _broker(tmp_path)
    controller.throttled = {"new-b"}
    with broker:
        refused = broker.service._maybe_auto_create({"new-a", "new-b"}, caller=MONA)
        assert list(refused) == ["new-b"], refused
        # Kafka answers a topic whose auto-creation did not happen UNKNOWN_TOPIC_OR_PARTITION (retriable).
        assert refused["new-b"].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert "THROTTLING_QUOTA_EXCEEDED" in refused["new-b"].message and "retry after" in refused["new-b"].message


def test_auto_creations_hold_at_most_their_share_of_the_client_threads(tmp_path: Path) -> None:
    broker, controller = _broker(tmp_path)
    controller.hold.clear()
    with broker, concurrent.futures.ThreadPoolExecutor(AUTO_CREATE_CONCURRENCY) as pool:
        held = [pool.submit(broker.service._maybe_auto_create, {f"slow-{i}"}, caller=MONA)
                for i in range(AUTO_CREATE_CONCURRENCY)]
        for _ in held:
            assert controller.started.acquire(timeout=10), "an auto-creation never reached the controller"
        # Both slots taken: the next one is answered at once, not queued behind them on a client thread.
        busy = broker.service._maybe_auto_create({"one-more"}, caller=MONA)
        assert busy["one-more"].code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, busy
        assert "already auto-creating" in busy["one-more"].message
        assert len(controller.calls) == AUTO_CREATE_CONCURRENCY, "the refused one was not sent"
        controller.hold.set()
        assert [f.result(timeout=10) for f in held] == [{}] * AUTO_CREATE_CONCURRENCY
        # The slots are given back.
        assert broker.service._maybe_auto_create({"one-more"}, caller=MONA) == {}
        assert [r.topics[0].name for r, _ in controller.calls][-1] == "one-more"
