"""Node configuration: one TOML file per node, overridable by environment and flags.

Keys use Apache Kafka's names wherever the concept is the same, so an operator's
knowledge carries over. The file may use quoted dotted keys (``"log.dirs" = ...``),
nested tables (``[log] dirs = ...``) or a mix; both flatten to the same dotted key.

Precedence, lowest to highest: built-in default < file < environment
(``BROOK_LOG_DIRS`` for ``log.dirs``: dots become underscores, upper case) < flags
(``--override log.dirs=/data``). Only known keys are read from the environment, so
unrelated ``BROOK_*`` variables (e.g. the CLI's ``BROOK_BOOTSTRAP``) are ignored.

Invalid or contradictory config is refused at start with a ``ConfigError`` naming the
key. Nothing here starts anything; ``NodeConfig`` builds the settings objects the
roles take (``ControllerSettings``, ``BrokerSettings``).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metadata_quorum import features
from metadata_quorum.quorum_security import check_quorum_protection
from proto.errors import InvalidConfigError
from storage import log_config

log = logging.getLogger(__name__)

ROLE_BROKER = "broker"
ROLE_CONTROLLER = "controller"
LISTENER_BROKER = "BROKER"
LISTENER_CONTROLLER = "CONTROLLER"
LISTENER_REPLICATION = "REPLICATION"  # followers' fetch sessions without gRPC (broker/replication_listener.py)
PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
_LISTENER_NAME = re.compile(r"^[A-Z][A-Z0-9_]{0,31}$")
ENV_PREFIX = "BROOK_"

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


class ConfigError(InvalidConfigError):  # type: ignore[misc, valid-type]
    """Invalid node configuration; ``key`` is the offending key (always in the message)."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"config key '{key}': {problem}")


@dataclass(frozen=True)
class KeyDef:
    name: str
    kind: str  # "int", "long", "bool", "string", "list", "double", "password"
    default: str | None  # None: no default (required where the roles need it)
    doc: str
    topic_key: str | None = None  # the topic config this broker key is the cluster default of
    check: Callable[[Any], str | None] | None = None  # returns a problem text or None
    roles: tuple[str, ...] = (ROLE_BROKER, ROLE_CONTROLLER)  # roles that read it (documentation)


def _buffer_size(value: Any) -> str | None:
    return None if value == -1 or value >= 1024 else "must be -1 (the operating system's default) or at least 1024"


def _at_least(low: int) -> Callable[[Any], str | None]:
    return lambda v: None if v >= low else f"must be at least {low}"


def _between(low: int, high: int, why: str) -> Callable[[Any], str | None]:
    return lambda v: None if low <= v <= high else f"must be between {low} and {high} ({why})"


# A fetch answer is one gRPC message of at most GRPC_MAX_MESSAGE_BYTES (128 MiB, broker/server.py): its byte
# bound, plus one whole first batch beyond it of up to 64 MiB (max.message.bytes' ceiling), plus the answer's
# own fields, must fit. A larger setting made answers no client could be sent (refused by gRPC at the send).
FETCH_BYTES_CEILING = 60 * 1024 * 1024
_FETCH_BYTES = "a fetch answer, with one whole batch beyond it, must fit a 128 MiB message"


