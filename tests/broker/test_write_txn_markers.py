"""WriteTxnMarkers on a partition leader (what a transaction coordinator on another broker sends): the markers are
appended on a replication thread, and their acks=all wait costs none.

A waiting WriteTxnMarkers held a replication thread until the in-sync replicas had its markers. Those threads also
put together follower fetch answers of many partitions: with all four waiting, no such answer went out, no high
watermark moved, and every wait ran to its timeout. 32 transactional producers on a local cluster committed 59-78
transactions a second, some commits taking 10-20 s; with the wait on the event loop, 165-177 (make bench-txn)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path

from inprocess import InProcessBroker, LoopbackCaller

from broker import principal
from proto import broker_pb2
from proto.common_pb2 import ErrorCode


def test_a_marker_waiting_for_its_followers_holds_no_replication_thread(tmp_path: Path) -> None:
    principal.configure(trust_loopback_plaintext=True)  # the caller stands for a broker on this host
    one_thread = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="replication")
    # replicas 1 and 2, both in sync: a marker is acknowledged once broker 2 fetched it, which it never does here
    with InProcessBroker(tmp_path, {"t": {}}, replicas=(1, 2), executor=one_thread) as b:
        async def run() -> tuple[int, float, float]:
            call = asyncio.ensure_future(b.service.WriteTxnMarkers(broker_pb2.WriteTxnMarkersRequest(
                producer_id=7, producer_epoch=0, commit=True, coordinator_epoch=0, timeout_ms=2_000,
                partitions=[broker_pb2.MarkerPartition(topic="t", partition=0)]), LoopbackCaller()))
            log = b.rm.partition("t", 0).log
            deadline = time.monotonic() + 5
            while log.log_end_offset == 0:  # until the marker is appended; then it waits for broker 2
                assert time.monotonic() < deadline, "the marker was not appended within 5 s"
                await asyncio.sleep(0.01)
            assert not call.done()
            probe_started = time.monotonic()
            await asyncio.get_running_loop().run_in_executor(one_thread, lambda: None)
            probed = time.monotonic() - probe_started
            resp = await call
            return resp.partitions[0].error_code, probed, time.monotonic() - probe_started
        code, probed, answered = asyncio.run(run())
    assert code == ErrorCode.REQUEST_TIMED_OUT  # the follower never fetched the marker
    assert probed < answered - 1.0, f"the replication thread was free after {probed:.2f} s, the answer {answered:.2f} s"
