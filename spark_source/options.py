"""Options of the ``brook`` Spark data source: parsing and validation.

The option names and their meaning follow Spark's built-in Kafka source so that jobs port
over by changing ``format("kafka")`` to ``format("brook")``. Everything is checked when the
query starts (in the driver); a wrong or contradictory option raises
``errors.InvalidConfigError`` whose message names the option. Spark hands option keys to a
Python data source lower-cased, so every lookup here is by the lower-cased name.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Literal

from client.security import SecurityConfig
from proto import errors
from spark_source import jaas as jaas_config

logger = logging.getLogger(__name__)

EARLIEST = -2  # the JSON forms of startingOffsets/endingOffsets use Kafka's sentinels
LATEST = -1

# Spark-generic options that reach the data source from DataFrameReader/Writer and mean
# nothing to Brook; accepted and ignored.
_SPARK_GENERIC = frozenset({"path", "checkpointlocation", "queryname"})

# Kafka consumer/producer settings that Spark's Kafka source refuses because the source
# manages them itself; the message says what to use instead.
_REFUSED = {
    "auto.offset.reset": "set the source option 'startingOffsets' instead",
    "enable.auto.commit": "offsets live in the checkpoint; nothing is committed to the cluster",
    "key.deserializer": "keys are always binary; cast or use DataFrame operations",
    "value.deserializer": "values are always binary; cast or use DataFrame operations",
    "key.serializer": "write a binary or string 'key' column",
    "value.serializer": "write a binary or string 'value' column",
    "interceptor.classes": "interceptors are not supported",
    "ssl.truststore.location": "Brook reads PEM files: set kafka.ssl.ca.location to the CA certificate",
    "ssl.keystore.location": "Brook reads PEM files: set kafka.ssl.certificate.location and kafka.ssl.key.location",
}

# Spark's Kafka source passes kafka.security.protocol / kafka.ssl.* / kafka.sasl.* to its
# consumer; Brook maps the same names onto client.security.SecurityConfig.
SECURITY_OPTIONS = frozenset(
    {
        "security.protocol",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.endpoint.identification.algorithm",
        "sasl.mechanism",
        "sasl.username",
        "sasl.password",
        "sasl.jaas.config",
    }
)

READ_OPTIONS = frozenset(
    {
        "bootstrap.servers",
        "subscribe",
        "subscribepattern",
        "assign",
        "startingoffsets",
        "startingoffsetsbytimestamp",
        "startingoffsetsbytimestampstrategy",
        "startingtimestamp",
        "endingoffsets",
        "endingoffsetsbytimestamp",
        "endingtimestamp",
        "maxoffsetspertrigger",
        "minoffsetspertrigger",
        "maxtriggerdelay",
        "groupidprefix",
        "group.id",
        "minpartitions",
        "maxrecordsperpartition",
        "failondataloss",
        "includeheaders",
        "fetch.max.bytes",
        "max.partition.fetch.bytes",
        "fetch.max.wait.ms",
        "request.timeout.ms",
        "kafkaconsumer.polltimeoutms",
        "fetchoffset.numretries",
        "fetchoffset.retryintervalms",
    }
) | SECURITY_OPTIONS

WRITE_OPTIONS = frozenset(
    {
        "bootstrap.servers",
        "topic",
        "acks",
        "linger.ms",
        "batch.size",
        "compression.type",
        "request.timeout.ms",
        "delivery.timeout.ms",
        "enable.idempotence",
        "max.block.ms",
    }
) | SECURITY_OPTIONS

# Upper bounds: every buffer and wait has one (a typo of extra zeros fails loudly).
_MAX_FETCH_BYTES = 256 * 1024 * 1024
_MAX_TIMEOUT_MS = 3_600_000
# Kafka's partition ids are int32 and its offsets and timestamps int64: larger values are refused
# at parse time instead of failing (or wrapping) later in a request.
_MAX_PARTITION = 2**31 - 1
_MIN_INT64, _MAX_INT64 = -(2**63), 2**63 - 1
_SHOWN_CHARS = 60  # of a bad value in an error message
# Plain ASCII digits only: int() also takes "1_0" (= 10), other scripts' digits ("١"), and raises
# ValueError instead of a clear error past 4300 digits.
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Subscription:
    """Which partitions the query reads: exactly one of the three kinds."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()  # subscribe
    pattern: str = ""  # subscribePattern (Python ``re`` syntax, matched in full like Java's)
    assigned: tuple[tuple[str, int], ...] = ()  # assign

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assigned)


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends.

    ``kind`` is "earliest", "latest", "offsets" (``offsets`` per (topic, partition), each an
    offset or EARLIEST/LATEST), "timestamps" (``timestamps`` per partition), or "timestamp"
    (one ``timestamp`` for every partition).
    """

    kind: Literal["earliest", "latest", "offsets", "timestamps", "timestamp"]
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    timestamps: dict[tuple[str, int], int] = field(default_factory=dict)
    timestamp: int = -1


@dataclass(frozen=True)
class FetchSettings:
    """What an executor task needs to fetch: shipped inside every input partition."""

    bootstrap_servers: str
    max_partition_fetch_bytes: int = 8 * 1024 * 1024
    fetch_max_wait_ms: int = 500
    request_timeout_ms: int = 30_000
    poll_timeout_ms: int = 120_000  # give up on a partition that yields nothing this long
    fail_on_data_loss: bool = True
    include_headers: bool = False
    security: SecurityConfig = field(default_factory=SecurityConfig)


@dataclass(frozen=True)
class ReadOptions:
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec | None  # batch only
    starting_timestamp_strategy: Literal["error", "latest"]
    max_offsets_per_trigger: int | None
    min_partitions: int | None
    max_records_per_partition: int | None
    fetch_offset_num_retries: int
    fetch_offset_retry_interval_ms: int
    fetch: FetchSettings
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000  # Spark's default, 15m
    group_id: str = ""  # kafka.group.id or groupIdPrefix + a unique suffix (logged; no group is joined)

    @property
    def bootstrap_servers(self) -> str:
        return self.fetch.bootstrap_servers

    @property
    def fail_on_data_loss(self) -> bool:
        return self.fetch.fail_on_data_loss

    @property
    def include_headers(self) -> bool:
        return self.fetch.include_headers


@dataclass(frozen=True)
class WriteOptions:
    bootstrap_servers: str
    topic: str | None
    linger_ms: int
    batch_size: int
    compression_type: str
    request_timeout_ms: int
    delivery_timeout_ms: int
    max_block_ms: int
    security: SecurityConfig = field(default_factory=SecurityConfig)


def _bad(name: str, why: str) -> errors.BrookError:
    if len(name) > 2 * _SHOWN_CHARS:  # an unknown option's key is the caller's text too
        name = name[: 2 * _SHOWN_CHARS] + "..."
    return errors.InvalidConfigError(f"option '{name}': {why}")


def _show(raw: str) -> str:
    """A bad value for an error message: quoted, and cut short when long (a huge number or document)."""
    if len(raw) <= _SHOWN_CHARS:
        return repr(raw)
    return f"{raw[:_SHOWN_CHARS]!r}... ({len(raw)} characters)"


def _show_json(value: object) -> str:
    """A parsed JSON value for an error message (containers by kind: they may be large or deeply nested)."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON array"
    return _show(json.dumps(value))


