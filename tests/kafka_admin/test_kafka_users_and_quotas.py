"""Kafka's client-quota and SCRAM-credential APIs (KIP-546, KIP-554) on the Kafka listener of the shared mTLS
cluster with the authorizer on: what they change is what Brook's own admin (``brook quota``, ``brook user``) reads,
what Brook does not keep (client-id and ip quotas, Kafka's request_percentage) is refused and stores nothing, and
each needs Kafka's permission on the cluster. No Python client library sends the quota APIs: the requests are built
from Kafka's own message schemas (kio)."""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kafka_admin_kit import principal_of_its_own
from kafka_raw import kafka_ask
from waiting import wait_for

from client import errors
from client.admin import Admin
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

DESCRIBE_QUOTAS, ALTER_QUOTAS, DESCRIBE_SCRAM, ALTER_SCRAM = 48, 49, 50, 51
INVALID_REQUEST, CLUSTER_AUTHORIZATION_FAILED = 42, 31


def _user(name: str | None) -> list[dict[str, Any]]:
    return [{"entity_type": "user", "entity_name": name}]


def _set(key: str, value: float) -> dict[str, Any]:
    return {"key": key, "value": value, "remove": False}


def _remove(key: str) -> dict[str, Any]:
    return {"key": key, "value": 0.0, "remove": True}


def _alter(cluster: LocalCluster, entries: list[dict[str, Any]], *, validate_only: bool = False, version: int = 1,
           name: str = "admin") -> list[tuple[int, str | None]]:
    out = kafka_ask(cluster, cluster.broker_ids[0], ALTER_QUOTAS, version,
                    {"entries": entries, "validate_only": validate_only}, name=name)
    assert [[(c.entity_type, c.entity_name) for c in e.entity] for e in out.entries] == \
        [[(c["entity_type"], c["entity_name"]) for c in e["entity"]] for e in entries]
    return [(int(e.error_code), e.error_message) for e in out.entries]


def _describe(cluster: LocalCluster, components: list[dict[str, Any]], *, strict: bool = False,
              name: str = "admin") -> tuple[int, Any]:
    out = kafka_ask(cluster, cluster.broker_ids[0], DESCRIBE_QUOTAS, 1, {"components": components, "strict": strict},
                    name=name)
    if out.error_code:
        return int(out.error_code), out.error_message
    return 0, {tuple((c.entity_type, c.entity_name) for c in e.entity): {v.key: v.value for v in e.values}
               for e in out.entries}


def _brook_admin(cluster: LocalCluster) -> Admin:
    return Admin(cluster.bootstrap_servers, controller_endpoints=cluster.controller_endpoints,
                 security=cluster.security, request_timeout_ms=30_000)


