"""The metadata cache a group coordinator under test looks topics up in: named topics with their partition
counts, each with a stable id (a unique module name: tests/ has no packages)."""

from __future__ import annotations

import types
import uuid
from typing import Any


class TopicsCache:
    version = 1

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics

    def topic(self, name: str) -> Any:
        if name not in self.topics:
            return None
        return types.SimpleNamespace(name=name, topic_id=uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                                     partition_count=self.topics[name])

    def topic_names(self) -> list[str]:
        return list(self.topics)

    def partition(self, topic: str, partition: int) -> Any:
        return types.SimpleNamespace(topic=topic, partition=partition, leader=1) \
            if 0 <= partition < self.topics.get(topic, 0) else None

    def counts(self) -> tuple[int, int]:
        return len(self.topics), sum(self.topics.values())

    def broker(self, node_id: int) -> Any:
        return None