def _small_int(text: str, max_digits: int) -> int | None:
    """``text`` (matched by _INTEGER) as an int, or None past ``max_digits`` significant digits.

    Leading zeros are dropped before int(), whose 4300-digit limit counts them too.
    """
    sign = "-" if text.startswith("-") else ""
    digits = text.lstrip("+-").lstrip("0") or "0"
    return int(sign + digits) if len(digits) <= max_digits else None


def _partition_id(text: str) -> int | None:
    """A partition id in a JSON key ("0", "12"), or None: ASCII digits only, at most int32."""
    value = _small_int(text, 10) if _DIGITS.fullmatch(text) else None
    return value if value is not None and value <= _MAX_PARTITION else None


def _bootstrap_servers(opts: dict[str, str]) -> str:
    """host:port[,host:port...] with ASCII-digit ports 1..65535 (str.isdigit() also takes "²")."""
    servers = opts.get("bootstrap.servers", "").strip()
    if not servers:
        raise _bad("bootstrap.servers", "required (host:port[,host:port...])")
    for hp in servers.split(","):
        host, sep, port = hp.strip().rpartition(":")
        number = _small_int(port, 5) if _DIGITS.fullmatch(port) else None
        if not sep or not host or number is None or not 1 <= number <= 65535:
            raise _bad("bootstrap.servers", f"{_show(hp.strip())} is not host:port with a port from 1 to 65535")
    return servers


