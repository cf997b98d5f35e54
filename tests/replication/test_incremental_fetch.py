"""Incremental fetch sessions (KIP-227, scoped to a ReplicaFetch stream), both sides.

Leader: broker/fetch_session.py keeps the follower's latest fetch of each partition and reads
only the partitions with something to tell or record, all of them once per refresh. Follower:
replication/fetcher.py sends the full fetch first, then (once the leader said it keeps sessions)
only the partitions whose fetch changed, and the ones it dropped as forgotten. The cluster-level
property (idle partitions stay in the ISR) is in tests/broker/test_replication_cluster.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from test_fetch_session import BATCH
from waiting import wait_for

from broker import fetch_session
from broker.fetch_session import FollowerFetchSession, SessionIndex
from proto import broker_pb2, broker_pb2_grpc, errors
from replication.fetcher import FetcherConfig, ReplicaFetcherManager
from replication.partition import Partition
from storage.log import Log
from storage.log_config import LogConfig


def fp(partition: int, offset: int = 0, topic: str = "t") -> broker_pb2.FetchPartition:
    return broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset, current_leader_epoch=0)


def request(*parts: broker_pb2.FetchPartition, incremental: bool = False,
            forgotten: tuple[int, ...] = ()) -> broker_pb2.FetchRequest:
    return broker_pb2.FetchRequest(replica_id=2, max_wait_ms=100, min_bytes=1, partitions=parts,
                                   incremental=incremental,
                                   forgotten=[broker_pb2.FetchForgotten(topic="t", partition=p) for p in forgotten])


def hosted(n: int) -> dict[tuple[str, int], Any]:
    """Stand-ins for the leader's Partitions: what the session looks at (data_seq)."""
    return {("t", p): SimpleNamespace(data_seq=0) for p in range(n)}


def read(session: FollowerFetchSession, parts: dict[tuple[str, int], Any], now: float) -> list[int]:
    """What a read at ``now`` covers; its answer is sent."""
    req, keys = session.request(parts, now)
    assert sorted(keys) == sorted((f.topic, f.partition) for f in req.partitions)
    session.answered(broker_pb2.FetchResponse())
    return sorted(f.partition for f in req.partitions)


def append(session: FollowerFetchSession, parts: dict[tuple[str, int], Any], p: int) -> None:
    parts[("t", p)].data_seq += 1
    session.changed(("t", p), parts[("t", p)])


def session_of(n: int, index: SessionIndex | None = None) -> FollowerFetchSession:
    s = FollowerFetchSession(index or SessionIndex(), refresh_s=1.0)
    s.update(request(*(fp(p) for p in range(n))))
    return s


def test_a_session_reads_only_what_changed_and_everything_once_per_refresh() -> None:
    parts = hosted(4)
    index = SessionIndex()
    s = session_of(4, index)
    assert read(s, parts, 10.0) == [0, 1, 2, 3], "a new session reads every partition"
    assert read(s, parts, 10.01) == [], "nothing changed: nothing to read (the fetch waits for a change)"
    parts[("t", 2)].data_seq += 1
    index.changed(("t", 2), parts[("t", 2)])
    assert read(s, parts, 10.02) == [2], "new data, marked through the broker's index"
    index.changed(("t", 3), parts[("t", 3)])  # a high watermark move: same data
    assert read(s, parts, 10.03) == [3], "a moved high watermark is read with the next answer"
    s.update(request(fp(1, offset=5), incremental=True))
    req, _ = s.request(parts, 10.05)
    assert [(f.partition, f.fetch_offset) for f in req.partitions] == [(1, 5)], \
        "the follower moved on partition 1: its progress is read (it may move the HW)"
    s.answered(broker_pb2.FetchResponse())
    # In turns, every partition is read once per refresh_s (1 s here), its share at each read.
    assert read(s, parts, 10.6) == [0, 1], "the refresh's share of 4 partitions over the 0.6 s since the last read"
    assert read(s, parts, 10.7) == [], "0.4 of a partition due: none yet"
    assert read(s, parts, 11.0) == [2, 3]
    turn = [read(s, parts, 11.0 + i / 8) for i in range(1, 9)]
    assert sorted(p for r in turn for p in r) == [0, 1, 2, 3], f"one read each per second: {turn}"
    assert read(s, parts, 30.0) == [0, 1, 2, 3], "after a long wait, every partition is due, once"
    s.close()
    append(s, parts, 0)
    assert index.sessions(("t", 0)) == 0, "a closed session is out of the index"


