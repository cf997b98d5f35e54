"""Producer ids for idempotent producers: handed out from blocks the controller allocates.

The controller's AllocateProducerIds gives each broker a disjoint block, so ids are
unique cluster-wide without a round trip per producer. Deduplication itself happens in
the storage layer's ProducerStateManager on append.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from proto import controller_pb2, errors
from proto.errors import ErrorCode


class ProducerIdManager:
    def __init__(self, node_id: int, controller_client: Any, broker_epoch: Callable[[], int]) -> None:
        self.node_id = node_id
        self._client = controller_client
        self._broker_epoch = broker_epoch
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0  # exclusive

    def next_id(self) -> int:
        with self._lock:
            if self._next >= self._end:
                self._allocate_block()
            pid = self._next
            self._next += 1
            return pid

    def _allocate_block(self) -> None:
        req = controller_pb2.AllocateProducerIdsRequest(broker_id=self.node_id, broker_epoch=self._broker_epoch())
        resp = self._client.call("AllocateProducerIds", req, timeout_s=10)
        if resp.error_code != ErrorCode.NONE:
            raise errors.error_for(resp.error_code, resp.error_message)
        if resp.producer_id_len <= 0 or resp.producer_id_start < 0:
            raise errors.UnknownServerError(
                f"controller returned an empty producer id block ({resp.producer_id_start}, {resp.producer_id_len})")
        self._next = resp.producer_id_start
        self._end = resp.producer_id_start + resp.producer_id_len
