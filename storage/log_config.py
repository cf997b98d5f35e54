"""Topic-level configuration: the keys, their defaults, types and validation.

Keys use Apache Kafka's names so an operator's knowledge carries over. This module is
the single source of truth for topic configs: the controller validates CreateTopics /
AlterConfigs against it, the storage layer builds a ``LogConfig`` from it, and the CLI
documents it. It is pure: no I/O, no clocks.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from proto.errors import InvalidConfigError
from storage.compression import CODEC_GZIP, CODEC_LZ4, CODEC_ZSTD, LEVELS, check_level

# Kafka's topic compression.type values; "uncompressed" (Kafka's name for a topic's) is "none".
COMPRESSION_TYPES = ("producer", "none", "uncompressed", "gzip", "snappy", "lz4", "zstd")
CLEANUP_POLICIES = ("delete", "compact")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

# The largest index.interval.bytes a client may set, and the interval the storage layer uses whatever is
# configured (storage/segment.py). Kafka takes any int >= 0, but a lookup of an offset inside a segment reads
# the batch headers from the index entry below it: at 2^31-1 the index had no entry and every mid-segment
# fetch walked the segment from its start, 3.8 s per 100 MiB per fetch entry (found by an audit). At 1 MiB
# (Kafka's default max.message.bytes) a lookup reads at most about one MiB of headers past its entry, and the
# index of a full 2 GiB segment is 16 KiB: a larger interval saves nothing worth having.
INDEX_INTERVAL_BYTES_MAX = 1024 * 1024
# The largest max.message.bytes a client may set, and what the storage layer uses whatever is configured
# (``LogConfig.from_overrides``). A leader stores only what every reader takes whole, and the largest batch it
# stores is max.message.bytes (a batch it recompresses for compression.type is checked again after: a 6 KB
# zstd request to a compression.type=none topic is a 60 MiB batch). Every reader takes one whole batch of this
# size beyond its max bytes, as Kafka returns it: a follower (replication/fetcher.py derives its receive bound
# from this), a Brook client or Spark over gRPC (a broker sends up to 128 MiB) and librdkafka (100 MB by
# default). Kafka takes any int; beyond 64 MiB a leader stored batches no follower, Brook consumer or
# librdkafka consumer could take (found by experiment).
MAX_MESSAGE_BYTES_MAX = 64 * 1024 * 1024
# The smallest index a segment is given: two time-index entries (12 bytes each; an offset-index entry is 8). Kafka
# accepts segment.index.bytes from 4 and rounds it down to whole entries (none, at 4 to 11: a segment per batch).
# Brook took 8 to 11 and then could create no index at all: the partition's log was never made, or, changed on an
# existing topic, every produce failed at the next segment roll. Smaller values are taken as this.
INDEX_BYTES_MIN = 24


@dataclass(frozen=True)
class ConfigDef:
    name: str
    kind: str  # "int", "long", "bool", "string", "list"
    default: str
    doc: str
    check: Callable[[object], str | None] | None = None  # returns an error text or None
    # A further check of what a client asks (``validate(strict=True)``, the controller), not of values already
    # stored: a journal, snapshot or broker config written before the check still replays and opens.
    strict_check: Callable[[object], str | None] | None = None


def _at_least(low: int) -> Callable[[object], str | None]:
    return lambda v: None if v >= low else f"must be at least {low}"  # type: ignore[operator]


def _at_most(high: int, why: str) -> Callable[[object], str | None]:
    return lambda v: None if v <= high else f"must be at most {high} ({why})"  # type: ignore[operator]


def _at_least_or_minus_one(low: int) -> Callable[[object], str | None]:
    return lambda v: None if v == -1 or v >= low else f"must be -1 or at least {low}"  # type: ignore[operator]


def _one_of(choices: tuple[str, ...]) -> Callable[[object], str | None]:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def _level(codec: int) -> Callable[[object], str | None]:
    return lambda v: check_level(codec, v)  # type: ignore[arg-type]


def _cleanup_policy(v: object) -> str | None:
    parts = v if isinstance(v, list) else [v]
    if not parts or any(p not in CLEANUP_POLICIES for p in parts):
        return "must be delete, compact, or compact,delete"
    return None


_DEFS = [
    ConfigDef("cleanup.policy", "list", "delete", "delete (retention), compact, or both: compact,delete",
              _cleanup_policy),
    ConfigDef("compression.type", "string", "producer",
              "Codec the log stores: producer keeps the producer's codec.", _one_of(COMPRESSION_TYPES)),
    ConfigDef("compression.gzip.level", "int", "-1",
              "gzip level (1-9; -1: zlib's default, 6) of batches the broker compresses for compression.type.",
              _level(CODEC_GZIP)),
    ConfigDef("compression.lz4.level", "int", str(LEVELS[CODEC_LZ4][2]),
              "lz4 level (1-17; 9, the default, is lz4's fast compressor) of batches the broker compresses.",
              _level(CODEC_LZ4)),
    ConfigDef("compression.zstd.level", "int", str(LEVELS[CODEC_ZSTD][2]),
              "zstd level (-131072 to 22) of batches the broker compresses for compression.type.",
              _level(CODEC_ZSTD)),
    ConfigDef("delete.retention.ms", "long", str(24 * 3600 * 1000),
              "How long compaction keeps tombstones.", _at_least(0)),
    ConfigDef("file.delete.delay.ms", "long", "60000", "Delay before a deleted segment's files are removed.",
              _at_least(0)),
    ConfigDef("flush.messages", "long", str(_INT64_MAX), "fsync after this many messages.", _at_least(1)),
    ConfigDef("flush.ms", "long", str(_INT64_MAX), "fsync at least this often.", _at_least(0)),
    ConfigDef("index.interval.bytes", "int", "4096",
              f"Bytes between offset-index entries (at most {INDEX_INTERVAL_BYTES_MAX}: a lookup inside a segment "
              "reads the batch headers of one interval).", _at_least(0),
              _at_most(INDEX_INTERVAL_BYTES_MAX, "1 MiB: a lookup of an offset or a timestamp reads the batch headers "
                       "of one index interval; a larger value is used as 1 MiB")),
    ConfigDef("max.compaction.lag.ms", "long", str(_INT64_MAX), "Longest a record may stay uncompacted.",
              _at_least(1)),
    ConfigDef("max.message.bytes", "int", str(1024 * 1024 + 12), "Largest record batch accepted.",
              _at_least(0),
              _at_most(MAX_MESSAGE_BYTES_MAX, "64 MiB: the largest batch a leader may store is what every reader "
                       "(a follower's replica fetch, a consumer's fetch) takes whole; a larger value is used as 64 MiB")),
    ConfigDef("message.timestamp.after.max.ms", "long", str(3600 * 1000),
              "CreateTime: refuse a record whose timestamp is further ahead of the broker's clock than this "
              "(INVALID_TIMESTAMP); Kafka 4's default.", _at_least(0)),
    ConfigDef("message.timestamp.before.max.ms", "long", str(_INT64_MAX),
              "CreateTime: refuse a record whose timestamp is further behind the broker's clock than this "
              "(INVALID_TIMESTAMP).", _at_least(0)),
    ConfigDef("message.timestamp.type", "string", "CreateTime", "CreateTime or LogAppendTime.",
              _one_of(TIMESTAMP_TYPES)),
    ConfigDef("min.cleanable.dirty.ratio", "double", "0.5", "Dirty ratio that triggers compaction.",
              lambda v: None if 0 <= v <= 1 else "must be between 0 and 1"),  # type: ignore[operator]
    ConfigDef("min.compaction.lag.ms", "long", "0", "Shortest a record stays uncompacted.", _at_least(0)),
    ConfigDef("min.insync.replicas", "int", "1", "Smallest ISR that acks=all accepts.", _at_least(1)),
    ConfigDef("retention.bytes", "long", "-1", "Size bound of a partition's log (any negative value: none, as "
              "Kafka takes it)."),
    ConfigDef("retention.ms", "long", str(7 * 24 * 3600 * 1000), "Age bound of a partition's log (-1: none).",
              _at_least_or_minus_one(0)),
    ConfigDef("segment.bytes", "int", str(1024 * 1024 * 1024), "Roll a segment at this size.", _at_least(14)),
    ConfigDef("segment.index.bytes", "int", str(10 * 1024 * 1024),
              f"Largest index file (below {INDEX_BYTES_MIN}, {INDEX_BYTES_MIN} is used).", _at_least(4)),
    ConfigDef("segment.ms", "long", str(7 * 24 * 3600 * 1000), "Roll a segment at this age.", _at_least(1)),
    ConfigDef("segment.jitter.ms", "long", "0",
              "Largest random time taken off segment.ms for each new segment, so partitions created together "
              "do not all roll at once.", _at_least(0)),
    ConfigDef("unclean.leader.election.enable", "bool", "false",
              "Allow an out-of-sync replica to become leader (may lose data)."),
]

TOPIC_CONFIGS: Mapping[str, ConfigDef] = {d.name: d for d in _DEFS}


# What a client may write as a number: Java's Long.parseLong and Double.parseDouble syntax (Kafka's), ASCII digits.
# Python's int() and float() also take "1_000" and other scripts' digits ("١٠٠"): such values were stored as
# sent and handed to Kafka clients, whose tools cannot read them. (The state replays stored values unchecked.)
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_NUMBER_TEXT = {"int": _INTEGER_TEXT, "long": _INTEGER_TEXT,
                "double": re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")}


def list_value(current: str | None, default: str, subtract: bool, value: str) -> str:
    """A LIST key's value after APPEND (each element of ``value`` not yet in it, at the end) or SUBTRACT (each
    element's first occurrence removed), from ``current`` (the resource's own value; None: ``default``), as
    Kafka's controller makes it (KIP-339)."""
    parts = [p.strip() for p in (default if current is None else current).split(",") if p.strip()]
    for element in (p.strip() for p in value.split(",")):
        if not element:
            continue
        if not subtract and element not in parts:
            parts.append(element)
        elif subtract and element in parts:
            parts.remove(element)
    return ",".join(parts)


