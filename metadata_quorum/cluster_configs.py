"""Cluster-wide broker configs changed at runtime (Kafka's dynamic default broker configs).

Stored in the metadata quorum (``AlterClusterConfigs``) and streamed to every broker with the
rest of the metadata, they override the value in each node's file without a restart. Only
keys whose change a running node can apply are accepted:

- the topic defaults, by their broker names (``log.retention.ms``, ``log.segment.bytes``,
  ``min.insync.replicas``, ...): brokers re-derive the config of every topic that does not
  override the key; the controller validates new topics against them;
- ``follower.replication.throttled.rate``: bytes per second a broker's followers may copy
  for partitions where they are not in sync (catching up after a move or a restart).

Pure: no I/O, no clocks; used by the state machine, the controller, the brokers and the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping

from proto import errors
from storage import log_config

# Topic config -> the broker-level key Kafka uses for its default.
BROKER_DEFAULT_KEYS: Mapping[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "compression.gzip.level": "compression.gzip.level",
    "compression.lz4.level": "compression.lz4.level",
    "compression.zstd.level": "compression.zstd.level",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "file.delete.delay.ms": "log.segment.delete.delay.ms",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "max.compaction.lag.ms": "log.cleaner.max.compaction.lag.ms",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.type": "log.message.timestamp.type",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "min.insync.replicas": "min.insync.replicas",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.index.bytes": "log.index.size.max.bytes",
    "segment.ms": "log.roll.ms",
    "segment.jitter.ms": "log.roll.jitter.ms",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}
TOPIC_KEY_OF: Mapping[str, str] = {broker: topic for topic, broker in BROKER_DEFAULT_KEYS.items()}

FOLLOWER_THROTTLE = "follower.replication.throttled.rate"
OTHER_KEYS: Mapping[str, str] = {
    FOLLOWER_THROTTLE: "Bytes per second each broker's followers may copy for partitions where they are not "
                       "in sync (a partition move, a restarted broker catching up). Unset: no limit.",
}
MAX_KEYS_PER_REQUEST = 100

# The largest max.message.bytes (a topic's) and message.max.bytes (the cluster default) a client may set and
# a broker uses: storage/log_config.py says why (log_config's strict check refuses more in ``validate``).
MAX_MESSAGE_BYTES_LIMIT = log_config.MAX_MESSAGE_BYTES_MAX


def known_keys() -> list[str]:
    return sorted([*TOPIC_KEY_OF, *OTHER_KEYS])


def builtin_default(key: str) -> str:
    """What a key is when neither the cluster (dynamic) nor the node's config sets it: its topic config's default;
    "" for one that is unset by default (the throttle: no limit)."""
    return log_config.TOPIC_CONFIGS[TOPIC_KEY_OF[key]].default if key in TOPIC_KEY_OF else ""


def doc(key: str) -> str:
    if key in OTHER_KEYS:
        return OTHER_KEYS[key]
    return f"Default of the topic config {TOPIC_KEY_OF[key]}: " + log_config.TOPIC_CONFIGS[TOPIC_KEY_OF[key]].doc


def validate(values: Mapping[str, str], delete: list[str] | tuple[str, ...] = (), *,
             strict: bool = True) -> dict[str, str]:
    """The values normalised as strings; INVALID_CONFIG naming the first unknown key or bad value.

    ``strict`` (what a client asks): topic defaults also within the bounds a client may set now
    (log_config's ``strict_check``, e.g. log.index.interval.bytes at most 1 MiB). The metadata state
    replays its journal with ``strict=False``, so what was accepted before still applies."""
    if len(values) + len(delete) > MAX_KEYS_PER_REQUEST:
        raise errors.InvalidConfigError(f"more than {MAX_KEYS_PER_REQUEST} keys in one change")
    for key in [*values, *delete]:
        if key not in TOPIC_KEY_OF and key not in OTHER_KEYS:
            raise errors.InvalidConfigError(
                f"'{key}' cannot be changed at runtime; dynamic cluster configs are: {', '.join(known_keys())}")
    if set(values) & set(delete):
        raise errors.InvalidConfigError(f"'{sorted(set(values) & set(delete))[0]}' is both set and deleted")
    out: dict[str, str] = {}
    for key, raw in values.items():
        text = str(raw).strip()
        if key == FOLLOWER_THROTTLE:
            try:
                if not log_config.is_number_text("long", text):  # not "1_000" nor other scripts' digits
                    raise ValueError
                rate = int(text)
            except ValueError:
                raise errors.InvalidConfigError(f"{key} must be a whole number of bytes per second, not {text!r}") \
                    from None
            if rate < 1:
                raise errors.InvalidConfigError(f"{key} must be at least 1 (delete the key for no limit)")
            if rate > 2**63 - 1:
                raise errors.InvalidConfigError(f"{key} must be at most {2**63 - 1} (delete the key for no limit)")
        else:
            # As a topic's own value: at most log_config.VALUE_MAX_CHARS and a list without repeats. Before, a
            # 3.5 MB cleanup.policy became every topic's (in each DescribeConfigs, and logged twice a change).
            name = TOPIC_KEY_OF[key]
            try:
                text = log_config.validate({name: text}, strict=strict)[name]
            except errors.BrookError as exc:
                raise errors.InvalidConfigError(f"{key}: {exc.message}") from None
        out[key] = text
    return out


def topic_defaults(configs: Mapping[str, str]) -> dict[str, str]:
    """The topic defaults among ``configs``, by topic config name (``segment.bytes``)."""
    return {TOPIC_KEY_OF[k]: v for k, v in configs.items() if k in TOPIC_KEY_OF}


def follower_throttle(configs: Mapping[str, str]) -> int | None:
    raw = configs.get(FOLLOWER_THROTTLE)
    return int(raw) if raw is not None else None
