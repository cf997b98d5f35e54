"""Config handling shared by Producer, Consumer and Admin.

Keys may be given with Kafka's dotted names (``{"batch.size": 65536}``, as
confluent-kafka does) or as keyword arguments with underscores (``batch_size=65536``,
as kafka-python does); both normalize to the underscore form. Unknown keys are an
error rather than silently ignored, so a typo cannot go unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from client import errors

COMPRESSION_CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}

# Kafka's client security keys (underscore form), accepted by Producer, Consumer and
# Admin and turned into a client.security.SecurityConfig.
SECURITY_DEFAULTS: dict[str, Any] = {
    "security_protocol": None,
    "ssl_ca_location": None,
    "ssl_certificate_location": None,
    "ssl_key_location": None,
    "ssl_endpoint_identification_algorithm": None,
    "sasl_mechanism": None,
    "sasl_username": None,
    "sasl_password": None,
}


def security_config(cfg: Mapping[str, Any]) -> Any:
    """The client.security.SecurityConfig of a normalized client config."""
    from client.security import SecurityConfig

    return SecurityConfig.from_config({k: v for k, v in cfg.items() if k in SECURITY_DEFAULTS})


def normalize(config: Mapping[str, Any] | None, kwargs: Mapping[str, Any], known: Mapping[str, Any],
              *, what: str) -> dict[str, Any]:
    """Merge ``config`` and ``kwargs`` over the defaults in ``known``; reject unknown keys."""
    merged = dict(known)
    for source in (config or {}, kwargs):
        for key, value in source.items():
            name = key.replace(".", "_").replace("-", "_")
            if name not in known:
                raise errors.InvalidConfigError(f"unknown {what} config {key!r}")
            merged[name] = value
    return merged


def parse_acks(value: Any) -> int:
    if value in ("all", "-1", -1):
        return -1
    if value in (0, 1, "0", "1"):
        return int(value)
    raise errors.InvalidConfigError(f"acks must be 0, 1 or all, got {value!r}")


def parse_codec(value: Any) -> int:
    name = "none" if value is None else str(value).lower()
    if name not in COMPRESSION_CODECS:
        raise errors.InvalidConfigError(
            f"compression.type must be one of {sorted(COMPRESSION_CODECS)}, got {value!r}")
    return COMPRESSION_CODECS[name]


def require_int(cfg: Mapping[str, Any], name: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    value = cfg[name]
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise errors.InvalidConfigError(f"{name.replace('_', '.')} must be an integer, got {value!r}")
    try:
        number = int(value)
    except ValueError as exc:
        raise errors.InvalidConfigError(f"{name.replace('_', '.')} must be an integer, got {value!r}") from exc
    if number < minimum or (maximum is not None and number > maximum):
        bound = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise errors.InvalidConfigError(f"{name.replace('_', '.')} must be {bound}, got {number}")
    return number


def parse_compression_level(cfg: Mapping[str, Any], codec: int) -> int | None:
    """The producer's compression.<codec>.level for ``codec`` (KIP-390), checked; None for codecs without one."""
    from storage.compression import CODEC_NAMES, LEVELS, check_level

    if codec not in LEVELS:
        return None
    name = f"compression_{CODEC_NAMES[codec]}_level"
    level = require_int(cfg, name, minimum=LEVELS[codec][0] if LEVELS[codec][2] >= 0 else -1)
    why = check_level(codec, level)
    if why is not None:
        raise errors.InvalidConfigError(f"{name.replace('_', '.')} {why}, got {level}")
    return level


# isolation.level (Kafka's IsolationLevel ids, as Fetch and ListOffsets carry them)
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
ISOLATION_LEVELS = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}


def parse_isolation_level(value: Any) -> int:
    """A consumer's isolation.level: read_uncommitted (0, Kafka's default) or read_committed (1)."""
    name = str(value).lower()
    if name not in ISOLATION_LEVELS:
        raise errors.InvalidConfigError(f"isolation.level must be read_uncommitted or read_committed, got {value!r}")
    return ISOLATION_LEVELS[name]


def parse_bool(cfg: Mapping[str, Any], name: str) -> bool:
    value = cfg[name]
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise errors.InvalidConfigError(f"{name.replace('_', '.')} must be true or false, got {value!r}")
