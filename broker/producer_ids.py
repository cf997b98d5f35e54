"""Producer ids for idempotent producers: handed out from blocks the controller allocates.

The controller's AllocateProducerIds gives each broker a disjoint block, so ids are
unique cluster-wide without a round trip per producer. Deduplication itself happens in
the storage layer's ProducerStateManager on append.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from proto import controller_pb2, errors
from proto.errors import ErrorCode

log = logging.getLogger(__name__)


# As Kafka's broker (RPCProducerIdManager): the next block is asked for once this much of the
# current one is handed out, so that new producers get ids at once, and for a while without the
# controller quorum (an outage stops no acks=all write, see replica_manager.append_records).
PREFETCH_AT_PERCENT = 90


class ProducerIdManager:
    def __init__(self, node_id: int, controller_client: Any, broker_epoch: Callable[[], int]) -> None:
        self.node_id = node_id
        self._client = controller_client
        self._broker_epoch = broker_epoch
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0  # exclusive
        self._block_len = 0
        self._prefetched: tuple[int, int] | None = None  # (start, end) of the next block
        self._prefetching = False

    def next_id(self) -> int:
        with self._lock:
            if self._next >= self._end:
                if self._prefetched is not None:
                    self._use_locked(self._prefetched)
                    self._prefetched = None
                else:
                    self._use_locked(self._allocate_block())
            pid = self._next
            self._next += 1
            self._maybe_prefetch_locked()
            return pid

    def prefetch(self) -> None:
        """Ask for a block in the background when none is at hand (the broker calls it once registered)."""
        with self._lock:
            self._maybe_prefetch_locked()

    def available(self) -> int:
        """Ids at hand: what is left of the current block and the prefetched one."""
        with self._lock:
            later = self._prefetched[1] - self._prefetched[0] if self._prefetched is not None else 0
            return max(0, self._end - self._next) + later

    def _use_locked(self, block: tuple[int, int]) -> None:
        self._next, self._end = block
        self._block_len = block[1] - block[0]

    def _maybe_prefetch_locked(self) -> None:
        if self._prefetched is not None or self._prefetching:
            return
        if (self._end - self._next) * 100 > (100 - PREFETCH_AT_PERCENT) * self._block_len:
            return
        self._prefetching = True
        threading.Thread(target=self._prefetch, name=f"producer-ids-{self.node_id}", daemon=True).start()

    def _prefetch(self) -> None:
        block: tuple[int, int] | None = None
        try:
            block = self._allocate_block()
        except Exception as exc:  # noqa: BLE001 - best effort: next_id asks again when it needs one
            log.info("broker %d: asking the controller for the next producer id block failed: %s", self.node_id, exc)
        with self._lock:
            self._prefetching = False
            if block is None:
                return
            if self._next >= self._end:
                self._use_locked(block)
            else:
                self._prefetched = block

    def _allocate_block(self) -> tuple[int, int]:
        req = controller_pb2.AllocateProducerIdsRequest(broker_id=self.node_id, broker_epoch=self._broker_epoch())
        resp = self._client.call("AllocateProducerIds", req, timeout_s=10)
        if resp.error_code != ErrorCode.NONE:
            raise errors.error_for(resp.error_code, resp.error_message)
        if resp.producer_id_len <= 0 or resp.producer_id_start < 0:
            raise errors.UnknownServerError(
                f"controller returned an empty producer id block ({resp.producer_id_start}, {resp.producer_id_len})")
        return resp.producer_id_start, resp.producer_id_start + resp.producer_id_len
