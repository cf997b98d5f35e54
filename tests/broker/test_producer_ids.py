"""Producer id blocks: the next one is asked for once 90% of the current one is handed out, and one
is fetched as soon as the broker is registered, so that new idempotent producers get ids at once,
and for a while after the controller quorum is lost (acks=all writes go on then)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from waiting import wait_for

from broker.producer_ids import ProducerIdManager
from proto import controller_pb2, errors

BLOCK = 10


class Controller:
    """AllocateProducerIds handing out consecutive blocks of BLOCK, until it is ``down``."""

    def __init__(self) -> None:
        self.calls = 0
        self.down = False
        self._lock = threading.Lock()

    def call(self, method: str, request: Any, timeout_s: float) -> Any:
        assert method == "AllocateProducerIds"
        with self._lock:
            if self.down:
                raise errors.RequestTimedOutError("no controller quorum")
            start = 1000 + BLOCK * self.calls
            self.calls += 1
        return controller_pb2.AllocateProducerIdsResponse(producer_id_start=start, producer_id_len=BLOCK)


def test_a_block_fetched_at_registration_serves_producers_while_the_quorum_is_down() -> None:
    ctl = Controller()
    ids = ProducerIdManager(1, ctl, lambda: 7)
    ids.prefetch()
    wait_for(lambda: ids.available() == BLOCK, 10, "the block to be fetched in the background")
    ctl.down = True
    assert [ids.next_id() for _ in range(BLOCK)] == list(range(1000, 1000 + BLOCK))


def test_the_next_block_is_fetched_before_the_current_one_runs_out() -> None:
    ctl = Controller()
    ids = ProducerIdManager(1, ctl, lambda: 7)
    first = [ids.next_id() for _ in range(BLOCK - 1)]  # 90% of the first block handed out
    assert first == list(range(1000, 1000 + BLOCK - 1))
    wait_for(lambda: ids.available() == BLOCK + 1, 10, "the next block to be fetched in the background")
    ctl.down = True
    rest = [ids.next_id() for _ in range(BLOCK + 1)]
    assert rest == list(range(1000 + BLOCK - 1, 1000 + 2 * BLOCK)), "ids not consecutive and unique"
    with pytest.raises(errors.RequestTimedOutError):
        for _ in range(BLOCK):  # past the prefetched block, the controller is needed again
            ids.next_id()
    ctl.down = False
    assert ids.next_id() >= 1000 + 2 * BLOCK


def test_ids_are_unique_across_threads() -> None:
    ids = ProducerIdManager(1, Controller(), lambda: 7)
    got: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        for _ in range(250):
            pid = ids.next_id()
            with lock:
                got.append(pid)
    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 1000 and len(set(got)) == 1000
