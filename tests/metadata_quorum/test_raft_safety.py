"""Raft's safety rules where pysyncobj (as the quorum uses it) broke them, each found by an audit of the quorum and
shown here with the quorum's own SyncObj class on a network the test drives (raft_sim.py), or with its journal.

Each of these failed on the code before its fix: two leaders in one term, an acknowledged write counted on a stale
answer, a follower applying entries no leader committed, a leader busy for a whole period sending the same empty
message, a voter losing acknowledged entries to a compaction killed midway, a commit index stored over entries
not on disk, acknowledged entries held in memory only, a vote forgotten with an unreadable term file, and a
follower's own snapshot lost to one received."""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.journal import FileJournal
from pysyncobj.node import TCPNode
from raft_sim import RAFT, Network, Voter, conf
from waiting import wait_for

from metadata_quorum.prevote import PRE_VOTE_RESPONSE
from metadata_quorum.quorum_journal import FailStopJournal
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


def test_a_deposed_leader_learns_the_new_term_from_the_first_answer(trio: Network) -> None:
    # A is paused; B is elected at term 2 with C's vote. A resumes and sends its term-1 heartbeats: pysyncobj's
    # voters ignored them, so A went on as leader of term 1 until its leaderFallbackTimeout (2 s), answering
    # from its old state. Raft's voters answer with their term, and A steps down at once.
    trio.elect("A", ["B", "C"])
    trio.replicate("A", ["B", "C"])
    trio.elect("B", ["C"])
    trio.replicate("B", ["C"])
    trio.drop("B", "A")  # A, paused, heard none of it
    a = trio["A"]
    assert (a.state, a.term) == (RAFT.LEADER, 1)
    a.obj._SyncObj__newAppendEntriesTime = 0
    a.tick()
    trio.deliver("A", "C")
    trio.deliver("C", "A")
    assert (a.state, a.term) == (RAFT.FOLLOWER, 2), f"A is {a.state} at term {a.term}"
    assert trio["C"].obj._SyncObj__raftLeader.id == trio.addresses["B"]  # C still follows B


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


def _dump_writing_settings(base: Path, writers: dict[str, _DumpWriter],
                           on_unreadable: Callable[[BaseException], None] | None = None) -> Any:
    """MetadataRaft's journal and snapshot hooks, per voter under ``base``."""
    def settings(name: str, voter: Voter) -> Any:
        directory = base / name
        directory.mkdir(parents=True, exist_ok=True)
        writer = writers[name] = _DumpWriter(directory / "quorum.snapshot", voter.list, on_unreadable)
        return conf(useFork=False, journalFile=str(directory / "quorum.journal"),
                    fullDumpFile=str(directory / "quorum.snapshot"), serializer=writer.start,
                    serializeChecker=writer.status, deserializer=writer.load)
    return settings


def _ticking(voter: Voter, done: Callable[[], bool]) -> Callable[[], bool]:
    """``done``, after a tick of ``voter`` (it has no tick thread): a condition for wait_for."""
    def check() -> bool:
        voter.tick()
        return done()
    return check


def _compact(voter: Voter, writer: _DumpWriter) -> None:
    voter.obj.forceLogCompaction()
    wait_for(_ticking(voter, lambda: writer._job is None and voter.obj._SyncObj__raftLog[0][1] > 1), 10,
             "the compaction to finish", poll_s=0.01)


def _restarted(net: Network, name: str, settings: Any) -> Voter:
    """``name`` started again (on the files it left) among the network's other voters."""
    others = [address for other, address in net.addresses.items() if other != name]
    return Voter(name, net.addresses[name], others, net.router, settings)


def _compacted_trio(tmp_path: Path, writers: dict[str, _DumpWriter], values: int) -> Network:
    """Three voters with MetadataRaft's journal and snapshot hooks; A leads, has written ``values`` values to the
    others, and has compacted its log."""
    net = Network(["A", "B", "C"], _dump_writing_settings(tmp_path, writers))
    net.elect("A", ["B", "C"])
    net.write("A", [f"v{i}" for i in range(values)], ["B", "C"])
    _compact(net["A"], writers["A"])
    return net


