"""Client quotas on a real secured cluster: an over-quota producer/consumer is throttled.

The cluster measures rates over 2 samples of 1 s (conftest), so a client can get ahead
of its quota by at most about two windows' worth of bytes plus what it has in flight
when the first throttle arrives. The assertion is on bytes against elapsed time (bytes
<= quota x elapsed + that allowance), so a slow, loaded machine only makes it easier to
pass; nothing asserts on how fast anything is.
"""

from __future__ import annotations

import time

import pytest
from opskit_security import sasl
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


def test_producer_over_its_byte_rate_quota_is_throttled(secure_cluster: LocalCluster, admin: Admin,
                                                        grant, sync) -> None:  # noqa: ANN001
    admin.create_topic("quota-produce", 1, 3)
    admin.create_user("quinn", "quinn-pw")
    grant("User:quinn", "WRITE", "TOPIC", "quota-produce")
    admin.alter_client_quotas("User:quinn", set={"producer_byte_rate": QUOTA_BPS})
    sync()  # the leader knows the quota before the first byte
    try:
        with Producer(bootstrap_servers=secure_cluster.bootstrap_servers, linger_ms=0, acks=1,
                      **sasl("quinn", "quinn-pw")) as p:
            p.send("quota-produce", b"warm-up").get(60)  # connect, authenticate, learn the leader
            payload = b"x" * RECORD_BYTES
            total = 0
            start = time.monotonic()
            for _ in range(8 * QUOTA_BPS // RECORD_BYTES):  # eight seconds' worth at the quota
                p.send("quota-produce", payload)
                total += RECORD_BYTES
            p.flush(120)
            elapsed = time.monotonic() - start
            throttled_ms = p._sender.throttle_time_ms_total
    finally:
        admin.alter_client_quotas("User:quinn", remove=["producer_byte_rate"])
    print(f"producer: {total} B in {elapsed:.2f} s = {total / elapsed:.0f} B/s against {QUOTA_BPS} B/s, "
          f"throttled {throttled_ms} ms in total")
    assert throttled_ms > 0
    allowance = WINDOWS_ALLOWANCE * QUOTA_BPS + IN_FLIGHT_BYTES_MAX
    assert total <= QUOTA_BPS * elapsed + allowance, (
        f"{total} B in {elapsed:.2f} s is more than the quota allows ({QUOTA_BPS} B/s + {allowance} B)")


def test_consumer_over_its_fetch_quota_is_throttled(secure_cluster: LocalCluster, admin: Admin,
                                                    grant, sync) -> None:  # noqa: ANN001
    admin.create_topic("quota-fetch", 1, 3)
    admin.create_user("fred", "fred-pw")
    grant("User:fred", "READ", "TOPIC", "quota-fetch")
    with Producer(bootstrap_servers=secure_cluster.bootstrap_servers, **sasl("admin", "admin-secret")) as p:
        for _ in range(6 * QUOTA_BPS // RECORD_BYTES):
            p.send("quota-fetch", b"y" * RECORD_BYTES)
        p.flush(60)
    admin.alter_client_quotas("User:fred", set={"consumer_byte_rate": QUOTA_BPS})
    sync()
    try:
        with Consumer(bootstrap_servers=secure_cluster.bootstrap_servers, auto_offset_reset="earliest",
                      max_partition_fetch_bytes=16_384, **sasl("fred", "fred-pw")) as c:
            c.assign([TopicPartition("quota-fetch", 0)])
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
        admin.alter_client_quotas("User:fred", remove=["consumer_byte_rate"])
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
