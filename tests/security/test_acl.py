"""ACLs on a real secured cluster: each attack of issue 10 now fails to do harm."""

from __future__ import annotations

import grpc
import pytest
from opskit_security import (
    ADMIN_PASSWORD,
    broker_metadata_error,
    metric_total,
    produce_raw,
    sasl,
    scrape_anonymously,
)
from waiting import wait_for

from client.admin import Admin
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster
from proto import errors
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow


def anonymous_admin(cluster: LocalCluster) -> Admin:
    return Admin(cluster.bootstrap_servers, request_timeout_ms=10_000, controller_endpoints=cluster.controller_endpoints)


def test_unauthenticated_client_cannot_delete_a_topic_or_shrink_its_retention(secure_cluster: LocalCluster,
                                                                              admin: Admin) -> None:
    admin.create_topic("acl-victim", 1, 3)
    with anonymous_admin(secure_cluster) as anon:
        result = anon.delete_topics(["acl-victim"], raise_on_error=False)
        assert result["acl-victim"] is not None
        assert result["acl-victim"].code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        with pytest.raises(errors.BrookError) as caught:
            anon.alter_configs("acl-victim", set={"retention.ms": "1"})
        assert caught.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        with pytest.raises(errors.BrookError) as caught:
            anon.create_topic("acl-anon-created", 1, 1)
        assert caught.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
        # Metadata answers without the topics the caller may not describe.
        assert "acl-victim" not in anon.list_topics()
    assert "acl-victim" in admin.list_topics()
    assert "acl-anon-created" not in admin.list_topics()
    assert admin.describe_configs(["acl-victim"])["acl-victim"]["retention.ms"].value != "1"


def test_wrong_principal_produce_is_refused_and_nothing_is_written(secure_cluster: LocalCluster, admin: Admin,
                                                                  grant) -> None:  # noqa: ANN001
    admin.create_topic("acl-orders", 1, 3)
    admin.create_user("writer", "writer-pw")
    admin.create_user("mallory", "mallory-pw")
    grant("User:writer", "WRITE", "TOPIC", "acl-orders")
    tp = TopicPartition("acl-orders", 0)
    with Producer(bootstrap_servers=secure_cluster.bootstrap_servers, **sasl("writer", "writer-pw")) as p:
        p.send("acl-orders", b"legit").get(30)
    end_before = admin.list_offsets({tp: "latest"})[tp][0]
    assert end_before == 1
    leader = admin.describe_topics(["acl-orders"])["acl-orders"].partitions[0].leader
    address = secure_cluster.broker_address(leader)
    part = produce_raw(address, ("mallory", "mallory-pw"), "acl-orders", b"evil")
    assert part.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED, part
    anon = produce_raw(address, None, "acl-orders", b"evil")
    assert anon.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED, anon
    # The client library raises it as a clear, non-retriable error.
    with Producer(bootstrap_servers=secure_cluster.bootstrap_servers, retries=0, delivery_timeout_ms=40_000,
                  **sasl("mallory", "mallory-pw")) as p, pytest.raises(errors.BrookError) as caught:
        p.send("acl-orders", b"evil").get(40)
    assert caught.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED and not caught.value.retriable
    assert admin.list_offsets({tp: "latest"})[tp][0] == end_before
    # Denials are counted on the broker that refused them.
    denied = metric_total(scrape_anonymously(secure_cluster, leader, admin),
                          "brook_authorization_denied_total", role="broker", resource_type="TOPIC", operation="WRITE")
    assert denied >= 2


def test_internal_offsets_topic_cannot_be_deleted_or_uncompacted_even_by_a_super_user(
        secure_cluster: LocalCluster, admin: Admin) -> None:
    # A group lookup makes the coordinator create __consumer_offsets (as in Kafka).
    with Consumer(bootstrap_servers=secure_cluster.bootstrap_servers, group_id="acl-internal",
                  **sasl("admin", ADMIN_PASSWORD)) as c:
        c.subscribe(["acl-victim-internal"])
        wait_for(lambda: c.poll(200) is not None and "__consumer_offsets" in admin.list_topics(include_internal=True),
                 60, "__consumer_offsets to exist")
    result = admin.delete_topics(["__consumer_offsets"], raise_on_error=False)
    assert result["__consumer_offsets"] is not None
    assert result["__consumer_offsets"].code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(errors.BrookError) as caught:
        admin.alter_configs("__consumer_offsets", set={"cleanup.policy": "delete"})
    assert caught.value.code == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    assert "__consumer_offsets" in admin.list_topics(include_internal=True)