def _normalize(options: dict[str, str], known: frozenset[str]) -> dict[str, str]:
    """Lower-case keys, drop the "kafka." prefix Spark's Kafka source uses, refuse unknowns."""
    out: dict[str, str] = {}
    for raw_key, value in options.items():
        key = raw_key.lower()
        if key in _SPARK_GENERIC:
            continue
        if key.startswith("kafka."):
            key = key[len("kafka.") :]
        if key in _REFUSED:
            raise _bad(raw_key, f"not supported: {_REFUSED[key]}")
        if key not in known and raw_key.lower().startswith("kafka.") and key in KAFKA_CONSUMER_NOT_APPLICABLE:
            _warn_not_applicable(raw_key)
            continue
        if key not in known:
            raise _bad(raw_key, f"unknown option; known options: {', '.join(sorted(known))}")
        if key in out:
            raise _bad(raw_key, "given twice (with and without the 'kafka.' prefix)")
        out[key] = str(value)
    return out


_SCRAM_LOGIN_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


def _jaas_credentials(jaas: str) -> dict[str, str]:
    """username/password of a ``kafka.sasl.jaas.config``, parsed as Kafka's JaasConfig parses it.

    Values may be quoted or not, as Kafka accepts both; what Kafka refuses (no control flag, no ';',
    a key without a value, not exactly one login module) is an error naming the option and never
    repeating a value. Only the ScramLoginModule (or a shaded copy of it) is supported.
    """
    name = "kafka.sasl.jaas.config"
    try:
        entries = jaas_config.parse(jaas)
    except jaas_config.JaasConfigError as e:
        raise _bad(name, str(e)) from None
    if len(entries) != 1:  # Kafka's JaasContext: "should be 1 module"
        raise _bad(name, f"holds {len(entries)} login modules; a client takes exactly 1")
    entry = entries[0]
    module = entry.login_module
    if module != _SCRAM_LOGIN_MODULE and not module.endswith("." + _SCRAM_LOGIN_MODULE):
        raise _bad(name, f"only {_SCRAM_LOGIN_MODULE} is supported (or set kafka.sasl.username/password), "
                         f"got {jaas_config.shown_module(module)}")
    if entry.options.get("tokenauth", "").lower() == "true":
        raise _bad(name, "tokenauth=true (delegation tokens) is not supported: give a SCRAM user")
    return {k: entry.options[k] for k in ("username", "password") if k in entry.options}


