"""The controller mutation quota (KIP-599) seen by a Kafka client through the KAFKA listener: kafka-python's
CreateTopics (v7, strict) gets THROTTLING_QUOTA_EXCEEDED (89) per topic once User:demo is over its quota;
the same request at v5, older than KIP-599, is accepted and only its throttle_time_ms is set (Kafka's
permissive quota), and the next one waits at the broker until that time is over (Kafka mutes the connection).
The quota is kept by the active controller, to which the broker forwards the request with the client's
principal."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kafka_admin_kit import kafka_python_ssl

from client.admin import Admin

pytestmark = pytest.mark.slow

T = 30
RATE = 1.0  # partition mutations/s; quota.window.num 11 x 1 s: a burst of 11


def test_kafka_clients_over_the_controller_mutation_quota_are_throttled(kcluster: Any, topic_name: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from kafka.admin import KafkaAdminClient
    from kafka.errors import ThrottlingQuotaExceededError
    from kafka.net.connection import KafkaConnection
    from kafka.protocol.admin import CreateTopicsRequest

    # Clients that ignore throttle_time_ms (kafka-python would pause the connection until it is over).
    monkeypatch.setattr(KafkaConnection, "_maybe_throttle", lambda self, response: None)

    kcluster.grant_demo_acls()
    name = "demo-" + topic_name
    clients: list[Any] = []

    def demo() -> Any:
        clients.append(KafkaAdminClient(request_timeout_ms=T * 1000, **kafka_python_ssl(kcluster, "demo")))
        return clients[-1]

    with Admin(kcluster.bootstrap_servers, controller_endpoints=kcluster.controller_endpoints,
               security=kcluster.security) as brook_admin:
        brook_admin.alter_client_quotas("User:demo", set={"controller_mutation_rate": RATE})
        try:
            new_client = demo()
            new_client.create_topics({f"{name}-big": {"num_partitions": 20, "replication_factor": 1}},
                                     timeout_ms=T * 1000)  # 11 - 20: accepted, 9 below zero
            with pytest.raises(ThrottlingQuotaExceededError) as refused:
                new_client.create_topics({f"{name}-next": {"num_partitions": 1, "replication_factor": 1}},
                                         timeout_ms=T * 1000)
            assert refused.value.errno == 89
            assert "throttled: controller mutation quota of 1/s exceeded, retry after" in str(refused.value)

            # CreateTopics v5, older than KIP-599: its client does not know error 89, so the topic is created
            # and only the answer is throttled.
            old_client = demo()
            old = CreateTopicsRequest(topics=old_client._process_create_topics_input(
                {f"{name}-old": {"num_partitions": 1, "replication_factor": 1}}), timeout_ms=T * 1000,
                validate_only=False, max_version=5)
            response = old_client._manager.run(old_client._send_request_to_controller, old)
            assert [t.error_code for t in response.topics] == [0], response
            assert 0 < response.throttle_time_ms <= 10_000, response  # at most -(-9 - 1) / 1 per s

            # Asked again at once, throttle time ignored: accepted too (permissive), but only once the throttle
            # time is over; the broker held it meanwhile, as Kafka mutes the connection. Before, it went through
            # at once, so an older client was never slowed by the quota.
            held = _held(kcluster)
            again = CreateTopicsRequest(topics=old_client._process_create_topics_input(
                {f"{name}-old-2": {"num_partitions": 1, "replication_factor": 1}}), timeout_ms=T * 1000,
                validate_only=False, max_version=5)
            started = time.monotonic()
            second = old_client._manager.run(old_client._send_request_to_controller, again)
            waited = time.monotonic() - started
            assert [t.error_code for t in second.topics] == [0], second
            assert waited >= response.throttle_time_ms / 2000, (
                f"answered {waited:.2f} s after a throttle time of {response.throttle_time_ms} ms")
            assert _held(kcluster) > held
        finally:
            for client in clients:
                client.close()
            brook_admin.alter_client_quotas("User:demo", remove=["controller_mutation_rate"])


def _held(kcluster: Any) -> float:
    """Requests the brokers held until their principal's throttle time was over."""
    from opskit import sample_values

    return sum(sum(sample_values(kcluster.read_metrics(n), "brook_quota_enforced_requests_total", action="held"))
               for n in kcluster.broker_ids)
