"""An internal topic whose partitions' leaders are coordinators: ``__consumer_offsets`` (groups) and
``__transaction_state`` (transactional ids). Which broker coordinates a key is the leader of the key's partition;
the topic is made in the background at the first lookup that finds it missing (as Kafka makes it), one attempt
at a time, the replication factor capped at the live brokers."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from proto import errors
from proto.errors import ErrorCode

log = logging.getLogger(__name__)


def int_setting(defaults: Mapping[str, str], key: str, fallback: int) -> int:
    """An integer broker key of a coordinator's config (Kafka's name), ``fallback`` when unset; not an integer:
    InvalidConfigError naming it."""
    raw = defaults.get(key)
    try:
        return int(raw) if raw not in (None, "") else fallback
    except ValueError as exc:
        raise errors.InvalidConfigError(f"{key}={raw!r} is not an integer") from exc


class InternalTopic:
    def __init__(self, name: str, metadata_cache: Any, replica_manager: Any, *, partitions: int,
                 replication_factor: int, configs: Callable[[int], Mapping[str, str]], partitions_key: str,
                 on_short: Callable[[str], None] | None = None) -> None:
        """``configs(rf)``: the topic's configs for the replication factor it is made with; ``partitions_key``: the
        broker key that sets ``partitions`` (named when the topic has fewer); ``on_short`` is told that message."""
        self.name = name
        self.metadata_cache = metadata_cache
        self.replica_manager = replica_manager
        self.partitions = partitions
        self.replication_factor = replication_factor
        self._configs = configs
        self._partitions_key = partitions_key
        self._on_short = on_short
        self._lock = threading.Lock()
        self._inflight = False

    def coordinator(self, partition: int, key: str, listener: str) -> tuple[int, str, int]:
        """(node id, host, port on ``listener``) of the leader of ``partition``, which ``key`` hashes to; raises
        COORDINATOR_NOT_AVAILABLE (retriable) while the topic is made or the partition has no leader."""
        info = self.metadata_cache.partition(self.name, partition)
        if info is None:
            topic = self.metadata_cache.topic(self.name)
            if topic is not None and topic.partition_count <= partition:
                # Made before (or with fewer partitions than the key says now): the keys placed past its
                # partitions have no coordinator until an operator fixes it.
                message = (f"{self.name} has {topic.partition_count} partitions, fewer than {self._partitions_key} "
                           f"({self.partitions}): {key[:100]!r} is placed on partition {partition}, which it lacks")
                if self._on_short is not None:
                    self._on_short(message)
                raise errors.error_for(ErrorCode.COORDINATOR_NOT_AVAILABLE, message)
            self.ensure()
            raise errors.error_for(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"creating {self.name}")
        broker = self.metadata_cache.broker(info.leader) if info.leader >= 0 else None
        if broker is None:
            raise errors.error_for(ErrorCode.COORDINATOR_NOT_AVAILABLE, f"{self.name}-{partition} has no leader")
        return (broker.node_id, *broker.endpoint(listener))

    def ensure(self) -> None:
        """Make the topic in the background (one attempt in flight)."""
        with self._lock:
            if self._inflight:
                return
            self._inflight = True
        threading.Thread(target=self._ensure_now, name=f"{self.name.strip('_')}-create", daemon=True).start()

    def _ensure_now(self) -> None:
        try:
            live = [b for b in self.metadata_cache.brokers() if not b.fenced]
            rf = max(1, min(self.replication_factor, len(live)))
            self.replica_manager.ensure_internal_topic(self.name, self.partitions, rf, dict(self._configs(rf)))
            log.info("ensured %s (%d partitions, replication factor %d)", self.name, self.partitions, rf)
        except errors.BrookError as exc:
            log.warning("could not create %s: %s", self.name, exc)
        finally:
            with self._lock:
                self._inflight = False
