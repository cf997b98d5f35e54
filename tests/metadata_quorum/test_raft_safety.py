"""Raft's safety rules where pysyncobj (as the quorum uses it) broke them, each found by an audit of the quorum and
shown here with the quorum's own SyncObj class on a network the test drives (raft_sim.py), or with its journal.

Each of these failed on the code before its fix: two leaders in one term, an acknowledged write counted on a stale
answer, a follower applying entries no leader committed, a leader busy for a whole period sending the same empty
message."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.node import TCPNode
from raft_sim import RAFT, Network, Voter, conf

from metadata_quorum.prevote import PRE_VOTE_RESPONSE
from metadata_quorum.raft import _DumpWriter


@pytest.fixture
def trio() -> Iterator[Network]:
    net = Network(["A", "B", "C"])
    try:
        yield net
    finally:
        net.destroy()


def test_a_late_pre_vote_answer_with_a_higher_term_deposes_a_leader(trio: Network) -> None:
    # A asked B for a pre-vote; the answer waited on a slow link while A was elected at term 1 and B took part in
    # an election at term 3. A took term 3 from the answer and went on leading in it, beside term 3's leader:
    # the audit's run then committed different commands at one index on two voters.
    trio.elect("A", ["B", "C"])
    trio.replicate("A", ["B", "C"])
    a = trio["A"]
    a.obj._SyncObj__onMessageReceived(TCPNode(trio.addresses["B"]), {
        "type": PRE_VOTE_RESPONSE, "round": 1, "term": 3, "granted": False})
    assert (a.state, a.term) == (RAFT.FOLLOWER, 3), f"A is {a.state} at term {a.term}, not a follower at term 3"
    assert a.obj._SyncObj__raftLeader is None


def test_an_answer_to_a_leader_of_an_earlier_term_is_not_counted() -> None:
    # Five voters: A leads term 1 and sends B entries; B's answer is held on its link while C leads term 2 and A
    # leads term 3. The answer to term 1 counted toward A's term-3 commits, and the audit's run committed and
    # acknowledged a write that C, elected next, overwrote.
    net = Network(["A", "B", "C", "D", "E"])
    try:
        net.elect("A", ["B", "C", "D", "E"])
        net.replicate("A", ["B", "C", "D", "E"])
        net.elect("C", ["A", "D", "E"])
        net.replicate("C", ["A", "D", "E"])
        net.elect("A", ["C", "D", "E"])
        a, b = net["A"], net.node_of("A", "B")
        assert a.term == 3
        before = a.obj._SyncObj__raftMatchIndex[b]
        a.obj._SyncObj__onMessageReceived(TCPNode(net.addresses["B"]), {
            "type": "next_node_idx", "next_node_idx": 7, "reset": False, "success": True, "term": 1})
        assert a.obj._SyncObj__raftMatchIndex[b] == before, "an answer to term 1 counted at term 3"
        # Answers carry the term they answer, and one of this term counts.
        net.replicate("A", ["B"], rounds=1)
        a.obj._SyncObj__newAppendEntriesTime = 0
        a.tick()
        net.deliver("A", "B")
        answers = [m for m in net.pending("B", "A") if m["type"] == "next_node_idx"]
        assert answers and all(m["term"] == 3 for m in answers), answers
        net.deliver("B", "A")
        assert a.obj._SyncObj__raftMatchIndex[b] == a.obj._SyncObj__getCurrentLogIndex()
        # An answer without a term (a voter of an older version) counts as before.
        a.obj._SyncObj__raftMatchIndex[b] = 0
        a.obj._SyncObj__onMessageReceived(TCPNode(net.addresses["B"]), {
            "type": "next_node_idx", "next_node_idx": 3, "reset": False, "success": True})
        assert a.obj._SyncObj__raftMatchIndex[b] == 2
    finally:
        net.destroy()


def test_a_snapshot_append_does_not_commit_entries_the_follower_never_matched(trio: Network) -> None:
    # C holds three entries A never committed (A was lost before anyone answered). Term 2's leader B has
    # compacted past C's end: its appends to C carry its snapshot, or nothing while it writes one, and no previous
    # entry. pysyncobj still raised C's commit index to B's, bounded by C's own last entry, and C applied A's
    # three entries.
    trio.elect("A", ["B", "C"])
    trio.replicate("A", ["B", "C"])
    a, c = trio["A"], trio["C"]
    for i in range(3):
        a.propose(f"never committed {i}")
    a.tick()
    trio.deliver("A", "C")
    committed = c.obj.raftCommitIndex
    assert c.log()[-1][0] == committed + 3
    c.obj._SyncObj__onMessageReceived(TCPNode(trio.addresses["B"]), {
        "type": "append_entries", "term": 2, "commit_index": 5000, "serialized": None})
    c.tick()
    assert c.list.rawData() == [], f"C applied {c.list.rawData()}"
    assert (c.obj.raftCommitIndex, c.term) == (committed, 2)


def _dump_writing_settings(base: Path, writers: dict[str, _DumpWriter]) -> Any:
    """MetadataRaft's journal and snapshot hooks, per voter under ``base``."""
    def settings(name: str, voter: Voter) -> Any:
        directory = base / name
        directory.mkdir(parents=True, exist_ok=True)
        writer = writers[name] = _DumpWriter(directory / "quorum.snapshot", voter.list)
        return conf(useFork=False, journalFile=str(directory / "quorum.journal"),
                    fullDumpFile=str(directory / "quorum.snapshot"), serializer=writer.start,
                    serializeChecker=writer.status, deserializer=writer.load)
    return settings


def _compact(voter: Voter, writer: _DumpWriter) -> None:
    voter.obj.forceLogCompaction()
    deadline = time.monotonic() + 10
    while writer._job is not None or voter.obj._SyncObj__raftLog[0][1] <= 1:
        assert time.monotonic() < deadline, "the compaction did not finish"
        voter.tick()
        time.sleep(0.01)


def test_a_leader_writing_its_snapshot_sends_a_follower_that_needs_it_one_message_a_period(tmp_path: Path) -> None:
    # While the snapshot is written it cannot be sent; pysyncobj sent such a follower {'serialized': None} again
    # and again for the whole append period: 11,112 messages from one call in the audit's run, each pickled and
    # encrypted on the Raft thread.
    writers: dict[str, _DumpWriter] = {}
    net = Network(["A", "B", "C"], _dump_writing_settings(tmp_path, writers))
    try:
        net.elect("A", ["B", "C"])
        a = net["A"]
        for i in range(10):
            a.propose(f"v{i}")
        a.tick()
        net.replicate("A", ["B", "C"])
        _compact(a, writers["A"])
        write = writers["A"]._write
        release = time.monotonic() + 1.0
        writers["A"]._write = lambda job, data: (time.sleep(max(0.0, release - time.monotonic())), write(job, data))[1]
        a.propose("after the first snapshot")
        a.tick()
        net.replicate("A", ["B"])
        a.obj.forceLogCompaction()
        a.tick()
        assert writers["A"]._job is not None, "the second snapshot is not being written"
        net.drop("A", "C")
        a.obj._SyncObj__raftNextIndex[net.node_of("A", "C")] = 2  # C needs the snapshot
        a.obj._SyncObj__newAppendEntriesTime = 0
        a.tick()
        sent = net.pending("A", "C")
        assert len(sent) == 1 and sent[0].get("serialized", "absent") is None, f"{len(sent)} messages: {sent[:3]}"
        net.replicate("A", ["B"], rounds=1)  # B, which needs no snapshot, is sent its appends as before
    finally:
        net.destroy()
