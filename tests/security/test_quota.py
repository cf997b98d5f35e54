"""Client quotas on a real secured cluster: an over-quota producer/consumer is throttled.

The cluster measures rates over 2 samples of 1 s (conftest), so a client can get ahead
of its quota by at most about two windows' worth of bytes plus what it has in flight
when the first throttle arrives. The assertion is on bytes against elapsed time (bytes
<= quota x elapsed + that allowance), so a slow, loaded machine only makes it easier to
pass; nothing asserts on how fast anything is.
"""

from __future__ import annotations

import time

import grpc
import pytest
from opskit_security import metric_total, produce_raw, sasl, scrape_anonymously
from waiting import wait_for

from admin_cli.main import main as brook_main
from client.admin import Admin
from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition
from deploy.local.cluster import LocalCluster

pytestmark = pytest.mark.slow

QUOTA_BPS = 50_000
RECORD_BYTES = 1_000
WINDOWS_ALLOWANCE = 2  # quota.window.num
IN_FLIGHT_BYTES_MAX = 5 * 16_384 * 2  # max.in.flight x batch.size, doubled for batch overhead


class _Ignored(dict):  # type: ignore[type-arg]
    """A client's ``throttled_until`` that forgets every throttle time it is told: a client that ignores
    throttle_time_ms. The broker must hold it to its quota all the same (as Kafka mutes its connection)."""

    def __setitem__(self, key: object, value: object) -> None:
        pass


HEEDS = pytest.mark.parametrize("heeds", [True, False], ids=["client-waits", "client-ignores-throttle"])