def test_acl_change_takes_effect_on_every_broker(secure_cluster: LocalCluster, admin: Admin, grant) -> None:  # noqa: ANN001
    admin.create_topic("acl-spread", 1, 1)
    admin.create_user("viewer", "viewer-pw")
    creds = ("viewer", "viewer-pw")
    addresses = [secure_cluster.broker_address(b) for b in secure_cluster.broker_ids]

    def codes() -> list[int]:
        return [broker_metadata_error(a, creds, "acl-spread") for a in addresses]

    # The new user's credential reaches every broker through the same metadata stream.
    wait_for(lambda: _authenticates(codes), 30, "every broker to know the new user")
    assert set(codes()) == {ErrorCode.TOPIC_AUTHORIZATION_FAILED}
    grant("User:viewer", "DESCRIBE", "TOPIC", "acl-", pattern="PREFIXED")
    wait_for(lambda: set(codes()) == {ErrorCode.NONE}, 30, "every broker to allow DESCRIBE after the grant",
             poll_s=0.1)
    admin.delete_acls([{"resource_type": "TOPIC", "resource_name": "acl-", "pattern_type": "PREFIXED",
                        "principal": "User:viewer"}])
    wait_for(lambda: set(codes()) == {ErrorCode.TOPIC_AUTHORIZATION_FAILED}, 30,
             "every broker to refuse again after the revoke", poll_s=0.1)


def _authenticates(fn) -> bool:  # noqa: ANN001
    try:
        fn()
        return True
    except errors.BrookError as exc:
        if exc.code != ErrorCode.SASL_AUTHENTICATION_FAILED:
            raise
        return False


def test_deny_beats_allow_on_a_live_broker(secure_cluster: LocalCluster, admin: Admin, grant) -> None:  # noqa: ANN001
    admin.create_topic("acl-deny", 1, 1)
    admin.create_topic("acl-open", 1, 1)  # its own: the test needs no other test's topic
    admin.create_user("dana", "dana-pw")
    grant("User:dana", "DESCRIBE", "TOPIC", "*")
    grant("User:dana", "DESCRIBE", "TOPIC", "acl-deny", permission="DENY")
    node = secure_cluster.broker_ids[0]
    address = secure_cluster.broker_address(node)
    seen: list[object] = []

    def described() -> bool:
        try:
            seen.append(broker_metadata_error(address, ("dana", "dana-pw"), "acl-open"))
        except errors.BrookError as exc:
            if exc.code != ErrorCode.SASL_AUTHENTICATION_FAILED:
                raise
            seen.append(exc)
        return seen[-1] == ErrorCode.NONE
    wait_for(described, 30, lambda: f"the user and the wildcard grant to reach broker {node}: it answered "
                                    f"{seen[-3:]} ({len(seen)} tries)\n{secure_cluster.log_tail(node, 40)}")
    assert broker_metadata_error(address, ("dana", "dana-pw"), "acl-deny") == ErrorCode.TOPIC_AUTHORIZATION_FAILED


def test_deleting_a_missing_topic_says_so_only_to_a_caller_that_may_describe_it(
        secure_cluster: LocalCluster, admin: Admin, grant) -> None:  # noqa: ANN001
    """Kafka's controller (ControllerApis.deleteTopics) answers a DeleteTopics of a topic the caller may not
    delete with TOPIC_AUTHORIZATION_FAILED, except when the topic does not exist and the caller may describe
    it: then UNKNOWN_TOPIC_OR_PARTITION, which Metadata would tell it anyway. To a caller that may not
    describe it, a missing topic and a forbidden one look alike."""
    admin.create_topic("acl-del-present", 1, 1)
    admin.create_user("erin", "erin-pw")
    grant("User:erin", "DESCRIBE", "TOPIC", "acl-del-", pattern="PREFIXED")
    with Admin(secure_cluster.bootstrap_servers, request_timeout_ms=10_000,
               controller_endpoints=secure_cluster.controller_endpoints, **sasl("erin", "erin-pw")) as erin:
        def codes() -> dict[str, int]:
            try:
                result = erin.delete_topics(["acl-del-missing", "acl-del-present", "acl-other-missing"],
                                            raise_on_error=False)
            except errors.BrookError as exc:
                if exc.code != ErrorCode.SASL_AUTHENTICATION_FAILED:
                    raise
                return {}  # erin's credentials have not reached that controller yet
            return {name: (exc.code if exc is not None else ErrorCode.NONE) for name, exc in result.items()}
        seen = wait_for(codes, 30, "erin's credentials to reach the controllers")
    assert seen == {"acl-del-missing": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    "acl-del-present": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                    "acl-other-missing": ErrorCode.TOPIC_AUTHORIZATION_FAILED}, seen
    assert "acl-del-present" in admin.list_topics()


