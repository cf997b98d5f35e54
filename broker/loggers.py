"""A node's log levels, read and changed while it runs: Kafka's BROKER_LOGGER config resource (KIP-412).

``kafka-configs --entity-type broker-loggers --entity-name <id> --describe`` lists the node's loggers with their
levels; ``--alter --add-config brook.replica_manager=DEBUG`` sets one (IncrementalAlterConfigs SET), and
``--delete-config`` unsets it, so that it follows the root logger again, as Kafka's "unset" does. As in Kafka the
change is the process's own (a combined node's broker and controller alike) and lasts until it stops.

Kafka's level names map onto Python's: TRACE is a level below DEBUG (5), WARN is WARNING, FATAL is CRITICAL and
OFF is above CRITICAL (nothing is logged). The root logger is named ``root``, as Kafka's.
"""

from __future__ import annotations

import logging

from proto import errors

log = logging.getLogger(__name__)

ROOT = "root"
TRACE, OFF = 5, logging.CRITICAL + 10
LEVELS: dict[str, int] = {"TRACE": TRACE, "DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARN": logging.WARNING,
                          "ERROR": logging.ERROR, "FATAL": logging.CRITICAL, "OFF": OFF}
_BY_LEVEL = sorted((level, name) for name, level in LEVELS.items())
MAX_LOGGERS = 2000  # listed at most; a process's loggers are its modules', a few hundred


def level_name(level: int) -> str:
    """Kafka's name for a Python level: the first of Kafka's levels at or above it."""
    for bound, name in _BY_LEVEL:
        if level <= bound:
            return name
    return "OFF"


def _named(name: str) -> logging.Logger | None:
    if name == ROOT:
        return logging.getLogger()
    known = logging.root.manager.loggerDict.get(name)
    return known if isinstance(known, logging.Logger) else None  # a PlaceHolder is no logger yet


def describe() -> list[tuple[str, str]]:
    """(logger, Kafka level) for the root logger and every logger of the process, by name: its effective level
    (a logger with none of its own shows the level it inherits)."""
    loggers = sorted(name for name, known in list(logging.root.manager.loggerDict.items())
                     if isinstance(known, logging.Logger))[:MAX_LOGGERS]
    root = logging.getLogger()
    return [(ROOT, level_name(root.level))] + [(name, level_name(logging.getLogger(name).getEffectiveLevel()))
                                               for name in loggers]


def check(to_set: dict[str, str], to_delete: list[str]) -> None:
    """Refuse an unknown logger or level (INVALID_CONFIG) and unsetting the root logger (INVALID_REQUEST), as Kafka's
    broker does."""
    for name, value in to_set.items():
        if _named(name) is None:
            raise errors.InvalidConfigError(f"logger {name} does not exist")
        if value.upper() not in LEVELS:
            raise errors.InvalidConfigError(f"cannot set the log level of {name} to {value}: the levels are "
                                            f"{', '.join(LEVELS)}")
    for name in to_delete:
        if name == ROOT:
            raise errors.InvalidRequestError("removing the log level of the root logger is not allowed")
        if _named(name) is None:
            raise errors.InvalidConfigError(f"logger {name} does not exist")


def apply(to_set: dict[str, str], to_delete: list[str]) -> None:
    """Set and unset levels (``check`` first)."""
    for name, value in to_set.items():
        logger = _named(name)
        assert logger is not None
        logger.setLevel(LEVELS[value.upper()])
    for name in to_delete:
        logger = _named(name)
        assert logger is not None
        logger.setLevel(logging.NOTSET)  # it follows its parents, the root at last
    if to_set or to_delete:
        log.warning("log levels changed: %s", ", ".join([f"{n}={v.upper()}" for n, v in sorted(to_set.items())]
                                                        + [f"{n} unset" for n in sorted(to_delete)]))
