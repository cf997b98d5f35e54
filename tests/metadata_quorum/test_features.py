"""brook.metadata.version (metadata_quorum/features.py): a change an older release would refuse to apply is written
only once the level allowing it is finalized, and the level is finalized only when every voter and registered
broker runs a release that supports it.

The state-machine rules first, then three real ControllerNodes (one process, real sockets): a broker of an older
release (one that reports no level) and a stopped voter each block the upgrade, by name; once they are upgraded
and back, the level is finalized on every voter, survives a voter's restart, reaches the brokers' watch stream,
and an older broker can no longer register."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from quorum_helpers import free_port, in_process_service
from waiting import wait_for

from broker.authorizer import ALLOW_ALL
from metadata_quorum import commands as c
from metadata_quorum import features
from metadata_quorum import security as sec
from metadata_quorum.client import ControllerClient, SecurityControllerClient
from metadata_quorum.node import ControllerNode, ControllerSettings, VoterAddress
from metadata_quorum.state import MetadataInvariantError, MetadataState
from proto import common_pb2, errors, security_pb2
from proto import controller_pb2 as pb
from proto.errors import ErrorCode

TXN_ACL = ["TRANSACTIONAL_ID", "orders-", "PREFIXED", "User:etl", "*", "WRITE", "ALLOW"]
TOKEN_ACL = ["USER", "User:etl", "LITERAL", "User:ops", "*", "CREATE_TOKENS", "ALLOW"]


# ---- the state machine ----
def test_a_binding_older_releases_refuse_waits_for_level_2_and_the_level_is_kept_in_the_snapshot() -> None:
    s = MetadataState()
    assert s.metadata_level == 1
    r = s.apply(c.CreateAcls([TXN_ACL]))
    assert r.error_code == ErrorCode.UNSUPPORTED_VERSION and "brook features upgrade --level 2" in r.error_message
    r = s.apply(c.CreateAcls([TOKEN_ACL, ["TOPIC", "t", "LITERAL", "User:etl", "*", "READ", "ALLOW"]]))
    assert r.error_code == ErrorCode.UNSUPPORTED_VERSION  # the whole command, the topic binding with it
    assert s.acls == frozenset() and s.version == 0
    # A release without features writes and reads no "features" section: at level 1 the snapshot is the same.
    assert "features" not in s.to_snapshot()

    assert s.apply(c.UpdateFeature(features.METADATA_VERSION, 2)).ok
    assert s.metadata_level == 2 and s.changes_since(0).metadata_level == 2
    assert s.apply(c.CreateAcls([TXN_ACL, TOKEN_ACL])).ok
    assert {b.resource_type for b in s.acls} == {"TRANSACTIONAL_ID", "USER"}

    restored = MetadataState.from_snapshot(s.to_snapshot())
    assert restored == s and restored.metadata_level == 2 and restored.full_delta().metadata_level == 2


@pytest.mark.parametrize(("name", "level", "code"), [
    (features.METADATA_VERSION, 1, ErrorCode.INVALID_UPDATE_VERSION),  # lowered
    (features.METADATA_VERSION, 0, ErrorCode.INVALID_UPDATE_VERSION),
    ("metadata.version", 2, ErrorCode.INVALID_REQUEST),  # Kafka's feature, not Brook's
])
def test_a_level_is_never_lowered_nor_set_past_what_the_release_supports(name: str, level: int, code: int) -> None:
    s = MetadataState()
    assert s.apply(c.UpdateFeature(features.METADATA_VERSION, 2)).ok
    before = s.to_snapshot()
    r = s.apply(c.UpdateFeature(name, level))
    assert r.error_code == code, r
    assert s.to_snapshot() == before


def test_metadata_past_the_releases_level_stops_the_node_instead_of_being_served() -> None:
    s = MetadataState()
    assert s.apply(c.UpdateFeature(features.METADATA_VERSION, 2)).ok
    # In the log (a voter rolled back after a later release finalized its level) as in a snapshot.
    with pytest.raises(MetadataInvariantError, match="this release supports up to"):
        s.apply(c.UpdateFeature(features.METADATA_VERSION, features.SUPPORTED_MAX + 1))
    snapshot = s.to_snapshot()
    snapshot["features"] = {features.METADATA_VERSION: features.SUPPORTED_MAX + 1}
    with pytest.raises(MetadataInvariantError, match="this release supports up to"):
        MetadataState.from_snapshot(snapshot)


# ---- three real voters ----
CLUSTER = "features-test"


def _settings(i: int, voters: dict[int, VoterAddress], base: object, password: str) -> ControllerSettings:
    return ControllerSettings(i, voters, base / f"c{i}", CLUSTER, password,  # type: ignore[operator]
                              broker_session_timeout_ms=60_000, broker_heartbeat_interval_ms=300)


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, ControllerNode]]:
    base = tmp_path_factory.mktemp("features")
    password = secrets.token_urlsafe(32)
    voters = {i: VoterAddress("127.0.0.1", free_port(), free_port()) for i in (1, 2, 3)}
    nodes = {i: ControllerNode(_settings(i, voters, base, password)) for i in (1, 2, 3)}
    try:
        for n in nodes.values():
            n.start()
        wait_for(lambda: any(n.is_active() for n in nodes.values()), 30, "an active controller")
        yield nodes
    finally:
        for n in nodes.values():
            n.stop()


def _endpoints(nodes: dict[int, ControllerNode]) -> list[tuple[str, int]]:
    return [(n.settings.voters[i].host, n.settings.voters[i].grpc_port) for i, n in nodes.items()]


def _register(client: ControllerClient, broker: int, supported: int, previous: str = "") -> pb.RegisterBrokerResponse:
    r = client.call("RegisterBroker", pb.RegisterBrokerRequest(
        node_id=broker, incarnation_id=f"inc-{broker}-{supported}", previous_incarnation_id=previous, cluster_id=CLUSTER,
        endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19000 + broker)],
        supported_metadata_level=supported))
    client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(
        node_id=broker, broker_epoch=r.broker_epoch, current_metadata_version=1 << 40,
        supported_metadata_level=supported))
    return r


def _create_acl(nodes: dict[int, ControllerNode], binding: list[str]) -> None:
    acl = security_pb2.AclBinding(**dict(zip(("resource_type", "resource_name", "pattern_type", "principal", "host",
                                              "operation", "permission"), binding, strict=True)))
    with SecurityControllerClient(_endpoints(nodes), timeout_s=15) as s:
        s.call("CreateAcls", security_pb2.CreateAclsRequest(acls=[acl]))


def test_the_level_is_raised_only_when_every_voter_and_broker_supports_it(
        quorum: dict[int, ControllerNode], caplog: pytest.LogCaptureFixture) -> None:
    with ControllerClient(_endpoints(quorum), timeout_s=15) as client:
        _register(client, 1, features.SUPPORTED_MAX)
        _register(client, 2, 0)  # an older release: it reports no level
        described = client.call("DescribeFeatures", pb.DescribeFeaturesRequest())
        assert (described.name, described.finalized_level) == (features.METADATA_VERSION, 1)
        top = features.SUPPORTED_MAX
        assert {(n.role, n.node_id): n.supported_max for n in described.nodes} == {
            ("controller", 1): top, ("controller", 2): top, ("controller", 3): top, ("broker", 1): top, ("broker", 2): 1}
        with pytest.raises(errors.BrookError) as refused:
            _create_acl(quorum, TXN_ACL)
        assert refused.value.code == ErrorCode.UNSUPPORTED_VERSION, refused.value

        for validate_only in (True, False):
            with pytest.raises(errors.BrookError) as behind:
                client.call("UpdateFeatures", pb.UpdateFeaturesRequest(
                    name=features.METADATA_VERSION, level=2, validate_only=validate_only))
            assert behind.value.code == ErrorCode.FEATURE_UPDATE_FAILED
            assert "broker 2 (supports up to 1)" in behind.value.message, behind.value.message

        _register(client, 2, features.SUPPORTED_MAX, previous="inc-2-0")  # broker 2 restarted, upgraded
        stopped = next(i for i, n in quorum.items() if not n.is_active())
        quorum[stopped].stop()
        with pytest.raises(errors.BrookError) as down:
            client.call("UpdateFeatures", pb.UpdateFeaturesRequest(name=features.METADATA_VERSION, level=2))
        assert down.value.code == ErrorCode.FEATURE_UPDATE_FAILED
        assert f"controller {stopped} (cannot be asked" in down.value.message, down.value.message
        assert all(n.raft.read(lambda s: s.metadata_level) == 1 for i, n in quorum.items() if i != stopped)

        quorum[stopped] = ControllerNode(quorum[stopped].settings)
        quorum[stopped].start()
        ok = client.call("UpdateFeatures", pb.UpdateFeaturesRequest(name=features.METADATA_VERSION, level=2,
                                                                     validate_only=True))
        assert ok.finalized_level == 1  # checked, nothing changed
        ok = client.call("UpdateFeatures", pb.UpdateFeaturesRequest(name=features.METADATA_VERSION, level=2))
        assert ok.finalized_level == 2
        wait_for(lambda: all(n.raft.read(lambda s: s.metadata_level) == 2 for n in quorum.values()), 20,
                 "every voter at level 2")
        _create_acl(quorum, TXN_ACL)
        wait_for(lambda: all(sec.acl_binding(TXN_ACL) in n.raft.read(lambda s: s.acls) for n in quorum.values()), 20,
                 "the TRANSACTIONAL_ID binding on every voter")
        update = next(iter(client.watch(0)))
        assert update.is_snapshot and update.metadata_level == 2

        # A broker of an older release can no longer join; the level cannot be lowered.
        with pytest.raises(errors.BrookError) as old:
            _register(client, 3, 0)
        assert old.value.code == ErrorCode.UNSUPPORTED_VERSION and "never lowered" in old.value.message
        # The controller says so too: the broker's older release may only log it where nobody looks (audit).
        assert "broker 3 refused: its release supports brook.metadata.version up to 1, the cluster is at 2" in \
            caplog.text
        with pytest.raises(errors.BrookError) as lower:
            client.call("UpdateFeatures", pb.UpdateFeaturesRequest(name=features.METADATA_VERSION, level=1))
        assert lower.value.code == ErrorCode.INVALID_UPDATE_VERSION

        # A voter restarted reads the level back from its own journal and snapshot.
        follower = next(i for i, n in quorum.items() if not n.is_active())
        quorum[follower].stop()
        quorum[follower] = ControllerNode(quorum[follower].settings)
        quorum[follower].start()
        wait_for(lambda: quorum[follower].raft.read(lambda s: s.metadata_level) == 2, 30,
                 f"restarted voter {follower} at level 2")


def test_a_voter_below_the_finalized_level_is_kept_out_of_the_quorum_until_it_runs_a_release_that_supports_it(
        quorum: dict[int, ControllerNode]) -> None:
    """A voter whose Raft messages carry no level (a release before feature levels: rolled back after the upgrade)
    is sent nothing and heard by no one: it cannot be elected or apply what it would refuse, and the others carry
    on. Back on a release that stamps its messages, it catches up."""
    with ControllerClient(_endpoints(quorum), timeout_s=15) as client:
        client.call("UpdateFeatures", pb.UpdateFeaturesRequest(name=features.METADATA_VERSION, level=2))
        wait_for(lambda: all(n.raft.read(lambda s: s.metadata_level) == 2 for n in quorum.values()), 20,
                 "every voter at level 2")
        old = next(i for i, n in quorum.items() if not n.is_active())
        transport = quorum[old].raft._syncobj._SyncObj__transport
        transport.stamp = None  # what a release before feature levels sends
        try:
            before = quorum[old].raft.last_applied
            for ms in (1001, 1002, 1003):
                client.call("AlterClusterConfigs", pb.AlterClusterConfigsRequest(set={"log.retention.ms": str(ms)}))
            others = [n for i, n in quorum.items() if i != old]
            wait_for(lambda: all(n.raft.last_applied > before + 2 for n in others), 20, "the others to commit")
            assert quorum[old].raft.last_applied <= before + 1, "the fenced voter went on applying the log"
            assert quorum[old].raft.read(lambda s: s.cluster_configs.get("log.retention.ms")) != "1003"
            assert not quorum[old].is_active()
        finally:
            transport.stamp = features.SUPPORTED_MAX  # restarted on a release that supports the level
        wait_for(lambda: quorum[old].raft.read(lambda s: s.cluster_configs.get("log.retention.ms")) == "1003", 30,
                 f"voter {old} to catch up once its messages carry the level again")


def test_voters_are_asked_once_a_round_in_parallel_however_many_callers() -> None:
    """DescribeFeatures floods share one round of questions to the voters (an audit's 200 callers, each asking a
    stopped voter for 5 s in turn, held the controller's workers until every broker was fenced)."""
    import threading
    import time

    from metadata_quorum.node import VoterLevels

    asked: list[int] = []
    lock = threading.Lock()

    def probe(node_id: int) -> tuple[int, str]:
        with lock:
            asked.append(node_id)
        if node_id == 3:
            time.sleep(0.5)  # a stopped voter: its question times out
            return 0, "cannot be asked: DEADLINE_EXCEEDED"
        return 2, ""

    levels = VoterLevels(probe, [1, 2, 3])
    answers: list[dict[int, tuple[int, str]]] = []
    callers = [threading.Thread(target=lambda: answers.append(levels.get(10.0))) for _ in range(50)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(10)
    assert len(answers) == 50 and all(a == {1: (2, ""), 2: (2, ""), 3: (0, "cannot be asked: DEADLINE_EXCEEDED")}
                                      for a in answers)
    assert sorted(asked) == [1, 2, 3], f"the voters were asked {len(asked)} times"
    levels.get(10.0)
    assert len(asked) == 3  # recent enough: not asked again
    levels.get(0.0)
    assert len(asked) == 6  # UpdateFeatures asks afresh
    # A caller that can take an old answer gets it at once, and a round starts behind it (a flood of them does not
    # wait for each new round: they delayed the brokers' heartbeats 2 s every 10 s in an audit's flood).
    assert levels.get(0.0, stale_ok=True)[3] == (0, "cannot be asked: DEADLINE_EXCEEDED")
    wait_for(lambda: len(asked) == 9, 10, "the round started in the background")


def test_a_broker_whose_session_ran_out_blocks_the_upgrade(tmp_path: Path) -> None:
    """A stopped broker may come back on another release: what it reported before counts only while its session
    is live (an audit stopped a broker, switched it to the older release and finalized level 2 past it)."""
    now = [1000.0]
    with in_process_service(tmp_path, CLUSTER, ALLOW_ALL, {},
                            clock=lambda: now[0]) as service:
        ctl = service._controller
        for b in (1, 2):  # both now on this release
            epoch = ctl.raft.read(lambda s, b=b: s.brokers[b].broker_epoch)
            ctl.heartbeat(pb.BrokerHeartbeatRequest(node_id=b, broker_epoch=epoch, current_metadata_version=1 << 40,
                                                    supported_metadata_level=features.SUPPORTED_MAX), 30)
        check = pb.UpdateFeaturesRequest(name=features.METADATA_VERSION, level=2, validate_only=True)
        assert ctl.update_features(check, 30).finalized_level == 1  # every node supports it
        now[0] += ctl.config.broker_session_timeout_ms / 1000 + 1  # broker 2 stops; broker 1 goes on
        epoch = ctl.raft.read(lambda s: s.brokers[1].broker_epoch)
        ctl.heartbeat(pb.BrokerHeartbeatRequest(node_id=1, broker_epoch=epoch, current_metadata_version=1 << 40,
                                                supported_metadata_level=features.SUPPORTED_MAX), 30)
        with pytest.raises(errors.BrookError) as refused:
            ctl.update_features(check, 30)
        assert refused.value.code == ErrorCode.FEATURE_UPDATE_FAILED
        assert "broker 2 (its session is not live" in refused.value.message and "broker 1" not in refused.value.message


def test_a_new_cluster_starts_at_initial_metadata_version_and_an_existing_one_is_never_raised(tmp_path: Path) -> None:
    """As Kafka formats a new cluster at its release's metadata.version: the first controller ever active finalizes
    initial.metadata.version (a node's default: the release's highest level) once every voter supports it. A
    cluster that already had a controller keeps its level whatever its nodes' initial.metadata.version says: after
    a rolling upgrade only the operator raises it (a raised level cannot be rolled back)."""
    import dataclasses

    password = secrets.token_urlsafe(32)
    initial = {"initial.metadata.version": str(features.SUPPORTED_MAX)}

    def run(base: Path, defaults: dict[str, str], check: Callable[[dict[int, ControllerNode]], None]) -> None:
        voters = {i: VoterAddress("127.0.0.1", free_port(), free_port()) for i in (1, 2, 3)}
        nodes = {i: ControllerNode(dataclasses.replace(_settings(i, voters, base, password), defaults=defaults))
                 for i in (1, 2, 3)}
        try:
            for n in nodes.values():
                n.start()
            wait_for(lambda: any(n.is_active() for n in nodes.values()), 30, "an active controller")
            check(nodes)
        finally:
            for n in nodes.values():
                n.stop()

    def levels(nodes: dict[int, ControllerNode]) -> set[int]:
        return {n.raft.read(lambda s: s.metadata_level) for n in nodes.values()}

    def at_highest(nodes: dict[int, ControllerNode]) -> None:
        wait_for(lambda: levels(nodes) == {features.SUPPORTED_MAX}, 30, "every voter at the highest level")

    run(tmp_path / "new", initial, at_highest)

    first_epoch: list[int] = []

    def activated_at_1(nodes: dict[int, ControllerNode]) -> None:
        wait_for(lambda: {n.raft.read(lambda s: s.controller_epoch) > 0 for n in nodes.values()} == {True}, 30,
                 "every voter applied the activation")
        assert levels(nodes) == {1}
        first_epoch.append(max(n.raft.read(lambda s: s.controller_epoch) for n in nodes.values()))

    run(tmp_path / "old", {}, activated_at_1)  # made by a release, or a config, that keeps level 1

    def stays_at_1(nodes: dict[int, ControllerNode]) -> None:
        wait_for(lambda: all(n.raft.read(lambda s: s.controller_epoch) > first_epoch[0] for n in nodes.values()), 30,
                 "the restarted cluster's controller activated on every voter")
        deadline = time.monotonic() + 3  # the new cluster above took well under a second
        while time.monotonic() < deadline:
            assert levels(nodes) == {1}, "an existing cluster's level was raised without its operator"
            time.sleep(0.1)

    run(tmp_path / "old", initial, stays_at_1)


def test_a_new_cluster_with_a_node_of_an_older_release_stays_for_its_operator_to_raise(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """While a voter cannot be asked yet the first controller tries again; a node that answers with a lower level
    (an older release) ends it. Before, it went on trying for two minutes and raised the cluster as soon as that node
    was rolled forward: without its operator, and the node could then not be rolled back (audit)."""
    import dataclasses
    import logging

    password = secrets.token_urlsafe(32)
    voters = {i: VoterAddress("127.0.0.1", free_port(), free_port()) for i in (1, 2, 3)}
    nodes = {i: ControllerNode(dataclasses.replace(_settings(i, voters, tmp_path, password), defaults={
        "initial.metadata.version": str(features.SUPPORTED_MAX)})) for i in (1, 2, 3)}
    caplog.set_level(logging.WARNING, logger="metadata_quorum.controller")
    try:
        for i in (1, 2):  # voter 3 is still starting: the first controller waits for it
            nodes[i].start()
        wait_for(lambda: any(nodes[i].is_active() for i in (1, 2)), 30, "an active controller")
        with ControllerClient([(voters[i].host, voters[i].grpc_port) for i in (1, 2)], timeout_s=15) as client:
            old = _register(client, 7, 1)  # a broker of an older release joins the new cluster
            wait_for(lambda: "nodes of an older release: broker 7 (supports up to 1)" in caplog.text, 30,
                     "the first controller to give up, naming the older broker")
            nodes[3].start()
            assert old.broker_epoch > 0
            _register(client, 7, features.SUPPORTED_MAX, previous="inc-7-1")  # the broker is rolled forward
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                assert {n.raft.read(lambda s: s.metadata_level) for n in nodes.values()} == {1}, \
                    "the cluster was raised without its operator once the older broker was rolled forward"
                time.sleep(0.2)
    finally:
        for n in nodes.values():
            n.stop()


def test_a_broker_of_an_older_release_cannot_register_between_the_level_check_and_its_commit(tmp_path: Path) -> None:
    """UpdateFeatures checks the registered brokers' levels, then proposes the level; a registration checks the
    level, then proposes itself. A broker of an older release registering between the two was let into a cluster
    finalized past it (audit; likelier since a new cluster finalizes its level as its brokers register). The two
    are serialized now: the registration waits, then is refused."""
    import threading

    with in_process_service(tmp_path, "toctou", ALLOW_ALL, {}) as service:
        ctl = service._controller
        for b in (1, 2):
            epoch = ctl.raft.read(lambda s, b=b: s.brokers[b].broker_epoch)
            ctl.heartbeat(pb.BrokerHeartbeatRequest(node_id=b, broker_epoch=epoch, current_metadata_version=1 << 40,
                                                    supported_metadata_level=features.SUPPORTED_MAX), 30)
        checked, go = threading.Event(), threading.Event()
        propose = ctl._propose

        def held_propose(cmd: object, timeout_s: float) -> object:
            if isinstance(cmd, c.UpdateFeature):
                checked.set()  # every node checked; the proposal stands for one slow to commit
                go.wait(10)
            return propose(cmd, timeout_s)

        ctl._propose = held_propose  # type: ignore[method-assign]
        outcome: dict[str, object] = {}

        def run(key: str, fn: Callable[[], object]) -> threading.Thread:
            def target() -> None:
                try:
                    outcome[key] = fn()
                except Exception as exc:
                    outcome[key] = exc
            thread = threading.Thread(target=target)
            thread.start()
            return thread

        finalizing = run("level", lambda: ctl.update_features(pb.UpdateFeaturesRequest(
            name=features.METADATA_VERSION, level=features.SUPPORTED_MAX), 30))
        assert checked.wait(10)
        registering = run("register", lambda: ctl.register_broker(pb.RegisterBrokerRequest(
            node_id=3, incarnation_id="old-3", cluster_id="toctou", supported_metadata_level=features.SUPPORTED_MAX - 1,
            endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19003)]), 30))
        registering.join(1.0)
        go.set()
        finalizing.join(30)
        registering.join(30)
        assert ctl.raft.read(lambda s: s.metadata_level) == features.SUPPORTED_MAX, outcome
        assert isinstance(outcome["register"], errors.UnsupportedVersionError), outcome
        assert 3 not in ctl.raft.read(lambda s: set(s.brokers)), "an older broker was let into the raised cluster"
