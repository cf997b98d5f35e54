"""The client-request pool takes turns between clients (broker/fair_pool.py).

One client that pipelines expensive requests (1 KiB zstd batches that inflate to 30 MiB: ~5 ms of a thread
each to check) used to have hundreds queued on ``num.io.threads`` at a time, and every other client's work
there waited behind all of them (0.7 s at the median on a real broker). Each client now has a queue of its
own and a free thread serves them in turn: another client's task waits for at most one task per thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessBroker
from waiting import await_for, wait_for

from broker.cpu_shares import CpuShares
from broker.fair_pool import CLIENT, FairExecutor, blocking
from proto import broker_pb2
from storage.record_batch import CODEC_ZSTD, RecordBatchBuilder

DEADLINE_S = 30.0  # a task that should run; failing, it would wait for good


def submit_as(pool: FairExecutor, client: str, fn, *args) -> concurrent.futures.Future:
    token = CLIENT.set(client)
    try:
        return pool.submit(fn, *args)
    finally:
        CLIENT.reset(token)


@pytest.fixture
def pool() -> Iterator[FairExecutor]:
    p = FairExecutor(1, thread_name_prefix="test-fair")
    yield p
    p.shutdown(wait=True, cancel_futures=True)


def test_a_client_with_many_tasks_waiting_delays_another_by_one_task_at_most(pool: FairExecutor) -> None:
    gate = threading.Event()
    ran: list[str] = []
    held = submit_as(pool, "holder", gate.wait)
    flood = [submit_as(pool, "A", ran.append, f"A{i}") for i in range(50)]
    other = submit_as(pool, "B", ran.append, "B0")
    wait_for(lambda: pool.queued() == 51, DEADLINE_S, "the tasks queued behind the held thread")
    assert pool.clients_waiting() == 2
    gate.set()
    concurrent.futures.wait([held, other, *flood], DEADLINE_S)
    assert ran.index("B0") <= 1, f"B's task ran after {ran.index('B0')} of A's"
    assert [r for r in ran if r.startswith("A")] == [f"A{i}" for i in range(50)], "a client's own order changed"


def test_turns_go_round_between_every_client_with_work(pool: FairExecutor) -> None:
    gate = threading.Event()
    ran: list[str] = []
    submit_as(pool, "holder", gate.wait)
    futures = [submit_as(pool, c, ran.append, f"{c}{i}") for c in "ABC" for i in range(3)]
    wait_for(lambda: pool.queued() == 9, DEADLINE_S, "the tasks queued")
    gate.set()
    concurrent.futures.wait(futures, DEADLINE_S)
    assert ran == ["A0", "B0", "C0", "A1", "B1", "C1", "A2", "B2", "C2"], ran


def test_results_exceptions_threads_and_shutdown() -> None:
    pool = FairExecutor(3, thread_name_prefix="test-fair")
    assert pool.submit(lambda x: x * 2, 21).result(DEADLINE_S) == 42
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(DEADLINE_S)
    # Three threads at most, all used: three tasks that wait for each other all run at once.
    barrier = threading.Barrier(3, timeout=DEADLINE_S)
    assert sorted(f.result(DEADLINE_S) for f in [pool.submit(barrier.wait) for _ in range(3)]) == [0, 1, 2]
    gate = threading.Event()
    running = [pool.submit(gate.wait) for _ in range(3)]
    waiting = pool.submit(lambda: "never")
    wait_for(lambda: pool.queued() == 1, DEADLINE_S, "a task waiting for a thread")
    assert threading.active_count() >= 3 and len(pool._threads) == 3  # no fourth thread for the fourth task
    pool.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)
    gate.set()
    concurrent.futures.wait(running, DEADLINE_S)
    assert all(f.result() for f in running)
    pool.shutdown(wait=True)
    assert not any(t.is_alive() for t in pool._threads)


def test_run_in_executor_takes_the_client_of_the_task_that_hands_the_work_over(pool: FairExecutor) -> None:
    gate = threading.Event()
    submit_as(pool, "holder", gate.wait)

    async def scenario() -> None:
        async def as_client(name: str) -> None:
            CLIENT.set(name)  # in this task's own copy of the context
            await asyncio.get_running_loop().run_in_executor(pool, lambda: None)
        tasks = [asyncio.ensure_future(as_client(n)) for n in ("10.0.0.1", "10.0.0.2", "10.0.0.1")]
        await await_for(lambda: pool.queued() == 3, DEADLINE_S, "the three queued")
        assert pool.clients_waiting() == 2, "the tasks' clients were not told apart"
        gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks), DEADLINE_S)
    asyncio.run(scenario())
    assert CLIENT.get() == "", "a task's client leaked out of it"


class Context:
    """What BrokerService reads of a gRPC call's context: the client's address."""

    def __init__(self, host: str) -> None:
        self.host = host

    def peer(self) -> str:
        return f"ipv4:{self.host}:5000"

    def auth_context(self) -> dict:
        return {}

    def invocation_metadata(self) -> tuple:
        return ()

    def add_done_callback(self, callback) -> None:
        pass

    async def abort(self, code, details: str) -> None:
        raise AssertionError(f"aborted: {code} {details}")


def zstd_produce() -> broker_pb2.ProduceRequest:
    b = RecordBatchBuilder(CODEC_ZSTD)  # compressed: checked on num.io.threads, never on the event loop
    b.append(0, None, b"v" * 1000)
    return broker_pb2.ProduceRequest(acks=1, timeout_ms=30_000, partitions=[
        broker_pb2.ProducePartitionData(topic="t", partition=0, records=b.build())])


@pytest.fixture
def broker(tmp_path: Path, pool: FairExecutor) -> Iterator[InProcessBroker]:
    with InProcessBroker(tmp_path, {"t": {}}, executor=pool) as b:
        yield b


def test_a_clients_produce_flood_delays_another_clients_produce_by_one_request_at_most(
        broker: InProcessBroker, pool: FairExecutor) -> None:
    """Real BrokerService, ReplicaManager and Log; the client is the address the call came from."""
    gate = threading.Event()
    submit_as(pool, "holder", gate.wait)

    async def scenario() -> None:
        service = broker.service
        flood = [asyncio.ensure_future(service.Produce(zstd_produce(), Context("10.0.0.1"))) for _ in range(30)]
        await await_for(lambda: pool.queued() == 30, DEADLINE_S, "the flood queued on the held thread")
        other = asyncio.ensure_future(service.Produce(zstd_produce(), Context("10.0.0.2")))
        await await_for(lambda: pool.queued() == 31, DEADLINE_S, "the other client's produce queued")
        gate.set()
        resp = await asyncio.wait_for(other, DEADLINE_S)
        assert resp.partitions[0].error_code == 0, resp
        # One record a request, appended in the order the thread took them: the offset says how many went first.
        before = resp.partitions[0].base_offset
        assert before <= 1, f"the other client's produce was appended after {before} of the flood's 30"
        assert all(r.partitions[0].error_code == 0 for r in await asyncio.gather(*flood))
    asyncio.run(scenario())


# ---- running_per_client: threads share one GIL, so a client's places, not only its turns, are bounded ----
def test_with_a_cap_a_client_runs_that_many_tasks_at_most_and_another_clients_task_runs_at_once() -> None:
    """A ListGroups flood of one address had tasks on 31 of the group pool's 32 threads, each taking its turn
    at the GIL: another address's commits were 12x slower. With the cap its tasks hold two places at most."""
    pool = FairExecutor(8, thread_name_prefix="test-fair", running_per_client=2)
    gate = threading.Event()
    lock = threading.Lock()
    running = {"A": 0}
    most = 0

    def held() -> None:
        nonlocal most
        with lock:
            running["A"] += 1
            most = max(most, running["A"])
        gate.wait(DEADLINE_S)
        with lock:
            running["A"] -= 1

    try:
        flood = [submit_as(pool, "A", held) for _ in range(6)]
        wait_for(lambda: running["A"] == 2 and pool.queued() == 4, DEADLINE_S, "A's two places taken, four waiting")
        assert submit_as(pool, "B", lambda: "B ran").result(DEADLINE_S) == "B ran"
        assert running["A"] == 2 and pool.queued() == 4, "A's waiting tasks started while its places were held"
        gate.set()
        concurrent.futures.wait(flood, DEADLINE_S)
        assert all(f.done() and f.exception() is None for f in flood)
        assert most == 2, f"{most} of A's tasks ran at once"
    finally:
        gate.set()
        pool.shutdown(wait=True)


def test_a_task_waiting_in_blocking_gives_its_place_up_and_takes_it_back_before_the_clients_queued_tasks() -> None:
    """A commit waiting for its acks=all write holds no share of the GIL: its place is another task's meanwhile,
    and it goes on before the tasks its client queued after it."""
    pool = FairExecutor(4, thread_name_prefix="test-fair", running_per_client=1)
    written, second_holds = threading.Event(), threading.Event()
    ran: list[str] = []

    def commit() -> None:
        ran.append("commit appended")
        with blocking():
            written.wait(DEADLINE_S)
        ran.append("commit answered")

    def heartbeat() -> None:
        ran.append("heartbeat")
        second_holds.wait(DEADLINE_S)  # holds the place (no blocking()): the commit must wait for it

    try:
        first = submit_as(pool, "A", commit)
        wait_for(lambda: ran == ["commit appended"], DEADLINE_S, "the commit waiting for its write")
        second = submit_as(pool, "A", heartbeat)
        wait_for(lambda: ran[-1:] == ["heartbeat"], DEADLINE_S, "the heartbeat running in the commit's place")
        third = submit_as(pool, "A", ran.append, "offset fetch")
        written.set()
        wait_for(lambda: pool._resuming.get("A") == 1, DEADLINE_S, "the commit waiting to take its place back")
        assert ran == ["commit appended", "heartbeat"], "a task ran past the client's one place"
        second_holds.set()
        concurrent.futures.wait([first, second, third], DEADLINE_S)
        assert ran == ["commit appended", "heartbeat", "commit answered", "offset fetch"], ran
        assert not pool._running and not pool._resuming, "places left taken"
    finally:
        written.set()
        second_holds.set()
        pool.shutdown(wait=True)


def test_blocking_outside_a_capped_pool_changes_nothing() -> None:
    with blocking():
        pass
    pool = FairExecutor(1, thread_name_prefix="test-fair")
    try:
        def inside() -> str:
            with blocking():
                return "ok"
        assert pool.submit(inside).result(DEADLINE_S) == "ok"
    finally:
        pool.shutdown(wait=True)


def test_each_tasks_thread_cpu_time_is_charged_to_its_client() -> None:
    class StillClock:
        def __call__(self) -> float:
            return 5000.0

    cpu = CpuShares(50, clock=StillClock())
    pool = FairExecutor(2, thread_name_prefix="test-fair", cpu=cpu)

    def spin() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    try:
        submit_as(pool, "10.0.0.9", spin).result(DEADLINE_S)
        submit_as(pool, "10.0.0.9", time.sleep, 0.1).result(DEADLINE_S)  # a wait costs no CPU
        assert 0.05 <= cpu.used_s("10.0.0.9") < 0.09, cpu.used_s("10.0.0.9")
        assert cpu.used_s("10.0.0.8") == 0.0
    finally:
        pool.shutdown(wait=True)
