"""ControllerService + ControllerClient against three real ControllerNodes (one process, real sockets).

The multi-process fault tests live in test_quorum_processes.py; these cover the RPC
surface: validation errors, redirects, broker lifecycle, ISR changes, watch streams.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from quorum_helpers import create_topic, free_port, heartbeat_all, register_brokers
from waiting import wait_for

from metadata_quorum.client import ControllerClient
from metadata_quorum.node import ControllerNode, ControllerSettings, VoterAddress, parse_voters
from proto import common_pb2, errors
from proto import controller_pb2 as pb
from proto.errors import ErrorCode

CLUSTER = "svc-test"
QUORUM_PASSWORD = secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ControllerNode]]:
    base = tmp_path_factory.mktemp("quorum")
    voters = {i: VoterAddress("127.0.0.1", free_port(), free_port()) for i in (1, 2, 3)}
    nodes = [ControllerNode(ControllerSettings(
        i, voters, base / f"c{i}", CLUSTER, QUORUM_PASSWORD, broker_session_timeout_ms=4000,
        broker_heartbeat_interval_ms=300, defaults={"num.partitions": "2", "default.replication.factor": "2",
                                                     "log.retention.ms": "12345"}))
        for i in (1, 2, 3)]
    try:
        for n in nodes:
            n.start()
        wait_for(lambda: any(n.is_active() for n in nodes), 20, "an active controller")
        yield nodes
    finally:
        for n in nodes:
            n.stop()


@pytest.fixture(scope="module")
def client(quorum: list[ControllerNode]) -> Iterator[ControllerClient]:
    endpoints = [(n.settings.voters[n.settings.node_id].host, n.settings.voters[n.settings.node_id].grpc_port)
                 for n in quorum]
    with ControllerClient(endpoints, timeout_s=15) as c:
        yield c


@pytest.fixture(scope="module")
def epochs(client: ControllerClient) -> dict[int, int]:
    return register_brokers(client, [1, 2, 3], CLUSTER)


def active(nodes: list[ControllerNode]) -> ControllerNode:
    return wait_for(lambda: next((n for n in nodes if n.is_active()), None), 20, "an active controller")


def test_parse_voters() -> None:
    v = parse_voters("1@127.0.0.1:9093:9193, 2@h:1:2")
    assert v == {1: VoterAddress("127.0.0.1", 9093, 9193), 2: VoterAddress("h", 1, 2)}
    with pytest.raises(errors.InvalidConfigError):
        parse_voters("1@127.0.0.1:9093")


def test_followers_redirect_to_the_active_controller(quorum: list[ControllerNode]) -> None:
    leader = active(quorum)
    follower = next(n for n in quorum if n is not leader)
    fv = follower.settings.voters[follower.settings.node_id]
    with ControllerClient([(fv.host, fv.grpc_port)]) as c:
        r = c.call_endpoint((fv.host, fv.grpc_port), "DescribeCluster", pb.DescribeClusterRequest(), timeout_s=5)
        assert r.error_code == ErrorCode.NOT_CONTROLLER and not r.brokers, r
        lv = leader.settings.voters[leader.settings.node_id]
        assert (r.redirect.leader_id, r.redirect.leader.port) == (leader.settings.node_id, lv.grpc_port), r
        # The client follows the redirect on its own.
        assert c.call("DescribeCluster", pb.DescribeClusterRequest()).cluster_id == CLUSTER


def test_create_topic_validation_errors(client: ControllerClient, epochs: dict[int, int]) -> None:
    cases = [
        (pb.CreatableTopic(name="bad name", num_partitions=1, replication_factor=1), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (pb.CreatableTopic(name="x" * 250, num_partitions=1, replication_factor=1), ErrorCode.INVALID_TOPIC_EXCEPTION),
        (pb.CreatableTopic(name="rf", num_partitions=1, replication_factor=4), ErrorCode.INVALID_REPLICATION_FACTOR),
        (pb.CreatableTopic(name="np", num_partitions=-5, replication_factor=1), ErrorCode.INVALID_PARTITIONS),
        (pb.CreatableTopic(name="zero", num_partitions=0, replication_factor=1), ErrorCode.INVALID_PARTITIONS),
        (pb.CreatableTopic(name="rf0", num_partitions=1, replication_factor=0), ErrorCode.INVALID_REPLICATION_FACTOR),
        (pb.CreatableTopic(name="cfg", num_partitions=1, replication_factor=1, configs={"retention.ms": "x"}),
         ErrorCode.INVALID_CONFIG),
        (pb.CreatableTopic(name="asg", num_partitions=-1, replication_factor=-1,
                           assignments=[pb.ReplicaList(replicas=[1, 9])]),
         ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        # Partitions of different replica counts: Kafka's INVALID_REPLICA_ASSIGNMENT (it was a replication factor's).
        (pb.CreatableTopic(name="uneven", num_partitions=-1, replication_factor=-1,
                           assignments=[pb.ReplicaList(replicas=[1, 2]), pb.ReplicaList(replicas=[1])]),
         ErrorCode.INVALID_REPLICA_ASSIGNMENT),
    ]
    r = client.call("CreateTopics", pb.CreateTopicsRequest(topics=[t for t, _ in cases]))
    for (topic, code), result in zip(cases, r.results, strict=True):
        assert result.error_code == code, (topic.name, result)
        assert result.error_message, result
    names = {t.name for t in client.call("DescribeCluster", pb.DescribeClusterRequest()).topics}
    assert not names & {t.name for t, _ in cases}


def test_create_describe_alter_and_grow_a_topic(client: ControllerClient, epochs: dict[int, int]) -> None:
    result = create_topic(client, "orders", -1, -1, configs={"cleanup.policy": "compact"})
    assert result.error_code == ErrorCode.NONE, result
    assert (result.num_partitions, result.replication_factor) == (2, 2)  # the node's defaults
    again = create_topic(client, "orders", 1, 1)
    assert again.error_code == ErrorCode.TOPIC_ALREADY_EXISTS
    dry = client.call("CreateTopics", pb.CreateTopicsRequest(
        validate_only=True, topics=[pb.CreatableTopic(name="dry", num_partitions=3, replication_factor=3)]))
    assert dry.results[0].error_code == ErrorCode.NONE
    cluster = client.call("DescribeCluster", pb.DescribeClusterRequest())
    assert "dry" not in {t.name for t in cluster.topics}

    configs = client.call("DescribeConfigs", pb.DescribeConfigsRequest(topics=["orders", "nope"]))
    entries = {e.name: e for e in configs.results[0].entries}
    assert (entries["cleanup.policy"].value, entries["cleanup.policy"].is_default) == ("compact", False)
    assert (entries["retention.ms"].value, entries["retention.ms"].is_default) == ("12345", True)
    assert configs.results[1].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    altered = client.call("AlterConfigs", pb.AlterConfigsRequest(resources=[
        pb.AlterConfigsResource(topic="orders", set={"retention.ms": "1000"}, delete=["cleanup.policy"])]))
    assert altered.results[0].error_code == ErrorCode.NONE
    refused = client.call("AlterConfigs", pb.AlterConfigsRequest(resources=[
        pb.AlterConfigsResource(topic="orders", set={"segment.bytes": "-1"})]))
    assert refused.results[0].error_code == ErrorCode.INVALID_CONFIG
    # A topic named twice in one request is refused at both mentions, and neither applied (as Kafka).
    twice = client.call("AlterConfigs", pb.AlterConfigsRequest(resources=[
        pb.AlterConfigsResource(topic="orders", set={"retention.ms": "2000"}),
        pb.AlterConfigsResource(topic="orders", set={"segment.bytes": "-1"})]))
    assert [r.error_code for r in twice.results] == [ErrorCode.INVALID_REQUEST] * 2
    cluster = client.call("DescribeCluster", pb.DescribeClusterRequest())
    topic = next(t for t in cluster.topics if t.name == "orders")
    assert dict(topic.configs) == {"retention.ms": "1000"}

    shrink = client.call("CreatePartitions", pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="orders", count=1)]))
    assert shrink.results[0].error_code == ErrorCode.INVALID_PARTITIONS
    grow = client.call("CreatePartitions", pb.CreatePartitionsRequest(
        topics=[pb.CreatePartitionsTopic(name="orders", count=5)]))
    assert grow.results[0].error_code == ErrorCode.NONE, grow
    cluster = client.call("DescribeCluster", pb.DescribeClusterRequest())
    parts = [p for p in cluster.partitions if p.topic == "orders"]
    assert sorted(p.partition for p in parts) == [0, 1, 2, 3, 4]
    assert all(len(p.replicas) == 2 and p.leader == p.replicas[0] for p in parts), parts

    deleted = client.call("DeleteTopics", pb.DeleteTopicsRequest(names=["orders", "never"]))
    assert [r.error_code for r in deleted.results] == [ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]


def test_alter_partition_compare_and_set(client: ControllerClient, epochs: dict[int, int]) -> None:
    heartbeat_all(client, epochs)
    assert create_topic(client, "isr", 1, 3).error_code == ErrorCode.NONE
    cluster = client.call("DescribeCluster", pb.DescribeClusterRequest())
    p = next(p for p in cluster.partitions if p.topic == "isr")
    leader = p.leader
    shrunk = [r for r in p.isr if r != p.replicas[-1]]
    req = pb.AlterPartitionRequest(broker_id=leader, broker_epoch=epochs[leader], items=[pb.AlterPartitionItem(
        topic="isr", partition=0, leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch, new_isr=shrunk)])
    ok = client.call("AlterPartition", req)
    assert ok.results[0].error_code == ErrorCode.NONE, ok
    assert list(ok.results[0].partition_state.isr) == shrunk
    assert ok.results[0].partition_state.partition_epoch == p.partition_epoch + 1
    stale = client.call("AlterPartition", req)  # same base epoch again
    assert stale.results[0].error_code == ErrorCode.INVALID_UPDATE_VERSION, stale
    with pytest.raises(errors.BrookError) as info:
        client.call("AlterPartition", pb.AlterPartitionRequest(broker_id=leader, broker_epoch=999999))
    assert info.value.code == ErrorCode.STALE_BROKER_EPOCH


def test_a_leader_shrinking_below_min_isr_hands_leadership_to_a_live_in_sync_replica(
        client: ControllerClient, epochs: dict[int, int]) -> None:
    """A leader cut from the other brokers (still heartbeating) drops its followers, often one check apart
    ([1, 2, 3] -> [1, 3] -> [1]): the shrink below min.insync.replicas moves leadership to the live follower it
    drops instead, the ISR kept. Not again within two sessions: the next shrink of the partition below
    min.insync.replicas is taken as proposed (a new leader that cannot keep its followers either)."""
    heartbeat_all(client, epochs)
    assert create_topic(client, "cut-leader", 1, 3, configs={"min.insync.replicas": "2"}).error_code == 0

    def alter(broker: int, isr: list[int]) -> pb.PartitionRecord:
        cluster = client.call("DescribeCluster", pb.DescribeClusterRequest())
        p = next(p for p in cluster.partitions if p.topic == "cut-leader")
        assert p.leader == broker, p
        r = client.call("AlterPartition", pb.AlterPartitionRequest(
            broker_id=broker, broker_epoch=epochs[broker], items=[pb.AlterPartitionItem(
                topic="cut-leader", partition=0, leader_epoch=p.leader_epoch, partition_epoch=p.partition_epoch,
                new_isr=isr)]))
        assert r.results[0].error_code == ErrorCode.NONE, r
        return r.results[0].partition_state

    p = next(p for p in client.call("DescribeCluster", pb.DescribeClusterRequest()).partitions
             if p.topic == "cut-leader")
    first, last = p.leader, [r for r in p.replicas if r != p.leader][-1]
    shrunk = alter(first, [first, last])  # down to min.insync.replicas: as proposed
    assert (shrunk.leader, list(shrunk.isr)) == (first, [first, last]), shrunk
    moved = alter(first, [first])
    assert (moved.leader, list(moved.isr), moved.leader_epoch) == (last, [first, last], p.leader_epoch + 1), moved
    heartbeat_all(client, epochs)
    again = alter(last, [last])
    assert (again.leader, list(again.isr)) == (last, [last]), again


def test_watch_sends_snapshot_then_deltas(client: ControllerClient, epochs: dict[int, int]) -> None:
    stream = client.watch(0, broker_id=1)
    first = next(stream)
    assert first.is_snapshot and first.version > 0
    assert {b.node_id for b in first.brokers} >= {1, 2, 3}
    assert create_topic(client, "watched", 3, 2).error_code == ErrorCode.NONE
    update = next(stream)
    assert not update.is_snapshot and update.version > first.version
    assert [t.name for t in update.topics] == ["watched"]
    assert sorted(p.partition for p in update.partitions) == [0, 1, 2]
    client.call("DeleteTopics", pb.DeleteTopicsRequest(names=["watched"]))
    gone = next(stream)
    assert list(gone.deleted_topic_ids) == [update.topics[0].topic_id]
    # Resuming from a version gets just the changes after it.
    with ControllerClient([client.active_controller]) as other:  # type: ignore[list-item]
        resumed = next(other.watch(update.version))
        assert not resumed.is_snapshot and list(resumed.deleted_topic_ids) == [update.topics[0].topic_id]


def test_missed_heartbeats_fence_and_a_caught_up_broker_is_unfenced(client: ControllerClient,
                                                                     epochs: dict[int, int]) -> None:
    heartbeat_all(client, epochs)
    assert create_topic(client, "lease", 1, 3).error_code == ErrorCode.NONE
    stop = threading.Event()

    def keep_alive() -> None:  # brokers 1 and 2 keep heartbeating; 3 goes silent
        while not stop.wait(0.2):
            heartbeat_all(client, {b: epochs[b] for b in (1, 2)})

    t = threading.Thread(target=keep_alive, daemon=True)
    t.start()
    try:
        def fenced_3() -> bool:
            c = client.call("DescribeCluster", pb.DescribeClusterRequest())
            return next(b for b in c.brokers if b.node_id == 3).fenced
        wait_for(fenced_3, 15, "broker 3 fenced after its session expired")
        c = client.call("DescribeCluster", pb.DescribeClusterRequest())
        p = next(p for p in c.partitions if p.topic == "lease")
        assert 3 not in p.isr and p.leader != 3, p
        # Broker 3 heartbeats again with a caught-up metadata version: unfenced.
        h = client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(
            node_id=3, broker_epoch=epochs[3], current_metadata_version=c.metadata_version))
        assert not h.is_fenced, h
    finally:
        stop.set()
        t.join()


def test_controlled_shutdown_then_reregistration(client: ControllerClient, epochs: dict[int, int]) -> None:
    heartbeat_all(client, epochs)
    assert create_topic(client, "cs", 6, 2).error_code == ErrorCode.NONE
    r = client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(node_id=2, broker_epoch=epochs[2],
                                                                 want_shutdown=True))
    assert r.should_shutdown, r
    c = client.call("DescribeCluster", pb.DescribeClusterRequest())
    assert all(p.leader != 2 for p in c.partitions), [(p.topic, p.partition, p.leader) for p in c.partitions]
    # It comes back as a new incarnation: new epoch, fenced until caught up.
    rr = client.call("RegisterBroker", pb.RegisterBrokerRequest(
        node_id=2, incarnation_id="incarnation-2b", cluster_id=CLUSTER,
        endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19002)]))
    assert rr.broker_epoch > epochs[2]
    stale = client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(node_id=2, broker_epoch=rr.broker_epoch,
                                                                     current_metadata_version=0))
    assert stale.is_fenced  # not caught up yet
    h = client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(node_id=2, broker_epoch=rr.broker_epoch,
                                                                 current_metadata_version=rr.broker_epoch))
    assert not h.is_fenced
    epochs[2] = rr.broker_epoch
    with pytest.raises(errors.InvalidRequestError):
        client.call("RegisterBroker", pb.RegisterBrokerRequest(node_id=7, incarnation_id="x", cluster_id="other",
                                                               endpoints=[common_pb2.Endpoint(port=1)]))


def test_a_controlled_shutdown_with_nothing_left_to_lead_fences_the_broker_at_once(
        client: ControllerClient, epochs: dict[int, int]) -> None:
    """The broker stops as soon as ControlledShutdown answers no leadership left; it was fenced only when its session
    ran out (6 s): listed unfenced meanwhile, and `brook cluster unregister` refused it as running (audit)."""
    heartbeat_all(client, epochs)
    r = client.call("ControlledShutdown", pb.ControlledShutdownRequest(node_id=3, broker_epoch=epochs[3]))
    assert r.remaining_leaderships == 0, r
    assert _registered(client, 3).fenced, "a broker that finished its controlled shutdown is still unfenced"
    rr = client.call("RegisterBroker", pb.RegisterBrokerRequest(  # back, as after a restart
        node_id=3, incarnation_id="incarnation-3b", cluster_id=CLUSTER,
        endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19003)]))
    h = client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(node_id=3, broker_epoch=rr.broker_epoch,
                                                                 current_metadata_version=1 << 40))
    assert not h.is_fenced
    epochs[3] = rr.broker_epoch


def _registered(client: ControllerClient, node_id: int) -> pb.BrokerRecord:
    return next(b for b in client.call("DescribeCluster", pb.DescribeClusterRequest()).brokers if b.node_id == node_id)


def test_second_process_with_a_live_node_id_is_refused(client: ControllerClient, epochs: dict[int, int]) -> None:
    """Kafka's DUPLICATE_BROKER_REGISTRATION: a new incarnation may not take the registration of an
    unfenced broker that is still heartbeating, unless it names that incarnation as the one it replaces."""
    heartbeat_all(client, epochs)
    before = _registered(client, 3)
    assert not before.fenced
    endpoints = [common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19103)]
    for previous in ("", "some-other-incarnation"):
        with pytest.raises(errors.BrookError) as refused:
            client.call("RegisterBroker", pb.RegisterBrokerRequest(
                node_id=3, incarnation_id="intruder", cluster_id=CLUSTER, endpoints=endpoints,
                previous_incarnation_id=previous))
        assert refused.value.code == ErrorCode.DUPLICATE_BROKER_REGISTRATION, refused.value
        assert "node.id 3" in refused.value.message
    after = _registered(client, 3)  # nothing changed: same incarnation, epoch, endpoints
    assert (after.incarnation_id, after.broker_epoch, list(after.endpoints)) == \
        (before.incarnation_id, before.broker_epoch, list(before.endpoints))
    # The registered process registering again (a retried request) is still idempotent.
    again = client.call("RegisterBroker", pb.RegisterBrokerRequest(
        node_id=3, incarnation_id=before.incarnation_id, cluster_id=CLUSTER, endpoints=list(before.endpoints)))
    assert again.broker_epoch == before.broker_epoch

    # Once its session has run out (no heartbeats from broker 3 now), the controller fences it and a
    # new process may register.
    def registered_anew() -> int | None:
        heartbeat_all(client, {b: e for b, e in epochs.items() if b != 3})
        try:
            return client.call("RegisterBroker", pb.RegisterBrokerRequest(
                node_id=3, incarnation_id="successor", cluster_id=CLUSTER, endpoints=endpoints)).broker_epoch
        except errors.BrookError as e:
            assert e.code == ErrorCode.DUPLICATE_BROKER_REGISTRATION, e
            return None
    epochs[3] = wait_for(registered_anew, 20, "broker 3 registered by a new process after its session ended")
    assert _registered(client, 3).incarnation_id == "successor"
    heartbeat_all(client, epochs)


def test_producer_ids_and_describe_quorum(client: ControllerClient, epochs: dict[int, int],
                                          quorum: list[ControllerNode]) -> None:
    heartbeat_all(client, epochs)
    a = client.call("AllocateProducerIds", pb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=epochs[1]))
    b = client.call("AllocateProducerIds", pb.AllocateProducerIdsRequest(broker_id=3, broker_epoch=epochs[3]))
    assert b.producer_id_start >= a.producer_id_start + a.producer_id_len
    leader = active(quorum)

    def quorum_caught_up() -> pb.DescribeQuorumResponse | None:
        q = client.call("DescribeQuorum", pb.DescribeQuorumRequest())
        return q if all(v.lag == 0 for v in q.voters) else None

    q = wait_for(quorum_caught_up, 10, "every voter caught up")
    assert q.leader_id == leader.settings.node_id and q.term >= 1 and q.commit_index > 0
    assert sorted(v.node_id for v in q.voters) == [1, 2, 3]
    assert [v.is_leader for v in q.voters].count(True) == 1
    assert all(v.connected and v.log_end_index == q.commit_index for v in q.voters), q
    stats = leader.stats()
    assert stats.is_active and stats.brokers == 3 and stats.leader_id == leader.settings.node_id
    assert stats.metadata_version == q.metadata_version or stats.metadata_version > 0


def test_preferred_leader_rebalance(client: ControllerClient, epochs: dict[int, int],
                                    quorum: list[ControllerNode]) -> None:
    heartbeat_all(client, epochs)
    assert create_topic(client, "pref", 3, 3).error_code == ErrorCode.NONE
    c = client.call("DescribeCluster", pb.DescribeClusterRequest())
    p = next(p for p in c.partitions if p.topic == "pref" and p.partition == 0)
    preferred = p.replicas[0]
    # The preferred leader shuts down (leadership moves), re-registers and catches up...
    r = client.call("ControlledShutdown", pb.ControlledShutdownRequest(node_id=preferred,
                                                                       broker_epoch=epochs[preferred]))
    assert r.remaining_leaderships == 0
    # Restarted on its own directories, it names the incarnation it replaces: taken at once, though the
    # old one is neither fenced nor out of its session.
    rr = client.call("RegisterBroker", pb.RegisterBrokerRequest(
        node_id=preferred, incarnation_id=f"pref-{time.monotonic()}", cluster_id=CLUSTER,
        endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19000 + preferred)],
        previous_incarnation_id=_registered(client, preferred).incarnation_id))
    epochs[preferred] = rr.broker_epoch
    heartbeat_all(client, epochs)
    c = client.call("DescribeCluster", pb.DescribeClusterRequest())
    p = next(p for p in c.partitions if p.topic == "pref" and p.partition == 0)
    assert p.leader != preferred
    # ... the leader adds it back to the ISR, and the rebalancer moves leadership home.
    client.call("AlterPartition", pb.AlterPartitionRequest(broker_id=p.leader, broker_epoch=epochs[p.leader], items=[
        pb.AlterPartitionItem(topic="pref", partition=0, leader_epoch=p.leader_epoch,
                              partition_epoch=p.partition_epoch, new_isr=list(p.isr) + [preferred])]))
    assert active(quorum).controller.submit_preferred_elections() >= 1

    def back_home() -> bool:
        cl = client.call("DescribeCluster", pb.DescribeClusterRequest())
        return next(x for x in cl.partitions if x.topic == "pref" and x.partition == 0).leader == preferred
    wait_for(back_home, 10, "leadership back on the preferred replica")


def test_restarted_single_node_data_dir_checks_cluster_id(tmp_path: Path) -> None:
    voters = {1: VoterAddress("127.0.0.1", free_port(), free_port())}
    node = ControllerNode(ControllerSettings(1, voters, tmp_path, "one", QUORUM_PASSWORD))
    node.start()
    node.stop()
    with pytest.raises(errors.InvalidConfigError):
        ControllerNode(ControllerSettings(1, voters, tmp_path, "two", QUORUM_PASSWORD)).start()


def test_client_without_any_reachable_controller_times_out_with_a_clear_error() -> None:
    with ControllerClient([("127.0.0.1", free_port()), ("127.0.0.1", free_port())], timeout_s=1.0) as c:
        started = time.monotonic()
        with pytest.raises(errors.RequestTimedOutError) as info:
            c.call("DescribeCluster", pb.DescribeClusterRequest())
        assert time.monotonic() - started < 5
        assert "no active controller" in str(info.value), info.value
    with pytest.raises(errors.InvalidRequestError):
        ControllerClient([])


def test_describe_quorum_answers_from_any_voter_saying_who_answered(client: ControllerClient,
                                                                    quorum: list[ControllerNode]) -> None:
    leader = active(quorum)
    leader_id = leader.settings.node_id
    for node in quorum:
        me = node.settings.voters[node.settings.node_id]
        q = client.call_endpoint((me.host, me.grpc_port), "DescribeQuorum", pb.DescribeQuorumRequest(any_voter=True),
                                 timeout_s=5)
        assert q.error_code == ErrorCode.NONE, q
        assert q.responder_id == node.settings.node_id
        assert q.responder_is_active == (node is leader)
        assert not q.responder_lacks_quorum, q  # every voter reaches the others
        assert q.leader_id == leader_id and q.active_controller_id == leader_id and q.controller_epoch >= 1
        assert [v.node_id for v in q.voters if v.is_leader] == [leader_id]
        if node is not leader:
            # Without any_voter a follower still refuses (clients use the call to find the leader).
            plain = client.call_endpoint((me.host, me.grpc_port), "DescribeQuorum", pb.DescribeQuorumRequest(),
                                         timeout_s=5)
            assert plain.error_code == ErrorCode.NOT_CONTROLLER and plain.redirect.leader_id == leader_id
            assert all(v.lag == -1 for v in q.voters), q  # a follower does not know the others' positions
    q = client.describe_quorum(timeout_s=10)
    assert q.responder_is_active and q.responder_id == leader_id


def test_topic_already_exists_carries_the_existing_topic_id(client: ControllerClient,
                                                             epochs: dict[int, int]) -> None:
    """What lets the admin client recognise its own earlier attempt when it retries a CreateTopics."""
    first = create_topic(client, "created-once", 1, 1)
    assert first.error_code == ErrorCode.NONE and first.topic_id
    again = create_topic(client, "created-once", 1, 1)
    assert again.error_code == ErrorCode.TOPIC_ALREADY_EXISTS and again.topic_id == first.topic_id


def test_a_retried_creation_with_the_same_request_id_is_answered_as_done(client: ControllerClient,
                                                                          epochs: dict[int, int]) -> None:
    """An admin client whose CreateTopics committed but whose answer was lost (a failover, a dropped
    connection) sends it again with the same request id: done, with the topic's id, not "already
    exists". Another request's id, or none, still hears that the topic exists."""
    first = create_topic(client, "retried", 2, 2, request_id="req-a")
    assert first.error_code == ErrorCode.NONE and first.topic_id
    again = create_topic(client, "retried", 2, 2, request_id="req-a")
    assert (again.error_code, again.topic_id, again.num_partitions, again.replication_factor) == \
        (ErrorCode.NONE, first.topic_id, 2, 2), again
    for other in ("req-b", ""):
        theirs = create_topic(client, "retried", 2, 2, request_id=other)
        assert theirs.error_code == ErrorCode.TOPIC_ALREADY_EXISTS and theirs.topic_id == first.topic_id, theirs
    long_id = create_topic(client, "long-request-id", 1, 1, request_id="x" * 65)
    assert long_id.error_code == ErrorCode.INVALID_REQUEST and "request_id" in long_id.error_message, long_id
    described = client.call("DescribeCluster", pb.DescribeClusterRequest())
    assert "long-request-id" not in {p.topic for p in described.partitions}
