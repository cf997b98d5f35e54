"""Test helper: broker 1's real ReplicaManager, Log and BrokerService in this process, no gRPC.

The metadata is applied as the broker's watch would apply it: broker 1 leads every partition of
the given topics, with the given replicas in sync (a follower here fetches only when a test
makes its fetch through the ReplicaManager, as the ReplicaFetch handler would). There is no
controller: a call to it fails the test.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

from broker.admission import ByteBudget, ClientLimits
from broker.metadata_cache import MetadataCache
from broker.replica_manager import ReplicaManager
from broker.service import BrokerService, Capacity
from proto import common_pb2, controller_pb2
from storage.log_manager import LogManager


class LoopbackCaller:
    """The ServicerContext calls a handler makes, for a plaintext caller on loopback (127.0.0.1). A handler that
    aborts the call fails the test."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:5000"

    def auth_context(self) -> dict:
        return {}

    def invocation_metadata(self) -> tuple:
        return ()

    async def abort(self, code: Any, details: str) -> None:
        raise AssertionError(f"aborted {code}: {details}")


class NoController:
    def call(self, method: str, request: Any, timeout_s: float) -> Any:
        raise AssertionError(f"no controller call expected here, got {method}")


class InProcessBroker:
    def __init__(self, tmp_path: Path, topics: Mapping[str, Mapping[str, str]], *, partitions: int = 1,
                 replicas: Sequence[int] = (1,), executor: concurrent.futures.Executor | None = None,
                 recompression: concurrent.futures.Executor | None = None, **rm_options: Any) -> None:
        """``rm_options``: more ReplicaManager keywords (``lease_valid``, ``fenced``)."""
        defaults = {"auto.create.topics.enable": "false", "log.cleaner.enable": "false"}
        self.logs = LogManager([tmp_path], defaults, cleaner_threads=0)
        self.logs.startup()
        cache = MetadataCache(1)
        self.rm = ReplicaManager(1, self.logs, cache, NoController(), defaults=defaults, broker_epoch=lambda: 1,
                                 **rm_options)
        update = controller_pb2.MetadataUpdate(version=1, is_snapshot=True, cluster_id="c", active_controller_id=-1)
        for node in replicas:
            update.brokers.add(node_id=node, incarnation_id=f"i{node}", broker_epoch=1,
                               endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=node)])
        for name, configs in topics.items():
            update.topics.add(name=name, topic_id=name[0] * 32, partition_count=partitions, configs=dict(configs))
            for p in range(partitions):
                update.partitions.add(topic=name, topic_id=name[0] * 32, partition=p, replicas=list(replicas),
                                      isr=list(replicas), leader=1, leader_epoch=0, partition_epoch=0)
        self.rm.apply_metadata_delta(cache.apply(update))
        self.io = executor or concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="test-io")
        capacity = Capacity(io=self.io, replication=self.io, limits=ClientLimits(100, 100),
                            budget=ByteBudget(64 << 20), recompression=recompression)
        self.service = BrokerService(1, self.rm, cache, None, None, defaults=defaults,  # type: ignore[arg-type]
                                     controller_endpoints=[], capacity=capacity)

    def close(self) -> None:
        self.rm.shutdown()
        self.logs.shutdown()
        self.io.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
