"""Kafka clients over the KAFKA listener of an mTLS cluster (LocalCluster(tls=True)): the same
CA and client certificate as Brook's gRPC listeners. One node is enough to prove the handshake
and the settings each client needs; the multi-node behaviour is covered in plaintext."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafkakit import brook_read_all, kcat, kcat_binary, rdkafka_config, rdkafka_read_all, unique
from sockets import open_past_the_bound

from client.admin import Admin, NewTopic
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

PER_IP = 12  # max.connections.per.ip: above what each client here opens from 127.0.0.1


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-compat-tls"), nodes=1, tls=True,
                      overrides={"max.connections.per.ip": str(PER_IP)}) as c:
        yield c


@pytest.fixture(scope="module")
def tls_topic(tls_cluster: LocalCluster) -> str:
    name = unique("tls")
    with Admin(tls_cluster.bootstrap_servers, request_timeout_ms=20_000, security=tls_cluster.security) as admin:
        admin.create_topics([NewTopic(name, 1, 1)])
    return name


def test_kafka_client_config_is_mtls(tls_cluster: LocalCluster) -> None:
    conf = tls_cluster.kafka_client_config()
    cert = tls_cluster.client_cert()
    assert conf == {"bootstrap.servers": tls_cluster.kafka_bootstrap_servers, "security.protocol": "SSL",
                    "ssl.ca.location": str(cert.ca), "ssl.certificate.location": str(cert.cert),
                    "ssl.key.location": str(cert.key)}


def test_librdkafka_over_mtls_and_refused_without_a_certificate(tls_cluster: LocalCluster, tls_topic: str) -> None:
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient

    conf = tls_cluster.kafka_client_config()
    producer = Producer(rdkafka_config(conf, **{"enable.idempotence": True, "acks": "all"}))
    errors: list[Any] = []
    for i in range(10):
        producer.produce(tls_topic, value=b"tls-%d" % i, key=b"k", headers=[("via", b"mtls")],
                         on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(30) == 0 and errors == [None] * 10, errors[:3]
    [msgs] = rdkafka_read_all(conf, tls_topic, 1, 10).values()
    assert [m.value() for m in msgs[:10]] == [b"tls-%d" % i for i in range(10)]
    # ... and Brook's own client reads them over its mTLS gRPC listener.
    [records] = brook_read_all(tls_cluster, tls_topic, 1, 10).values()
    assert [(r.key, r.value, r.headers) for r in records[:10]] == [
        (b"k", b"tls-%d" % i, (("via", b"mtls"),)) for i in range(10)]

    # Server-only TLS (the CA, no client certificate): the listener requires one.
    anonymous = {k: v for k, v in conf.items() if k not in ("ssl.certificate.location", "ssl.key.location")}
    with pytest.raises(KafkaException):
        AdminClient(rdkafka_config(anonymous)).list_topics(timeout=3)


def test_kcat_over_mtls(tls_cluster: LocalCluster, tls_topic: str) -> None:
    binary, why = kcat_binary()
    if binary is None:
        pytest.skip(why)
    conf = tls_cluster.kafka_client_config()
    # Twice, from the beginning each time: a second read of the same segment over TLS once got
    # 0 record bytes and a closed connection (the records were sent from the file's shared offset).
    for n in (1, 2):
        proc = kcat(binary, conf, ["-P", "-t", tls_topic, "-K:", "-H", "tool=kcat"], stdin=f"kk{n}:from-kcat-{n}\n")
        assert proc.returncode == 0 and "ERROR" not in proc.stderr, proc.stderr[-2000:]
        proc = kcat(binary, conf, ["-C", "-t", tls_topic, "-o", "beginning", "-e", "-q", "-J"])
        assert proc.returncode == 0, f"read {n}: {proc.stderr[-2000:]}"
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
        mine = [(r["key"], r["payload"], r.get("headers")) for r in rows if r["key"].startswith("kk")]
        assert mine == [(f"kk{i}", f"from-kcat-{i}", ["tool", "kcat"]) for i in range(1, n + 1)], rows[-3:]


def test_kafka_python_over_mtls(tls_cluster: LocalCluster, tls_topic: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KpTopicPartition

    conf = tls_cluster.kafka_client_config()
    tls = {"security_protocol": "SSL", "ssl_cafile": conf["ssl.ca.location"],
           "ssl_certfile": conf["ssl.certificate.location"], "ssl_keyfile": conf["ssl.key.location"]}
    boot = conf["bootstrap.servers"].split(",")
    producer = KafkaProducer(bootstrap_servers=boot, acks="all", **tls)
    try:
        md = producer.send(tls_topic, b"from-kafka-python").get(timeout=30)
    finally:
        producer.close(timeout=10)
    consumer = KafkaConsumer(bootstrap_servers=boot, enable_auto_commit=False, **tls)
    try:
        tp = KpTopicPartition(tls_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, md.offset)
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=500).get(tp, [])
    finally:
        consumer.close()
    assert got and got[0].value == b"from-kafka-python" and got[0].offset == md.offset


async def test_aiokafka_over_mtls(tls_cluster: LocalCluster, tls_topic: str) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.helpers import create_ssl_context

    conf = tls_cluster.kafka_client_config()
    context = create_ssl_context(cafile=conf["ssl.ca.location"], certfile=conf["ssl.certificate.location"],
                                 keyfile=conf["ssl.key.location"])
    assert context.verify_mode == ssl.CERT_REQUIRED
    common = {"bootstrap_servers": conf["bootstrap.servers"], "security_protocol": "SSL", "ssl_context": context}
    producer = AIOKafkaProducer(acks="all", **common)
    await producer.start()
    try:
        md = await producer.send_and_wait(tls_topic, b"from-aiokafka")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **common)
    await consumer.start()
    try:
        tp = TopicPartition(tls_topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, md.offset)
        record = await asyncio.wait_for(consumer.getone(), 30)
    finally:
        await consumer.stop()
    assert (record.value, record.offset) == (b"from-aiokafka", md.offset)


def test_connections_that_never_shake_hands_are_counted_before_tls(tls_cluster: LocalCluster,
                                                                    tls_topic: str) -> None:
    # TLS is started once a connection is counted: connections that never send a ClientHello hold
    # no more than their address's max.connections.per.ip (before, the listener shook hands before
    # any bound saw them, and each held a descriptor for kafka.authentication.timeout.ms, without
    # limit). A client from another address is served meanwhile.
    from confluent_kafka.admin import AdminClient

    port = int(tls_cluster.kafka_bootstrap_servers.split(",")[0].rsplit(":", 1)[1])
    held = open_past_the_bound(port, PER_IP)  # the first ones open, their handshakes not begun
    try:
        metadata = AdminClient(rdkafka_config(tls_cluster.kafka_client_config())).list_topics(timeout=30)
        assert tls_topic in metadata.topics
    finally:
        for s in held:
            s.close()