def test_new_data_wakes_the_parked_fetch_once_and_a_high_watermark_move_does_not() -> None:
    parts = hosted(2)
    index = SessionIndex()
    s = session_of(2, index)
    read(s, parts, 0.0)
    woken: list[int] = []
    assert s.park(lambda: woken.append(1))
    assert s.parked and index.parked() == 1, "a parked fetch counts as a delayed follower fetch"
    s.changed(("t", 1), parts[("t", 1)])
    assert woken == [], "a HW move (same data) does not wake a follower's fetch"
    append(s, parts, 0)
    append(s, parts, 0)
    assert woken == [1], "new data wakes it, once"
    assert index.parked() == 0
    assert read(s, parts, 0.1) == [0, 1]
    append(s, parts, 1)
    assert not s.park(lambda: woken.append(2)), "data already new: read it now instead of waiting"
    assert woken == [1]


def test_a_read_whose_answer_was_not_sent_is_read_again() -> None:
    parts = hosted(3)
    s = session_of(3)
    read(s, parts, 0.0)
    s.changed(("t", 0), parts[("t", 0)])
    _, keys = s.request(parts, 0.1)
    assert keys == [("t", 0)]
    s.discarded(keys)  # nothing to send yet: the fetch waits on
    append(s, parts, 2)
    assert read(s, parts, 0.2) == [0, 2], "partition 0's HW goes with the next answer"
    req, keys = s.request(parts, 0.3)
    assert keys == []
    append(s, parts, 1)
    resp = broker_pb2.FetchResponse()
    resp.partitions.add(topic="t", partition=1, error_code=errors.ErrorCode.NOT_LEADER_OR_FOLLOWER)
    s.request(parts, 0.4)
    s.answered(resp)
    assert read(s, parts, 0.5) == [1], "an error is answered again until the follower forgets the partition"
    parts.pop(("t", 2))
    s.changed(("t", 2), None)
    assert read(s, parts, 0.6) == [2], "a partition this broker no longer hosts is read (answered with the error)"


def test_forgotten_partitions_leave_and_a_full_request_replaces_the_session() -> None:
    parts = hosted(3)
    index = SessionIndex()
    s = session_of(3, index)
    s.update(request(incremental=True, forgotten=(1,)))
    assert sorted(s.keys()) == [("t", 0), ("t", 2)]
    assert index.sessions(("t", 1)) == 0 and index.sessions(("t", 0)) == 1
    assert read(s, parts, 0.0) == [0, 2]
    s.update(request(fp(1)))
    assert s.keys() == [("t", 1)], "a full request (a follower that started over) is the whole session"
    assert [index.sessions(("t", p)) for p in range(3)] == [0, 1, 0]


def test_a_session_past_its_bound_is_refused_and_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch_session, "MIN_SESSION_BOUND", 2)
    hosting = [1]
    s = FollowerFetchSession(SessionIndex(), refresh_s=1.0, hosted=lambda: hosting[0])
    s.update(request(fp(0), fp(1)))
    with pytest.raises(errors.InvalidRequestError, match="at most 2 partitions"):
        s.update(request(fp(2), incremental=True))
    assert sorted(s.keys()) == [("t", 0), ("t", 1)]
    hosting[0] = 2  # twice what the broker hosts
    s.update(request(fp(2), fp(3), incremental=True))
    with pytest.raises(errors.InvalidRequestError, match="at most 4 partitions"):
        s.update(request(fp(4), incremental=True))
    assert len(s) == 4


# ---- the follower's requests, against a stand-in leader on a real socket ----

