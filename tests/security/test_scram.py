"""SCRAM users on a real secured cluster: the authorised path works end to end, bad credentials do not."""

from __future__ import annotations

import grpc
import pytest
from opskit_security import sasl
from waiting import wait_for

from admin_cli.main import main as brook_main
from client.admin import Admin
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster
from proto import broker_pb2, errors
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_authorised_user_produces_consumes_and_commits_in_a_group(secure_cluster: LocalCluster, admin: Admin,
                                                                  grant, mechanism: str) -> None:  # noqa: ANN001
    topic, group, user = f"scram-path-{mechanism[-3:]}", f"scram-group-{mechanism[-3:]}", f"alice{mechanism[-3:]}"
    admin.create_topic(topic, 2, 3)
    admin.create_user(user, "alice-pw", mechanisms=[mechanism])
    grant(f"User:{user}", "WRITE", "TOPIC", topic)
    grant(f"User:{user}", "READ", "TOPIC", topic)
    grant(f"User:{user}", "READ", "GROUP", group)
    creds = sasl(user, "alice-pw", mechanism)
    values = [f"v{i}".encode() for i in range(20)]
    with Producer(bootstrap_servers=secure_cluster.bootstrap_servers, **creds) as p:
        for v in values:
            p.send(topic, v)
        p.flush(60)
    seen: list[bytes] = []
    with Consumer(topic, bootstrap_servers=secure_cluster.bootstrap_servers, group_id=group,
                  auto_offset_reset="earliest", enable_auto_commit=False, **creds) as c:
        def got_all() -> bool:
            for records in c.poll(500).values():
                seen.extend(r.value for r in records)
            return len(seen) >= len(values)
        wait_for(got_all, 90, f"{user} to consume {len(values)} records")
        c.commit()
    assert sorted(seen) == sorted(values)
    committed = admin.describe_groups([group])[group].offsets
    assert sum(o.committed_offset for tp, o in committed.items() if tp.topic == topic) == len(values)


def test_wrong_password_and_unknown_user_are_refused(secure_cluster: LocalCluster, admin: Admin) -> None:
    admin.create_user("bob", "bob-pw")
    for user, password in (("bob", "not-bobs"), ("nobody", "whatever")):
        with Admin(secure_cluster.bootstrap_servers, request_timeout_ms=5_000,
                   controller_endpoints=secure_cluster.controller_endpoints, **sasl(user, password)) as a:
            with pytest.raises(errors.BrookError) as caught:
                a.list_topics()
            assert caught.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
            assert not caught.value.retriable
            with pytest.raises(errors.BrookError) as caught:
                a.describe_cluster()  # the controllers refuse it too
            assert caught.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_deleted_user_can_no_longer_authenticate(secure_cluster: LocalCluster, admin: Admin) -> None:
    admin.create_user("carol", "carol-pw")
    assert "carol" in admin.list_users()
    admin.delete_user("carol")
    assert "carol" not in admin.list_users()
    with pytest.raises(errors.BrookError) as caught:
        admin.delete_user("carol")
    assert caught.value.code == ErrorCode.RESOURCE_NOT_FOUND

    def refused_everywhere() -> bool:
        for broker in secure_cluster.broker_ids:
            with Admin(secure_cluster.broker_address(broker), request_timeout_ms=5_000,
                       **sasl("carol", "carol-pw")) as a:
                try:
                    a.cluster.metadata(refresh=True)
                    return False
                except errors.BrookError as exc:
                    if exc.code != ErrorCode.SASL_AUTHENTICATION_FAILED:
                        raise
        return True
    wait_for(refused_everywhere, 30, "every broker to forget carol")


@pytest.mark.parametrize("change", ["deleted", "password changed"])
def test_a_logged_in_producer_is_refused_once_its_user_is_deleted_or_its_password_changed(
        secure_cluster: LocalCluster, admin: Admin, grant, sync, change: str) -> None:  # noqa: ANN001
    """A session lasts while its credential does: no hour-long grace for a deleted user or a leaked password."""
    topic, user = f"scram-revoke-{change[0]}", f"dave{change[0]}"
    admin.create_topic(topic, 1, 3)
    admin.create_user(user, "dave-pw")
    grant(f"User:{user}", "WRITE", "TOPIC", topic)
    with Producer(bootstrap_servers=secure_cluster.bootstrap_servers, request_timeout_ms=10_000,
                  delivery_timeout_ms=15_000, **sasl(user, "dave-pw")) as p:
        p.send(topic, b"before").get(60)  # logged in: its session is live on the leader
        if change == "deleted":
            admin.delete_user(user)
        else:
            admin.create_user(user, "new-dave-pw")
        sync()
        with pytest.raises(errors.BrookError) as caught:
            p.send(topic, b"after").get(60)
        assert caught.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED, caught.value
    tp = TopicPartition(topic, 0)
    assert admin.list_offsets({tp: "latest"})[tp][0] == 1, "a record was written after the credential changed"