def test_host_specific_acls_apply_to_callers_at_that_address_only(secure_cluster: LocalCluster, admin: Admin,
                                                                  grant) -> None:  # noqa: ANN001
    """The brokers see this test's calls come from 127.0.0.1: bindings on another address do not apply to
    them, bindings on 127.0.0.1 do (Kafka's host rule, matched against the connection's address)."""
    admin.create_topic("acl-by-host", 1, 1)
    admin.create_user("hana", "hana-pw")
    address = secure_cluster.broker_address(secure_cluster.broker_ids[0])
    hana = ("hana", "hana-pw")
    grant("User:hana", "DESCRIBE", "TOPIC", "acl-by-host", host="10.9.9.9")
    wait_for(lambda: _authenticates(lambda: broker_metadata_error(address, hana, "acl-by-host")), 30, "the user")
    assert broker_metadata_error(address, hana, "acl-by-host") == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    grant("User:hana", "DESCRIBE", "TOPIC", "acl-by-host", host="127.0.0.1")
    assert broker_metadata_error(address, hana, "acl-by-host") == ErrorCode.NONE
    grant("User:hana", "DESCRIBE", "TOPIC", "acl-by-host", permission="DENY", host="10.9.9.9")
    assert broker_metadata_error(address, hana, "acl-by-host") == ErrorCode.NONE  # a DENY elsewhere
    grant("User:hana", "DESCRIBE", "TOPIC", "acl-by-host", permission="DENY", host="127.0.0.1")
    assert broker_metadata_error(address, hana, "acl-by-host") == ErrorCode.TOPIC_AUTHORIZATION_FAILED
    listed = admin.describe_acls(principal="User:hana", host="127.0.0.1")
    assert sorted(b.permission for b in listed) == ["ALLOW", "DENY"] and {b.host for b in listed} == {"127.0.0.1"}


def test_acl_hosts_are_ip_addresses(admin: Admin) -> None:
    from metadata_quorum.security import acl_binding

    for host in ("db.example", "10.0.0.300", "*.example"):
        with pytest.raises(errors.BrookError) as refused:
            admin.create_acls([acl_binding(["TOPIC", "t", "LITERAL", "User:x", host, "READ", "ALLOW"])])
        assert refused.value.code == ErrorCode.INVALID_REQUEST and "IP address" in refused.value.message
    assert admin.describe_acls(principal="User:x") == []


def test_acl_admin_needs_cluster_alter(secure_cluster: LocalCluster, admin: Admin) -> None:
    admin.create_user("eve", "eve-pw")
    with Admin(secure_cluster.bootstrap_servers, request_timeout_ms=10_000,
               controller_endpoints=secure_cluster.controller_endpoints, **sasl("eve", "eve-pw")) as eve:
        from metadata_quorum.security import acl_binding
        everything = acl_binding(["CLUSTER", "kafka-cluster", "LITERAL", "User:eve", "*", "ALL", "ALLOW"])

        def refused_code() -> int:
            try:
                eve.create_acls([everything])
            except errors.BrookError as exc:
                return exc.code
            return ErrorCode.NONE
        # A follower controller may learn the new user a moment after the active one.
        code = wait_for(lambda: (c := refused_code()) != ErrorCode.SASL_AUTHENTICATION_FAILED and c, 30,
                        "eve to authenticate")
        assert code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        with pytest.raises(errors.BrookError) as caught:
            eve.create_user("eve2", "x")
        assert caught.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def test_watch_metadata_with_its_scram_keys_is_for_brokers_only(secure_cluster: LocalCluster) -> None:
    from proto import controller_pb2, controller_pb2_grpc

    for host, port in secure_cluster.controller_endpoints:
        with grpc.insecure_channel(f"{host}:{port}") as ch:
            stream = controller_pb2_grpc.ControllerServiceStub(ch).WatchMetadata(
                controller_pb2.WatchMetadataRequest(broker_id=-1, since_version=0), timeout=10)
            first = next(iter(stream))
            assert first.error_code in (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.NOT_CONTROLLER)
            assert not first.security.credentials


