"""The leader's AlterPartition sender keeps a pending ISR until the controller's answer is known.

A lost response (timeout, controller failover) says nothing about whether the change was
committed: dropping the pending ISR there let the HW pass a member the controller had
added (found by the simulator: tests/sim/testdata/alter_partition_lost_response.txt).
Here a real ReplicaManager talks to a controller stand-in that commits the first request
but loses its answer, then refuses the retry with INVALID_UPDATE_VERSION and the
committed state, as metadata_quorum/state.py does.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from waiting import wait_for

from broker.metadata_cache import MetadataCache
from broker.replica_manager import ReplicaManager
from proto import common_pb2, controller_pb2, errors
from proto.errors import ErrorCode
from replication.partition import IsrProposal
from storage.log_manager import LogManager


class LosingController:
    """Commits each AlterPartition at its partition epoch; the first answer is lost."""

    def __init__(self) -> None:
        self.calls: list[controller_pb2.AlterPartitionRequest] = []
        self.isr = [1]
        self.partition_epoch = 0
        self.lock = threading.Lock()

    def call(self, method: str, request: Any, timeout_s: float) -> Any:
        assert method == "AlterPartition", method
        with self.lock:
            self.calls.append(request)
            item = request.items[0]
            state = controller_pb2.PartitionRecord(topic=item.topic, partition=item.partition, replicas=[1, 2],
                                                   leader=1, leader_epoch=0)
            if item.partition_epoch != self.partition_epoch:
                state.isr[:] = self.isr
                state.partition_epoch = self.partition_epoch
                return controller_pb2.AlterPartitionResponse(results=[controller_pb2.AlterPartitionResult(
                    topic=item.topic, partition=item.partition, error_code=ErrorCode.INVALID_UPDATE_VERSION,
                    error_message="stale partition epoch", partition_state=state)])
            self.isr, self.partition_epoch = list(item.new_isr), self.partition_epoch + 1
            if len(self.calls) == 1:
                raise errors.RequestTimedOutError("AlterPartition: the response was lost")
            state.isr[:] = self.isr
            state.partition_epoch = self.partition_epoch
            return controller_pb2.AlterPartitionResponse(results=[controller_pb2.AlterPartitionResult(
                topic=item.topic, partition=item.partition, partition_state=state)])


def test_a_lost_alter_partition_response_keeps_the_pending_isr_until_the_outcome_is_known(tmp_path: Path) -> None:
    defaults = {"auto.create.topics.enable": "false", "log.cleaner.enable": "false"}
    logs = LogManager([tmp_path], defaults, cleaner_threads=0)
    logs.startup()
    cache = MetadataCache(1)
    controller = LosingController()
    rm = ReplicaManager(1, logs, cache, controller, defaults=defaults, broker_epoch=lambda: 1)
    try:
        update = controller_pb2.MetadataUpdate(version=1, is_snapshot=True, cluster_id="c", active_controller_id=-1)
        for node in (1, 2):
            update.brokers.add(node_id=node, incarnation_id=f"i{node}", broker_epoch=1,
                               endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=node)])
        update.topics.add(name="t", topic_id="t" * 32, partition_count=1)
        update.partitions.add(topic="t", topic_id="t" * 32, partition=0, replicas=[1, 2], isr=[1], leader=1,
                              leader_epoch=0, partition_epoch=0)
        rm.apply_metadata_delta(cache.apply(update))
        p = rm.partition("t", 0)
        assert p is not None and p.is_leader and p.isr == (1,)
        with p.lock:  # what _maybe_expand_isr does once follower 2 has caught up
            p.pending_isr = (1, 2)
        rm._alter.start()
        rm._alter.submit(IsrProposal("t", 0, 0, 0, (1, 2)))

        wait_for(lambda: len(controller.calls) >= 1, 10, "the first AlterPartition")
        # The answer was lost, yet the controller did commit ISR [1, 2]: the HW must keep
        # counting broker 2 until the outcome is known.
        assert p.maximal_isr() == (1, 2), p.maximal_isr()
        wait_for(lambda: p.isr == (1, 2) and p.pending_isr is None, 10,
                 f"the retry to settle the ISR (calls: {len(controller.calls)}, isr {p.isr}, pending {p.pending_isr})")
        assert p.partition_epoch == 1
        assert len(controller.calls) == 2 and controller.calls[1].items[0].partition_epoch == 0
    finally:
        rm.shutdown()
        logs.shutdown()