def test_brook_user_commands(secure_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BROOK_BOOTSTRAP", secure_cluster.bootstrap_servers)
    monkeypatch.setenv("BROOK_SASL_USERNAME", "admin")
    monkeypatch.setenv("BROOK_SASL_PASSWORD", "admin-secret")
    monkeypatch.setenv("BROOK_USER_PASSWORD", "dave-pw")
    assert brook_main(["user", "create", "dave", "-m", "SCRAM-SHA-512"]) == 0
    capsys.readouterr()
    assert brook_main(["-o", "json", "user", "list"]) == 0
    listed = capsys.readouterr().out
    assert '"dave"' in listed and "SCRAM-SHA-512" in listed and "dave-pw" not in listed
    assert brook_main(["user", "delete", "dave"]) == 0
    assert brook_main(["user", "delete", "dave"]) == 1  # already gone: a clear error
    assert "RESOURCE_NOT_FOUND" in capsys.readouterr().err
    monkeypatch.setenv("BROOK_SASL_PASSWORD", "wrong")
    assert brook_main(["user", "list"]) == 1
    assert "SASL_AUTHENTICATION_FAILED" in capsys.readouterr().err


def test_group_and_topic_acls_are_checked_on_the_group_path(secure_cluster: LocalCluster, admin: Admin,
                                                           grant) -> None:  # noqa: ANN001
    admin.create_topic("scram-grp", 1, 3)
    admin.create_user("gina", "gina-pw")
    grant("User:gina", "READ", "TOPIC", "scram-grp")  # but no READ on any group
    with Consumer("scram-grp", bootstrap_servers=secure_cluster.bootstrap_servers, group_id="gina-group",
                  auto_offset_reset="earliest", **sasl("gina", "gina-pw")) as c:
        with pytest.raises(errors.BrookError) as caught:
            wait_for(lambda: c.poll(500) is None, 60, "the group to be refused")
        assert caught.value.code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    tp = TopicPartition("scram-grp", 0)
    assert admin.list_offsets({tp: "latest"})[tp][0] == 0


def test_sessions_recover_after_a_node_restart(secure_cluster: LocalCluster, admin: Admin, grant) -> None:  # noqa: ANN001
    """A restarted node has forgotten every session: the other nodes and the clients re-authenticate."""
    admin.create_topic("scram-restart", 1, 3)
    admin.create_user("rita", "rita-pw")
    grant("User:rita", "WRITE", "TOPIC", "scram-restart")
    with Producer(bootstrap_servers=secure_cluster.bootstrap_servers, **sasl("rita", "rita-pw")) as p:
        p.send("scram-restart", b"before").get(60)
        victim = admin.describe_topics(["scram-restart"])["scram-restart"].partitions[0].leader
        secure_cluster.restart_node(victim)

        def healthy() -> bool:
            try:
                desc = admin.describe_cluster()
            except errors.BrookError:
                return False
            return len(desc.brokers) == 3 and not desc.fenced_brokers
        wait_for(healthy, 120, f"node {victim} to rejoin the secured cluster")
        p.send("scram-restart", b"after").get(120)
    tp = TopicPartition("scram-restart", 0)
    wait_for(lambda: admin.list_offsets({tp: "latest"})[tp][0] == 2, 60, "both records committed")
    # The restarted node fetches again as a follower: it authenticated to the new leader.
    wait_for(lambda: len(admin.describe_topics(["scram-restart"])["scram-restart"].partitions[0].isr) == 3, 120,
             "the restarted node back in the ISR")
    # The admin's own channel to the restarted node still carries the old token: the node
    # answers UNAUTHENTICATED, the client re-authenticates once and the call succeeds.
    stub = admin.cluster.stub_for_address(secure_cluster.broker_address(victim))

    def metadata_code() -> int | None:
        try:
            return stub.Metadata(broker_pb2.MetadataRequest(topics=["scram-restart"]), timeout=30).topics[0].error_code
        except grpc.RpcError as exc:  # the channel may still be in its reconnect back-off
            assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
            return None
    assert wait_for(lambda: metadata_code() is not None, 60, "the restarted broker to answer") is not None
    assert metadata_code() == ErrorCode.NONE