def _one_of(*choices: str) -> Callable[[Any], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def _host_port_or_empty(v: str) -> str | None:
    if v == "":
        return None
    try:
        _split_host_port(v)
    except ValueError as e:
        return str(e)
    return None


def per_ip_override_entries(entries: list[str]) -> list[tuple[str, int]]:
    """``max.connections.per.ip.overrides`` (Kafka's key): ``host:count`` entries, an IPv6 address in
    brackets or not (the count is after the last colon); ValueError naming a malformed one."""
    out = []
    for entry in entries:
        host, sep, count = entry.rpartition(":")
        host = host.strip().removeprefix("[").removesuffix("]")
        if not sep or not host or not (count.strip().isascii() and count.strip().isdigit()):
            raise ValueError(f"{entry!r} is not host:count (a host name or IP, and a count of at least 0)")
        out.append((host, int(count)))
    return out


def _per_ip_overrides(v: list[str]) -> str | None:
    try:
        per_ip_override_entries(v)
    except ValueError as e:
        return str(e)
    return None


_B = (ROLE_BROKER,)
_C = (ROLE_CONTROLLER,)
_DAY_MS = 24 * 3600 * 1000

# Node identity, listeners and quorum. Checks here are per value; cross-key rules are
# in ``_validate_cross``.
_CORE = [
    KeyDef("process.roles", "list", None, "broker, controller, or controller,broker (combined)."),
    KeyDef("node.id", "int", None, "Unique id of this node (controller voter id and/or broker id).",
           check=_at_least(0)),
    KeyDef("cluster.id", "string", None, "Cluster name; nodes refuse to join another cluster."),
    KeyDef("listeners", "list", None,
           "NAME://host:port,...: BROKER (clients and replication; the inter-broker listener), CONTROLLER "
           "(controller gRPC), REPLICATION (optional: followers fetch from this broker there, not over gRPC; "
           "same protocol as BROKER) and any extra client listeners of a broker, e.g. LOCAL://127.0.0.1:9192."),
    KeyDef("advertised.listeners", "list", "",
           "NAME://host:port,... clients and peers are told to use; a listener not named here advertises its "
           "bind address.", roles=_B),
    KeyDef("kafka.listener.names", "list", "KAFKA",
           "Listeners (by name) that speak Kafka's wire protocol instead of gRPC, for unmodified Kafka clients "
           "(librdkafka, kcat, kafka-python, aiokafka, Kafka's Java client): e.g. listeners=...,KAFKA://0.0.0.0:9092 "
           "with KAFKA:SASL_SSL in listener.security.protocol.map.", roles=_B),
    KeyDef("listener.security.protocol.map", "list", "BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
           "NAME:PROTOCOL,... (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL). A listener named after a protocol "
           "needs no entry. BROKER and CONTROLLER carry node-to-node traffic: PLAINTEXT or SSL only."),
    KeyDef("ssl.certificate.location", "string", "",
           "PEM certificate (chain) of this node: served on SSL listeners and presented to other nodes."),
    KeyDef("ssl.key.location", "string", "", "PEM private key of ssl.certificate.location."),
    KeyDef("ssl.ca.location", "string", "",
           "PEM CA bundle: verifies client certificates on SSL listeners and the other nodes' certificates."),
    KeyDef("ssl.client.auth", "string", "required",
           "required (mTLS: SSL listeners refuse clients without a certificate from ssl.ca.location) or none.",
           check=_one_of("required", "none")),
    KeyDef("ssl.principal.mapping.rules", "string", "RULE:^CN=([^,]*)(,.*)?$/$1/,DEFAULT",
           "Kafka's RULE:pattern/replacement/[LU],...,DEFAULT applied to a client certificate's subject DN; "
           "the default keeps the CN (CN=alice,O=x is User:alice)."),
    KeyDef("broker.principal.format", "string", "User:node-{id}",
           "Principal a node's own certificate maps to; broker-only requests (registration, heartbeats, "
           "ISR changes, replica fetches) are accepted only from it."),
    KeyDef("security.plaintext.loopback.trusted", "bool", "true",
           "Accept broker-only requests arriving in plaintext from 127.0.0.0/8 or ::1 (single-host dev "
           "clusters); ignored unless every plaintext listener is bound to loopback. Otherwise "
           "broker-only requests need the node's certificate."),
    KeyDef("controller.quorum.voters", "list", None,
           "id@host:grpc_port:raft_port,... of every controller voter (brokers use the gRPC ports)."),
    KeyDef("controller.quorum.password", "password", "",
           "Shared secret authenticating and encrypting the Raft (pysyncobj) traffic between controllers: "
           "at least 16 characters, 8 distinct, ~72 bits (see metadata_quorum/quorum_security.py). Required, "
           "on loopback too: the quorum port runs what it is sent.", roles=_C),
    KeyDef("controller.quorum.election.timeout.ms", "int", "600",
           "Raft election timeout; elections start after a random wait between it and 2.5x it.",
           check=_at_least(50), roles=_C),
    KeyDef("controller.quorum.fetch.timeout.ms", "int", "2000",
           "A Raft leader that has not heard from a majority for this long steps down.", check=_at_least(100),
           roles=_C),
    KeyDef("controller.quorum.request.timeout.ms", "int", "30000",
           "Longest a controller request (e.g. CreateTopics) waits for the quorum to commit it.",
           check=_at_least(100), roles=_C),
    KeyDef("log.dirs", "list", None, "Comma-separated directories holding partition logs.", roles=_B),
    KeyDef("metadata.log.dir", "string", None,
           "Directory of the controller's Raft journal and snapshots.", roles=_C),
    KeyDef("metrics.listener", "string", "127.0.0.1:9100",
           "host:port serving Prometheus /metrics; empty disables.", check=_host_port_or_empty),
    KeyDef("console.listener", "string", "",
           "host:port of the read-only web console (broker/console.py); HTTPS with the node certificate when "
           "the BROKER listener uses TLS, a client certificate required when ssl.client.auth=required; the "
           "viewer needs DESCRIBE on the cluster. Empty disables.", check=_host_port_or_empty, roles=_B),
    KeyDef("health.listener", "string", "",
           "host:port serving plain-HTTP /livez and /readyz for probes (broker/health.py); empty disables.",
           check=_host_port_or_empty),
    KeyDef("metrics.ssl.enable", "bool", "false",
           "Serve /metrics over HTTPS with ssl.certificate.location / ssl.key.location."),
    KeyDef("metrics.ssl.client.auth", "string", "none",
           "required: a /metrics scraper must present a certificate signed by ssl.ca.location.",
           check=_one_of("required", "none")),
    KeyDef("broker.rack", "string", "", "Rack (failure domain) of this broker, for replica placement.",
           roles=_B),
    KeyDef("logging.level", "string", "INFO", "Log level on stderr: DEBUG, INFO, WARNING, ERROR.",
           check=_one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")),
]

# Broker and controller behaviour (Kafka's names and defaults).
_BEHAVIOUR = [
    KeyDef("num.partitions", "int", "1", "Partitions of a topic created without a count.", check=_at_least(1)),
    KeyDef("max.cluster.partitions", "int", "200000",
           "Most partitions the cluster may hold; CreateTopics/CreatePartitions beyond it get POLICY_VIOLATION.",
           check=_at_least(1), roles=_C),
    KeyDef("max.partitions.per.broker", "int", "0",
           "Most partition replicas this broker takes; 0: derived from its file-descriptor limit only "
           "(ulimit -n / 12). It reports the lower of the two when it registers, and the controllers refuse "
           "CreateTopics/CreatePartitions/reassignments past it (POLICY_VIOLATION).",
           check=_at_least(0), roles=_B),
    KeyDef("default.replication.factor", "int", "1", "Replication factor of a topic created without one.",
           check=_at_least(1)),
    KeyDef("auto.create.topics.enable", "bool", "true", "Create a topic on first metadata request/produce."),
    KeyDef("initial.metadata.version", "int", str(features.SUPPORTED_MAX),
           "The brook.metadata.version a new cluster is finalized at by its first active controller (as Kafka formats "
           "a new cluster at its release's metadata.version), once every voter supports it. It never changes an "
           "existing cluster: raise that with brook features upgrade. 1 keeps a new cluster at the level every "
           "release applies.",
           check=_between(features.SUPPORTED_MIN, features.SUPPORTED_MAX, "the levels this release supports"),
           roles=_C),
    KeyDef("auto.leader.rebalance.enable", "bool", "true",
           "The active controller moves leadership back to preferred replicas every "
           "leader.imbalance.check.interval.seconds (brook cluster elect-leaders does it on demand).", roles=_C),
    KeyDef("leader.imbalance.check.interval.seconds", "long", "300",
           "How often the active controller checks for partitions not led by their preferred replica.",
           check=_at_least(1), roles=_C),
    KeyDef("replica.selector.class", "string", "",
           "Which replica a Kafka consumer (Fetch v11+, KIP-392) is told to read from: empty or Kafka's "
           "org.apache.kafka.common.replica.LeaderSelector, the leader; "
           "org.apache.kafka.common.replica.RackAwareReplicaSelector, an in-sync replica in the rack the "
           "consumer names (client.rack), else the leader.",
           check=_one_of("", "org.apache.kafka.common.replica.LeaderSelector",
                         "org.apache.kafka.common.replica.RackAwareReplicaSelector"), roles=_B),
    KeyDef("replica.lag.time.max.ms", "long", "30000",
           "A follower that has not caught up for this long leaves the ISR.", check=_at_least(1), roles=_B),
    KeyDef("replica.fetch.wait.max.ms", "int", "500", "Longest a follower fetch waits for data.",
           check=_at_least(0), roles=_B),
    KeyDef("replica.fetch.max.bytes", "int", "1048576", "Bytes per partition a follower fetch asks for.",
           check=_between(1, FETCH_BYTES_CEILING, _FETCH_BYTES), roles=_B),
    KeyDef("replica.fetch.response.max.bytes", "int", "10485760", "Bytes per follower fetch response.",
           check=_between(1, FETCH_BYTES_CEILING, _FETCH_BYTES), roles=_B),
    KeyDef("replica.fetch.backoff.ms", "int", "200", "Pause of a follower fetcher after a failed fetch.",
           check=_at_least(0), roles=_B),
    KeyDef("fetch.max.bytes", "int", str(55 * 1024 * 1024),
           "Largest Fetch response the broker builds, whatever the request's max_bytes (a first batch "
           "larger than this is still returned whole).", check=_between(1024, FETCH_BYTES_CEILING, _FETCH_BYTES), roles=_B),
    KeyDef("fetch.partition.max.bytes", "int", str(10 * 1024 * 1024),
           "Largest share of one partition in a Fetch response, whatever the request asks.",
           check=_between(1024, FETCH_BYTES_CEILING, _FETCH_BYTES), roles=_B),
    KeyDef("queued.max.request.bytes", "long", str(256 * 1024 * 1024),
           "Bytes of client produce requests and fetch responses the broker holds at once; fetches wait "
           "for their share, produces over it are refused (RESOURCE_EXHAUSTED).", check=_at_least(1024),
           roles=_B),
    KeyDef("max.fetch.response.bytes.per.ip", "long", str(64 * 1024 * 1024),
           "Bytes of fetch responses one client address may hold at once, from the start of their read until "
           "they are written out to it (a client that does not read its answers holds them); its further "
           "fetches wait for its own answers to go out. Part of queued.max.request.bytes.",
           check=_at_least(1024), roles=_B),
    KeyDef("num.io.threads", "int", "8", "Threads doing the blocking work (disk, metadata) of client requests.",
           check=_at_least(1), roles=_B),
    KeyDef("num.recompression.threads", "int", "2",
           "Threads appending produce requests to topics whose compression.type is a codec (each batch in "
           "another codec is decompressed and compressed again): kept apart from num.io.threads, so a flood "
           "of small batches that inflate to many MiB cannot take the threads of other clients' requests.",
           check=_at_least(1), roles=_B),
    KeyDef("num.replica.io.threads", "int", "4",
           "Threads serving follower fetches from other brokers (kept apart from client requests).",
           check=_at_least(1), roles=_B),
    KeyDef("max.inflight.requests.per.ip", "int", "2000",
           "Requests one client address may have in flight, from their arrival until their answer is written "
           "out to it; excess is refused (RESOURCE_EXHAUSTED).",
           check=_at_least(1), roles=_B),
    KeyDef("max.streams.per.connection", "int", "100",
           "HTTP/2 streams one gRPC connection may have open at once (at most max.inflight.requests.per.ip); "
           "a client's further calls wait in the client. A stream reset before the broker handled it counts "
           "until it has, so this also bounds the work one connection can queue with HTTP/2 rapid resets.",
           check=_at_least(1), roles=_B),
    KeyDef("max.receiving.requests", "int", "16",
           "gRPC request messages the broker receives at once (each up to socket.request.max.bytes): a call "
           "past it waits, its message unread beyond HTTP/2's 64 KiB window, for its turn.",
           check=_at_least(1), roles=_B),
    KeyDef("max.receiving.requests.per.ip", "int", "4",
           "Of max.receiving.requests, how many one client address may take; its further calls wait "
           "(256 at most, then RESOURCE_EXHAUSTED).", check=_at_least(1), roles=_B),
    KeyDef("request.receive.timeout.ms", "long", "30000",
           "Longest a gRPC call waits for its turn to be received, and then for its message to arrive; "
           "past it the call ends (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED).", check=_at_least(1), roles=_B),
    KeyDef("max.request.streams.per.ip", "int", "16",
           "Request streams (ProduceStream, FetchStream, ReplicaFetch) of each kind one client address may have "
           "open; more are refused (RESOURCE_EXHAUSTED: producers and consumers then send unary calls for a while).",
           check=_at_least(1), roles=_B),
    KeyDef("max.produce.streams", "int", "64",
           "ProduceStream calls open at once (each may be receiving a request of socket.request.max.bytes); "
           "more are refused and their producers send unary Produce calls for a while.",
           check=_at_least(1), roles=_B),
    KeyDef("max.fetch.streams", "int", "64",
           "FetchStream calls open at once (each may be receiving a request of socket.request.max.bytes); "
           "more are refused and their consumers send unary Fetch calls for a while.",
           check=_at_least(1), roles=_B),
    KeyDef("producer.id.max.tracked", "int", "200000",
           "Idempotent producers whose state (their last batches' sequences, about 1 KB each) all the partition "
           "logs of a broker keep together. Past it, a log taking a new producer forgets its least recently "
           "active one, whose next batch is answered UNKNOWN_PRODUCER_ID (the client restarts its sequence).",
           check=_at_least(1000), roles=_B),
    KeyDef("producer.id.expiration.ms", "long", "86400000",
           "An idempotent producer whose last batch's timestamp is this old is forgotten by each partition log "
           "(Kafka's, KIP-854): its next batch is answered UNKNOWN_PRODUCER_ID and the client restarts its "
           "sequence. Checked every producer.id.expiration.check.interval.ms.",
           check=_at_least(1), roles=_B),
    KeyDef("producer.id.expiration.check.interval.ms", "int", "600000",
           "How often the partition logs forget producers past producer.id.expiration.ms.",
           check=_at_least(1), roles=_B),
    KeyDef("max.connections", "int", "10000",
           "Client connections the broker's port accepts at once (at most half the file-descriptor limit), and "
           "the controller's port (at most an eighth of it); more are refused at accept.", check=_at_least(1)),
    KeyDef("max.connections.per.ip", "int", "1000",
           "Connections one client address may have open on each Kafka listener (Kafka's max.connections.per.ip), "
           "and on the broker's gRPC ports together and the controller's port; more are closed (at accept on a "
           "Kafka listener; within half a second on a gRPC port), so one address cannot take all max.connections.",
           check=_at_least(1)),
    KeyDef("max.connections.per.ip.overrides", "list", "",
           "host:count,... (Kafka's key): max.connections.per.ip for these client addresses instead, e.g. "
           "10.0.0.7:5000 for a NAT many clients share, or 0 to close every connection of an address. A host "
           "name stands for every address it resolves to when the node starts; one that does not resolve is "
           "skipped with a WARNING.", check=_per_ip_overrides),
    KeyDef("request.cpu.max.percent.per.ip", "int", "50",
           "Share of one core (the broker's interpreter) the requests of one client address may take while the "
           "broker has requests from other addresses too: the work of the client threads and of the event loop "
           "for them, summed over the last second. An address over it has its next requests wait before they "
           "start (as Kafka's request quota throttles a client), one at a time, until it is back under. A lone "
           "client is never held. 0: no bound.", check=_between(0, 100, "a percentage of one core"), roles=_B),
    KeyDef("max.waiting.fetches.per.ip", "int", "1000",
           "Long-poll fetches one client address may have parked; excess is refused (RESOURCE_EXHAUSTED).",
           check=_at_least(0), roles=_B),
    KeyDef("event.loop.stall.warn.ms", "int", "250",
           "A broker event loop this late is a stall: counted (brook_event_loop_stalls_total), and logged at "
           "WARNING with the loop thread's stack while it lasts (rate-limited).", check=_at_least(10), roles=_B),
    KeyDef("event.loop.stall.fence.ms", "int", "5000",
           "A broker whose event loop has not run for this long (stuck: a hung disk, a deadlock) stops "
           "heartbeating, so that the controller fences it and moves its leaderships to in-sync replicas; it "
           "heartbeats again once the loop runs. 0: never; else at least 1000 (the loop's probe runs every "
           "50 ms: a shorter bound would fence a healthy broker).",
           check=lambda v: None if v == 0 or v >= 1000 else "must be 0 (never) or at least 1000", roles=_B),
    KeyDef("replica.high.watermark.checkpoint.interval.ms", "long", "5000",
           "How often high watermarks are checkpointed.", check=_at_least(1), roles=_B),
    KeyDef("broker.session.timeout.ms", "int", "9000",
           "A broker that has not heartbeated the controller for this long is fenced.", check=_at_least(1)),
    KeyDef("broker.heartbeat.interval.ms", "int", "2000", "Broker to controller heartbeat period.",
           check=_at_least(1)),
    KeyDef("controlled.shutdown.enable", "bool", "true",
           "On SIGTERM move leaderships away before stopping.", roles=_B),
    KeyDef("controlled.shutdown.timeout.ms", "long", "30000",
           "Longest a controlled shutdown waits for leaderships to move.", check=_at_least(0), roles=_B),
    KeyDef("socket.request.max.bytes", "int", str(8 * 1024 * 1024),
           "Largest request accepted (gRPC message, or Kafka-listener frame: a larger size prefix closes the "
           "connection unread). Kafka's default is 100 MiB; Brook's is 8 MiB (8 times a producer's default "
           "max.request.size) because each gRPC request being received may hold this much before it can be "
           "refused: raise it with your producers' max.request.size.", check=_at_least(1024)),
    KeyDef("connections.max.idle.ms", "long", "600000",
           "A connection with no request for this long is closed: on a Kafka listener, no request; on the "
           "broker's gRPC port, no call open (gRPC's max_connection_idle: the client is sent GOAWAY and reconnects "
           "on its next call). Controllers close theirs after the default.", check=_at_least(1), roles=_B),
    KeyDef("socket.send.buffer.bytes", "int", "102400",
           "The kernel's send buffer (SO_SNDBUF) of each Kafka-listener connection; -1 for the operating system's "
           "own (on Linux it grows to net.ipv4.tcp_wmem's maximum, 4 MiB by default, for each connection whose "
           "client reads slowly or not at all). Kafka's key and default.",
           check=_buffer_size, roles=_B),
    KeyDef("socket.receive.buffer.bytes", "int", "102400",
           "The kernel's receive buffer (SO_RCVBUF) of each Kafka-listener connection; -1 for the operating "
           "system's own. Kafka's key and default.", check=_buffer_size, roles=_B),
    KeyDef("sasl.server.max.receive.size", "int", "65536",
           "Largest frame a SASL Kafka-listener client may send before it has authenticated (ApiVersions, "
           "SaslHandshake, SaslAuthenticate); a larger size prefix closes the connection unread. Such frames are "
           "held in a 16 MiB pool of their own, not queued.max.request.bytes. Kafka's key (its default: 512 KiB).",
           check=_at_least(1024), roles=_B),
    KeyDef("kafka.authentication.timeout.ms", "long", "10000",
           "A client of a SASL (or SSL) Kafka listener must finish the TLS handshake and authenticate within this "
           "long, or it is disconnected.", check=_at_least(1), roles=_B),
    KeyDef("kafka.request.timeout.ms", "long", "30000",
           "Longest a Kafka-listener request may take to arrive once its size is read, and longest one waits "
           "for the broker's in-flight bounds before the connection is closed (a group's JoinGroup and SyncGroup "
           "are held as long as the group's rebalance needs, as Kafka holds them).", check=_at_least(1), roles=_B),
    KeyDef("offsets.topic.replication.factor", "int", "3", "Replication factor of __consumer_offsets.",
           check=_at_least(1), roles=_B),
    KeyDef("offsets.topic.num.partitions", "int", "50", "Partitions of __consumer_offsets.",
           check=_at_least(1), roles=_B),
    KeyDef("offsets.topic.segment.bytes", "int", str(100 * 1024 * 1024), "segment.bytes of __consumer_offsets.",
           check=_at_least(14), roles=_B),
    KeyDef("offsets.retention.minutes", "int", "10080", "Committed offsets of an empty group expire after.",
           check=_at_least(1), roles=_B),
    KeyDef("offsets.retention.check.interval.ms", "long", "600000",
           "How often the group coordinator expires old committed offsets.",
           check=_at_least(1), roles=_B),
    KeyDef("offsets.commit.timeout.ms", "int", "5000",
           "Longest an offset commit waits for the offsets topic replicas (acks=all).",
           check=_at_least(1), roles=_B),
    KeyDef("transaction.state.log.num.partitions", "int", "50", "Partitions of __transaction_state (made at the "
           "first transactional producer's FindCoordinator).", check=_at_least(1), roles=_B),
    KeyDef("transaction.state.log.replication.factor", "int", "3", "Replication factor of __transaction_state "
           "(at most the live brokers when it is made).", check=_at_least(1), roles=_B),
    KeyDef("transaction.state.log.min.isr", "int", "2", "min.insync.replicas of __transaction_state.",
           check=_at_least(1), roles=_B),
    KeyDef("transaction.state.log.segment.bytes", "int", str(100 * 1024 * 1024),
           "segment.bytes of __transaction_state.", check=_at_least(14), roles=_B),
    KeyDef("transaction.max.timeout.ms", "int", "900000",
           "Largest transaction.timeout.ms a transactional producer may ask for (InitProducerId answers "
           "INVALID_TRANSACTION_TIMEOUT above it). A transaction left open holds back read_committed consumers "
           "of its partitions until it ends or times out.", check=_at_least(1), roles=_B),
    KeyDef("transactional.id.expiration.ms", "int", "604800000",
           "A transactional id with no transaction for this long is forgotten by its coordinator.",
           check=_at_least(1), roles=_B),
    KeyDef("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", "10000",
           "How often the transaction coordinator aborts transactions open longer than their timeout (their "
           "producer is fenced).", check=_at_least(1), roles=_B),
    KeyDef("transaction.remove.expired.transaction.cleanup.interval.ms", "int", "3600000",
           "How often the transaction coordinator forgets transactional ids past transactional.id.expiration.ms.",
           check=_at_least(1), roles=_B),
    KeyDef("offset.metadata.max.bytes", "int", "4096", "Largest metadata string of a committed offset.",
           check=_between(0, 32767, "the metadata is a string of Kafka's offset record, whose length is an int16"),
           roles=_B),
    KeyDef("group.initial.rebalance.delay.ms", "int", "3000",
           "Wait for more members before the first rebalance of a new group.", check=_at_least(0), roles=_B),
    KeyDef("group.min.session.timeout.ms", "int", "6000", "Smallest consumer session timeout accepted.",
           check=_at_least(1), roles=_B),
    KeyDef("group.max.session.timeout.ms", "int", "1800000", "Largest consumer session timeout accepted.",
           check=_at_least(1), roles=_B),
    KeyDef("group.consumer.heartbeat.interval.ms", "int", "5000",
           "How often members of Kafka's consumer protocol (KIP-848: librdkafka's group.protocol=consumer) "
           "heartbeat; the coordinator tells them in each answer, and a reassignment reaches a member at its next "
           "heartbeat.", check=_at_least(100), roles=_B),
    KeyDef("group.consumer.session.timeout.ms", "int", "45000",
           "A member of Kafka's consumer protocol silent this long is removed from its group and its partitions "
           "are assigned to the others; a static member that left for a restart keeps them this long.",
           check=_at_least(1000), roles=_B),
    KeyDef("group.member.metadata.max.bytes", "int", "1048576",
           "Largest protocol metadata (summed over a JoinGroup's protocols) or assignment one group member "
           "may hand the coordinator; larger is refused with INVALID_REQUEST.", check=_at_least(1024), roles=_B),
    KeyDef("group.coordinator.metadata.max.bytes", "long", "268435456",
           "Bytes of protocol metadata and assignments, and 512 a member (pending ones too), a broker's group "
           "coordinator keeps for the members of all its groups; a JoinGroup or SyncGroup that would pass it "
           "is refused with the retriable COORDINATOR_NOT_AVAILABLE.", check=_at_least(1 << 20), roles=_B),
    KeyDef("group.coordinator.metadata.max.bytes.per.ip", "long", "67108864",
           "Of group.coordinator.metadata.max.bytes, what the members at one client address may hold (their "
           "metadata, assignments and ids, and 512 a member); a JoinGroup or SyncGroup that would pass it is "
           "refused with the retriable COORDINATOR_NOT_AVAILABLE, so one address cannot fill the coordinator "
           "for every other's members.", check=_at_least(1 << 20), roles=_B),
    KeyDef("group.coordinator.offsets.max.bytes", "long", "268435456",
           "Bytes a broker's group coordinator keeps for committed offsets (256 a partition's offset, plus its "
           "topic name and metadata) and groups (1,024 each, plus the id) over all its groups; a commit that "
           "would pass it with a new offset, longer metadata or a new group is refused with the retriable "
           "COORDINATOR_NOT_AVAILABLE (commits that add nothing are always taken).", check=_at_least(1 << 20),
           roles=_B),
    KeyDef("group.coordinator.offsets.max.bytes.per.ip", "long", "67108864",
           "Of group.coordinator.offsets.max.bytes, what the groups one client address made on a coordinator (by "
           "its first commit or join there) may hold; a commit past it is refused with the retriable "
           "COORDINATOR_NOT_AVAILABLE, so one address cannot fill the coordinator for every other's new groups. "
           "A coordinator that loads the groups after a restart or failover counts them there too.",
           check=_at_least(1 << 20), roles=_B),
    KeyDef("group.coordinator.record.format", "string", "kafka",
           "How the group coordinator writes __consumer_offsets: kafka (Kafka's record layouts, which tools such "
           "as Burrow read) or brook (the earlier values, which releases before the Kafka layouts read: set it on "
           "every node while upgrading a cluster from such a release, and remove it once every node runs this "
           "one; both are always read).", check=_one_of("kafka", "brook"), roles=_B),
    KeyDef("group.lag.metrics.max.series", "int", "1000",
           "Group-partition rows /metrics shows in brook_consumer_group_committed_offset and "
           "brook_consumer_group_lag, the largest lags first (the rest are counted in "
           "brook_consumer_group_lag_rows_left_out): group ids are chosen by clients, so without a bound any "
           "client allowed to commit offsets could grow every scrape without end. 0 shows none.",
           check=_at_least(0), roles=_B),
    KeyDef("log.flush.scheduler.interval.ms", "long", "1000", "How often the flusher checks logs.",
           check=_at_least(1), roles=_B),
    KeyDef("log.retention.check.interval.ms", "long", "300000", "How often retention runs.",
           check=_at_least(1), roles=_B),
    KeyDef("log.cleaner.enable", "bool", "true", "Run the log cleaner (compaction).", roles=_B),
    KeyDef("log.cleaner.threads", "int", "1", "Log cleaner threads.", check=_at_least(0), roles=_B),
    KeyDef("log.cleaner.backoff.ms", "long", "15000",
           "How long a cleaner thread sleeps when no log needs cleaning (Kafka's key).", check=_at_least(1),
           roles=_B),
    KeyDef("log.cleaner.dedupe.buffer.size", "long", "33554432",
           "Memory for the cleaners' key maps, shared by the cleaner threads (Kafka's key; a key costs about "
           "160 bytes here, 24 in Kafka, so 32 MiB maps about 200,000 keys a thread). A pass maps as many dirty "
           "keys as fit and cleans up to there; the next one goes on from it.",
           check=_at_least(1 << 20), roles=_B),
    KeyDef("log.scrubber.enable", "bool", "true",
           "Read every segment again now and then (the active one up to where it ends then) and check each "
           "batch's CRC (storage/scrubber.py).",
           roles=_B),
    KeyDef("log.scrubber.bytes.per.second", "long", "1048576", "The log scrubber's read rate.",
           check=_at_least(1), roles=_B),
    KeyDef("log.scrubber.interval.ms", "long", "604800000",
           "How often a scrubber pass over every log starts (the first one 10 minutes after the start).",
           check=_at_least(1), roles=_B),
]

# Authentication, authorization and quotas (broker/authorizer.py, broker/sasl.py, broker/quotas.py).
_SECURITY = [
    KeyDef("authorizer.class.name", "string", "",
           "StandardAuthorizer checks Kafka ACLs on every RPC; empty allows everything (no authorizer).",
           check=_one_of("", "StandardAuthorizer", "org.apache.kafka.metadata.authorizer.StandardAuthorizer")),
    KeyDef("super.users", "string", "",
           "Principals allowed everything, ';'-separated (User:admin;User:ops). Brokers' own principals always are."),
    KeyDef("allow.everyone.if.no.acl.found", "bool", "false",
           "With an authorizer: allow an operation on a resource no ACL mentions at all."),
    KeyDef("sasl.session.lifetime.ms", "long", "3600000",
           "Lifetime of a SASL/SCRAM session token; the client re-authenticates after it.", check=_at_least(1000)),
    KeyDef("scram.bootstrap.users", "password", "",
           "user:password,... SCRAM users the active controller creates if missing (the first admin).", roles=_C),
    KeyDef("inter.broker.sasl.username", "string", "",
           "SCRAM user this node authenticates as to other nodes over PLAINTEXT BROKER/CONTROLLER listeners (list "
           "it in super.users); on SSL ones the node certificate is the identity. Empty: none."),
    KeyDef("inter.broker.sasl.password", "password", "", "Password of inter.broker.sasl.username."),
    KeyDef("quota.window.num", "int", "11", "Samples a client quota's rate is measured over.", check=_at_least(2),
           roles=_B),
    KeyDef("quota.window.size.seconds", "int", "1", "Length of one quota sample.", check=_at_least(1), roles=_B),
]

# Cluster defaults of topic configs, with Kafka's broker-level names. Value syntax and
# checks come from storage/log_config.py (the topic config schema).
_TOPIC_DEFAULTS = [
    ("log.segment.bytes", "segment.bytes"),
    ("log.roll.ms", "segment.ms"),
    ("log.roll.jitter.ms", "segment.jitter.ms"),
    ("log.index.size.max.bytes", "segment.index.bytes"),
    ("log.index.interval.bytes", "index.interval.bytes"),
    ("log.retention.ms", "retention.ms"),
    ("log.retention.bytes", "retention.bytes"),
    ("log.cleanup.policy", "cleanup.policy"),
    ("log.flush.interval.messages", "flush.messages"),
    ("log.flush.interval.ms", "flush.ms"),
    ("log.segment.delete.delay.ms", "file.delete.delay.ms"),
    ("log.cleaner.delete.retention.ms", "delete.retention.ms"),
    ("log.cleaner.min.compaction.lag.ms", "min.compaction.lag.ms"),
    ("log.cleaner.max.compaction.lag.ms", "max.compaction.lag.ms"),
    ("log.cleaner.min.cleanable.ratio", "min.cleanable.dirty.ratio"),
    ("log.message.timestamp.type", "message.timestamp.type"),
    ("log.message.timestamp.before.max.ms", "message.timestamp.before.max.ms"),
    ("log.message.timestamp.after.max.ms", "message.timestamp.after.max.ms"),
    ("message.max.bytes", "max.message.bytes"),
    ("compression.type", "compression.type"),
    ("compression.gzip.level", "compression.gzip.level"),
    ("compression.lz4.level", "compression.lz4.level"),
    ("compression.zstd.level", "compression.zstd.level"),
    ("min.insync.replicas", "min.insync.replicas"),
    ("unclean.leader.election.enable", "unclean.leader.election.enable"),
]
# Coarser-unit spellings Kafka accepts; the finer one wins when several are set (Kafka: log.retention.ms,
# then .minutes, then .hours), so each key's finer spellings come first: the first one set is applied.
_COARSE_UNITS = {
    "log.retention.minutes": ("log.retention.ms", 60 * 1000),
    "log.retention.hours": ("log.retention.ms", 3600 * 1000),
    "log.roll.hours": ("log.roll.ms", 3600 * 1000),
    "log.roll.jitter.hours": ("log.roll.jitter.ms", 3600 * 1000),
}
# Each coarse key -> (the key it stands for, its unit in ms), in the order ``_apply_coarse_units`` applies them
# (the first one set wins over those after it). DescribeConfigs of a BROKER resource lists them as synonyms.
COARSE_UNITS: Mapping[str, tuple[str, int]] = _COARSE_UNITS


def _topic_key_defs() -> list[KeyDef]:
    out = []
    for broker_key, topic_key in _TOPIC_DEFAULTS:
        d = log_config.TOPIC_CONFIGS[topic_key]
        out.append(KeyDef(broker_key, "topic", None, f"Cluster default of topic config {topic_key}: {d.doc}",
                          topic_key=topic_key, roles=(ROLE_BROKER, ROLE_CONTROLLER)))
    for coarse, (fine, factor) in _COARSE_UNITS.items():
        # Kafka's bounds: log.roll.hours at least 1, log.roll.jitter.hours at least 0, retention -1 (forever) or
        # more; and at most what fits the millisecond key once multiplied.
        low = 1 if coarse == "log.roll.hours" else 0 if coarse == "log.roll.jitter.hours" else -1
        out.append(KeyDef(coarse, "long", None, f"{fine} in coarser units ({fine} wins if both are set).",
                          check=_between(low, _INT64_MAX // factor, f"{fine} is a long of milliseconds")))
    return out


def _index(defs: list[KeyDef]) -> dict[str, KeyDef]:
    """Name -> definition; a name defined twice is a programming error, not a silent override."""
    index: dict[str, KeyDef] = {}
    for d in defs:
        if d.name in index:
            raise AssertionError(f"node config key {d.name!r} is defined twice")
        index[d.name] = d
    return index


KEYS: Mapping[str, KeyDef] = _index([*_CORE, *_BEHAVIOUR, *_SECURITY, *_topic_key_defs()])


_REQUIRED = ("process.roles", "node.id", "cluster.id", "listeners", "controller.quorum.voters")
_REQUIRED_BY_ROLE = {"log.dirs": ROLE_BROKER, "metadata.log.dir": ROLE_CONTROLLER}


def keys_markdown() -> str:
    """Every node config key as a Markdown table (``brook-server --describe-config``)."""
    rows = ["| key | type | default | roles | what it does |", "| --- | --- | --- | --- | --- |"]
    for d in KEYS.values():
        kind = "topic default" if d.kind == "topic" else d.kind
        if d.topic_key is not None:
            default = log_config.TOPIC_CONFIGS[d.topic_key].default
        elif d.default is not None:
            default = d.default or '""'
        elif d.name in _REQUIRED:
            default = "(required)"
        elif d.name in _REQUIRED_BY_ROLE:
            default = f"(required: {_REQUIRED_BY_ROLE[d.name]})"
        else:
            default = "(unset)"
        rows.append(f"| `{d.name}` | {kind} | `{default}` | {','.join(d.roles)} | {d.doc} |")
    return "\n".join(rows)


def env_var(key: str) -> str:
    """Environment variable overriding ``key``: ``log.dirs`` -> ``BROOK_LOG_DIRS``."""
    return ENV_PREFIX + key.replace(".", "_").replace("-", "_").upper()


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Listener:
    name: str
    host: str
    port: int
    protocol: str = "PLAINTEXT"
    advertised_host: str = ""
    advertised_port: int = 0

    @property
    def advertised(self) -> tuple[str, int]:
        return (self.advertised_host or self.host, self.advertised_port or self.port)

    @property
    def uses_ssl(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)


@dataclass(frozen=True)
class Voter:
    node_id: int
    host: str
    grpc_port: int
    raft_port: int


class NodeDefaults(dict[str, str]):
    """``NodeConfig.defaults()``, the dict the settings objects take, remembering the config it came from
    (``node``): a broker describing its own configs (DescribeConfigs of a BROKER resource) tells the keys the
    operator set (STATIC_BROKER_CONFIG) from those left at their default (DEFAULT_CONFIG) by it."""

    def __init__(self, values: Mapping[str, str], node: NodeConfig) -> None:
        super().__init__(values)
        self.node = node


@dataclass(frozen=True)
class NodeConfig:
    """A validated node configuration. ``values`` holds every known key, typed."""

    values: Mapping[str, Any]
    explicit: frozenset[str]  # keys set by file, environment or flag (not defaults)
    source: Path | None = None
    listeners: Mapping[str, Listener] = field(default_factory=dict)
    voters: Mapping[int, Voter] = field(default_factory=dict)
    # The keys as the operator wrote them: ``explicit`` less the keys only derived from a coarser unit
    # (log.retention.ms from log.retention.hours). None: the same as ``explicit``.
    given: frozenset[str] | None = None

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def set_by_operator(self) -> frozenset[str]:
        """The keys the file, the environment or a flag set, as written (not defaulted, not derived)."""
        return self.explicit if self.given is None else self.given

    def text(self, key: str) -> str | None:
        """``key``'s value as its config text (``true``, ``a,b``), None when it has none."""
        value = self.values.get(key)
        return None if value is None else _to_text(value)

    @property
    def node_id(self) -> int:
        return int(self.values["node.id"])

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(self.values["process.roles"])

    @property
    def is_broker(self) -> bool:
        return ROLE_BROKER in self.roles

    @property
    def is_controller(self) -> bool:
        return ROLE_CONTROLLER in self.roles

    @property
    def cluster_id(self) -> str:
        return str(self.values["cluster.id"])

    @property
    def log_dirs(self) -> list[Path]:
        return [Path(p) for p in self.values["log.dirs"] or []]

    @property
    def metadata_log_dir(self) -> Path | None:
        v = self.values["metadata.log.dir"]
        return Path(v) if v else None

    @property
    def metrics_address(self) -> tuple[str, int] | None:
        v = self.values["metrics.listener"]
        return _split_host_port(v) if v else None

    @property
    def console_address(self) -> tuple[str, int] | None:
        v = self.values["console.listener"]
        return _split_host_port(v) if v else None

    def console_tls(self) -> Any:
        """The console's TLS context: the BROKER listener's protocol and certificate (None: plaintext)."""
        broker = self.listeners.get(LISTENER_BROKER)
        if broker is None or not broker.uses_ssl:
            return None
        from broker.http_serving import tls_context

        return tls_context(self.values["ssl.certificate.location"], self.values["ssl.key.location"],
                           self.values["ssl.ca.location"] or None,
                           str(self.values["ssl.client.auth"]).lower() == "required")

    @property
    def health_address(self) -> tuple[str, int] | None:
        v = self.values["health.listener"]
        return _split_host_port(v) if v else None

    @property
    def controller_endpoints(self) -> list[tuple[str, int]]:
        return [(v.host, v.grpc_port) for v in sorted(self.voters.values(), key=lambda v: v.node_id)]

    @property
    def quorum_password(self) -> str | None:
        return self.values["controller.quorum.password"] or None

    def topic_defaults(self) -> dict[str, str]:
        """Cluster defaults of topic configs, by topic config name (``segment.bytes``)."""
        out: dict[str, str] = {}
        for d in KEYS.values():
            if d.topic_key is not None and self.values.get(d.name) is not None:
                out[d.topic_key] = str(self.values[d.name])
        return out

    def defaults(self) -> NodeDefaults:
        """The ``defaults`` of the settings objects: every behaviour key by its Kafka broker
        name (``num.partitions``, ``replica.lag.time.max.ms``, ``log.segment.bytes``, ...) plus
        the topic defaults by topic config name (``segment.bytes``), all as strings; it remembers
        this config (``NodeDefaults.node``)."""
        structural = {d.name for d in _CORE}
        out: dict[str, str] = {}
        for name, value in self.values.items():
            if name in structural or value is None or name in _COARSE_UNITS:
                continue
            out[name] = _to_text(value)
        out.update(self.topic_defaults())
        return NodeDefaults(out, self)

    def controller_settings(self) -> Any:
        """metadata_quorum.node.ControllerSettings for this node (controller role)."""
        from metadata_quorum.node import ControllerSettings, VoterAddress

        if self.metadata_log_dir is None:  # validated already; keeps type checkers honest
            raise ConfigError("metadata.log.dir", "required for the controller role")
        voters = {v.node_id: VoterAddress(v.host, v.grpc_port, v.raft_port) for v in self.voters.values()}
        return ControllerSettings(
            node_id=self.node_id,
            voters=voters,
            data_dir=self.metadata_log_dir,
            cluster_id=self.cluster_id,
            password=self.quorum_password,
            tls=self.server_tls(LISTENER_CONTROLLER),
            peer_security=self.node_security(LISTENER_CONTROLLER),
            broker_session_timeout_ms=int(self.values["broker.session.timeout.ms"]),
            broker_heartbeat_interval_ms=int(self.values["broker.heartbeat.interval.ms"]),
            defaults=self.defaults(),
            **self._quorum_timing(),
        )

    def _quorum_timing(self) -> dict[str, Any]:
        """Only what the operator set: otherwise the quorum's own tuned defaults apply."""
        from dataclasses import replace

        from metadata_quorum.raft import RaftTiming

        out: dict[str, Any] = {}
        changes: dict[str, float] = {}
        if "controller.quorum.election.timeout.ms" in self.explicit:
            election_s = self.values["controller.quorum.election.timeout.ms"] / 1000
            changes.update(election_timeout_min_s=election_s, election_timeout_max_s=2.5 * election_s)
        if "controller.quorum.fetch.timeout.ms" in self.explicit:
            changes["leader_fallback_timeout_s"] = self.values["controller.quorum.fetch.timeout.ms"] / 1000
        if changes:
            out["raft_timing"] = replace(RaftTiming(), **changes)
        if "controller.quorum.request.timeout.ms" in self.explicit:
            out["request_timeout_ms"] = int(self.values["controller.quorum.request.timeout.ms"])
        return out

    def broker_settings(self) -> Any:
        """broker.server.BrokerSettings for this node (broker role)."""
        from broker.server import BrokerSettings, ListenerSpec

        listener = self.listeners[LISTENER_BROKER]
        kafka = {str(n).strip().upper() for n in self.values["kafka.listener.names"] or []}
        extra = [ListenerSpec(lst.name, lst.host, lst.port, self.server_tls(lst.name), lst.advertised, lst.protocol,
                              wire="replication" if lst.name == LISTENER_REPLICATION
                              else "kafka" if lst.name in kafka else "grpc")
                 for lst in self.listeners.values() if lst.name not in (LISTENER_BROKER, LISTENER_CONTROLLER)]
        return BrokerSettings(
            node_id=self.node_id,
            host=listener.host,
            port=listener.port,
            rack=str(self.values["broker.rack"]),
            log_dirs=self.log_dirs,
            cluster_id=self.cluster_id,
            controller_endpoints=self.controller_endpoints,
            defaults=self.defaults(),
            tls=self.server_tls(LISTENER_BROKER),
            advertised=listener.advertised,
            extra_listeners=extra,
            inter_broker_security=self.node_security(LISTENER_BROKER),
            controller_security=self.node_security(LISTENER_CONTROLLER),
        )

    # ---- security ----
    def listener_protocol(self, name: str) -> str:
        """Protocol of listener ``name``; CONTROLLER on a broker-only node comes from the map."""
        if name in self.listeners:
            return self.listeners[name].protocol
        protocols = _parse_protocol_map(self.values["listener.security.protocol.map"] or [])
        return protocols.get(name, PLAINTEXT)

    def server_tls(self, name: str) -> Any:
        """broker.tls.ServerTls of listener ``name``, or None for a plaintext one."""
        from broker.tls import CLIENT_AUTH_NONE, ServerTls

        protocol = self.listener_protocol(name)
        if protocol not in (SSL, SASL_SSL):
            return None
        # On SASL_SSL the password authenticates; a client certificate is not asked for.
        client_auth = CLIENT_AUTH_NONE if protocol == SASL_SSL else str(self.values["ssl.client.auth"])
        return ServerTls(Path(self.values["ssl.certificate.location"]), Path(self.values["ssl.key.location"]),
                         Path(self.values["ssl.ca.location"]) if self.values["ssl.ca.location"] else None,
                         client_auth)

    def node_security(self, name: str) -> Any:
        """client.security.SecurityConfig this node uses to reach listener ``name`` of other nodes."""
        from client.security import SecurityConfig

        protocol = self.listener_protocol(name)
        if protocol == PLAINTEXT:
            user = str(self.values["inter.broker.sasl.username"] or "").strip()
            if user:  # a plaintext cluster with an authorizer: the nodes' own (super) SCRAM user
                return SecurityConfig(protocol=SASL_PLAINTEXT, sasl_mechanism="SCRAM-SHA-512", sasl_username=user,
                                      sasl_password=str(self.values["inter.broker.sasl.password"] or ""))
            return SecurityConfig()
        if protocol != SSL:
            raise ConfigError("listener.security.protocol.map", f"{name} must be PLAINTEXT or SSL, not {protocol}")
        v = self.values
        if not (v["ssl.ca.location"] and v["ssl.certificate.location"] and v["ssl.key.location"]):
            raise ConfigError("ssl.certificate.location", f"the {name} listener is SSL: this node needs "
                                                          "ssl.certificate.location, ssl.key.location and "
                                                          "ssl.ca.location to reach it")
        return SecurityConfig(protocol=SSL, ssl_ca_location=v["ssl.ca.location"],
                              ssl_certificate_location=v["ssl.certificate.location"],
                              ssl_key_location=v["ssl.key.location"])

    def metrics_tls(self) -> dict[str, Any] | None:
        """Keyword arguments of NodeMetrics.serve for HTTPS, or None for plain HTTP."""
        if not self.values["metrics.ssl.enable"]:
            return None
        required = self.values["metrics.ssl.client.auth"] == "required"
        return {"certfile": self.values["ssl.certificate.location"], "keyfile": self.values["ssl.key.location"],
                "client_cafile": self.values["ssl.ca.location"] if required else None,
                "client_auth_required": required}

    def plaintext_listeners_are_local(self) -> bool:
        """Every plaintext listener of this node is bound to a loopback address (none reachable from outside)."""
        from broker import principal

        return all(principal.is_loopback_host(lst.host) for lst in self.listeners.values() if not lst.uses_ssl)

    def configure_principals(self) -> None:
        """Install this node's principal rules in broker.principal (process-wide, at node start).

        Plaintext callers are trusted as nodes only when the key allows it *and* every
        plaintext listener is bound to loopback: a plaintext listener on the network
        cannot tell a node from anyone else, so broker-only requests need certificates.
        """
        from broker import principal

        trusted = bool(self.values["security.plaintext.loopback.trusted"])
        if trusted and not self.plaintext_listeners_are_local():
            log.warning("plaintext listeners are reachable beyond loopback: broker-only requests (registration, "
                        "heartbeats, ISR changes, replica fetches) are accepted only with node certificates")
            trusted = False
        inter_user = str(self.values["inter.broker.sasl.username"] or "").strip()
        principal.configure(mapping_rules=self.values["ssl.principal.mapping.rules"],
                            node_principal_format=self.values["broker.principal.format"],
                            trust_loopback_plaintext=trusted,
                            loopback_node_principal=principal.Principal(principal.USER, inter_user) if inter_user
                            else None)


# ----------------------------------------------------------------------------- loading


def load_config(
    path: str | Path | None,
    overrides: Iterable[str] | Mapping[str, str] = (),
    *,
    env: Mapping[str, str] | None = None,
) -> NodeConfig:
    """Read, merge and validate a node config; raise ConfigError naming the bad key."""
    raw: dict[str, tuple[Any, str]] = {}  # key -> (value, where it came from)
    if path is not None:
        for key, value in read_toml(Path(path)).items():
            raw[key] = (value, f"file {path}")
    environ = os.environ if env is None else env
    for key in KEYS:
        var = env_var(key)
        if var in environ:
            raw[key] = (environ[var], f"environment {var}")
    for key, value in _parse_overrides(overrides).items():
        raw[key] = (value, "--override")
    return build_config(raw, source=Path(path) if path is not None else None)


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file and flatten it to dotted keys."""
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("--config", f"file {path} does not exist") from None
    except OSError as e:
        raise ConfigError("--config", f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", f"{path} is not valid TOML: {e}{_quote_line(path, str(e))}") from None
    return flatten(doc)


def _quote_line(path: Path, message: str) -> str:
    """The offending line, so a duplicate or malformed key is named, not just numbered."""
    match = re.search(r"at line (\d+)", message)
    if match is None:
        return ""
    lines = path.read_text(errors="replace").splitlines()
    n = int(match.group(1))
    return f": {lines[n - 1].strip()!r}" if 0 < n <= len(lines) else ""


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"log": {"dirs": x}, "log.retention.ms": y}`` -> ``{"log.dirs": x, "log.retention.ms": y}``."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        key = f"{prefix}{k}"
        items = flatten(v, key + ".") if isinstance(v, dict) else {key: v}
        for fk, fv in items.items():
            if fk in out:
                raise ConfigError(fk, "set twice in the file (as a dotted key and in a table)")
            out[fk] = fv
    return out


def _parse_overrides(overrides: Iterable[str] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(overrides, Mapping):
        return {str(k).strip(): str(v) for k, v in overrides.items()}
    out: dict[str, str] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(item, "an override must look like key=value")
        out[key.strip()] = value
    return out


def build_config(raw: Mapping[str, tuple[Any, str]], *, source: Path | None = None) -> NodeConfig:
    """Type, default and validate merged raw values (key -> (value, origin))."""
    values: dict[str, Any] = {}
    for key, (value, origin) in raw.items():
        d = KEYS.get(key)
        if d is None:
            raise ConfigError(key, f"unknown key (from {origin}){_suggest(key)}")
        values[key] = _coerce(d, value, origin)
    given = frozenset(values)
    _apply_coarse_units(values)
    explicit = frozenset(values)
    for key, d in KEYS.items():
        if key not in values:
            values[key] = None if d.default is None else _coerce(d, d.default, "default")
    listeners, voters = _validate_cross(values)
    return NodeConfig(values=values, explicit=explicit, source=source, listeners=listeners, voters=voters,
                      given=given)


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, list(KEYS), n=1, cutoff=0.75)
    return f"; did you mean '{close[0]}'?" if close else ""


def _to_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _coerce(d: KeyDef, value: Any, origin: str) -> Any:
    """Type one value: TOML natives are taken as they are; strings (env, flags) are parsed."""
    where = f" (from {origin})"
    if isinstance(value, dict) or (isinstance(value, list) and d.kind not in ("list", "topic")):
        raise ConfigError(d.name, f"expected a {d.kind} value, got a TOML {type(value).__name__}{where}")
    if isinstance(value, list):  # TOML array for a list key
        if not all(isinstance(x, str | int) for x in value):
            raise ConfigError(d.name, f"expected a list of strings{where}")
        value = ",".join(str(x) for x in value)
    kind = d.kind
    try:
        if kind == "topic":
            assert d.topic_key is not None
            text = _to_text(value)
            log_config.parse_value(d.topic_key, text)
            result: Any = text.strip()
        elif kind in ("int", "long"):
            if isinstance(value, bool) or isinstance(value, float):
                raise ValueError
            result = int(str(value).strip()) if isinstance(value, str) else int(value)
            bound = _INT32_MAX if kind == "int" else _INT64_MAX
            if not -bound - 1 <= result <= bound:
                raise ValueError
        elif kind == "double":
            if isinstance(value, bool):
                raise ValueError
            result = float(value)
        elif kind == "bool":
            if isinstance(value, bool):
                result = value
            elif isinstance(value, str) and value.strip().lower() in ("true", "false"):
                result = value.strip().lower() == "true"
            else:
                raise ValueError
        elif kind == "list":
            if not isinstance(value, str):
                raise ValueError
            result = [p.strip() for p in value.split(",") if p.strip()]
        else:  # string, password
            if not isinstance(value, str):
                raise ValueError
            result = value.strip() if kind == "string" else value
    except InvalidConfigError as e:
        problem = getattr(e, "message", str(e))
        raise ConfigError(d.name, f"{problem}{where}") from None
    except ValueError:
        shown = "***" if kind == "password" else repr(value)
        raise ConfigError(d.name, f"invalid value {shown}: expected {_kind_text(kind)}{where}") from None
    if d.check is not None:
        problem = d.check(result)
        if problem:
            raise ConfigError(d.name, f"invalid value {result!r}: {problem}{where}")
    return result


def _kind_text(kind: str) -> str:
    return {"int": "an integer", "long": "an integer", "bool": "true or false", "double": "a number",
            "list": "a comma-separated list"}.get(kind, "a string")


def _apply_coarse_units(values: dict[str, Any]) -> None:
    for coarse, (fine, factor) in _COARSE_UNITS.items():
        if coarse in values and fine not in values:
            n = int(values[coarse])
            values[fine] = "-1" if n == -1 else str(n * factor)
            try:
                log_config.parse_value(KEYS[fine].topic_key or fine, values[fine])
            except InvalidConfigError as e:  # one line naming the key the operator wrote, not a traceback
                raise ConfigError(coarse, f"{n} is {values[fine]} ms of {fine}: {e.message}") from None


def _is_ascii_digits(text: str) -> bool:
    """str.isdigit() also takes "²" and other scripts' digits, which int() then refuses (a traceback)."""
    return text.isascii() and text.isdigit()


def _split_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"'{text}' is not host:port")
    host = host.strip("[]")
    if not _is_ascii_digits(port) or not 0 <= int(port) <= 65535:
        raise ValueError(f"'{text}' has no valid port (0-65535)")
    return host, int(port)


def _parse_endpoints(key: str, items: list[str]) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for item in items:
        name, sep, rest = item.partition("://")
        if not sep:
            raise ConfigError(key, f"'{item}' must look like NAME://host:port")
        name = name.strip().upper()
        if not _LISTENER_NAME.match(name):
            raise ConfigError(key, f"listener name '{name}' must be letters, digits and _ (e.g. BROKER)")
        if name in out:
            raise ConfigError(key, f"listener {name} is given twice")
        try:
            host, port = _split_host_port(rest)
        except ValueError as e:
            raise ConfigError(key, str(e)) from None
        if port == 0:
            raise ConfigError(key, f"listener {name} needs a fixed port, not 0")
        out[name] = (host, port)
    return out


def _parse_protocol_map(items: list[str]) -> dict[str, str]:
    key = "listener.security.protocol.map"
    out: dict[str, str] = {}
    for item in items:
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not _LISTENER_NAME.match(name):
            raise ConfigError(key, f"'{item}' must look like NAME:PROTOCOL")
        if protocol not in PROTOCOLS:
            raise ConfigError(key, f"'{item}': protocol must be one of {', '.join(PROTOCOLS)}")
        out[name] = protocol
    return out


def _parse_listeners(values: dict[str, Any]) -> dict[str, Listener]:
    bound = _parse_endpoints("listeners", values["listeners"])
    advertised = _parse_endpoints("advertised.listeners", values["advertised.listeners"] or [])
    protocols = _parse_protocol_map(values["listener.security.protocol.map"] or [])
    for name in advertised:
        if name not in bound:
            raise ConfigError("advertised.listeners", f"listener {name} is not in listeners")
    out: dict[str, Listener] = {}
    for name, (host, port) in bound.items():
        protocol = protocols.get(name) or (name if name in PROTOCOLS else None)
        if protocol is None:
            raise ConfigError("listener.security.protocol.map", f"listener {name} has no protocol: add "
                                                                f"{name}:PLAINTEXT (or SSL, ...) to it")
        if name in (LISTENER_BROKER, LISTENER_CONTROLLER, LISTENER_REPLICATION) and protocol not in (PLAINTEXT, SSL):
            # Nodes authenticate to each other with their certificates, never with SASL.
            raise ConfigError("listener.security.protocol.map",
                              f"{name} carries node-to-node traffic: PLAINTEXT or SSL, not {protocol}")
        ad_host, ad_port = advertised.get(name, ("", 0))
        out[name] = Listener(name, host, port, protocol, ad_host, ad_port)
    return out


def _parse_voters(items: list[str]) -> dict[int, Voter]:
    key = "controller.quorum.voters"
    out: dict[int, Voter] = {}
    for item in items:
        node, sep, rest = item.partition("@")
        parts = rest.rsplit(":", 2)
        if not sep or len(parts) != 3 or not _is_ascii_digits(node.strip()):
            raise ConfigError(key, f"'{item}' must look like id@host:grpc_port:raft_port")
        host, grpc_port, raft_port = parts
        if not (_is_ascii_digits(grpc_port) and _is_ascii_digits(raft_port)) or not host:
            raise ConfigError(key, f"'{item}' must look like id@host:grpc_port:raft_port")
        voter = Voter(int(node), host.strip("[]"), int(grpc_port), int(raft_port))
        if not (0 < voter.grpc_port <= 65535 and 0 < voter.raft_port <= 65535):
            raise ConfigError(key, f"'{item}': ports must be 1-65535")
        if voter.grpc_port == voter.raft_port:
            raise ConfigError(key, f"'{item}': the gRPC and Raft ports must differ")
        if voter.node_id in out:
            raise ConfigError(key, f"voter id {voter.node_id} is given twice")
        out[voter.node_id] = voter
    return out


def _validate_cross(values: dict[str, Any]) -> tuple[dict[str, Listener], dict[int, Voter]]:
    """Rules spanning keys: required-by-role, listeners vs roles, voters vs node id."""
    for key in _REQUIRED:
        if not values.get(key):
            if key == "node.id" and values.get(key) == 0:
                continue
            raise ConfigError(key, "is required")
    roles = values["process.roles"]
    bad = [r for r in roles if r not in (ROLE_BROKER, ROLE_CONTROLLER)]
    if bad or len(set(roles)) != len(roles):
        raise ConfigError("process.roles", f"invalid value {','.join(roles)!r}: must be broker, controller, "
                                           "or controller,broker")
    listeners = _parse_listeners(values)
    voters = _parse_voters(values["controller.quorum.voters"])
    node_id = values["node.id"]
    if ROLE_BROKER in roles:
        if LISTENER_BROKER not in listeners:
            raise ConfigError("listeners", "the broker role needs a BROKER://host:port listener")
        if not values["log.dirs"]:
            raise ConfigError("log.dirs", "is required for the broker role")
        if LISTENER_REPLICATION in {str(n).strip().upper() for n in values["kafka.listener.names"] or []}:
            raise ConfigError("kafka.listener.names", "REPLICATION is the followers' listener, not a Kafka one")
        replication = listeners.get(LISTENER_REPLICATION)
        if replication is not None and replication.protocol != listeners[LISTENER_BROKER].protocol:
            # Followers reach it with the security they use for the BROKER listener.
            raise ConfigError("listener.security.protocol.map", f"REPLICATION must use BROKER's protocol "
                              f"({listeners[LISTENER_BROKER].protocol}), not {replication.protocol}")
    else:
        extra = [n for n in listeners if n != LISTENER_CONTROLLER]
        if extra:
            raise ConfigError("listeners", f"listener(s) {', '.join(extra)} given but process.roles has no broker")
    if ROLE_CONTROLLER in roles:
        _validate_controller(values, listeners, voters, node_id)
    elif LISTENER_CONTROLLER in listeners:
        raise ConfigError("listeners", "a CONTROLLER listener is given but process.roles has no controller")
    elif node_id in voters:
        raise ConfigError("node.id", f"{node_id} is a voter in controller.quorum.voters but process.roles "
                                     "has no controller")
    _validate_ports(values, listeners, voters, node_id)
    _validate_ssl(values, listeners)
    _validate_relations(values)
    return listeners, voters


def _validate_controller(values: dict[str, Any], listeners: dict[str, Listener], voters: dict[int, Voter],
                         node_id: int) -> None:
    if LISTENER_CONTROLLER not in listeners:
        raise ConfigError("listeners", "the controller role needs a CONTROLLER://host:port listener")
    me = voters.get(node_id)
    if me is None:
        raise ConfigError("controller.quorum.voters", f"node.id {node_id} is not among the voters "
                                                      f"({', '.join(str(v) for v in sorted(voters))})")
    ctl = listeners[LISTENER_CONTROLLER]
    if (ctl.host, ctl.port) != (me.host, me.grpc_port):
        raise ConfigError("controller.quorum.voters", f"voter {node_id} is {me.host}:{me.grpc_port} but the "
                                                      f"CONTROLLER listener is {ctl.host}:{ctl.port}")
    if not values["metadata.log.dir"]:
        raise ConfigError("metadata.log.dir", "is required for the controller role")
    partners = [f"{v.host}:{v.raft_port}" for n, v in voters.items() if n != node_id]
    try:
        check_quorum_protection(f"{me.host}:{me.raft_port}", partners, values["controller.quorum.password"] or None)
    except InvalidConfigError as exc:
        raise ConfigError("controller.quorum.password", exc.message) from None


def _validate_ports(values: dict[str, Any], listeners: dict[str, Listener], voters: dict[int, Voter],
                    node_id: int) -> None:
    used: dict[int, str] = {}

    def claim(port: int, key: str, what: str) -> None:
        if port in used and port != 0:
            raise ConfigError(key, f"port {port} of {what} is also used by {used[port]}")
        used[port] = what

    for listener in listeners.values():
        claim(listener.port, "listeners", f"listener {listener.name}")
    if ROLE_CONTROLLER in values["process.roles"]:
        claim(voters[node_id].raft_port, "controller.quorum.voters", "this node's Raft port")
    if values["metrics.listener"]:
        claim(_split_host_port(values["metrics.listener"])[1], "metrics.listener", "metrics.listener")
    if values["health.listener"]:
        claim(_split_host_port(values["health.listener"])[1], "health.listener", "health.listener")
    if values["console.listener"]:
        claim(_split_host_port(values["console.listener"])[1], "console.listener", "console.listener")


def _validate_ssl(values: dict[str, Any], listeners: dict[str, Listener]) -> None:
    from broker import principal

    ssl_names = [lst.name for lst in listeners.values() if lst.uses_ssl]
    protocols = _parse_protocol_map(values["listener.security.protocol.map"] or [])
    if LISTENER_CONTROLLER not in listeners and protocols.get(LISTENER_CONTROLLER) == SSL:
        ssl_names.append("the controllers' CONTROLLER listener")  # a broker-only node reaching them
    if values["metrics.ssl.enable"]:
        ssl_names.append("metrics (metrics.ssl.enable)")
    cert, key, ca = (values["ssl.certificate.location"], values["ssl.key.location"], values["ssl.ca.location"])
    if ssl_names:
        for name, value in (("ssl.certificate.location", cert), ("ssl.key.location", key),
                            ("ssl.ca.location", ca)):
            if not value:
                raise ConfigError(name, f"is required: {', '.join(ssl_names)} use TLS")
            # Existence is checked when the listener binds (files may be mounted later, e.g. k8s).
    try:
        principal.parse_mapping_rules(values["ssl.principal.mapping.rules"])
        fmt = values["broker.principal.format"]
        if "{id}" not in fmt:
            raise ConfigError("broker.principal.format", f"{fmt!r} must contain {{id}}")
        principal.Principal.parse(fmt.replace("{id}", "0"))
    except InvalidConfigError as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError("ssl.principal.mapping.rules" if "mapping" in str(e) else "broker.principal.format",
                          getattr(e, "message", str(e))) from None


def _validate_relations(values: dict[str, Any]) -> None:
    if values["broker.heartbeat.interval.ms"] >= values["broker.session.timeout.ms"]:
        raise ConfigError("broker.heartbeat.interval.ms",
                          f"{values['broker.heartbeat.interval.ms']} must be below broker.session.timeout.ms "
                          f"({values['broker.session.timeout.ms']})")
    if values["group.min.session.timeout.ms"] > values["group.max.session.timeout.ms"]:
        raise ConfigError("group.min.session.timeout.ms", "must not exceed group.max.session.timeout.ms")
    if values["group.consumer.heartbeat.interval.ms"] >= values["group.consumer.session.timeout.ms"]:
        raise ConfigError("group.consumer.heartbeat.interval.ms",
                          f"{values['group.consumer.heartbeat.interval.ms']} must be below "
                          f"group.consumer.session.timeout.ms ({values['group.consumer.session.timeout.ms']})")
    rf = values["default.replication.factor"]
    mir = values.get("min.insync.replicas")
    if mir is not None and int(mir) > rf:
        raise ConfigError("min.insync.replicas", f"{mir} exceeds default.replication.factor ({rf}): "
                                                 "acks=all produce would always fail")
