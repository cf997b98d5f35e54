"""Brook's Python client: Producer, Consumer, Admin, and the low-level ClusterClient.

    from client import Producer, Consumer, Admin, NewTopic, TopicPartition

Names are imported lazily so that ``client.types`` (used by the broker) does not pull
in the whole client.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Producer": "client.producer",
    "Consumer": "client.consumer",
    "ConsumerRebalanceListener": "client.consumer",
    "Admin": "client.admin",
    "NewTopic": "client.admin",
    "ClusterClient": "client.cluster",
    "TopicPartition": "client.types",
    "OffsetAndMetadata": "client.types",
    "RecordMetadata": "client.types",
    "ConsumerRecord": "client.types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