def is_number_text(kind: str, text: str) -> bool:
    """Is ``text`` a number of ``kind`` ("int", "long", "double") as Kafka's Java parsers read one?"""
    return _NUMBER_TEXT[kind].fullmatch(text) is not None


def parse_value(name: str, raw: str, *, strict: bool = False) -> object:
    """Parse and validate one topic config value; raise InvalidConfigError naming the key.

    ``strict``: also the checks of what a client may set now (``ConfigDef.strict_check``)."""
    d = TOPIC_CONFIGS.get(name)
    if d is None:
        raise InvalidConfigError(f"unknown topic config '{name}'")
    text = str(raw).strip()
    try:
        if strict and d.kind in _NUMBER_TEXT and not is_number_text(d.kind, text):
            raise ValueError
        if d.kind in ("int", "long"):
            value: object = int(text)
            bound = _INT32_MAX if d.kind == "int" else _INT64_MAX
            if not -bound - 1 <= value <= bound:  # type: ignore[operator]
                raise ValueError
        elif d.kind == "double":
            value = float(text)
        elif d.kind == "bool":
            if text.lower() not in ("true", "false"):
                raise ValueError
            value = text.lower() == "true"
        elif d.kind == "list":
            value = [p.strip() for p in text.split(",") if p.strip()]
        else:
            value = text
    except ValueError:
        raise InvalidConfigError(f"invalid value '{raw}' for topic config '{name}': expected {d.kind}") from None
    for check in (d.check, d.strict_check if strict else None):
        problem = check(value) if check is not None else None
        if problem:
            raise InvalidConfigError(f"invalid value '{raw}' for topic config '{name}': {problem}")
    return value


