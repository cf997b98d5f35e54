"""Helpers for driving unmodified Kafka clients (kcat, confluent-kafka, kafka-python, aiokafka)
against a LocalCluster's KAFKA listener (a unique module name: tests/ has no packages)."""

from __future__ import annotations

import fcntl
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from client.admin import Admin
from client.consumer import Consumer as BrookConsumer
from client.types import ConsumerRecord, TopicPartition
from deploy.local.cluster import LocalCluster
from deploy.local.tools import debian_tool

KCAT_TIMEOUT_S = 60.0
# librdkafka settings that keep a stuck test short: a bounded delivery timeout, so a stuck produce fails the
# test instead of hanging it. The metadata refresh stays librdkafka's own (5 minutes): a 1 s refresh once hid
# that a consumer could not look up topics by id, and a client must find a moved leader from its errors.
RDKAFKA_TEST_DEFAULTS = {
    "message.timeout.ms": 60_000,
    "socket.timeout.ms": 10_000,
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def kcat_binary() -> tuple[str | None, str]:
    """kcat from Debian's package (installed when root, as in CI); (None, why) otherwise."""
    return debian_tool("kcat", "kcat")


def kcat(binary: str, config: Mapping[str, Any], args: Iterable[str], *, stdin: str | None = None,
         timeout_s: float = KCAT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run kcat with librdkafka-style ``config`` (bootstrap.servers becomes -b, the rest -X k=v)."""
    cmd = [binary, "-b", str(config["bootstrap.servers"])]
    for k, v in config.items():
        if k != "bootstrap.servers":
            cmd += ["-X", f"{k}={v}"]
    cmd += list(args)
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout_s)


def rdkafka_config(cluster_config: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {**cluster_config, **RDKAFKA_TEST_DEFAULTS, **extra}


def rdkafka_read_all(config: Mapping[str, Any], topic: str, partitions: int, expected: int,
                     timeout_s: float = 30.0) -> dict[int, list[Any]]:
    """confluent-kafka: read ``topic`` from the beginning (manual assignment) until ``expected``
    messages arrived; {partition: [Message, ...]}. Fails at the deadline saying what it saw."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as RdTopicPartition

    out: dict[int, list[Any]] = {p: [] for p in range(partitions)}
    consumer = Consumer(rdkafka_config(config, **{"group.id": unique("reader"), "enable.auto.commit": False}))
    try:
        consumer.assign([RdTopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        total = 0
        errors: list[str] = []
        deadline = time.monotonic() + timeout_s
        while total < expected and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error():
                    errors.append(str(msg.error()))
                    continue
                out[msg.partition()].append(msg)
                total += 1
        assert total >= expected, f"confluent-kafka read {total} of {expected} records of {topic}; errors {errors[-5:]}"
        return out
    finally:
        consumer.close()


def brook_read_all(cluster: LocalCluster, topic: str, partitions: int, expected: int,
                   timeout_s: float = 30.0) -> dict[int, list[ConsumerRecord]]:
    """Brook's own client (gRPC BROKER listener): read ``topic`` from the beginning."""
    out: dict[int, list[ConsumerRecord]] = {p: [] for p in range(partitions)}
    kw = {k.replace(".", "_"): v for k, v in cluster.client_config.items()}
    with BrookConsumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest", **kw) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        total = 0
        deadline = time.monotonic() + timeout_s
        while total < expected and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                out[tp.partition].extend(records)
                total += len(records)
    assert total >= expected, f"Brook's consumer read {total} of {expected} records of {topic}"
    return out


def partition_leader(admin: Admin, topic: str, partition: int = 0) -> int:
    return admin.describe_topics([topic])[topic].partitions[partition].leader


def in_sync(admin: Admin, topic: str, replicas: int) -> bool:
    """Every partition of ``topic`` has a leader and ``replicas`` in-sync replicas."""
    try:
        parts = admin.describe_topics([topic])[topic].partitions.values()
    except Exception:  # noqa: BLE001 - "not yet" while a node restarts
        return False
    return all(p.leader >= 0 and len(p.isr) == replicas for p in parts)


def brook_batch_headers(cluster: LocalCluster, topic: str, partitions: int, expected_records: int,
                        timeout_s: float = 30.0) -> dict[int, list[Any]]:
    """The stored RecordBatch headers of ``topic`` (read undecoded through Brook's client), to
    check what a Kafka producer really wrote: codec, producer id, sequences."""
    from storage.record_batch import iter_batches

    headers: dict[int, list[Any]] = {p: [] for p in range(partitions)}
    kw = {k.replace(".", "_"): v for k, v in cluster.client_config.items()}
    with BrookConsumer(bootstrap_servers=cluster.bootstrap_servers, auto_offset_reset="earliest", **kw) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        total = 0
        deadline = time.monotonic() + timeout_s
        while total < expected_records and time.monotonic() < deadline:
            for tp, raw in consumer.poll_batches(timeout_ms=500).items():
                for _pos, h in iter_batches(raw):
                    headers[tp.partition].append(h)
                    total += h.record_count
    assert total >= expected_records, f"read {total} of {expected_records} records of {topic} as batches"
    return headers


# ---------------------------------------------------------------------------- KafkaJS (Node.js)

KAFKAJS_DIR = Path(__file__).resolve().parent / "kafkajs"
NPM_TIMEOUT_S = 300


def kafkajs_node() -> tuple[str | None, str]:
    """(node binary, "") once KafkaJS (pinned in kafkajs/package-lock.json) is installed next to the driver, or
    (None, why not). Node.js and npm come from the machine, or from Debian's packages when root (as kcat does);
    ``npm ci`` runs once per checkout, under a lock so that parallel test workers do not install twice."""
    node, why = debian_tool("node", "nodejs")
    if node is None:
        return None, why
    npm, why = debian_tool("npm", "npm")
    if npm is None:
        return None, why
    marker = KAFKAJS_DIR / "node_modules" / "kafkajs" / "package.json"
    with open(KAFKAJS_DIR / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            proc = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=KAFKAJS_DIR,
                                  capture_output=True, text=True, timeout=NPM_TIMEOUT_S)
            if proc.returncode != 0 or not marker.exists():
                raise RuntimeError(f"npm ci of KafkaJS failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    return node, ""


def kafkajs_connection(cluster: LocalCluster, name: str = "admin", **extra: Any) -> dict[str, Any]:
    """The driver's connection arguments for ``cluster``'s KAFKA listeners: mTLS as User:<name> on TLS clusters."""
    conn: dict[str, Any] = {"brokers": cluster.kafka_bootstrap_servers.split(",")}
    tls = cluster.client_config_for(name)
    if tls:
        conn["ssl"] = {"ca": tls["ssl.ca.location"], "cert": tls["ssl.certificate.location"],
                       "key": tls["ssl.key.location"]}
    return {**conn, **extra}


def kafkajs_start(node: str, args: Mapping[str, Any]) -> subprocess.Popen[str]:
    """Start ``driver.js`` with ``args`` (its header says what each op takes and prints)."""
    return subprocess.Popen([node, str(KAFKAJS_DIR / "driver.js"), json.dumps(args)], cwd=KAFKAJS_DIR,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class KafkaJSProcess:
    """``driver.js`` running in the background: its JSON lines in ``lines`` as they come."""

    def __init__(self, node: str, args: Mapping[str, Any]) -> None:
        self.proc = kafkajs_start(node, args)
        self.lines: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def wait(self, timeout_s: float) -> None:
        """Until the driver exits and its last line is read."""
        self.proc.wait(timeout_s)
        self._reader.join(10)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def kafkajs_run(node: str, args: Mapping[str, Any], timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Run ``driver.js`` to its end; its JSON lines. Fails saying what KafkaJS logged when the driver fails."""
    proc = kafkajs_start(node, args)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"KafkaJS {args['op']} still running after {timeout_s} s; it logged: {stderr[-2000:]}"
                             ) from None
    lines = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    assert proc.returncode == 0, f"KafkaJS {args['op']} exited {proc.returncode}: {lines[-3:]}; it logged: {stderr[-2000:]}"
    return lines


def kafkajs_admin(node: str, conn: Mapping[str, Any], *calls: list[Any]) -> list[dict[str, Any]]:
    """Each ``[method, *args]`` called on one KafkaJS admin client in order: [{call, ok | error}, ...]."""
    return kafkajs_run(node, {**conn, "op": "admin", "calls": list(calls)})