def _security(opts: dict[str, str]) -> SecurityConfig:
    """kafka.security.protocol / kafka.ssl.* / kafka.sasl.* (incl. a ScramLoginModule jaas config)."""
    config = {k: v for k, v in opts.items() if k in SECURITY_OPTIONS and k != "sasl.jaas.config"}
    jaas = opts.get("sasl.jaas.config")
    if jaas is not None:
        # kafka.sasl.username/password, when given too, take precedence over the JAAS text.
        for key, value in _jaas_credentials(jaas).items():
            config.setdefault(f"sasl.{key}", value)
        for key in ("username", "password"):
            if f"sasl.{key}" not in config:
                raise _bad("kafka.sasl.jaas.config", f"the ScramLoginModule entry has no {key}=... option "
                                                     f"(nor is kafka.sasl.{key} set)")
            if not config[f"sasl.{key}"]:
                raise _bad("kafka.sasl.jaas.config", f"the ScramLoginModule entry has an empty {key}")
    try:
        return SecurityConfig.from_config(config)
    except errors.BrookError as e:
        raise _bad("kafka.security.protocol", e.message) from None


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    low = raw.strip().lower()
    if low not in ("true", "false"):
        raise _bad(name, f"must be true or false, got {_show(raw)}")
    return low == "true"


