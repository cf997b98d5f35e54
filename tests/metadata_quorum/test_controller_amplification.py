"""What one request may cost the active controller (audit: amplification findings #4, #12, #14).

- #4: a broker forwards Kafka admin requests read from frames of up to ``socket.request.max.bytes``
  (8 MiB); the controller read at most gRPC's default 4 MiB, and ``ControllerClient.call`` retried
  gRPC's "larger than max" until its deadline (30 s on a Kafka admin worker of the broker).
- #12: DeleteAcls matched every ACL against every filter inside the metadata state lock (3.5 s for
  10,000 ACLs x 1,000 filters; the Raft tick thread stalled).
- #14: AlterConfigs naming one topic 1,000 times made 1,000 Raft commits.

One real voter (pysyncobj on loopback) with its gRPC server, in this process. The work is counted
(commands proposed, matcher calls, whether the state lock was held), never timed.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from quorum_helpers import create_topic, free_port, register_brokers
from waiting import wait_for

from metadata_quorum import commands as c
from metadata_quorum import security_service as ss
from metadata_quorum.client import ControllerClient
from metadata_quorum.node import ControllerNode, ControllerSettings, VoterAddress
from proto import controller_pb2 as pb
from proto import errors
from proto import security_pb2 as spb
from proto.errors import ErrorCode
from storage import log_config

pytestmark = pytest.mark.slow

CLUSTER = "amplification"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerNode]:
    voters = {1: VoterAddress("127.0.0.1", free_port(), free_port())}
    # Broker leases outlast the module: no fencing proposals run behind the tests' backs.
    n = ControllerNode(ControllerSettings(1, voters, Path(tmp_path_factory.mktemp("amp")), CLUSTER,
                                          secrets.token_urlsafe(32), broker_session_timeout_ms=600_000))
    n.start()
    try:
        wait_for(n.is_active, 20, "the single voter to become active")
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def client(node: ControllerNode) -> Iterator[ControllerClient]:
    v = node.settings.voters[1]
    with ControllerClient([(v.host, v.grpc_port)], timeout_s=15) as cc:
        register_brokers(cc, [1], CLUSTER)
        yield cc


class Proposals:
    """Every command the node proposes (``raft.submit``), by command type."""

    def __init__(self, node: ControllerNode, monkeypatch: pytest.MonkeyPatch) -> None:
        self.commands: list[Any] = []
        self._lock = threading.Lock()
        real = node.raft.submit

        def submit(cmd: Any, *args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.commands.append(cmd)
            return real(cmd, *args, **kwargs)
        monkeypatch.setattr(node.raft, "submit", submit)

    def of(self, kind: type) -> list[Any]:
        with self._lock:
            return [cmd for cmd in self.commands if isinstance(cmd, kind)]


# ---- #4: forwarded requests up to socket.request.max.bytes; "larger than max" is not retried ----
def padded_configs() -> dict[str, str]:
    """Every topic config whose default is a non-negative integer, as its default padded with zeros to the
    longest value a client may set: valid, and long."""
    return {key: str(d.default).zfill(log_config.VALUE_MAX_CHARS) for key, d in log_config.TOPIC_CONFIGS.items()
            if str(d.default).isdigit()}


def test_the_controller_reads_requests_up_to_socket_request_max_bytes(client: ControllerClient) -> None:
    # A valid CreateTopics of 5 MB (what a Kafka client may send a broker, forwarded): gRPC's default 4 MiB
    # refused it before the controller read it, whatever it asked for.
    configs = padded_configs()
    request = pb.CreateTopicsRequest(validate_only=True, topics=[
        pb.CreatableTopic(name=f"big-{i:04d}-" + "x" * 200, num_partitions=1, replication_factor=1, configs=configs)
        for i in range(1000)])
    assert 4 * MiB < request.ByteSize() < 8 * MiB
    answer = client.call("CreateTopics", request, timeout_s=10)
    assert [r.error_code for r in answer.results] == [ErrorCode.NONE] * 1000, answer.results[0]
    # And a 4.5 MB ElectLeaders (1.5 million partitions, the audit's request) gets the controller's own
    # answer at once: too many partitions.
    elect = pb.ElectLeadersRequest(election_type=0, timeout_ms=60000, topic_partitions=[
        pb.TopicPartitions(topic="t", partitions=list(range(1_500_000)))])
    assert elect.ByteSize() > 4 * MiB
    with pytest.raises(errors.BrookError) as refused:
        client.call("ElectLeaders", elect, timeout_s=10)
    assert refused.value.code != ErrorCode.REQUEST_TIMED_OUT and "10000" in refused.value.message, refused.value
    # The limit is the node's socket.request.max.bytes, as a broker's, 8 MiB unless configured.
    from metadata_quorum.node import max_request_bytes

    assert max_request_bytes({}) == 8 * MiB
    assert max_request_bytes({"socket.request.max.bytes": str(20 * MiB)}) == 20 * MiB


def test_a_request_larger_than_the_controller_reads_is_answered_at_once(
        client: ControllerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    retries: list[int] = []
    real_sleep = client._sleep_before_retry

    def sleep_before_retry(attempt: int, deadline: float) -> None:
        retries.append(attempt)
        real_sleep(attempt, deadline)
    monkeypatch.setattr(client, "_sleep_before_retry", sleep_before_retry)
    huge = pb.DeleteTopicsRequest(names=["x" * 249] * 40_000)
    assert huge.ByteSize() > 8 * MiB
    with pytest.raises(errors.BrookError) as refused:
        client.call("DeleteTopics", huge, timeout_s=10)
    assert refused.value.code == ErrorCode.MESSAGE_TOO_LARGE, refused.value
    assert "larger than" in refused.value.message and "socket.request.max.bytes" in refused.value.message
    assert retries == [], f"retried {len(retries)} times"
    # The controller is as it was: the next call is answered.
    assert client.call("DescribeCluster", pb.DescribeClusterRequest(), timeout_s=10).error_code == ErrorCode.NONE


def test_a_busy_controller_is_still_retried(client: ControllerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only gRPC's size refusal is permanent: the controller's own RESOURCE_EXHAUSTED (its receive gate,
    its call limit) is retried after a backoff, as before."""
    import grpc

    class Busy(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.RESOURCE_EXHAUSTED

        def details(self) -> str:
            return "broker overloaded: client ipv4:127.0.0.1 has 16 requests being received"

    real_stub = client._stub
    calls: list[int] = []

    class Stub:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            method = getattr(self._inner, name)
            if name != "DescribeCluster":
                return method

            def flaky(*args: Any, **kwargs: Any) -> Any:
                calls.append(1)
                if len(calls) < 3:
                    raise Busy()
                return method(*args, **kwargs)
            return flaky
    monkeypatch.setattr(client, "_stub", lambda endpoint: Stub(real_stub(endpoint)))
    assert client.call("DescribeCluster", pb.DescribeClusterRequest(), timeout_s=10).error_code == ErrorCode.NONE
    assert len(calls) == 3


# ---- #14: AlterConfigs naming a topic more than once ----
def alter(client: ControllerClient, resources: list[pb.AlterConfigsResource], *,
          validate_only: bool = False) -> list[pb.TopicResult]:
    return list(client.call("AlterConfigs", pb.AlterConfigsRequest(resources=resources, validate_only=validate_only),
                            timeout_s=15).results)


def test_a_topic_named_twice_in_alter_configs_is_refused_at_every_mention_and_not_proposed(
        node: ControllerNode, client: ControllerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("dup", "single"):
        assert create_topic(client, name, 1, 1).error_code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS)
    before = node.raft.read(lambda s: dict(s.topics["dup"].configs))
    proposals = Proposals(node, monkeypatch)
    # The audit's request: one topic, 1,000 times (each a different retention.ms).
    results = alter(client, [pb.AlterConfigsResource(topic="dup", set={"retention.ms": str(600_000_000 + i)})
                             for i in range(1000)])
    assert [(r.name, r.error_code) for r in results] == [("dup", ErrorCode.INVALID_REQUEST)] * 1000
    assert "Duplicate resource" in results[0].error_message and "at most once" in results[0].error_message
    assert proposals.of(c.AlterConfigs) == [], f"{len(proposals.of(c.AlterConfigs))} AlterConfigs proposed"
    assert node.raft.read(lambda s: dict(s.topics["dup"].configs)) == before
    # The other resources of the request are altered; the duplicated one at none of its mentions.
    results = alter(client, [pb.AlterConfigsResource(topic="dup", set={"retention.ms": "1000"}),
                             pb.AlterConfigsResource(topic="single", set={"retention.ms": "2000"}),
                             pb.AlterConfigsResource(topic="dup", delete=["retention.ms"])])
    assert [(r.name, r.error_code) for r in results] == [
        ("dup", ErrorCode.INVALID_REQUEST), ("single", ErrorCode.NONE), ("dup", ErrorCode.INVALID_REQUEST)]
    assert [cmd.name for cmd in proposals.of(c.AlterConfigs)] == ["single"]
    assert node.raft.read(lambda s: s.topics["single"].configs.get("retention.ms")) == "2000"
    assert node.raft.read(lambda s: dict(s.topics["dup"].configs)) == before
    # validate_only answers the same.
    results = alter(client, [pb.AlterConfigsResource(topic="dup", set={"retention.ms": "1000"})] * 2,
                    validate_only=True)
    assert [r.error_code for r in results] == [ErrorCode.INVALID_REQUEST] * 2
    # Once, it is altered as before.
    [ok] = alter(client, [pb.AlterConfigsResource(topic="dup", set={"retention.ms": "3000"})])
    assert ok.error_code == ErrorCode.NONE, ok
    assert len(proposals.of(c.AlterConfigs)) == 2


# ---- #12: DeleteAcls matches outside the state lock, each distinct filter once ----
def binding(name: str, principal: str, operation: str = "READ") -> spb.AclBinding:
    return spb.AclBinding(resource_type="TOPIC", resource_name=name, pattern_type="LITERAL", principal=principal,
                          host="*", operation=operation, permission="ALLOW")


def acl_filter(principal: str = "", **fields: str) -> spb.AclFilter:
    return spb.AclFilter(principal=principal, **fields)


@pytest.fixture
def admin(node: ControllerNode) -> ss.QuorumSecurityAdmin:
    return ss.QuorumSecurityAdmin(node.controller, node.raft, node._redirect)


class Matcher:
    """``acl_matches_filter`` counted, noting each call made while this thread held the state lock."""

    def __init__(self, node: ControllerNode, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.under_lock = 0
        self.on_first_call: Any = None
        self._lock = node.raft.lock
        real = ss.acl_matches_filter

        def matches(b: Any, f: Any) -> bool:
            self.calls += 1
            if self._lock._is_owned():  # the state lock (an RLock) held by the thread matching
                self.under_lock += 1
            if self.calls == 1 and self.on_first_call is not None:
                self.on_first_call()
            return real(b, f)
        monkeypatch.setattr(ss, "acl_matches_filter", matches)


def acls_of(node: ControllerNode, principal: str) -> set[str]:
    return node.raft.read(lambda s: {b.resource_name for b in s.acls if b.principal == principal})


def test_delete_acls_matches_outside_the_state_lock_each_distinct_filter_once(
        node: ControllerNode, admin: ss.QuorumSecurityAdmin, monkeypatch: pytest.MonkeyPatch) -> None:
    for start in (0, 1000):
        admin.create_acls([binding(f"bulk-{i}", "User:bulk") for i in range(start, start + 1000)], 15)
    total = node.raft.read(lambda s: len(s.acls))
    assert total >= 2000
    proposals = Proposals(node, monkeypatch)
    matcher = Matcher(node, monkeypatch)
    # The audit's request: 1,000 copies of a filter that matches nothing (19 KB).
    answer = admin.delete_acls([acl_filter("User:nobody")] * 1000, 15)
    assert list(answer.acls) == []
    assert matcher.under_lock == 0, f"{matcher.under_lock} of {matcher.calls} matches ran holding the state lock"
    assert matcher.calls == total, f"{matcher.calls} matches for {total} ACLs and one distinct filter"
    assert proposals.of(c.DeleteAcls) == []
    # Filters equal but for letter case are one filter, as they match the same bindings.
    matcher.calls = 0
    admin.delete_acls([acl_filter("User:nobody", resource_type="topic", operation="read"),
                       acl_filter("User:nobody", resource_type="TOPIC", operation="READ")] * 300, 15)
    assert matcher.calls == total
    # Still at most MAX_ITEMS_PER_REQUEST filters, duplicates counted.
    with pytest.raises(errors.InvalidRequestError):
        admin.delete_acls([acl_filter("User:nobody")] * (ss.MAX_ITEMS_PER_REQUEST + 1), 15)
    # What the filters match is deleted by one command naming exactly those bindings.
    answer = admin.delete_acls([acl_filter("User:bulk", resource_name="bulk-7")] * 500
                               + [acl_filter("User:bulk", resource_name="bulk-1999")], 15)
    assert sorted(a.resource_name for a in answer.acls) == ["bulk-1999", "bulk-7"]
    [cmd] = proposals.of(c.DeleteAcls)
    assert sorted(a[1] for a in cmd.acls) == ["bulk-1999", "bulk-7"]
    assert matcher.under_lock == 0
    assert "bulk-7" not in acls_of(node, "User:bulk") and len(acls_of(node, "User:bulk")) == 1998
    admin.delete_acls([acl_filter("User:bulk")], 15)
    assert acls_of(node, "User:bulk") == set()


def test_delete_acls_deletes_what_it_matched_even_when_the_acls_change_meanwhile(
        node: ControllerNode, admin: ss.QuorumSecurityAdmin, monkeypatch: pytest.MonkeyPatch) -> None:
    """As before the change: the bindings matched are proposed as they are, and the state deletes those
    still there. One created after the match stays; one deleted meanwhile is not in the answer."""
    admin.create_acls([binding(f"race-{i}", "User:race") for i in range(5)], 15)
    matcher = Matcher(node, monkeypatch)
    changed = threading.Event()

    def change_meanwhile() -> None:  # another admin, between the match and the apply
        admin.create_acls([binding("race-late", "User:race")], 15)
        admin.delete_acls([acl_filter("User:race", resource_name="race-0")], 15)
        changed.set()
    matcher.on_first_call = change_meanwhile
    answer = admin.delete_acls([acl_filter("User:race")], 15)
    assert changed.is_set()
    assert sorted(a.resource_name for a in answer.acls) == [f"race-{i}" for i in range(1, 5)]
    assert acls_of(node, "User:race") == {"race-late"}
    admin.delete_acls([acl_filter("User:race")], 15)


def test_a_topic_named_twice_in_delete_topics_is_refused_at_every_mention_and_not_deleted(
        node: ControllerNode, client: ControllerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka answers "Duplicate topic name." at each mention; it used to be proposed once per mention."""
    for name in ("del-dup", "del-single"):
        assert create_topic(client, name, 1, 1).error_code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS)
    proposals = Proposals(node, monkeypatch)
    results = list(client.call("DeleteTopics", pb.DeleteTopicsRequest(
        names=["del-dup"] * 500 + ["del-single"] + ["del-dup"] * 499), timeout_s=15).results)
    assert [(r.name, r.error_code) for r in results] == (
        [("del-dup", ErrorCode.INVALID_REQUEST)] * 500 + [("del-single", ErrorCode.NONE)]
        + [("del-dup", ErrorCode.INVALID_REQUEST)] * 499)
    assert "more than once" in results[0].error_message
    assert [cmd.name for cmd in proposals.of(c.DeleteTopic)] == ["del-single"]
    assert node.raft.read(lambda s: ("del-dup" in s.topics, "del-single" in s.topics)) == (True, False)
