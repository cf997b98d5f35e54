"""The active controller's checks of AlterPartitionReassignments before it proposes a move: KIP-860's
allowReplicationFactorChange=false (Brook: ``keep_replication_factor``), on a real single-voter quorum, in process.
The brokers are registered and never fetch, so a growth stays in progress for as long as a test needs it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from quorum_helpers import register_on, single_voter
from waiting import wait_for

from metadata_quorum import features
from metadata_quorum.controller import ControllerConfig, QuorumController
from proto import controller_pb2 as pb
from proto.errors import ErrorCode


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuorumController]:
    config = ControllerConfig(1, "reassign", defaults={"initial.metadata.version": str(features.SUPPORTED_MAX)})
    with single_voter(tmp_path_factory.mktemp("reassign"), config) as ctl:
        wait_for(lambda: ctl.raft.read(lambda s: s.metadata_level) == features.SUPPORTED_MAX, 30,
                 "the new cluster at the highest level")
        register_on(ctl, (1, 2, 3, 4), "reassign", supported=features.SUPPORTED_MAX)
        yield ctl


def _move(ctl: QuorumController, topic: str, replicas: list[int], *, keep: bool) -> tuple[int, str]:
    out = ctl.alter_reassignments(pb.AlterPartitionReassignmentsRequest(keep_replication_factor=keep, partitions=[
        pb.ReassignablePartition(topic=topic, partition=0, replicas=replicas)]), 30)
    return out.results[0].error_code, out.results[0].error_message


def _replicas(ctl: QuorumController, topic: str) -> tuple[list[int], list[int]]:
    return ctl.raft.read(lambda s: (list(s.topics[topic].partitions[0].replicas),
                                    list(s.topics[topic].partitions[0].adding)))


def test_allow_replication_factor_change_false_keeps_the_count_a_move_in_progress_is_heading_for(
        controller: QuorumController) -> None:
    ctl = controller
    ctl.create_topics(pb.CreateTopicsRequest(topics=[pb.CreatableTopic(
        name="k", assignments=[pb.ReplicaList(replicas=[1])])]), 30)
    # Outside a move: another length is refused with Kafka's words, the same length is a move as ever.
    assert _move(ctl, "k", [1, 2, 3], keep=True) == (ErrorCode.INVALID_REPLICATION_FACTOR,
                                                     "The replication factor is changed from 1 to 3")
    assert _replicas(ctl, "k") == ([1], [])
    # A list no move can take is refused as such (INVALID_REPLICA_ASSIGNMENT), not as a count change (audit).
    for bad in ([], [2, 2], [1, 2, 99]):
        code, message = _move(ctl, "k", bad, keep=True)
        assert code == ErrorCode.INVALID_REPLICA_ASSIGNMENT, (bad, code, message)
    # A growth in progress (the new replicas never catch up here): its target's count is what is kept, as Kafka's
    # controller counts it. Sending the same target again is taken; a redirect to another count is refused.
    assert _move(ctl, "k", [1, 2, 3], keep=False) == (ErrorCode.NONE, "")
    assert _replicas(ctl, "k") == ([1, 2, 3], [2, 3])
    assert _move(ctl, "k", [1, 2, 3], keep=True) == (ErrorCode.NONE, "")
    assert _move(ctl, "k", [1, 2, 4], keep=True) == (ErrorCode.NONE, "")
    assert _move(ctl, "k", [4], keep=True) == (ErrorCode.INVALID_REPLICATION_FACTOR,
                                               "The replication factor is changed from 3 to 1")
    assert _replicas(ctl, "k") == ([1, 2, 4], [2, 4])