def _int(opts: dict[str, str], name: str, default: int | None, *, lo: int, hi: int) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not _INTEGER.fullmatch(text):
        raise _bad(name, f"must be an integer, got {_show(raw)}")
    value = _small_int(text, 19)  # every bound fits in 19 digits: a longer number is out of range
    if value is None or not lo <= value <= hi:
        raise _bad(name, f"must be between {lo} and {hi}, got {_show(text)}")
    return value


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json.loads keeps the last of two equal keys: refuse them, as two offsets for one partition are ambiguous."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _json_object(name: str, raw: str) -> dict:
    try:
        parsed = json.loads(raw, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise _bad(name, f"not valid JSON ({exc.msg} at char {exc.pos}): {_show(raw)}") from None
    except _DuplicateKey as exc:
        raise _bad(name, f"key {_show(str(exc))} appears twice in one object: {_show(raw)}") from None
    except ValueError:
        # Python's int() limit, not a JSON syntax error: no offset or partition needs 4300 digits.
        raise _bad(name, f"holds a number of over 4300 digits: {_show(raw)}") from None
    except RecursionError:
        raise _bad(name, f"nested too deeply: {_show(raw)}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise _bad(name, f"must be a non-empty JSON object, got {_show(raw)}")
    return parsed


def _partition_map(name: str, raw: str) -> dict[tuple[str, int], int]:
    """``{"topicA":{"0":23,"1":-1}}`` -> {("topicA", 0): 23, ("topicA", 1): -1}."""
    out: dict[tuple[str, int], int] = {}
    for topic, per_partition in _json_object(name, raw).items():
        if not isinstance(per_partition, dict) or not per_partition:
            raise _bad(name, f"topic {_show(topic)} must map to an object of partition -> value")
        for part, value in per_partition.items():
            partition = _partition_id(part)
            if partition is None:
                raise _bad(name, f"partition {_show(part)} of topic {_show(topic)} is not an integer "
                                 f"from 0 to {_MAX_PARTITION}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise _bad(name, f"{_show(topic)} partition {partition}: need an integer value, got {_show_json(value)}")
            if not _MIN_INT64 <= value <= _MAX_INT64:
                raise _bad(name, f"{_show(topic)} partition {partition}: {_show(str(value))} is beyond a 64-bit integer")
            if (topic, partition) in out:
                raise _bad(name, f"{_show(topic)} partition {partition} is given twice ({_show(part)})")
            out[(topic, partition)] = value
    return out


def _subscription(opts: dict[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(given) != 1:
        raise _bad(
            "subscribe/subscribePattern/assign",
            f"exactly one must be given, got {given or 'none'}",
        )
    kind = given[0]
    raw = opts[kind]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise _bad("subscribe", "no topic named")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribepattern":
        return Subscription("subscribePattern", pattern=_java_pattern(raw))
    assigned: list[tuple[str, int]] = []
    for topic, parts in _json_object("assign", raw).items():
        if not isinstance(parts, list) or not parts:
            raise _bad("assign", f"topic {_show(topic)} must map to a non-empty list of partitions")
        for p in parts:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= _MAX_PARTITION:
                raise _bad("assign", f"partition {_show_json(p)} of topic {_show(topic)} is not an integer "
                                     f"from 0 to {_MAX_PARTITION}")
            assigned.append((topic, p))
    return Subscription("assign", assigned=tuple(sorted(set(assigned))))


def _offset_spec(opts: dict[str, str], name: str, default: str, *, ending: bool) -> OffsetSpec:
    raw = opts.get(name, default).strip()
    display = "endingOffsets" if ending else "startingOffsets"
    low = raw.lower()
    if low == "earliest":
        if ending:
            raise _bad(display, "'earliest' is not allowed as an ending offset")
        return OffsetSpec("earliest")
    if low == "latest":
        return OffsetSpec("latest")
    if not raw.startswith("{"):
        raise _bad(display, f"must be 'earliest', 'latest' or a JSON object, got {_show(raw)}")
    offsets = _partition_map(display, raw)
    for (topic, part), off in offsets.items():
        if off < EARLIEST or (ending and off == EARLIEST):
            allowed = "-1 (latest) or an offset >= 0" if ending else "-2 (earliest), -1 (latest) or >= 0"
            raise _bad(display, f"{_show(topic)} partition {part}: {off} is not {allowed}")
    return OffsetSpec("offsets", offsets=offsets)


def _starting(opts: dict[str, str], *, streaming: bool) -> OffsetSpec:
    given = [
        k for k in ("startingoffsets", "startingoffsetsbytimestamp", "startingtimestamp") if k in opts
    ]
    if len(given) > 1:
        raise _bad("startingOffsets/startingOffsetsByTimestamp/startingTimestamp", f"give at most one, got {given}")
    if "startingtimestamp" in opts:
        ts = _int(opts, "startingtimestamp", None, lo=0, hi=2**63 - 1)
        return OffsetSpec("timestamp", timestamp=int(ts or 0))
    if "startingoffsetsbytimestamp" in opts:
        stamps = _partition_map("startingOffsetsByTimestamp", opts["startingoffsetsbytimestamp"])
        for (topic, part), ts in stamps.items():
            if ts < 0:
                raise _bad("startingOffsetsByTimestamp", f"{_show(topic)} partition {part}: timestamp {ts} < 0")
        return OffsetSpec("timestamps", timestamps=stamps)
    spec = _offset_spec(opts, "startingoffsets", "latest" if streaming else "earliest", ending=False)
    if not streaming and (spec.kind == "latest" or LATEST in spec.offsets.values()):
        raise _bad("startingOffsets", "'latest' (-1) is not allowed for batch queries")
    return spec


def parse_read_options(options: dict[str, str], *, streaming: bool) -> ReadOptions:
    """Validate everything a read needs; raises ``InvalidConfigError`` naming the option."""
    opts = _normalize(options, READ_OPTIONS)
    servers = _bootstrap_servers(opts)
    sub = _subscription(opts)
    starting = _starting(opts, streaming=streaming)
    ending = _ending(opts, streaming=streaming)
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise _bad("startingOffsetsByTimestampStrategy", f"must be 'error' or 'latest', got {_show(strategy)}")
    _warn_batch_only_ignored(opts, streaming=streaming)
    if sub.kind == "assign":
        _check_assigned_covered(sub, starting, ending)
    fetch = FetchSettings(
        bootstrap_servers=servers,
        max_partition_fetch_bytes=_int(
            opts, "max.partition.fetch.bytes", opts_fetch_default(opts), lo=1024, hi=_MAX_FETCH_BYTES
        ),
        fetch_max_wait_ms=_int(opts, "fetch.max.wait.ms", 500, lo=0, hi=_MAX_TIMEOUT_MS),
        request_timeout_ms=_int(opts, "request.timeout.ms", 30_000, lo=100, hi=_MAX_TIMEOUT_MS),
        poll_timeout_ms=_int(opts, "kafkaconsumer.polltimeoutms", 120_000, lo=100, hi=_MAX_TIMEOUT_MS),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        include_headers=_bool(opts, "includeheaders", False),
        security=_security(opts),
    )
    return ReadOptions(
        subscription=sub,
        starting=starting,
        ending=ending,
        starting_timestamp_strategy=strategy,  # type: ignore[arg-type]
        max_offsets_per_trigger=_int(opts, "maxoffsetspertrigger", None, lo=1, hi=2**62),
        min_partitions=_int(opts, "minpartitions", None, lo=1, hi=1_000_000),
        max_records_per_partition=_int(opts, "maxrecordsperpartition", None, lo=1, hi=2**62),
        fetch_offset_num_retries=_int(opts, "fetchoffset.numretries", 3, lo=0, hi=100),
        fetch_offset_retry_interval_ms=_int(opts, "fetchoffset.retryintervalms", 1000, lo=0, hi=_MAX_TIMEOUT_MS),
        fetch=fetch,
        **_trigger_options(opts, streaming=streaming),
        group_id=_group_id(opts),
    )


def opts_fetch_default(opts: dict[str, str]) -> int:
    """max.partition.fetch.bytes defaults to fetch.max.bytes when only that one is given."""
    value = _int(opts, "fetch.max.bytes", 8 * 1024 * 1024, lo=1024, hi=_MAX_FETCH_BYTES)
    return int(value or 0)


# ----------------------------------------------------------------------------- issue 13 options
# endingOffsetsByTimestamp / endingTimestamp, minOffsetsPerTrigger / maxTriggerDelay,
# groupIdPrefix / kafka.group.id and the kafka.* pass-through, with Spark's Kafka source meaning.

# Kafka consumer settings Spark's Kafka source passes to its consumer that have no effect on
# Brook's reader (it fetches offset ranges directly from the leaders: no group membership,
# no background fetcher, gRPC connections). Given with the "kafka." prefix they are accepted
# with a warning, as Kafka's consumer logs "supplied but isn't used"; anything else is an error.
KAFKA_CONSUMER_NOT_APPLICABLE = frozenset({
    "session.timeout.ms", "heartbeat.interval.ms", "max.poll.records", "max.poll.interval.ms",
    "fetch.min.bytes", "receive.buffer.bytes", "send.buffer.bytes", "reconnect.backoff.ms",
    "reconnect.backoff.max.ms", "retry.backoff.ms", "retry.backoff.max.ms", "metadata.max.age.ms",
    "connections.max.idle.ms", "default.api.timeout.ms", "client.rack", "check.crcs", "isolation.level",
    "exclude.internal.topics", "allow.auto.create.topics", "partition.assignment.strategy",
    "group.instance.id", "client.dns.lookup", "socket.connection.setup.timeout.ms",
    "socket.connection.setup.timeout.max.ms", "metrics.num.samples", "metrics.recording.level",
    "metrics.sample.window.ms", "auto.commit.interval.ms", "client.id",
})
_DEFAULT_GROUP_ID_PREFIX = "spark-kafka-source"  # Spark's default groupIdPrefix


def _warn_not_applicable(raw_key: str) -> None:
    logger.warning("option '%s' is a Kafka consumer setting with no effect on the brook source; ignored", raw_key)


def _warn_batch_only_ignored(opts: dict[str, str], *, streaming: bool) -> None:
    """Spark's Kafka source logs, not fails, when a batch query gets streaming-only trigger options."""
    if streaming:
        return
    for key, display in (("maxoffsetspertrigger", "maxOffsetsPerTrigger"),
                         ("minoffsetspertrigger", "minOffsetsPerTrigger"),
                         ("maxtriggerdelay", "maxTriggerDelay")):
        if key in opts:
            logger.warning("%s option ignored in batch queries", display)


def _ending(opts: dict[str, str], *, streaming: bool) -> OffsetSpec | None:
    """endingOffsets, endingOffsetsByTimestamp or endingTimestamp (batch only; at most one)."""
    names = {"endingoffsets": "endingOffsets", "endingoffsetsbytimestamp": "endingOffsetsByTimestamp",
             "endingtimestamp": "endingTimestamp"}
    given = [k for k in names if k in opts]
    if given and streaming:
        raise _bad(names[given[0]], "only for batch queries (spark.read), not for streaming queries")
    if streaming:
        return None
    if len(given) > 1:
        raise _bad("endingOffsets/endingOffsetsByTimestamp/endingTimestamp", f"give at most one, got {given}")
    if "endingtimestamp" in opts:
        ts = _int(opts, "endingtimestamp", None, lo=0, hi=2**63 - 1)
        return OffsetSpec("timestamp", timestamp=int(ts or 0))
    if "endingoffsetsbytimestamp" in opts:
        stamps = _partition_map("endingOffsetsByTimestamp", opts["endingoffsetsbytimestamp"])
        for (topic, part), ts in stamps.items():
            if ts < 0:
                raise _bad("endingOffsetsByTimestamp", f"{_show(topic)} partition {part}: timestamp {ts} < 0")
        return OffsetSpec("timestamps", timestamps=stamps)
    return _offset_spec(opts, "endingoffsets", "latest", ending=True)


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(name: str, raw: str) -> int:
    """Spark's duration strings ("30s", "5m", "15 minutes", "100ms"); a bare number is milliseconds."""
    m = re.fullmatch(r"\s*([0-9]+)\s*([a-z]*)\s*", raw.lower())  # [0-9]: \d takes any script's digits
    unit = (m.group(2) if m else "") or "ms"
    unit = {"second": "s", "seconds": "s", "sec": "s", "minute": "m", "minutes": "m", "hour": "h", "hours": "h",
            "day": "d", "days": "d", "millisecond": "ms", "milliseconds": "ms"}.get(unit, unit)
    if m is None or unit not in _DURATION_UNITS_MS:
        raise _bad(name, f"must be a duration such as 30s, 5m or 100ms, got {_show(raw)}")
    number = _small_int(m.group(1), 9)  # 7 days is 604800000 ms: more digits are too long in any unit
    value = -1 if number is None else number * _DURATION_UNITS_MS[unit]
    if not 0 <= value <= 7 * 86_400_000:
        raise _bad(name, f"at most 7 days, got {_show(raw)}")
    return value


def _trigger_options(opts: dict[str, str], *, streaming: bool) -> dict[str, int | None]:
    """minOffsetsPerTrigger / maxTriggerDelay: wait for at least N new records, at most the delay."""
    if not streaming:
        return {}
    low = _int(opts, "minoffsetspertrigger", None, lo=1, hi=2**62)
    high = _int(opts, "maxoffsetspertrigger", None, lo=1, hi=2**62)
    if low is not None and high is not None and low > high:
        raise _bad("minOffsetsPerTrigger", f"({low}) must not exceed maxOffsetsPerTrigger ({high})")
    delay = _duration_ms("maxTriggerDelay", opts["maxtriggerdelay"]) if "maxtriggerdelay" in opts \
        else 15 * 60 * 1000
    if "maxtriggerdelay" in opts and low is None:
        logger.warning("maxTriggerDelay has no effect without minOffsetsPerTrigger")
    return {"min_offsets_per_trigger": low, "max_trigger_delay_ms": delay}


def _group_id(opts: dict[str, str]) -> str:
    """kafka.group.id, else groupIdPrefix + a unique suffix, as Spark names its consumers.

    Accepted so Kafka jobs port unchanged, but the brook source never joins a group and
    commits nothing (offsets live in the checkpoint, as with Spark's Kafka source), so the
    id is only validated and logged; no group appears in `brook group list`.
    """
    explicit = opts.get("group.id")
    if explicit is not None:
        if not explicit.strip():
            raise _bad("kafka.group.id", "empty group id")
        if "groupidprefix" in opts:
            logger.warning("groupIdPrefix is ignored because kafka.group.id is set")
        return explicit.strip()
    prefix = opts.get("groupidprefix", _DEFAULT_GROUP_ID_PREFIX).strip()
    if not prefix:
        raise _bad("groupIdPrefix", "empty prefix")
    import uuid

    return f"{prefix}-{uuid.uuid4()}"


_JAVA_ONLY = re.compile(r"\\[pP]\{|\\[QE]|\[\[|&&")  # \p{L}, \Q..\E quoting, [a&&[b]] class intersection


def _java_pattern(raw: str) -> str:
    r"""subscribePattern: a java.util.regex pattern, matched against the whole topic name (Matcher.matches()).

    Python's ``re`` agrees with Java on the patterns topic names call for; Java's named
    groups ``(?<name>...)`` are rewritten to Python's ``(?P<name>...)``, and the Java-only
    constructs (\p{...} classes, \Q...\E quoting, class intersection) are refused by name
    rather than silently meaning something else.
    """
    if not raw.strip():
        raise _bad("subscribePattern", "empty pattern")
    java_only = _JAVA_ONLY.search(raw)
    if java_only:
        raise _bad("subscribePattern", f"{java_only.group(0)!r} (java.util.regex only) is not supported; "
                                       "use an equivalent Python re construct")
    pattern = re.sub(r"\(\?<(?=[A-Za-z])", "(?P<", raw)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise _bad("subscribePattern", f"not a valid regular expression: {exc}") from None
    return pattern


def _check_assigned_covered(sub: Subscription, starting: OffsetSpec, ending: OffsetSpec | None) -> None:
    """With ``assign``, per-partition offsets may only name assigned partitions."""
    assigned = set(sub.assigned)
    for name, spec in (("startingOffsets", starting), ("endingOffsets", ending)):
        if spec is None:
            continue
        named = set(spec.offsets) | set(spec.timestamps)
        extra = sorted(named - assigned)
        if extra:
            raise _bad(name, f"names partitions that are not assigned: {extra}")


def parse_write_options(options: dict[str, str]) -> WriteOptions:
    opts = _normalize(options, WRITE_OPTIONS)
    servers = _bootstrap_servers(opts)
    acks = opts.get("acks", "all").strip().lower()
    if acks not in ("all", "-1"):
        raise _bad("acks", f"the brook sink always writes with acks=all, got {_show(acks)}")
    if not _bool(opts, "enable.idempotence", True):
        raise _bad("enable.idempotence", "the brook sink always uses the idempotent producer")
    compression = opts.get("compression.type", "none").strip().lower()
    if compression not in ("none", "gzip", "snappy", "lz4", "zstd"):
        raise _bad("compression.type", f"must be none, gzip, snappy, lz4 or zstd, got {_show(compression)}")
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise _bad("topic", "empty topic name")
    return WriteOptions(
        bootstrap_servers=servers,
        topic=topic.strip() if topic else None,
        linger_ms=int(_int(opts, "linger.ms", 5, lo=0, hi=_MAX_TIMEOUT_MS) or 0),
        batch_size=int(_int(opts, "batch.size", 256 * 1024, lo=1024, hi=_MAX_FETCH_BYTES) or 0),
        compression_type=compression,
        request_timeout_ms=int(_int(opts, "request.timeout.ms", 30_000, lo=100, hi=_MAX_TIMEOUT_MS) or 0),
        delivery_timeout_ms=int(_int(opts, "delivery.timeout.ms", 120_000, lo=100, hi=_MAX_TIMEOUT_MS) or 0),
        max_block_ms=int(_int(opts, "max.block.ms", 60_000, lo=0, hi=_MAX_TIMEOUT_MS) or 0),
        security=_security(opts),
    )