def test_a_leader_writing_its_snapshot_sends_a_follower_that_needs_it_one_message_a_period(tmp_path: Path) -> None:
    # While the snapshot is written it cannot be sent; pysyncobj sent such a follower {'serialized': None} again
    # and again for the whole append period: 11,112 messages from one call in the audit's run, each pickled and
    # encrypted on the Raft thread.
    writers: dict[str, _DumpWriter] = {}
    net = _compacted_trio(tmp_path, writers, 10)
    try:
        a = net["A"]
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


def test_a_compaction_killed_before_its_journal_trim_keeps_the_entries_after_the_snapshot(tmp_path: Path) -> None:
    # The snapshot is renamed into place (and its directory fsynced) before the journal is trimmed. A voter killed
    # in between restarted with a journal that did not start at the snapshot, and pysyncobj emptied it: the
    # entries after the snapshot, which the voter had acknowledged, were gone.
    writers: dict[str, _DumpWriter] = {}
    settings = _dump_writing_settings(tmp_path / "live", writers)
    net = Network(["A", "B", "C"], settings)
    at_kill = tmp_path / "A-at-kill"
    try:
        net.elect("A", ["B", "C"])
        a = net["A"]
        net.write("A", [f"v{i}" for i in range(20)], ["B", "C"])
        journal = a.obj._SyncObj__raftLog
        trim = journal.deleteEntriesTo

        def killed_before_trim(position: int) -> None:
            if not at_kill.exists():  # the files as a kill -9 now leaves them (mmap writes are in the page cache)
                shutil.copytree(tmp_path / "live" / "A", at_kill)
            trim(position)
        journal.deleteEntriesTo = killed_before_trim  # on the journal: the SyncObj's own fields go into its dump
        write = writers["A"]._write
        writers["A"]._write = lambda job, data: (time.sleep(0.3), write(job, data))[1]  # a large state: slow
        a.obj.forceLogCompaction()
        a.tick()
        for i in range(20, 30):  # appended and acknowledged while the snapshot is written
            a.propose(f"v{i}")
        a.tick()
        net.replicate("A", ["B", "C"], rounds=3)
        wait_for(_ticking(a, at_kill.exists), 10, "the compaction to trim the journal", poll_s=0.01)
        held = a.obj._SyncObj__getCurrentLogIndex()
        acknowledged = a.obj.raftCommitIndex
    finally:
        net.destroy()
    shutil.rmtree(tmp_path / "live" / "A")
    shutil.copytree(at_kill, tmp_path / "live" / "A")
    restarted = _restarted(net, "A", settings)
    try:
        restarted.tick()
        assert restarted.log()[-1][0] == held, \
            f"A held entries up to {held} ({acknowledged} committed) and restarted with {restarted.log()}"
        assert restarted.list.rawData()[:20] == [f"v{i}" for i in range(20)]
    finally:
        restarted.obj.destroy()


def _send_snapshot(net: Network, leader: str, follower: str) -> list[dict[str, Any]]:
    """A late "reset" answer from ``follower`` makes ``leader`` send it its snapshot; the pieces, undelivered."""
    net[leader].obj._SyncObj__onMessageReceived(TCPNode(net.addresses[follower]), {
        "type": "next_node_idx", "next_node_idx": 2, "reset": True, "success": False, "term": net[leader].term})
    net[leader].obj._SyncObj__newAppendEntriesTime = 0
    net[leader].tick()
    pieces = [m for m in net.pending(leader, follower) if "serialized" in m]
    assert pieces, f"{leader} did not send its snapshot"
    return pieces


def _answer(net: Network, follower: str, leader: str) -> dict[str, Any]:
    [answer] = [m for m in net.pending(follower, leader) if m["type"] == "next_node_idx"][-1:]
    return answer


def test_a_snapshot_a_follower_holds_unapplied_entries_past_keeps_them(tmp_path: Path) -> None:
    # B holds entries up to 32 but has applied only up to 12 when A's snapshot (at 22) arrives. pysyncobj emptied
    # B's journal for it: B held 22 entries, though it had acknowledged 32.
    writers: dict[str, _DumpWriter] = {}
    net = Network(["A", "B", "C"], _dump_writing_settings(tmp_path, writers))
    try:
        a, b = net["A"], net["B"]
        net.elect("A", ["B", "C"])
        net.write("A", [f"v{i}" for i in range(10)], ["B", "C"])
        for i in range(10, 20):
            a.propose(f"v{i}")
        a.tick()
        net.deliver("A", "B")  # B appends 13..22 (B does not tick: it applies nothing new)
        net.replicate("A", ["C"])  # A commits them with C
        _compact(a, writers["A"])  # at 22
        for i in range(20, 30):
            a.propose(f"v{i}")
        a.tick()
        net.deliver("A", "B")  # and 23..32
        assert b.log()[-1] == (32, 1) and b.obj._SyncObj__raftLastApplied == 12, (b.log(), b.list.rawData())
        net.drop("B", "A")
        net.deliver("A", "B", len(_send_snapshot(net, "A", "B")))
        assert b.log()[-1] == (32, 1), f"B acknowledged up to 32 and then held {b.log()}"
        answer = _answer(net, "B", "A")
        assert answer["success"] and answer["next_node_idx"] == 23, answer  # what the snapshot covers, no more
        assert b.obj._SyncObj__raftLastApplied == 22 and len(b.list.rawData()) == 20
    finally:
        net.destroy()


def test_a_snapshot_older_than_what_a_follower_applied_is_refused(tmp_path: Path) -> None:
    # B has applied up to 32 and compacted there when a late "reset" makes A send its snapshot at 22. pysyncobj
    # loaded it: B's state went back to 20 values, and its journal, which started at 31, was emptied, the
    # acknowledged entries 23..32 with it; its own snapshot file was replaced by A's older one.
    writers: dict[str, _DumpWriter] = {}
    net = _compacted_trio(tmp_path, writers, 20)
    try:
        b = net["B"]
        net.write("A", [f"v{i}" for i in range(20, 30)], ["B", "C"])
        _compact(b, writers["B"])
        own = (tmp_path / "B" / "quorum.snapshot").read_bytes()
        held = b.log()
        assert held[-1] == (32, 1) and len(b.list.rawData()) == 30, (held, b.list.rawData())
        net.deliver("A", "B", len(_send_snapshot(net, "A", "B")))
        assert b.log() == held, f"B held {held} and then {b.log()}"
        assert b.list.rawData() == [f"v{i}" for i in range(30)], b.list.rawData()
        answer = _answer(net, "B", "A")
        assert answer["success"] and answer["next_node_idx"] == 33, answer  # what B applied: committed
        assert (tmp_path / "B" / "quorum.snapshot").read_bytes() == own, "B's own snapshot was replaced"
    finally:
        net.destroy()
    restarted = _restarted(net, "B", _dump_writing_settings(tmp_path, writers))
    try:
        restarted.tick()
        assert restarted.log()[-1] == (32, 1) and len(restarted.list.rawData()) == 30, restarted.log()
    finally:
        restarted.obj.destroy()


def test_a_received_snapshot_that_does_not_read_back_leaves_the_followers_own(tmp_path: Path) -> None:
    # A snapshot cut short (pysyncobj sends the rest of one on the next connection) was renamed over B's own
    # snapshot and failed to load: B went on, but at its next start its snapshot did not read back and it stopped.
    writers: dict[str, _DumpWriter] = {}
    net = _compacted_trio(tmp_path, writers, 20)
    stopped: list[BaseException] = []
    try:
        b = net["B"]
        _compact(b, writers["B"])
        own = (tmp_path / "B" / "quorum.snapshot").read_bytes()
        net.write("A", [f"v{i}" for i in range(20, 25)], ["C"])  # B is behind: its applied state is older
        _compact(net["A"], writers["A"])
        net.drop("A", "B")
        pieces = _send_snapshot(net, "A", "B")
        queue = net.router.queues[(net.addresses["A"], net.addresses["B"])]
        for i, raw in enumerate(queue):  # a piece from the middle of the file lost
            message = pickle.loads(raw)
            piece = message.get("serialized")
            if piece and piece[0]:
                queue[i] = pickle.dumps(dict(message, serialized=(piece[0][: len(piece[0]) // 2], *piece[1:])))
                break
        net.deliver("A", "B", len(pieces))
        assert b.list.rawData() == [f"v{i}" for i in range(20)], b.list.rawData()
        assert _answer(net, "B", "A")["next_node_idx"] == 23  # the leader sends it again
        assert (tmp_path / "B" / "quorum.snapshot").read_bytes() == own, "B's own snapshot was replaced"
        received = (tmp_path / "A" / "quorum.snapshot").read_bytes()
    finally:
        net.destroy()
    assert not (tmp_path / "B" / "quorum.snapshot.receiving").exists()
    # As if B were killed between pysyncobj's rename of a received snapshot (cut short) and its load: B starts
    # from its own.
    (tmp_path / "B" / "quorum.snapshot.receiving").touch()  # as its last piece left it
    (tmp_path / "B" / "quorum.snapshot.1.tmp").write_bytes(received[: len(received) // 2])
    os.replace(tmp_path / "B" / "quorum.snapshot.1.tmp", tmp_path / "B" / "quorum.snapshot")  # as pysyncobj does
    restarted = _restarted(net, "B", _dump_writing_settings(tmp_path, writers, stopped.append))
    try:
        restarted.tick()
        assert not stopped, f"B stopped on a snapshot it never accepted: {stopped}"
        assert restarted.log()[-1] == (22, 1) and len(restarted.list.rawData()) == 20, restarted.log()
    finally:
        restarted.obj.destroy()


def test_a_snapshot_another_version_wrote_is_trusted_at_a_start(tmp_path: Path) -> None:
    # A node rolled back to a version without quorum.snapshot.own compacts (its new snapshot renamed over the old,
    # its journal trimmed to it) and is upgraded again: the snapshot that is not the .own one is its latest, and
    # putting the .own one back would leave a journal that starts after it (emptied: acknowledged entries lost).
    writers: dict[str, _DumpWriter] = {}
    net = _compacted_trio(tmp_path, writers, 20)
    own = tmp_path / "B" / "quorum.snapshot.own"
    try:
        net.write("A", [f"v{i}" for i in range(20, 30)], ["B", "C"])
        b = net["B"]
        _compact(b, writers["B"])  # at 32: the snapshot this version last wrote
        older = own.read_bytes()
        net.write("A", [f"v{i}" for i in range(30, 40)], ["B", "C"])
        _compact(b, writers["B"])  # at 42, as the rolled-back version would write it, its journal trimmed to it
        held = b.log()
    finally:
        net.destroy()
    own.unlink()
    own.write_bytes(older)  # what .own still names: the rolled-back version did not touch it
    restarted = _restarted(net, "B", _dump_writing_settings(tmp_path, writers))
    try:
        restarted.tick()
        assert restarted.log() == held and len(restarted.list.rawData()) == 40, (held, restarted.log())
        assert os.path.samefile(tmp_path / "B" / "quorum.snapshot", own), "the trusted snapshot is not its own"
    finally:
        restarted.obj.destroy()


def test_a_voter_whose_snapshot_does_not_read_back_stops(tmp_path: Path) -> None:
    # pysyncobj logged the failed load and went on with a journal that starts past the snapshot: the voter voted
    # and acknowledged but never applied anything, and as a leader its metadata would have been empty.
    writers: dict[str, _DumpWriter] = {}
    net = _compacted_trio(tmp_path, writers, 5)
    net.destroy()
    snapshot = tmp_path / "A" / "quorum.snapshot"
    snapshot.write_bytes(snapshot.read_bytes()[:20])  # a damaged block
    stopped: list[BaseException] = []
    restarted = _restarted(net, "A", _dump_writing_settings(tmp_path, writers, stopped.append))
    try:
        restarted.tick()
        assert len(stopped) == 1, f"the voter went on with an unreadable snapshot: {restarted.log()}"
    finally:
        restarted.obj.destroy()


_KILLED_MID_COMPACTION = r"""
import os, signal, sys
from pysyncobj.journal import FileJournal
from metadata_quorum.quorum_journal import FailStopJournal
journal = FailStopJournal(sys.argv[1], lambda *failure: os._exit(9))
for index in range(1, 1001):
    journal.add(b"\x01entry", index, 1)
journal.flush()
written = [0]
add, replace = FileJournal.add, os.replace
def killed_after_some(self, *entry):
    written[0] += 1
    if written[0] == 120:
        os.kill(os.getpid(), signal.SIGKILL)
    add(self, *entry)
FileJournal.add = killed_after_some
os.replace = lambda *paths: os.kill(os.getpid(), signal.SIGKILL)
journal.deleteEntriesTo(499)
"""


def test_a_compaction_killed_midway_leaves_the_whole_journal_or_the_trimmed_one(tmp_path: Path) -> None:
    # pysyncobj trimmed the journal by emptying it in place and writing the kept entries back one by one: a kill
    # after 120 of the 501 left those 120, and the restart kept them (they start at the snapshot).
    path = tmp_path / "quorum.journal"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", _KILLED_MID_COMPACTION, str(path)], env=env, capture_output=True,
                           timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    journal = FileJournal(str(path))
    try:
        indexes = [journal[i][1] for i in range(len(journal))]
    finally:
        journal._destroy()
    assert indexes in (list(range(1, 1001)), list(range(500, 1001))), \
        f"{len(indexes)} entries, {indexes[0]}..{indexes[-1]}, after a kill in the middle of a compaction"


class _Durability:
    """What of a FailStopJournal's files a power loss would keep: the journal as of its last flush (msync), the
    term and vote file as stored (it is fsynced)."""

    def __init__(self, journal: FailStopJournal) -> None:
        self.stored: list[tuple[int, bool]] = []  # (commit index stored, entries not yet flushed at that moment)
        flush = journal.flush
        storer = journal._FileJournal__metaStorer
        store = storer.storeMeta

        def flushed() -> None:
            flush()
            self.unflushed = False

        def stored(meta: dict[str, Any]) -> None:
            self.stored.append((meta.get("raftCommitIndex", 1), self.unflushed))
            store(meta)
        journal.flush = flushed
        storer.storeMeta = stored
        self.unflushed = False


def test_the_commit_index_is_stored_only_over_entries_on_disk(tmp_path: Path) -> None:
    # The one-second timer stored the commit index (with the term and vote, fsynced) before it flushed the
    # entries that index covers, and a vote stored it without flushing them at all. After a power loss in between,
    # the audit's voter restarted with that commit index over its older journal and applied an old leader's
    # uncommitted entry there.
    journal = FailStopJournal(str(tmp_path / "quorum.journal"), lambda *failure: None)
    durability = _Durability(journal)
    try:
        for index in range(1, 4):
            journal.add(b"\x01entry", index, 1)
            durability.unflushed = True
        journal.setRaftCommitIndex(3)
        journal.setCurrentTerm(2, "127.0.0.1:1")  # a vote
        journal.add(b"\x01entry", 4, 2)
        durability.unflushed = True
        journal.setRaftCommitIndex(4)
        journal.onOneSecondTimer()
        assert durability.stored == [(3, False), (4, False)], \
            f"(commit index stored, over entries not yet flushed): {durability.stored}"
    finally:
        journal._destroy()


class _PowerLoss:
    """Each voter's journal as a power loss would leave it: the file's bytes as of its last flush (msync)."""

    def __init__(self, net: Network, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.images: dict[str, bytes] = {}
        for name, voter in net.voters.items():
            journal = voter.obj._SyncObj__raftLog
            assert isinstance(journal, FailStopJournal), type(journal)
            self.images[name] = Path(journal._path).read_bytes()  # nothing written to it yet
            journal.flush = self._keeping(name, journal)

    def _keeping(self, name: str, journal: FailStopJournal) -> Callable[[], None]:
        flush = journal.flush

        def flushed() -> None:
            flush()
            self.images[name] = Path(journal._path).read_bytes()
        return flushed

    def entries(self, name: str) -> list[tuple[int, int]]:
        """(index, term) of each entry the voter's journal would hold after the power loss."""
        copy = self.tmp_path / f"{name}.after-power-loss"
        copy.write_bytes(self.images[name])
        journal = FailStopJournal(str(copy), lambda *failure: pytest.fail(f"journal failure {failure}"))
        try:
            return [(journal[i][1], journal[i][2]) for i in range(len(journal))]
        finally:
            journal._destroy()


def _file_journals(tmp_path: Path) -> Callable[[str, Voter], Any]:
    return lambda name, _voter: conf(journalFile=str(tmp_path / f"{name}.journal"))


def test_an_acknowledged_entry_is_on_the_disk_of_a_majority(tmp_path: Path) -> None:
    # pysyncobj flushed the journal only in its one-second timer (before that, never): a follower answered an append,
    # and the leader committed and answered the proposer, with the entries in memory only. A power loss of every
    # voter then lost acknowledged metadata changes. Raft counts an entry as committed once a majority stores it.
    net = Network(["A", "B", "C"], _file_journals(tmp_path))
    try:
        disks = _PowerLoss(net, tmp_path)
        net.elect("A", ["B", "C"])
        net.replicate("A", ["B", "C"])
        outcomes = [net["A"].propose(value) for value in range(5)]
        net["A"].tick()
        net.replicate("A", ["B", "C"], rounds=2)
        assert outcomes == [[0]] * 5, f"the proposals' outcomes (0: committed): {outcomes}"
        committed = [entry for entry in net["A"].log() if entry[0] <= net["A"].obj._SyncObj__raftCommitIndex]
        kept = {name: set(disks.entries(name)) for name in ("A", "B", "C")}
        for entry in committed:
            holders = sorted(name for name, entries in kept.items() if entry in entries)
            assert len(holders) >= 2, (f"committed entry (index, term) {entry} survives a power loss on {holders} only; "
                                       f"on disk: { {n: sorted(e) for n, e in kept.items()} }")
    finally:
        net.destroy()


def test_a_single_voter_applies_only_entries_on_its_disk(tmp_path: Path) -> None:
    # A single voter sends nothing: it committed (and answered) each proposal at its next tick, from memory.
    net = Network(["A"], _file_journals(tmp_path))
    try:
        disks = _PowerLoss(net, tmp_path)
        net.elect("A", [])
        outcome = net["A"].propose("a change")
        net["A"].tick(3)
        assert outcome == [0], f"the proposal's outcome (0: committed): {outcome}"
        applied = net["A"].obj._SyncObj__raftLastApplied
        on_disk = disks.entries("A")
        assert on_disk and on_disk[-1][0] >= applied, \
            f"applied up to index {applied}; a power loss leaves the journal with {on_disk}"
    finally:
        net.destroy()


@pytest.mark.parametrize("content", [b"", b"\x80\x04not a pickle", b"\x80\x04K\x07."], ids=["empty", "garbage", "int"])
def test_an_unreadable_term_and_vote_file_stops_the_voter(tmp_path: Path, content: bytes) -> None:
    # pysyncobj read any failure as no term and no vote: a voter that had voted at term 5 voted again at term 5
    # after its file came back empty (the audit's run: two leaders' majorities shared it).
    path = tmp_path / "quorum.journal"
    (tmp_path / "quorum.journal.meta").write_bytes(content)
    failures: list[tuple[str, str]] = []
    with pytest.raises(OSError, match="unreadable"):
        FailStopJournal(str(path), lambda where, what, exc: failures.append((where, what)))
    assert len(failures) == 1 and "term and vote file" in failures[0][1], failures