def test_client_quotas_set_and_read_through_the_kafka_listener(kcluster: LocalCluster) -> None:
    alice, bob = f"qa-{uuid.uuid4().hex[:8]}", f"qb-{uuid.uuid4().hex[:8]}"
    with _brook_admin(kcluster) as brook:
        try:
            assert _alter(kcluster, [
                {"entity": _user(alice), "ops": [_set("producer_byte_rate", 1024.0), _set("request_rate", 50.0)]},
                {"entity": _user(None), "ops": [_set("controller_mutation_rate", 1e9)]},
            ]) == [(0, None), (0, None)]
            assert _alter(kcluster, [{"entity": _user(bob), "ops": [_set("consumer_byte_rate", 2048.0)]}],
                          version=0) == [(0, None)]
            # What Brook's own admin reads (brook quota describe).
            assert brook.describe_client_quotas(f"User:{alice}") == {
                f"User:{alice}": {"producer_byte_rate": 1024.0, "request_rate": 50.0}}
            assert brook.describe_client_quotas("<default>") == {"<default>": {"controller_mutation_rate": 1e9}}

            code, everyone = _describe(kcluster, [])
            assert code == 0 and everyone[(("user", alice),)] == {"producer_byte_rate": 1024.0, "request_rate": 50.0}
            assert everyone[(("user", bob),)] == {"consumer_byte_rate": 2048.0}
            assert everyone[(("user", None),)] == {"controller_mutation_rate": 1e9}
            assert _describe(kcluster, [{"entity_type": "user", "match_type": 0, "match": alice}]) == \
                (0, {(("user", alice),): {"producer_byte_rate": 1024.0, "request_rate": 50.0}})
            assert _describe(kcluster, [{"entity_type": "user", "match_type": 1, "match": None}], strict=True) == \
                (0, {(("user", None),): {"controller_mutation_rate": 1e9}})
            # SPECIFIED: every entity of the type, the default included (Kafka's; kafka-configs --entity-type users).
            code, named = _describe(kcluster, [{"entity_type": "user", "match_type": 2, "match": None}])
            assert code == 0 and {alice, bob, None} <= {k[0][1] for k in named}, named
            # Brook keeps no client-id quota, so no entity has a client-id component.
            assert _describe(kcluster, [{"entity_type": "client-id", "match_type": 2, "match": None}]) == (0, {})
            assert _describe(kcluster, [], strict=True) == (0, {})
            assert _describe(kcluster, [{"entity_type": "group", "match_type": 2, "match": None}])[0] == 35
            assert _describe(kcluster, [{"entity_type": "user", "match_type": 2, "match": None},
                                        {"entity_type": "ip", "match_type": 2, "match": None}])[0] == INVALID_REQUEST

            # Refused items change nothing; the request's other items are done.
            carl, dora, emil, fred = (f"q{c}-{uuid.uuid4().hex[:8]}" for c in "cdef")
            answers = _alter(kcluster, [
                {"entity": [{"entity_type": "client-id", "entity_name": "app"}], "ops": [_set("producer_byte_rate", 1.0)]},
                {"entity": [*_user(carl), {"entity_type": "client-id", "entity_name": "app"}],
                 "ops": [_set("producer_byte_rate", 1.0)]},
                {"entity": _user(carl), "ops": [_set("request_percentage", 50.0)]},
                {"entity": _user(dora), "ops": [_set("producer_byte_rate", -1.0)]},
                {"entity": _user(emil), "ops": [_set("producer_byte_rate", 1.0), _set("producer_byte_rate", 2.0)]},
                {"entity": _user(emil), "ops": [_set("consumer_byte_rate", 1.0)]},
                {"entity": _user(fred), "ops": [_set("producer_byte_rate", 1.5)]},  # Kafka's byte rates are Longs
                {"entity": _user(bob), "ops": [_remove("consumer_byte_rate")]},
            ])
            assert [code for code, _ in answers] == [INVALID_REQUEST] * 7 + [0], answers
            assert "client-id" in answers[0][1] and "request_rate" in answers[2][1], answers
            assert _alter(kcluster, [{"entity": _user(dora), "ops": [_set("producer_byte_rate", 5.0)]}],
                          validate_only=True) == [(0, None)]
            quotas = brook.describe_client_quotas()
            assert not {f"User:{u}" for u in (carl, dora, emil, fred, bob)} & set(quotas), quotas
        finally:
            brook.alter_client_quotas(f"User:{alice}", remove=["producer_byte_rate", "request_rate"])
            brook.alter_client_quotas("<default>", remove=["controller_mutation_rate"])


def test_the_controller_applies_a_requests_quota_changes_together_and_answers_each(kcluster: LocalCluster) -> None:
    """The controller's side of a Kafka AlterClientQuotas request (the broker forwards its entries in one call): each
    alteration checked, the good ones proposed together and applied, each answered in order."""
    from proto import security_pb2
    a, b = f"qg-{uuid.uuid4().hex[:8]}", f"qh-{uuid.uuid4().hex[:8]}"
    with _brook_admin(kcluster) as brook:
        try:
            out = brook._call("AlterClientQuotas", security_pb2.AlterClientQuotasRequest(alterations=[
                security_pb2.QuotaAlteration(entity=f"User:{a}", set={"request_rate": 7.0}),
                security_pb2.QuotaAlteration(entity="nobody", set={"request_rate": 7.0}),
                security_pb2.QuotaAlteration(entity=f"User:{b}", set={"producer_byte_rate": 0.0}),
                security_pb2.QuotaAlteration(entity=f"User:{b}", set={"consumer_byte_rate": 4096.0}),
                security_pb2.QuotaAlteration(entity=f"User:{a}", remove=["no_such_quota"]),
            ]))
            assert [(r.entity, int(r.error_code)) for r in out.results] == [
                (f"User:{a}", 0), ("nobody", INVALID_REQUEST), (f"User:{b}", INVALID_REQUEST), (f"User:{b}", 0),
                (f"User:{a}", INVALID_REQUEST)], out.results
            assert "no_such_quota" in out.results[4].error_message
            quotas = brook.describe_client_quotas()
            assert quotas[f"User:{a}"] == {"request_rate": 7.0} and quotas[f"User:{b}"] == {"consumer_byte_rate": 4096.0}
            # Alterations and an entity of its own in one request: refused whole, nothing changed.
            with pytest.raises(errors.InvalidRequestError, match="names no entity of its own"):
                brook._call("AlterClientQuotas", security_pb2.AlterClientQuotasRequest(
                    entity=f"User:{a}", set={"request_rate": 1.0},
                    alterations=[security_pb2.QuotaAlteration(entity=f"User:{b}", set={"request_rate": 1.0})]))
            quotas = brook.describe_client_quotas()
            assert quotas[f"User:{a}"] == {"request_rate": 7.0} and quotas[f"User:{b}"] == {"consumer_byte_rate": 4096.0}
        finally:
            brook.alter_client_quotas(f"User:{a}", remove=["request_rate"])
            brook.alter_client_quotas(f"User:{b}", remove=["consumer_byte_rate"])