# The latest record timestamp a leader stores (and the CLI accepts): 9999-12-31T23:59:59.999Z, the end of
# what Spark's and Python's timestamps (and ISO 8601) can write.
MAX_TIMESTAMP_MS = 253_402_300_799_999

# The longest value a client may set (every topic config is a number, a name or "compact,delete"): values
# are replicated to every controller and broker, and "delete," repeated to 4 MB, or a float of 3 million
# digits, was stored as sent, until the metadata snapshot outgrew what a broker may receive (audit).
VALUE_MAX_CHARS = 256


def validate(overrides: Mapping[str, str], *, strict: bool = False) -> dict[str, str]:
    """Validate a set of overrides; return them normalised as strings. Raises on the first bad key.

    ``strict`` (the controller, for what a client asks): values at most VALUE_MAX_CHARS, within the bounds a
    client may set now (``ConfigDef.strict_check``: index.interval.bytes at most INDEX_INTERVAL_BYTES_MAX) and
    stored in their canonical form (a list without repeats). The metadata state applies commands without it,
    so a journal written before replays to the same state."""
    out: dict[str, str] = {}
    for name, raw in overrides.items():
        text = str(raw)
        if strict and len(text) > VALUE_MAX_CHARS:
            raise InvalidConfigError(f"value of topic config '{name}' is {len(text)} characters, longer than "
                                     f"{VALUE_MAX_CHARS}")
        value = parse_value(name, raw, strict=strict)
        out[name] = ",".join(dict.fromkeys(value)) if strict and isinstance(value, list) else text.strip()
    return out


