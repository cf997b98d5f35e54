"""Helpers shared by the ops and fault tests (a unique module name: tests/ has no packages)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from client.consumer import Consumer
from client.producer import Producer
from client.types import TopicPartition


def sample_values(text: str, name: str, **labels: str) -> list[float]:
    """Values of the samples called ``name`` whose labels include ``labels`` in a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    found = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                found.append(s.value)
    return found


def describe(values: Sequence[float]) -> str:
    return ", ".join(f"{v:g}" for v in values) or "(no samples)"


def client_security(cluster: Any) -> dict[str, str]:
    """A LocalCluster's client security configs as client keyword arguments (none when plaintext)."""
    return {k.replace(".", "_"): v for k, v in getattr(cluster, "client_config", {}).items()}


def produce_acked(cluster: Any, topic: str, values: list[bytes]) -> None:
    """Each value to ``topic`` with acks=all, one at a time, each acknowledged before the next."""
    with Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all", request_timeout_ms=10_000,
                  **client_security(cluster)) as p:
        for v in values:
            p.send(topic, v).get(timeout=30)


def read_values(cluster: Any, topic: str, count: int, timeout_s: float = 60.0) -> list[bytes]:
    """The first ``count`` values of partition 0 of ``topic``, read from offset 0 by a new Brook consumer."""
    out: list[bytes] = []
    with Consumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest",
                  request_timeout_ms=5000, fetch_max_wait_ms=100, **client_security(cluster)) as consumer:
        consumer.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + timeout_s
        while len(out) < count:
            assert time.monotonic() < deadline, f"read {len(out)} of {count} records of {topic}-0"
            for records in consumer.poll(timeout_ms=200).values():
                out.extend(r.value for r in records)
    return out
