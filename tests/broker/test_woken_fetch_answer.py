"""A follower's parked fetch on a connection that can write its own answer is answered by the wake.

The replication listener gives each follower session a ``send_now`` (FollowerFetchSession): when an
append on the event loop wakes the session's parked fetch and the read it makes has an answer due,
the answer is written from the wake itself, before the append returns, as Kafka's purgatory
completes a follower's fetch from the appending thread. The awaiting ``session_fetch`` then returns
None (sent already). Anything else (a gRPC stream's session, an append off the loop, an answer not
due) takes the usual way: the read is handed to the parked fetch, which answers when it resumes.
Real ReplicaManager and Log (tests/broker/inprocess.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from inprocess import InProcessBroker
from waiting import await_for

from broker.fetch_answer import FetchAnswer, answer_of
from broker.fetch_session import FollowerFetchSession
from proto import broker_pb2
from storage.record_batch import RecordBatchBuilder, iter_batches


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[InProcessBroker]:
    """Broker 1 leading t-0, broker 2 an in-sync follower whose fetches the tests make."""
    with InProcessBroker(tmp_path, {"t": {}}, replicas=(1, 2)) as b:
        yield b


def batch(value: bytes) -> bytes:
    b = RecordBatchBuilder()
    b.append(0, None, value)
    return b.build()


def follower_fetch(offset: int, min_bytes: int = 1) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(replica_id=2, replica_epoch=1, max_wait_ms=10_000, min_bytes=min_bytes,
                                   max_bytes=1 << 20, partitions=[broker_pb2.FetchPartition(
                                       topic="t", partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
                                       current_leader_epoch=0, last_fetched_epoch=0, log_start_offset=0)])


def offsets(resp: FetchAnswer | broker_pb2.FetchResponse) -> list[int]:
    return [h.base_offset for pr in answer_of(resp).to_message().partitions for _, h in iter_batches(pr.records)]


def fetch(leader: InProcessBroker, session: FollowerFetchSession,
          req: broker_pb2.FetchRequest) -> asyncio.Future[broker_pb2.FetchResponse | None]:
    """The session's next fetch, as the leader's fetch-session handler makes it (the caller checked)."""
    session.update(req)
    return asyncio.ensure_future(leader.rm.session_fetch(req, session, run=leader.service._replication_io))


async def parked(leader: InProcessBroker, session: FollowerFetchSession,
                 req: broker_pb2.FetchRequest) -> asyncio.Future[broker_pb2.FetchResponse | None]:
    """The session's fetch of ``req``, once it waits for data."""
    task = fetch(leader, session, req)
    await await_for(lambda: session.parked, 10, "the caught-up fetch to park")
    return task


def listener_session(leader: InProcessBroker) -> tuple[FollowerFetchSession, list[broker_pb2.FetchResponse]]:
    """A session with a writer of its own, as the replication listener's, and the answers it wrote."""
    session = leader.rm.new_fetch_session()
    sent: list[broker_pb2.FetchResponse] = []
    session.send_now = sent.append
    return session, sent


def append_on_loop(leader: InProcessBroker, value: bytes) -> None:
    leader.rm.append_records("t", 0, batch(value), acks=1, timeout_ms=1000, blocking=False).result(0)


def test_an_append_on_the_loop_answers_the_parked_fetch_from_its_wake(leader: InProcessBroker) -> None:
    async def scenario() -> None:
        session, sent = listener_session(leader)
        append_on_loop(leader, b"first")
        first = await fetch(leader, session, follower_fetch(0))
        assert first is not None and offsets(first) == [0], "data already there: answered the usual way"
        assert not sent

        task = await parked(leader, session, follower_fetch(1))
        append_on_loop(leader, b"second")
        assert [offsets(r) for r in sent] == [[1]], "answered within the append, before it returned"
        assert sent[0].message.incremental, "a session's answers say the leader keeps its partitions"
        assert await asyncio.wait_for(task, 10) is None, "the fetch returns nothing more to send"
        assert not session.parked

        task = await parked(leader, session, follower_fetch(2))  # the session goes on as before
        append_on_loop(leader, b"third")
        assert [offsets(r) for r in sent] == [[1], [2]]
        assert await asyncio.wait_for(task, 10) is None
        session.close()

    asyncio.run(scenario())


def test_without_send_now_or_off_the_loop_the_woken_fetch_answers_itself(leader: InProcessBroker) -> None:
    async def scenario() -> None:
        stream = leader.rm.new_fetch_session()  # a ReplicaFetch stream's session: no writer of its own
        append_on_loop(leader, b"first")
        await fetch(leader, stream, follower_fetch(0))
        task = await parked(leader, stream, follower_fetch(1))
        append_on_loop(leader, b"second")
        resp = await asyncio.wait_for(task, 10)
        assert resp is not None and offsets(resp) == [1] and resp.message.incremental
        stream.close()

        listener, sent = listener_session(leader)
        await fetch(leader, listener, follower_fetch(0))
        task = await parked(leader, listener, follower_fetch(2))
        # An append on another thread (the executor's, for a request the loop may not wait for) reads for
        # the fetch there and hands the read over: writing to the connection belongs to the loop.
        await asyncio.get_running_loop().run_in_executor(None, lambda: leader.rm.append_records(
            "t", 0, batch(b"third"), acks=1, timeout_ms=1000).result(10))
        resp = await asyncio.wait_for(task, 10)
        assert resp is not None and offsets(resp) == [2] and not sent
        listener.close()

    asyncio.run(scenario())


def test_a_woken_read_short_of_min_bytes_is_not_sent_and_the_fetch_waits_on(leader: InProcessBroker) -> None:
    async def scenario() -> None:
        session, sent = listener_session(leader)
        append_on_loop(leader, b"first")
        await fetch(leader, session, follower_fetch(0))
        task = await parked(leader, session, follower_fetch(1, min_bytes=10_000))
        append_on_loop(leader, b"small")  # far fewer bytes than the fetch's min_bytes
        await await_for(lambda: session.parked, 10, "the fetch to park again")
        assert not sent and not task.done()
        append_on_loop(leader, b"x" * 20_000)
        assert [offsets(r) for r in sent] == [[1, 2]], "both batches, once min_bytes is reached"
        assert await asyncio.wait_for(task, 10) is None
        session.close()

    asyncio.run(scenario())