def effective(overrides: Mapping[str, str], broker_defaults: Mapping[str, str] | None = None) -> dict[str, object]:
    """Every topic config with its parsed value: topic override > broker default > built-in."""
    merged: dict[str, object] = {}
    for name, d in TOPIC_CONFIGS.items():
        raw = overrides.get(name, (broker_defaults or {}).get(name, d.default))
        merged[name] = parse_value(name, raw)
    return merged


# --- LogConfig: the typed view the storage layer works with (added by STORAGE) ---------------


@dataclass(frozen=True)
class LogConfig:
    """Effective topic config of one partition log, parsed once (see ``effective``)."""

    segment_bytes: int = int(TOPIC_CONFIGS["segment.bytes"].default)
    segment_ms: int = int(TOPIC_CONFIGS["segment.ms"].default)
    segment_jitter_ms: int = int(TOPIC_CONFIGS["segment.jitter.ms"].default)
    segment_index_bytes: int = int(TOPIC_CONFIGS["segment.index.bytes"].default)
    index_interval_bytes: int = int(TOPIC_CONFIGS["index.interval.bytes"].default)
    max_message_bytes: int = int(TOPIC_CONFIGS["max.message.bytes"].default)
    flush_messages: int = int(TOPIC_CONFIGS["flush.messages"].default)
    flush_ms: int = int(TOPIC_CONFIGS["flush.ms"].default)
    retention_ms: int = int(TOPIC_CONFIGS["retention.ms"].default)
    retention_bytes: int = int(TOPIC_CONFIGS["retention.bytes"].default)
    cleanup_policy: tuple[str, ...] = ("delete",)
    delete_retention_ms: int = int(TOPIC_CONFIGS["delete.retention.ms"].default)
    min_compaction_lag_ms: int = int(TOPIC_CONFIGS["min.compaction.lag.ms"].default)
    min_cleanable_dirty_ratio: float = float(TOPIC_CONFIGS["min.cleanable.dirty.ratio"].default)
    message_timestamp_type: str = "CreateTime"
    message_timestamp_before_max_ms: int = int(TOPIC_CONFIGS["message.timestamp.before.max.ms"].default)
    message_timestamp_after_max_ms: int = int(TOPIC_CONFIGS["message.timestamp.after.max.ms"].default)
    file_delete_delay_ms: int = int(TOPIC_CONFIGS["file.delete.delay.ms"].default)
    compression_type: str = "producer"
    compression_gzip_level: int = int(TOPIC_CONFIGS["compression.gzip.level"].default)
    compression_lz4_level: int = int(TOPIC_CONFIGS["compression.lz4.level"].default)
    compression_zstd_level: int = int(TOPIC_CONFIGS["compression.zstd.level"].default)
    min_insync_replicas: int = 1
    unclean_leader_election_enable: bool = False
    max_compaction_lag_ms: int = int(TOPIC_CONFIGS["max.compaction.lag.ms"].default)

    def __post_init__(self) -> None:
        if self.segment_index_bytes < INDEX_BYTES_MIN:  # see INDEX_BYTES_MIN
            object.__setattr__(self, "segment_index_bytes", INDEX_BYTES_MIN)

    def compression_level(self, codec: int) -> int | None:
        """The topic's compression.<codec>.level for ``codec`` (None: snappy and none have no level)."""
        return {CODEC_GZIP: self.compression_gzip_level, CODEC_LZ4: self.compression_lz4_level,
                CODEC_ZSTD: self.compression_zstd_level}.get(codec)

    @classmethod
    def from_overrides(cls, overrides: Mapping[str, str],
                       broker_defaults: Mapping[str, str] | None = None) -> LogConfig:
        """Topic overrides > broker defaults > built-in defaults; raises InvalidConfigError."""
        v = effective(overrides, broker_defaults)
        return cls(
            segment_bytes=v["segment.bytes"],  # type: ignore[arg-type]
            segment_ms=v["segment.ms"],  # type: ignore[arg-type]
            segment_jitter_ms=v["segment.jitter.ms"],  # type: ignore[arg-type]
            segment_index_bytes=v["segment.index.bytes"],  # type: ignore[arg-type]
            index_interval_bytes=v["index.interval.bytes"],  # type: ignore[arg-type]
            max_message_bytes=min(v["max.message.bytes"], MAX_MESSAGE_BYTES_MAX),  # type: ignore[type-var]
            flush_messages=v["flush.messages"],  # type: ignore[arg-type]
            flush_ms=v["flush.ms"],  # type: ignore[arg-type]
            retention_ms=v["retention.ms"],  # type: ignore[arg-type]
            retention_bytes=v["retention.bytes"],  # type: ignore[arg-type]
            cleanup_policy=tuple(v["cleanup.policy"]),  # type: ignore[arg-type]
            delete_retention_ms=v["delete.retention.ms"],  # type: ignore[arg-type]
            min_compaction_lag_ms=v["min.compaction.lag.ms"],  # type: ignore[arg-type]
            min_cleanable_dirty_ratio=v["min.cleanable.dirty.ratio"],  # type: ignore[arg-type]
            message_timestamp_type=v["message.timestamp.type"],  # type: ignore[arg-type]
            message_timestamp_before_max_ms=v["message.timestamp.before.max.ms"],  # type: ignore[arg-type]
            message_timestamp_after_max_ms=v["message.timestamp.after.max.ms"],  # type: ignore[arg-type]
            file_delete_delay_ms=v["file.delete.delay.ms"],  # type: ignore[arg-type]
            compression_type="none" if v["compression.type"] == "uncompressed"  # type: ignore[arg-type]
            else v["compression.type"],
            compression_gzip_level=v["compression.gzip.level"],  # type: ignore[arg-type]
            compression_lz4_level=v["compression.lz4.level"],  # type: ignore[arg-type]
            compression_zstd_level=v["compression.zstd.level"],  # type: ignore[arg-type]
            min_insync_replicas=v["min.insync.replicas"],  # type: ignore[arg-type]
            unclean_leader_election_enable=v["unclean.leader.election.enable"],  # type: ignore[arg-type]
            max_compaction_lag_ms=v["max.compaction.lag.ms"],  # type: ignore[arg-type]
        )

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy
