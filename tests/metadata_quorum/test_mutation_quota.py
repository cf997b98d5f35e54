"""The controller mutation quota (KIP-599), enforced by the active controller before it proposes.

One real voter (pysyncobj on loopback), its QuorumController on a fake clock (the token buckets
refill only when the test moves it: nothing depends on how fast this machine is) and the
ControllerService in front of it, called in-process with the caller's identity as a Kafka
connection carries it. quota.window.num = 2 and quota.window.size.seconds = 1: a principal
with a quota of R partition mutations/s has a burst of 2R.
"""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest
from quorum_helpers import caller as quorum_caller
from quorum_helpers import in_process_service

from broker.authorizer import EMPTY_INDEX, Authorizer, AuthorizerConfig
from broker.principal import AUTH_CERTIFICATE, AUTH_FORWARDED, AUTH_SASL
from metadata_quorum import commands as c
from metadata_quorum.controller import QuorumController
from metadata_quorum.service import ControllerService
from proto import controller_pb2 as pb
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow

DEFAULTS = {"quota.window.num": "2", "quota.window.size.seconds": "1"}
THROTTLED = ErrorCode.THROTTLING_QUOTA_EXCEEDED


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Quorum:
    def __init__(self, controller: QuorumController, service: ControllerService, clock: Clock) -> None:
        self.controller = controller
        self.service = service
        self.clock = clock

    def set_quota(self, entity: str, rate: float | None) -> None:
        cmd = c.AlterClientQuota(entity, {} if rate is None else {"controller_mutation_rate": rate},
                                 [] if rate is not None else ["controller_mutation_rate"])
        self.controller._propose(cmd, 30).raise_for_error()

    def create(self, who: types.SimpleNamespace, *topics: tuple[str, int], validate_only: bool = False,
               permissive: bool = False) -> pb.CreateTopicsResponse:
        return self.service.CreateTopics(pb.CreateTopicsRequest(
            topics=[pb.CreatableTopic(name=n, num_partitions=p, replication_factor=1) for n, p in topics],
            validate_only=validate_only, permissive_quota=permissive), who)


def caller(name: str, method: str = AUTH_SASL) -> types.SimpleNamespace:
    return quorum_caller(name, method)


ALICE, BOB, ADMIN = caller("alice"), caller("bob"), caller("admin")
NODE = caller("node-2", AUTH_CERTIFICATE)  # a broker's own certificate (auto-created and internal topics)


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Quorum]:
    clock = Clock()
    # Kafka's StandardAuthorizer configuration, without ACLs: allow.everyone.if.no.acl.found.
    authorizer = Authorizer(AuthorizerConfig(True, frozenset({"User:admin"}), True), lambda: EMPTY_INDEX)
    with in_process_service(tmp_path_factory.mktemp("mutation-quota"), "mq", authorizer, DEFAULTS, clock) as service:
        yield Quorum(service._controller, service, clock)


def codes(response: pb.CreateTopicsResponse | pb.DeleteTopicsResponse | pb.CreatePartitionsResponse) -> list[int]:
    return [r.error_code for r in response.results]


def test_a_topic_over_the_quota_is_refused_and_nothing_is_proposed(quorum: Quorum) -> None:
    quorum.set_quota("User:alice", 1.0)  # burst 2
    # The bucket (2) is not negative: the first topic is accepted although it takes it to -3; the second,
    # in the same request, is refused.
    first = quorum.create(ALICE, ("a-5", 5), ("a-1", 1))
    assert codes(first) == [ErrorCode.NONE, THROTTLED], first
    assert first.results[1].error_message == \
        "throttled: controller mutation quota of 1/s exceeded, retry after 3000 ms"
    assert first.throttle_time_ms == 3000
    before = quorum.controller.raft.commit_index
    proposed: list[object] = []  # every proposal goes through QuorumController._submit, synchronously
    submit = quorum.controller._submit
    quorum.controller._submit = lambda cmd: (proposed.append(cmd), submit(cmd))[1]  # type: ignore[method-assign]
    try:
        refused = quorum.create(ALICE, ("a-2", 1))
    finally:
        del quorum.controller._submit
    assert codes(refused) == [THROTTLED] and refused.throttle_time_ms == 3000, refused
    assert proposed == [], f"a refused topic was proposed: {proposed}"
    assert quorum.controller.raft.commit_index == before, "a refused topic went through Raft"
    assert quorum.controller.mutation_quotas.stats.refused == 2

    quorum.clock.now += 2.0  # -3 + 2: still 1 s to wait
    assert quorum.create(ALICE, ("a-2", 1)).results[0].error_message.endswith("retry after 1000 ms")
    quorum.clock.now += 1.0  # back at zero
    assert codes(quorum.create(ALICE, ("a-2", 1))) == [ErrorCode.NONE]


def test_validate_only_is_not_counted_and_others_are_not_limited(quorum: Quorum) -> None:
    quorum.set_quota("User:alice", 1.0)
    quorum.clock.now += 100.0  # a full bucket (2)
    assert codes(quorum.create(ALICE, ("v-50", 50), validate_only=True)) == [ErrorCode.NONE]
    assert codes(quorum.create(ALICE, ("v-3", 3))) == [ErrorCode.NONE]  # the burst is still there
    assert codes(quorum.create(ALICE, ("v-1", 1))) == [THROTTLED]
    # Alice's quota is hers: a user without one, a super user and a broker (auto-created and internal
    # topics) are not limited, whatever she did.
    assert codes(quorum.create(BOB, ("bob-40", 40), ("bob-1", 1))) == [ErrorCode.NONE] * 2
    assert codes(quorum.create(ADMIN, ("admin-40", 40), ("admin-1", 1))) == [ErrorCode.NONE] * 2
    assert codes(quorum.create(NODE, ("node-40", 40), ("node-1", 1))) == [ErrorCode.NONE] * 2


def test_the_default_quota_applies_to_every_principal_but_super_users_and_nodes(quorum: Quorum) -> None:
    quorum.set_quota("User:alice", None)
    quorum.set_quota("<default>", 2.0)  # burst 4
    try:
        quorum.clock.now += 100.0
        assert codes(quorum.create(BOB, ("d-bob-10", 10), ("d-bob-1", 1))) == [ErrorCode.NONE, THROTTLED]
        assert codes(quorum.create(ALICE, ("d-alice-4", 4), ("d-alice-1", 1))) == [ErrorCode.NONE] * 2
        assert codes(quorum.create(ADMIN, ("d-admin-10", 10), ("d-admin-1", 1))) == [ErrorCode.NONE] * 2
        assert codes(quorum.create(NODE, ("d-node-10", 10), ("d-node-1", 1))) == [ErrorCode.NONE] * 2
    finally:
        quorum.set_quota("<default>", None)


def test_create_partitions_counts_the_added_and_delete_topics_the_deleted(quorum: Quorum) -> None:
    assert codes(quorum.create(ADMIN, ("grow", 2), ("gone-6", 6), ("gone-1", 1))) == [ErrorCode.NONE] * 3
    quorum.set_quota("User:alice", 1.0)
    quorum.clock.now += 100.0  # burst 2
    grow = quorum.service.CreatePartitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="grow", count=4)]), ALICE)  # 2 added: 2 -> 0
    assert codes(grow) == [ErrorCode.NONE], grow
    grow_more = quorum.service.CreatePartitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="grow", count=5)], validate_only=True), ALICE)
    assert codes(grow_more) == [ErrorCode.NONE]  # not counted
    delete = quorum.service.DeleteTopics(pb.DeleteTopicsRequest(names=["gone-6", "gone-1"]), ALICE)
    assert codes(delete) == [ErrorCode.NONE, THROTTLED], delete  # 0 -> -6, then refused
    assert delete.throttle_time_ms == 6000
    grow_refused = quorum.service.CreatePartitions(pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="grow", count=5)]), ALICE)
    assert codes(grow_refused) == [THROTTLED] and grow_refused.throttle_time_ms == 6000
    assert quorum.controller.raft.read(lambda s: ("gone-6" in s.topics, "gone-1" in s.topics,
                                                  len(s.topics["grow"].partitions))) == (False, True, 4)


def test_permissive_quota_only_for_requests_a_broker_forwards(quorum: Quorum) -> None:
    quorum.set_quota("User:alice", 1.0)
    quorum.clock.now += 100.0  # burst 2
    throttled_before = quorum.controller.mutation_quotas.stats.accepted_over_quota
    # Alice's own gRPC client cannot ask for the permissive treatment of older Kafka clients.
    assert codes(quorum.create(ALICE, ("p-3", 3), ("p-1", 1), permissive=True)) == [ErrorCode.NONE, THROTTLED]
    quorum.clock.now += 100.0
    # A broker forwarding CreateTopics v5 of a Kafka client: everything is accepted, the answer throttled.
    forwarded = caller("alice", AUTH_FORWARDED)
    old_client = quorum.create(forwarded, ("p-old-3", 3), ("p-old-1", 1), permissive=True)
    assert codes(old_client) == [ErrorCode.NONE] * 2, old_client
    assert old_client.throttle_time_ms == 2000  # 2 - 3 - 1 = -2 at 1/s
    assert quorum.controller.mutation_quotas.stats.accepted_over_quota == throttled_before + 4
    # The same client on CreateTopics v6+ (strict) finds the bucket empty.
    assert codes(quorum.create(forwarded, ("p-new-1", 1))) == [THROTTLED]