def _upsertion(user: str, password: bytes) -> dict[str, Any]:
    salt = b"0123456789abcdef"
    return {"name": user, "mechanism": 2, "iterations": 4096, "salt": salt,
            "salted_password": hashlib.pbkdf2_hmac("sha512", password, salt, 4096)}


@contextlib.contextmanager
def _on_the_cluster(cluster: LocalCluster, confluent_admin: Any, prefix: str,
                    operations: dict[str, bool]) -> Iterator[str]:
    """A principal of its own (its certificate's name), allowed (True) or denied (False) each operation on the
    cluster for the block; its ACLs are deleted after."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    name = principal_of_its_own(cluster, prefix)
    acls = [AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, f"User:{name}", "*",
                       AclOperation[op], AclPermissionType.ALLOW if allow else AclPermissionType.DENY)
            for op, allow in operations.items()]
    try:
        for f in confluent_admin.create_acls(acls, request_timeout=30).values():
            f.result(30)
        yield name
    finally:
        confluent_admin.delete_acls([AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY,
                                                      f"User:{name}", None, AclOperation.ANY,
                                                      AclPermissionType.ANY)], request_timeout=30)


def test_users_and_quotas_need_kafkas_permissions_on_the_cluster(kcluster: LocalCluster, confluent_admin: Any) -> None:
    """DESCRIBE_CONFIGS reads quotas and ALTER_CONFIGS changes them; DESCRIBE lists SCRAM users and ALTER changes
    them (Kafka's rules). A principal with only the two describe permissions reads both and changes neither."""
    target = f"qe-{uuid.uuid4().hex[:8]}"
    with _on_the_cluster(kcluster, confluent_admin, "viewer", {"DESCRIBE": True, "DESCRIBE_CONFIGS": True}) as name:
        wait_for(lambda: _describe(kcluster, [], name=name)[0] == 0, 30, f"User:{name}'s DESCRIBE_CONFIGS to arrive")

        assert _alter(kcluster, [{"entity": _user(target), "ops": [_set("producer_byte_rate", 1.0)]}], name=name) == \
            [(CLUSTER_AUTHORIZATION_FAILED, f"User:{name} is not authorized to ALTER_CONFIGS the cluster")]
        refused = kafka_ask(kcluster, kcluster.broker_ids[0], ALTER_SCRAM, 0,
                            {"deletions": [], "upsertions": [_upsertion(target, b"pw")]}, name=name)
        assert [(r.user, int(r.error_code)) for r in refused.results] == [(target, CLUSTER_AUTHORIZATION_FAILED)]

        with _brook_admin(kcluster) as brook:
            assert f"User:{target}" not in brook.describe_client_quotas()
            assert target not in brook.list_users()
            # The cluster's admin may (a super user); logging in with such a credential: tests/kafka_compat.
            done = kafka_ask(kcluster, kcluster.broker_ids[0], ALTER_SCRAM, 0,
                             {"deletions": [], "upsertions": [_upsertion(target, b"pw")]})
            assert [(r.user, int(r.error_code)) for r in done.results] == [(target, 0)]
            assert brook.list_users([target]) == {target: [("SCRAM-SHA-512", 4096)]}
            scram = kafka_ask(kcluster, kcluster.broker_ids[0], DESCRIBE_SCRAM, 0, {"users": None}, name=name)
            assert scram.error_code == 0
            assert [(i.mechanism, i.iterations) for r in scram.results if r.user == target
                    for i in r.credential_infos] == [(2, 4096)]
            brook.delete_user(target)


def test_a_request_of_many_items_is_answered_within_its_timeout_without_a_quorum(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """With no controller to answer, AlterClientQuotas' entries (sent to the controller one by one) share the
    request's timeout: once it is spent the rest are REQUEST_TIMED_OUT at once. Each had been given a fresh 30 s, so
    four entries took 120 s and held one of the listener's admin workers meanwhile (audit)."""
    timeout_ms = 2_000
    with LocalCluster(tmp_path_factory.mktemp("quota-no-quorum"), nodes=3,
                      overrides={"kafka.request.timeout.ms": str(timeout_ms)}) as cluster:
        survivor, *others = cluster.broker_ids
        for node in others:
            cluster.kill_node(node)
        entries = [{"entity": _user(f"nq{i}"), "ops": [_set("request_rate", 5.0)]} for i in range(4)]
        start = time.monotonic()
        answers = kafka_ask(cluster, survivor, ALTER_QUOTAS, 1, {"entries": entries, "validate_only": False})
        elapsed = time.monotonic() - start
        assert [int(e.error_code) for e in answers.entries] == [7] * 4, answers  # REQUEST_TIMED_OUT
        assert elapsed < 5 * timeout_ms / 1000, f"answered after {elapsed:.1f} s, the request's timeout is 2 s"


def test_a_users_credential_change_survives_a_lost_quorum_whole(tmp_path_factory: pytest.TempPathFactory) -> None:
    """At brook.metadata.version 4 a user's deletion and upsertion are one command: asked while the active
    controller has lost its followers, the request times out, and once they are back the user has the new
    credential and not the old one. As two commands, the deletion alone was applied later and the user had none
    (audit)."""
    from metadata_quorum import features

    with LocalCluster(tmp_path_factory.mktemp("scram-no-quorum"), nodes=3,
                      overrides={"kafka.request.timeout.ms": "3000"}) as cluster:
        with _brook_admin(cluster) as brook:
            # A new cluster is at its release's highest level, past ATOMIC_SCRAM.
            wait_for(lambda: brook.describe_features().finalized_level >= features.ATOMIC_SCRAM, 30,
                     f"{features.METADATA_VERSION} {features.ATOMIC_SCRAM}")
            brook.create_user("sam", "old-pw", mechanisms=["SCRAM-SHA-256"])
            active = brook.describe_quorum().leader_id
        followers = [n for n in cluster.controller_ids if n != active]
        for node in followers:
            cluster.kill_node(node)
        out = kafka_ask(cluster, active, ALTER_SCRAM, 0, {"deletions": [{"name": "sam", "mechanism": 1}],
                                                          "upsertions": [_upsertion("sam", b"new-pw")]})
        assert [(r.user, int(r.error_code)) for r in out.results] == [("sam", 7)], out  # REQUEST_TIMED_OUT
        for node in followers:
            cluster.start_node(node)
        with _brook_admin(cluster) as brook:
            wait_for(lambda: brook.list_users(["sam"]) == {"sam": [("SCRAM-SHA-512", 4096)]}, 60,
                     "sam's change applied whole once the quorum is back")


def test_deleting_a_credential_needs_alter_only(kcluster: LocalCluster, confluent_admin: Any) -> None:
    """Kafka checks ALTER on the cluster for AlterUserScramCredentials. Below brook.metadata.version 4 the broker
    checks that the deleted credentials exist first: as this broker, so a caller allowed ALTER and denied DESCRIBE
    still deletes (forwarded as the caller, it was refused, audit)."""
    target = f"qf-{uuid.uuid4().hex[:8]}"
    with _on_the_cluster(kcluster, confluent_admin, "alterer", {"ALTER": True, "DESCRIBE": False}) as name:
        with _brook_admin(kcluster) as brook:
            brook.create_user(target, "pw", mechanisms=["SCRAM-SHA-256"])

            def deleted() -> bool:
                out = kafka_ask(kcluster, kcluster.broker_ids[0], ALTER_SCRAM, 0, {
                    "deletions": [{"name": target, "mechanism": 1}], "upsertions": [_upsertion(target, b"pw2")]},
                    name=name)
                assert [r.user for r in out.results] == [target]
                return int(out.results[0].error_code) == 0  # 31 until the ACLs reach the broker
            wait_for(deleted, 30, f"User:{name}'s change of {target}")
            assert brook.list_users([target]) == {target: [("SCRAM-SHA-512", 4096)]}
            brook.delete_user(target)