@pytest.mark.parametrize("who", ["anonymous", "super-user"])
def test_no_client_on_loopback_can_act_as_a_broker(secure_cluster: LocalCluster, who: str) -> None:
    """With an authorizer, loopback trust covers only the nodes' own SCRAM user: neither an anonymous
    local client nor a super user may register a broker (the forged RegisterBroker of issue 10)."""
    from client.sasl import ScramCredentials, scram_channel
    from proto import common_pb2, controller_pb2, controller_pb2_grpc

    forged = controller_pb2.RegisterBrokerRequest(
        node_id=3, incarnation_id="forged", cluster_id=secure_cluster.state.cluster_id,
        endpoints=[common_pb2.Endpoint(name="BROKER", host="10.66.66.66", port=9092)])
    seen = []
    for host, port in secure_cluster.controller_endpoints:
        target = f"{host}:{port}"
        ch = grpc.insecure_channel(target) if who == "anonymous" else \
            scram_channel(target, ScramCredentials("admin", ADMIN_PASSWORD))
        with ch:
            resp = controller_pb2_grpc.ControllerServiceStub(ch).RegisterBroker(forged, timeout=10)
        seen.append(resp.error_code)
        assert resp.error_code in (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.NOT_CONTROLLER), resp
    assert ErrorCode.CLUSTER_AUTHORIZATION_FAILED in seen, seen
    with Admin(secure_cluster.bootstrap_servers, request_timeout_ms=10_000,
               controller_endpoints=secure_cluster.controller_endpoints, **sasl("admin", ADMIN_PASSWORD)) as admin:
        broker = next(b for b in admin.describe_cluster().brokers if b.node_id == 3)
    assert broker.host != "10.66.66.66" and not broker.fenced, broker


def test_brook_acl_commands_with_hosts(secure_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from admin_cli.main import main as brook_main

    monkeypatch.setenv("BROOK_BOOTSTRAP", secure_cluster.bootstrap_servers)
    monkeypatch.setenv("BROOK_SASL_USERNAME", "admin")
    monkeypatch.setenv("BROOK_SASL_PASSWORD", ADMIN_PASSWORD)
    base = ["acl", "create", "--topic", "cli-hosts", "--operation", "READ"]
    assert brook_main([*base, "--allow-principal", "User:ivy", "--allow-host", "10.0.0.1", "--allow-host",
                       "::FFFF:10.0.0.2", "--deny-principal", "User:ivy"]) == 0
    capsys.readouterr()
    assert brook_main(["-o", "json", "acl", "list", "--principal", "User:ivy"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted((r["permission"], r["host"]) for r in rows) == [
        ("ALLOW", "10.0.0.1"), ("ALLOW", "10.0.0.2"), ("DENY", "*")]  # stored canonical; DENY on any host
    assert brook_main(["acl", "delete", "--topic", "cli-hosts", "--principal", "User:ivy", "--host", "10.0.0.2"]) == 0
    capsys.readouterr()
    assert brook_main(["-o", "json", "acl", "list", "--principal", "User:ivy"]) == 0
    assert sorted(r["host"] for r in json.loads(capsys.readouterr().out)) == ["*", "10.0.0.1"]
    assert brook_main([*base, "--allow-principal", "User:ivy", "--allow-host", "db.example"]) == 2
    assert "IP address" in capsys.readouterr().err
    assert brook_main([*base, "--deny-host", "10.0.0.1", "--allow-principal", "User:ivy"]) == 2  # no DENY principal
    assert brook_main(["acl", "delete", "--topic", "cli-hosts", "--principal", "User:ivy"]) == 0
