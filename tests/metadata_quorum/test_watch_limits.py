"""WatchMetadata bounds: a watcher that falls behind the changelog window is cut off with a clear error,
and ControllerClient.watch recovers from it with a snapshot. Single-voter quorum, real sockets."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from quorum_helpers import create_topic, free_port, register_brokers
from waiting import wait_for

from metadata_quorum.client import ControllerClient
from metadata_quorum.node import ControllerNode, ControllerSettings, VoterAddress
from proto import controller_pb2 as pb
from proto.errors import ErrorCode


class OpenContext:
    """Stands in for grpc.ServicerContext: a plaintext caller on loopback (a node of a single-host cluster)."""

    def is_active(self) -> bool:
        return True

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50000"

    def auth_context(self) -> dict:
        return {}

    def invocation_metadata(self) -> tuple:
        return ()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerNode]:
    voters = {1: VoterAddress("127.0.0.1", free_port(), free_port())}
    n = ControllerNode(ControllerSettings(1, voters, Path(tmp_path_factory.mktemp("single")), "single", secrets.token_urlsafe(32),
                                          metadata_changelog_max_keys=40))
    n.start()
    try:
        wait_for(n.is_active, 20, "the single voter to become active")
        yield n
    finally:
        n.stop()


def test_a_watcher_behind_the_changelog_window_is_cut_off_then_resumes_with_a_snapshot(
        node: ControllerNode) -> None:
    v = node.settings.voters[1]
    with ControllerClient([(v.host, v.grpc_port)]) as client:
        register_brokers(client, [1], "single")
        stream = node.service.WatchMetadata(pb.WatchMetadataRequest(broker_id=1, since_version=0), OpenContext())
        first = next(stream)
        assert first.is_snapshot and first.error_code == ErrorCode.NONE
        for i in range(15):  # 15 topics x 3 keys > the 40-key window
            assert create_topic(client, f"burst-{i}", 2, 1).error_code == ErrorCode.NONE
        cut = next(stream)
        assert cut.error_code == ErrorCode.REQUEST_TIMED_OUT, cut
        assert f"since_version={first.version}" in cut.error_message, cut.error_message
        with pytest.raises(StopIteration):
            next(stream)
        # The client reconnects from its last version and is served a snapshot.
        resumed = next(client.watch(first.version))
        assert resumed.is_snapshot and len(resumed.topics) == 15, (resumed.is_snapshot, len(resumed.topics))
        # A recent version still gets a delta.
        assert create_topic(client, "one-more", 1, 1).error_code == ErrorCode.NONE
        delta = next(client.watch(resumed.version))
        assert not delta.is_snapshot and [t.name for t in delta.topics] == ["one-more"]