@HEEDS
def test_producer_over_its_byte_rate_quota_is_throttled(secure_cluster: LocalCluster, admin: Admin,
                                                        grant, sync, heeds: bool) -> None:  # noqa: ANN001
    topic, user = f"quota-produce-{heeds:d}", f"quinn{heeds:d}"
    admin.create_topic(topic, 1, 3)
    admin.create_user(user, "quinn-pw")
    grant(f"User:{user}", "WRITE", "TOPIC", topic)
    admin.alter_client_quotas(f"User:{user}", set={"producer_byte_rate": QUOTA_BPS})
    sync()  # the leader knows the quota before the first byte
    try:
        with Producer(bootstrap_servers=secure_cluster.bootstrap_servers, linger_ms=0, acks=1,
                      **sasl(user, "quinn-pw")) as p:
            if not heeds:
                p._sender.throttled_until = _Ignored()
            p.send(topic, b"warm-up").get(60)  # connect, authenticate, learn the leader
            payload = b"x" * RECORD_BYTES
            total = 0
            start = time.monotonic()
            for _ in range(8 * QUOTA_BPS // RECORD_BYTES):  # eight seconds' worth at the quota
                p.send(topic, payload)
                total += RECORD_BYTES
            p.flush(120)
            elapsed = time.monotonic() - start
            throttled_ms = p._sender.throttle_time_ms_total
    finally:
        admin.alter_client_quotas(f"User:{user}", remove=["producer_byte_rate"])
    print(f"producer: {total} B in {elapsed:.2f} s = {total / elapsed:.0f} B/s against {QUOTA_BPS} B/s, "
          f"throttled {throttled_ms} ms in total")
    assert throttled_ms > 0
    allowance = WINDOWS_ALLOWANCE * QUOTA_BPS + IN_FLIGHT_BYTES_MAX
    assert total <= QUOTA_BPS * elapsed + allowance, (
        f"{total} B in {elapsed:.2f} s is more than the quota allows ({QUOTA_BPS} B/s + {allowance} B)")


def test_a_unary_produce_within_its_principals_throttle_time_is_refused(secure_cluster: LocalCluster, admin: Admin,
                                                                        grant, sync) -> None:  # noqa: ANN001
    """A unary gRPC call has no connection to mute: one that comes before the throttle time it was given is over
    is refused (RESOURCE_EXHAUSTED) without being read further, and counted."""
    topic, user = "quota-unary", "una"
    admin.create_topic(topic, 1, 3)
    admin.create_user(user, "una-pw")
    grant(f"User:{user}", "WRITE", "TOPIC", topic)
    admin.alter_client_quotas(f"User:{user}", set={"producer_byte_rate": QUOTA_BPS})
    sync()
    leader = wait_for(lambda: max(admin.describe_topics([topic])[topic].partitions[0].leader, 0), 30,
                      "a leader of the new topic")
    address = secure_cluster.broker_address(leader)
    before = metric_total(scrape_anonymously(secure_cluster, leader, admin), "brook_quota_enforced_requests_total",
                          action="refused")
    try:
        # Six times the quota in one request: a throttle time of several seconds.
        first = produce_raw(address, (user, "una-pw"), topic, b"z" * (6 * QUOTA_BPS))
        assert first.error_code == 0, first
        with pytest.raises(grpc.RpcError) as refused:
            produce_raw(address, (user, "una-pw"), topic, b"too soon")
    finally:
        admin.alter_client_quotas(f"User:{user}", remove=["producer_byte_rate"])
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused.value
    assert "over its quota" in (refused.value.details() or "")
    after = metric_total(scrape_anonymously(secure_cluster, leader, admin), "brook_quota_enforced_requests_total",
                          action="refused")
    assert after == before + 1, (before, after)
    tp = TopicPartition(topic, 0)
    assert admin.list_offsets({tp: "latest"})[tp][0] == 1, "the refused record was written"


@HEEDS
def test_consumer_over_its_fetch_quota_is_throttled(secure_cluster: LocalCluster, admin: Admin,
                                                    grant, sync, heeds: bool) -> None:  # noqa: ANN001
    topic, user = f"quota-fetch-{heeds:d}", f"fred{heeds:d}"
    admin.create_topic(topic, 1, 3)
    admin.create_user(user, "fred-pw")
    grant(f"User:{user}", "READ", "TOPIC", topic)
    with Producer(bootstrap_servers=secure_cluster.bootstrap_servers, **sasl("admin", "admin-secret")) as p:
        for _ in range(6 * QUOTA_BPS // RECORD_BYTES):
            p.send(topic, b"y" * RECORD_BYTES)
        p.flush(60)
    admin.alter_client_quotas(f"User:{user}", set={"consumer_byte_rate": QUOTA_BPS})
    sync()
    try:
        with Consumer(bootstrap_servers=secure_cluster.bootstrap_servers, auto_offset_reset="earliest",
                      max_partition_fetch_bytes=16_384, **sasl(user, "fred-pw")) as c:
            if not heeds:
                c._fetcher.throttled_until = _Ignored()
            c.assign([TopicPartition(topic, 0)])
            got = 0
            start = time.monotonic()

            def drained() -> bool:
                nonlocal got
                got += sum(len(r.value) for records in c.poll(200).values() for r in records)
                return got >= 6 * QUOTA_BPS
            wait_for(drained, 120, "fred to read the topic")
            elapsed = time.monotonic() - start
            throttled_ms = c._fetcher.throttle_time_ms_total
    finally:
        admin.alter_client_quotas(f"User:{user}", remove=["consumer_byte_rate"])
    print(f"consumer: {got} B in {elapsed:.2f} s = {got / elapsed:.0f} B/s against {QUOTA_BPS} B/s, "
          f"throttled {throttled_ms} ms in total")
    assert throttled_ms > 0
    assert got <= QUOTA_BPS * elapsed + WINDOWS_ALLOWANCE * QUOTA_BPS + 2 * 16_384


def test_brook_quota_commands(secure_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BROOK_BOOTSTRAP", secure_cluster.bootstrap_servers)
    monkeypatch.setenv("BROOK_SASL_USERNAME", "admin")
    monkeypatch.setenv("BROOK_SASL_PASSWORD", "admin-secret")
    assert brook_main(["quota", "set", "--default", "--request-rate", "500", "--consumer-byte-rate", "1e9"]) == 0
    capsys.readouterr()
    assert brook_main(["-o", "json", "quota", "describe", "--default"]) == 0
    out = capsys.readouterr().out
    assert '"request_rate": 500.0' in out
    assert brook_main(["quota", "delete", "--default"]) == 0
    capsys.readouterr()
    assert brook_main(["-o", "json", "quota", "describe"]) == 0
    assert "<default>" not in capsys.readouterr().out
    assert brook_main(["quota", "set", "--default", "--request-rate", "-1"]) == 2  # a usage error, not sent
    assert "must be > 0" in capsys.readouterr().err