class RecordingLeader(broker_pb2_grpc.BrokerServiceServicer):
    """Answers partition 0 at offset 0 with one batch once ``serve`` is set, everything else with nothing
    (after a short long poll); says it keeps sessions when ``sessions``. Records every request."""

    def __init__(self, *, sessions: bool) -> None:
        self.sessions = sessions
        self.serve = threading.Event()
        self.requests: list[broker_pb2.FetchRequest] = []
        self.lock = threading.Lock()

    def ReplicaFetch(self, request_iterator: Iterator[broker_pb2.FetchRequest],
                     context: Any) -> Iterator[broker_pb2.FetchResponse]:
        offsets: dict[int, int] = {}  # the stream's session: each partition's fetch offset
        for req in request_iterator:
            with self.lock:
                self.requests.append(req)
            if not req.incremental:
                offsets.clear()
            for f in req.forgotten:
                offsets.pop(f.partition, None)
            offsets.update((f.partition, f.fetch_offset) for f in req.partitions)
            resp = broker_pb2.FetchResponse(incremental=self.sessions)
            if offsets.get(0) == 0 and self.serve.is_set():
                resp.partitions.add(topic="t", partition=0, log_start_offset=0, high_watermark=1, records=BATCH)
            else:
                threading.Event().wait(0.02)  # a long poll with nothing new
            yield resp

    def seen(self) -> list[broker_pb2.FetchRequest]:
        with self.lock:
            return list(self.requests)


def follower_partition(tmp_path: Path, p: int) -> Partition:
    lg = Log.open(tmp_path / f"t-{p}", LogConfig.from_overrides({}))
    part = Partition("t", p, "T", lg, 2, broker_usable=lambda b: True)
    part.make_follower(1, (1, 2), (1, 2), 0, 0)
    return part


@pytest.fixture
def leader_server() -> Iterator[tuple[grpc.Server, int]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    port = server.add_insecure_port("127.0.0.1:0")
    yield server, port
    server.stop(0)


@pytest.mark.parametrize("sessions", [True, False])
def test_the_follower_sends_only_changes_to_a_leader_that_keeps_sessions(
        tmp_path: Path, leader_server: tuple[grpc.Server, int], sessions: bool) -> None:
    server, port = leader_server
    leader = RecordingLeader(sessions=sessions)
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(leader, server)
    server.start()
    parts = [follower_partition(tmp_path, p) for p in range(3)]
    manager = ReplicaFetcherManager(2, lambda: 1, FetcherConfig(max_wait_ms=50, backoff_ms=50))
    try:
        for p in parts:
            manager.add_partition(p, 1, f"127.0.0.1:{port}", 0)
        # From here on no partition is added, so no fetch is cut short and the stream stays.
        wait_for(lambda: any(len(r.partitions) == 3 for r in leader.seen()), 10, "a fetch of every partition")
        served_from = len(leader.seen())
        leader.serve.set()
        wait_for(lambda: parts[0].log.log_end_offset == 1, 10, "partition 0's batch replicated")
        wait_for(lambda: len(leader.seen()) >= served_from + 4, 10, "more fetches")
        manager.remove_partitions([("t", 2)])
        n = len(leader.seen())
        wait_for(lambda: len(leader.seen()) >= n + 3, 10, "fetches after partition 2 left")
        # This broker's own retention moves a log start: no response says so, the periodic rebuild does.
        parts[0].log.set_log_start_offset(1)
        wait_for(lambda: any(f.partition == 0 and f.log_start_offset == 1 for r in leader.seen() for f in r.partitions),
                 10, "partition 0's new log start in a fetch")
    finally:
        manager.shutdown()
    later = leader.seen()[served_from:]
    if not sessions:
        assert not any(r.incremental or r.forgotten for r in later), "an older leader gets full fetches"
        assert sorted(f.partition for f in later[-1].partitions) == [0, 1]
        return
    # at most the first fetch of the stream opened by the last cut-short one is full (every partition)
    while later and not later[0].incremental:
        assert len(later[0].partitions) == 3, later[0]
        later = later[1:]
    assert later and all(r.incremental for r in later), [r.incremental for r in later]
    moved = [[(f.partition, f.fetch_offset, f.log_start_offset) for f in r.partitions] for r in later if r.partitions]
    assert moved == [[(0, 1, 0)], [(0, 1, 1)]], f"only partition 0 moved (to offset 1, then its log start): {moved}"
    assert [(f.topic, f.partition) for r in later for f in r.forgotten] == [("t", 2)], \
        "partition 2 forgotten once, when it left"
