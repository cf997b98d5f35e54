"""Kafka clients logging in over SASL (SCRAM-SHA-256/512 and PLAIN) on a SASL_PLAINTEXT KAFKA
listener: a 1-node cluster whose bootstrap SCRAM user is the only way in on that listener."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafkakit import (
    brook_read_all,
    kafkajs_admin,
    kafkajs_node,
    kafkajs_run,
    kcat,
    kcat_binary,
    rdkafka_config,
    rdkafka_read_all,
    unique,
)
from opskit import sample_values
from waiting import wait_for

from client.admin import Admin, NewTopic
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

USER, PASSWORD = "alice", "alice-secret"
# Failed logins are rate-limited per user: the refusal test spends its failures on another user.
OTHER_USER, OTHER_PASSWORD = "bob", "bob-secret"
KCAT_USER, KCAT_PASSWORD = "carol", "carol-secret"  # kcat logs in as its own user


@pytest.fixture(scope="module")
def sasl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    overrides = {"listener.security.protocol.map": "BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT,KAFKA:SASL_PLAINTEXT",
                 "scram.bootstrap.users": f"{USER}:{PASSWORD},{OTHER_USER}:{OTHER_PASSWORD},{KCAT_USER}:{KCAT_PASSWORD}"}
    with LocalCluster(tmp_path_factory.mktemp("kafka-compat-sasl"), nodes=1, overrides=overrides) as c:
        yield c


def _sasl(cluster: LocalCluster, mechanism: str, password: str = PASSWORD, user: str = USER) -> dict[str, Any]:
    return {"bootstrap.servers": cluster.kafka_bootstrap_servers, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password}


@pytest.fixture(scope="module")
def sasl_topic(sasl_cluster: LocalCluster) -> str:
    from confluent_kafka.admin import AdminClient

    name = unique("sasl")
    with Admin(sasl_cluster.bootstrap_servers, request_timeout_ms=20_000) as admin:
        admin.create_topics([NewTopic(name, 1, 1)])

    def logged_in() -> bool:  # the bootstrap user reaches the broker through the metadata log
        try:
            return name in AdminClient(rdkafka_config(_sasl(sasl_cluster, "SCRAM-SHA-256"))).list_topics(
                timeout=5).topics
        except Exception:  # noqa: BLE001 - "not yet"
            return False
    wait_for(logged_in, 60, f"a SCRAM login as {USER}")
    return name


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_librdkafka_logs_in_with_each_mechanism(sasl_cluster: LocalCluster, sasl_topic: str, mechanism: str) -> None:
    from confluent_kafka import Producer

    conf = _sasl(sasl_cluster, mechanism)
    producer = Producer(rdkafka_config(conf, **{"enable.idempotence": True}))
    errors: list[Any] = []
    value = f"via-{mechanism}".encode()
    producer.produce(sasl_topic, value=value, on_delivery=lambda err, _m: errors.append(err))
    assert producer.flush(30) == 0 and errors == [None], errors
    [msgs] = rdkafka_read_all(conf, sasl_topic, 1, 1).values()
    assert value in [m.value() for m in msgs]


def test_wrong_password_and_no_sasl_are_refused(sasl_cluster: LocalCluster, sasl_topic: str) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    for conf in (_sasl(sasl_cluster, "SCRAM-SHA-512", "wrong", OTHER_USER), _sasl(sasl_cluster, "PLAIN", "wrong", OTHER_USER),
                 {"bootstrap.servers": sasl_cluster.kafka_bootstrap_servers}):
        with pytest.raises(KafkaException):
            AdminClient(rdkafka_config(conf)).list_topics(timeout=3)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_librdkafka_connection_is_closed_once_its_user_is_deleted(sasl_cluster: LocalCluster, sasl_topic: str,
                                                                 mechanism: str) -> None:
    """A logged-in Kafka connection does not outlive its user: its next request closes it, and the client's
    login on a new connection fails, so nothing more is written."""
    from confluent_kafka import KafkaError, Producer

    user = f"erin-{mechanism[-3:].lower()}"
    with Admin(sasl_cluster.bootstrap_servers, request_timeout_ms=20_000) as admin:
        admin.create_user(user, "erin-pw")
        conf = _sasl(sasl_cluster, mechanism, "erin-pw", user)
        seen: list[Any] = []
        producer = Producer(rdkafka_config(conf, **{"message.timeout.ms": 8_000, "error_cb": seen.append}))
        delivered: list[Any] = []

        def produce(value: bytes) -> None:
            producer.produce(sasl_topic, value=value, on_delivery=lambda err, _m: delivered.append(err))
            producer.flush(30)

        try:
            wait_for(lambda: produce(b"before") or delivered[-1] is None, 60, f"{user} to log in and produce")
            revoked_before = _revoked(sasl_cluster)
            admin.delete_user(user)
            wait_for(lambda: user not in admin.list_users(), 30, f"{user} deleted")
            # The broker learns of the deletion through its metadata: produce until a record is refused.
            wait_for(lambda: produce(b"after") or delivered[-1], 60,
                     f"a record of the deleted user {user} to be refused (None: delivered)")
            assert any(e.code() == KafkaError._AUTHENTICATION for e in seen), f"no authentication error, saw {seen}"
            assert _revoked(sasl_cluster) > revoked_before, "the broker counted no revoked connection"
        finally:
            producer.purge()
            producer = None  # its threads stop: a failed run must not leave it reconnecting for the next tests


def _revoked(cluster: LocalCluster) -> float:
    return sum(sample_values(cluster.read_metrics(cluster.broker_ids[0]), "brook_sasl_sessions_revoked_total"))


def test_kafka_python_and_aiokafka_over_sasl(sasl_cluster: LocalCluster, sasl_topic: str) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer
    from kafka import KafkaConsumer, KafkaProducer

    boot = sasl_cluster.kafka_bootstrap_servers
    kp_sasl = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
               "sasl_plain_username": USER, "sasl_plain_password": PASSWORD}
    producer = KafkaProducer(bootstrap_servers=boot.split(","), acks="all", **kp_sasl)
    try:
        producer.send(sasl_topic, b"from-kafka-python").get(timeout=30)
    finally:
        producer.close(timeout=10)

    async def aio_send() -> None:
        p = AIOKafkaProducer(bootstrap_servers=boot, acks="all", security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=USER, sasl_plain_password=PASSWORD)
        await p.start()
        try:
            await p.send_and_wait(sasl_topic, b"from-aiokafka")
        finally:
            await p.stop()
    asyncio.run(aio_send())

    consumer = KafkaConsumer(sasl_topic, bootstrap_servers=boot.split(","), group_id=unique("sasl-group"),
                             auto_offset_reset="earliest", **kp_sasl)
    values: set[bytes] = set()
    try:
        deadline = time.monotonic() + 30
        while not {b"from-kafka-python", b"from-aiokafka"} <= values and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.update(r.value for r in records)
    finally:
        consumer.close()
    assert {b"from-kafka-python", b"from-aiokafka"} <= values


# Debian 12's kcat (librdkafka 2.0.2) repeats its client nonce in SCRAM's final message; see
# broker/sasl.py _accept_librdkafka_nonce.
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kcat_over_sasl(sasl_cluster: LocalCluster, sasl_topic: str, mechanism: str) -> None:
    binary, why = kcat_binary()
    if binary is None:
        pytest.skip(why)
    conf = _sasl(sasl_cluster, mechanism, KCAT_PASSWORD, KCAT_USER)
    proc = kcat(binary, conf, ["-L", "-J", "-t", sasl_topic, "-m", "5"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [t["topic"] for t in json.loads(proc.stdout)["topics"]] == [sasl_topic]


def test_a_kafka_client_that_ignores_throttle_time_is_held_to_its_quota(
        sasl_cluster: LocalCluster, sasl_topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kafka's broker mutes the connection of a throttled answer; Brook's Kafka listener reads nothing more from it
    until the throttle time is over. kafka-python made deaf to throttle_time_ms (its connection never pauses) is
    held to its quota: before, it produced at whatever rate it could."""
    from kafka.net.connection import KafkaConnection

    user, password, quota = "quentin", "quentin-secret", 100_000
    windows = 11  # quota.window.num: the rate is measured over that many seconds, so that much gets ahead at first
    with Admin(sasl_cluster.bootstrap_servers, request_timeout_ms=20_000) as admin:
        admin.create_user(user, password)
        admin.alter_client_quotas(f"User:{user}", set={"producer_byte_rate": quota})
    monkeypatch.setattr(KafkaConnection, "_maybe_throttle", lambda self, response: None)
    boot = sasl_cluster.kafka_bootstrap_servers
    producer = wait_for(lambda: _kafka_python_producer(boot, user, password, sasl_topic), 60,
                        f"kafka-python logged in as {user}")
    payload, total = b"q" * 1_000, 0
    try:
        start = time.monotonic()
        for _ in range(15 * quota // len(payload)):
            producer.send(sasl_topic, payload)
            total += len(payload)
        producer.flush(timeout=120)
        elapsed = time.monotonic() - start
    finally:
        producer.close(timeout=10)
        with Admin(sasl_cluster.bootstrap_servers, request_timeout_ms=20_000) as admin:
            admin.alter_client_quotas(f"User:{user}", remove=["producer_byte_rate"])
    print(f"kafka-python ignoring throttle_time_ms: {total} B in {elapsed:.2f} s = {total / elapsed:.0f} B/s "
          f"against {quota} B/s")
    allowance = windows * quota + 5 * 16_384 * 2  # the first windows, and what is in flight
    assert total <= quota * elapsed + allowance, (
        f"{total} B in {elapsed:.2f} s is more than the quota allows ({quota} B/s + {allowance} B)")
    held = sum(sample_values(sasl_cluster.read_metrics(sasl_cluster.broker_ids[0]),
                             "brook_quota_enforced_requests_total", action="held"))
    assert held > 0


def _kafka_python_producer(boot: str, user: str, password: str, topic: str) -> Any:
    """A kafka-python producer that has written one record as ``user`` (the user reaches the broker through
    the metadata log), or None."""
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    producer = KafkaProducer(bootstrap_servers=boot.split(","), acks=1, linger_ms=0,
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                             sasl_plain_username=user, sasl_plain_password=password)
    try:
        producer.send(topic, b"warm-up").get(timeout=10)
        return producer
    except KafkaError:
        producer.close(timeout=5)
        return None


def _logs_in(cluster: LocalCluster, mechanism: str, user: str, password: str) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient(rdkafka_config(_sasl(cluster, mechanism, password, user))).list_topics(timeout=3)
        return True
    except Exception:  # noqa: BLE001 - refused (or not yet known to the broker)
        return False


def test_confluent_kafka_manages_scram_users(sasl_cluster: LocalCluster, sasl_topic: str) -> None:
    """KIP-554 as librdkafka sends it: a user created with a password librdkafka salts logs in; refused items are
    Kafka's codes; a user with one refused item has none of its items applied."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(rdkafka_config(_sasl(sasl_cluster, "SCRAM-SHA-256")))

    def error_of(future: Any) -> str | None:
        try:
            future.result(timeout=30)
            return None
        except KafkaException as exc:
            return exc.args[0].name()
    user, other = unique("dave"), unique("frank")
    results = admin.alter_user_scram_credentials([
        UserScramCredentialUpsertion(user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), b"dave-pw"),
        UserScramCredentialUpsertion(other, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"frank-pw"),
        UserScramCredentialDeletion(other, ScramMechanism.SCRAM_SHA_512),  # it has none: frank's upsert is not done
        UserScramCredentialUpsertion("erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"erin-pw"),
    ])
    assert {u: error_of(f) for u, f in results.items()} == {
        user: None, other: "RESOURCE_NOT_FOUND", "erin": "UNACCEPTABLE_CREDENTIAL"}
    described = admin.describe_user_scram_credentials([user, other])
    assert [(i.mechanism, i.iterations) for i in described[user].result(timeout=30).scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_512, 8192)]
    assert error_of(described[other]) == "RESOURCE_NOT_FOUND"
    everyone = admin.describe_user_scram_credentials().result(timeout=30)
    assert {USER, user} <= set(everyone) and other not in everyone
    wait_for(lambda: _logs_in(sasl_cluster, "SCRAM-SHA-512", user, "dave-pw"), 60,
             f"{user} to log in with the password librdkafka salted")
    assert not _logs_in(sasl_cluster, "SCRAM-SHA-256", user, "dave-pw"), "a mechanism never set let the user in"


def test_kafka_python_changes_and_deletes_a_scram_password(sasl_cluster: LocalCluster, sasl_topic: str) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.admin._users import UserScramCredentialDeletion, UserScramCredentialUpsertion

    user = unique("gina")
    admin = KafkaAdminClient(bootstrap_servers=sasl_cluster.kafka_bootstrap_servers.split(","),
                             security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                             sasl_plain_username=USER, sasl_plain_password=PASSWORD, request_timeout_ms=30_000)
    try:
        assert admin.alter_user_scram_credentials([
            UserScramCredentialUpsertion(user, "SCRAM-SHA-256", "first", iterations=4096),
            UserScramCredentialUpsertion(user, "SCRAM-SHA-512", "first", iterations=16384)]) == {user: None}
        wait_for(lambda: _logs_in(sasl_cluster, "SCRAM-SHA-256", user, "first"), 60, f"{user} to log in")
        assert admin.describe_user_scram_credentials([user])[user]["credential_infos"] == [
            {"mechanism": 1, "iterations": 4096}, {"mechanism": 2, "iterations": 16384}]

        assert admin.alter_user_scram_credentials([
            UserScramCredentialUpsertion(user, "SCRAM-SHA-256", "second")]) == {user: None}
        wait_for(lambda: _logs_in(sasl_cluster, "SCRAM-SHA-256", user, "second"), 60, f"{user}'s new password")
        assert not _logs_in(sasl_cluster, "SCRAM-SHA-256", user, "first"), "the old password still let the user in"

        assert admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, "SCRAM-SHA-256"),
                                                   UserScramCredentialDeletion(user, "SCRAM-SHA-512")]) == {user: None}
        assert admin.describe_user_scram_credentials([user])[user]["error"] == \
            "Attempt to describe a user credential that does not exist"
        wait_for(lambda: not _logs_in(sasl_cluster, "SCRAM-SHA-512", user, "first"), 60,
                 f"the deleted {user} to be refused")
    finally:
        admin.close()


def test_kafkajs_logs_in_with_each_mechanism_and_a_wrong_password_is_refused(sasl_cluster: LocalCluster,
                                                                             sasl_topic: str) -> None:
    """KafkaJS (Node.js) over SASL_PLAINTEXT: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 log in and write; a
    wrong password is a SASL authentication error, and nothing is written."""
    node, why = kafkajs_node()
    if node is None:
        pytest.skip(why)
    user, password = "dave", "dave-secret"
    with Admin(sasl_cluster.bootstrap_servers, request_timeout_ms=20_000) as admin:
        admin.create_user(user, password)
        admin.create_user("frank", "frank-secret")  # refusals spend their rate-limited failures on frank
    brokers = sasl_cluster.kafka_bootstrap_servers.split(",")
    for mechanism in ("plain", "scram-sha-256", "scram-sha-512"):
        conn = {"brokers": brokers, "sasl": {"mechanism": mechanism, "username": user, "password": password}}
        # the new user reaches the broker through the metadata log: the first login may come before it
        lines = wait_for(lambda c=conn, m=mechanism: _kafkajs_write(node, c, sasl_topic, f"kafkajs-{m}"), 60,
                         f"KafkaJS to log in with {mechanism} and write")
        assert lines[-1] == {"done": True}, lines
    [refused] = kafkajs_admin(node, {"brokers": brokers, "retries": 0, "sasl": {
        "mechanism": "scram-sha-512", "username": "frank", "password": "wrong"}}, ["fetchTopicMetadata"])
    assert refused["call"] == "connect" and refused["error"]["name"] == "KafkaJSSASLAuthenticationError", refused
    tp = TopicPartition(sasl_topic, 0)
    with Admin(sasl_cluster.bootstrap_servers, request_timeout_ms=20_000) as admin:
        end = admin.list_offsets({tp: "latest"})[tp][0]
    [records] = brook_read_all(sasl_cluster, sasl_topic, 1, end).values()
    written = sorted(r.value for r in records if r.value.startswith(b"kafkajs-"))
    assert written == [b"kafkajs-plain-000000", b"kafkajs-scram-sha-256-000000", b"kafkajs-scram-sha-512-000000"], \
        written


def _kafkajs_write(node: str, conn: dict[str, Any], topic: str, prefix: str) -> list[dict[str, Any]] | None:
    """One record written by KafkaJS (value ``<prefix>-000000``); None when it could not log in or write."""
    try:
        lines = kafkajs_run(node, {**conn, "op": "produce", "topic": topic, "count": 1, "partitions": 1,
                                   "prefix": f"{prefix}-", "retries": 0})
    except AssertionError:  # the driver could not connect: not yet
        return None
    return lines if all("acked" in x or "done" in x for x in lines) else None
