"""A follower keeps what a repeated AppendEntries sends again (metadata_quorum/log_matching.py), against the installed
pysyncobj: the quorum's own SyncObj class, messages handed to its callback, its answers recorded instead of sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
import pytest
from pysyncobj import SyncObjConf
from pysyncobj.batteries import ReplList
from pysyncobj.transport import TCPTransport
from quorum_helpers import free_port
from waiting import wait_for

from metadata_quorum.raft import QuorumSyncObj

LEADER = "leader"


class Follower:
    """A voter that never ticks by itself (nothing is applied), fed append_entries from ``LEADER``."""

    def __init__(self) -> None:
        me, a, b = (f"127.0.0.1:{free_port()}" for _ in range(3))
        self.node = QuorumSyncObj(me, [a, b], SyncObjConf(autoTick=False, dynamicMembershipChange=False))
        self.sent: list[dict[str, Any]] = []
        self.node._SyncObj__transport.send = lambda to, message: self.sent.append(message)
        self.deletes: list[int] = []  # the log positions pysyncobj deleted from
        journal = self.node._SyncObj__raftLog
        delete = journal.deleteEntriesFrom

        def recorded(position: int) -> None:
            self.deletes.append(position)
            delete(position)
        journal.deleteEntriesFrom = recorded

    def append(self, *, term: int, prev: tuple[int, int], entries: list[tuple[int, int]],
               commit: int) -> dict[str, Any]:
        """Hand it an append_entries of (index, term) entries; returns its answer."""
        self.sent.clear()
        self.node._SyncObj__onMessageReceived(LEADER, {
            "type": "append_entries", "term": term, "commit_index": commit,
            "prevLogIdx": prev[0], "prevLogTerm": prev[1],
            "entries": [(_command(index, entry_term), index, entry_term) for index, entry_term in entries]})
        [answer] = self.sent
        assert answer["type"] == "next_node_idx"
        return answer

    def log(self) -> list[tuple[int, int]]:
        return [(entry[1], entry[2]) for entry in self.node._SyncObj__raftLog[:]]

    def log_commands(self) -> list[bytes]:
        return [entry[0] for entry in self.node._SyncObj__raftLog[:]]

    @property
    def commit_index(self) -> int:
        return int(self.node._SyncObj__raftCommitIndex)


def _command(index: int, term: int) -> bytes:
    return b"\x00entry %d of term %d" % (index, term)


def _run(first: int, last: int, term: int) -> list[tuple[int, int]]:
    return [(index, term) for index in range(first, last + 1)]


@pytest.fixture
def follower() -> Iterator[Follower]:
    f = Follower()
    try:
        yield f
    finally:
        f.node.destroy()


def test_a_late_batch_the_follower_already_holds_truncates_nothing_and_claims_only_what_it_sent(follower) -> None:  # noqa: ANN001
    # The leader's pipelined catch-up: entries 2..11 sent and acknowledged, then an earlier batch (2..6) arrives
    # again (the leader went back to it on a second "reset" answer). pysyncobj deleted 7..11 here and answered
    # success: the follower held less than the leader counted for it.
    assert follower.append(term=1, prev=(1, 0), entries=_run(2, 11, 1), commit=1) == \
        {"type": "next_node_idx", "next_node_idx": 12, "reset": False, "success": True, "term": 1}
    held = follower.log()
    answer = follower.append(term=1, prev=(1, 0), entries=_run(2, 6, 1), commit=1)
    assert follower.log() == held, f"the follower acknowledged entries 1..11, then held {follower.log()}"
    assert follower.deletes == []
    assert answer == {"type": "next_node_idx", "next_node_idx": 7, "reset": False, "success": True, "term": 1}
    assert follower.node.repeated_appends_total == 1


def test_a_late_heartbeat_truncates_nothing(follower) -> None:  # noqa: ANN001
    follower.append(term=1, prev=(1, 0), entries=_run(2, 11, 1), commit=8)
    held = follower.log()
    answer = follower.append(term=1, prev=(4, 1), entries=[], commit=3)
    assert follower.log() == held and follower.deletes == []
    assert answer["success"] and answer["next_node_idx"] == 5
    assert follower.commit_index == 8  # a commit index is never taken back


def test_entries_past_those_sent_are_not_committed_on_the_leaders_word(follower) -> None:  # noqa: ANN001
    # 6..11 came from the leader of term 1. The leader of term 2 sends 4..5 (the same) with its commit index 9:
    # its own 6..9 may differ from these, so the follower commits only up to the last entry sent (Raft §5.3).
    follower.append(term=1, prev=(1, 0), entries=_run(2, 11, 1), commit=1)
    held = follower.log()
    answer = follower.append(term=2, prev=(3, 1), entries=_run(4, 5, 1), commit=9)
    assert follower.log() == held
    assert answer == {"type": "next_node_idx", "next_node_idx": 6, "reset": False, "success": True, "term": 2}
    assert follower.commit_index == 5
    assert follower.node.getStatus()["leader_commit_idx"] == 9  # the leader's word itself is kept as sent


def test_a_conflicting_entry_and_all_after_it_are_replaced(follower) -> None:  # noqa: ANN001
    follower.append(term=1, prev=(1, 0), entries=_run(2, 11, 1), commit=1)
    answer = follower.append(term=2, prev=(5, 1), entries=[(6, 1), (7, 2)], commit=6)
    assert follower.log() == [(1, 0)] + _run(2, 6, 1) + [(7, 2)]
    assert follower.log_commands()[-1] == _command(7, 2)
    assert follower.deletes == [6]  # from entry 7 (position 6) on, and nothing before it
    assert answer == {"type": "next_node_idx", "next_node_idx": 8, "reset": False, "success": True, "term": 2}
    assert follower.commit_index == 6


def test_entries_past_the_followers_end_are_appended_after_the_ones_it_holds(follower) -> None:  # noqa: ANN001
    follower.append(term=1, prev=(1, 0), entries=_run(2, 6, 1), commit=1)
    answer = follower.append(term=1, prev=(3, 1), entries=_run(4, 9, 1), commit=7)
    assert follower.log() == [(1, 0)] + _run(2, 9, 1)
    assert follower.deletes == []
    assert answer["success"] and answer["next_node_idx"] == 10
    assert follower.commit_index == 7


def test_a_large_entry_sent_again_in_pieces_truncates_nothing(follower) -> None:  # noqa: ANN001
    # An entry larger than the batch size goes in pieces (pysyncobj's "transmission"), gathered by the follower;
    # the last piece is handled as the whole entry would be.
    follower.append(term=1, prev=(1, 0), entries=_run(2, 11, 1), commit=1)
    held = follower.log()
    data = pysyncobj_pickle.dumps((_command(5, 1), 5, 1))
    pieces = [data[:10], data[10:20], data[20:]]
    answers = []
    for kind, piece in zip(("start", "process", "finish"), pieces, strict=True):
        follower.sent.clear()
        follower.node._SyncObj__onMessageReceived(LEADER, {
            "type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 4, "prevLogTerm": 1,
            "transmission": kind, "data": piece})
        answers += follower.sent
    assert follower.log() == held and follower.deletes == []
    assert answers[-1] == {"type": "next_node_idx", "next_node_idx": 6, "reset": False, "success": True, "term": 1}
    assert follower.node._SyncObj__recvTransmission == ""
    # A large entry that is new is appended as before.
    data = pysyncobj_pickle.dumps((_command(12, 1), 12, 1))
    for kind, piece in zip(("start", "finish"), (data[:10], data[10:]), strict=True):
        follower.node._SyncObj__onMessageReceived(LEADER, {
            "type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 11, "prevLogTerm": 1,
            "transmission": kind, "data": piece})
    assert follower.log() == held + [(12, 1)]


def test_a_large_entry_whose_pieces_are_mislabelled_is_still_gathered(follower) -> None:  # noqa: ANN001
    # pysyncobj's leader labels a piece "finish" by the command's length, not the pickled entry's: a command of
    # 131,062 bytes goes as start, finish, finish. The first "finish" raised in the follower's tick thread.
    follower.append(term=1, prev=(1, 0), entries=_run(2, 3, 1), commit=1)
    command = b"\x00" + b"c" * 131_061
    data = pysyncobj_pickle.dumps((command, 4, 1))
    for kind, piece in (("start", data[:65536]), ("finish", data[65536:131072]), ("finish", data[131072:])):
        follower.node._SyncObj__onMessageReceived(LEADER, {
            "type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 3, "prevLogTerm": 1,
            "transmission": kind, "data": piece})
    assert follower.log()[-1] == (4, 1) and follower.log_commands()[-1] == command


@pytest.mark.parametrize("entry", [("text", 4, 1), (b"\x00c", 5, 1), (b"\x00c", 4, 2), [b"\x00c", 4]],
                         ids=["command-not-bytes", "wrong-index", "later-term", "two-fields"])
def test_a_large_entry_of_the_wrong_shape_is_refused_before_anything_is_truncated(follower, entry) -> None:  # noqa: ANN001
    # An entry sent in pieces is whole only at its last piece: raft_messages checks it there, before pysyncobj
    # deletes the entries after prevLogIdx (it stored the entry's fields as they came).
    follower.append(term=1, prev=(1, 0), entries=_run(2, 6, 1), commit=1)
    held = follower.log()
    data = pysyncobj_pickle.dumps(tuple(entry) if isinstance(entry, tuple) else entry)
    follower.node._SyncObj__onMessageReceived(LEADER, {
        "type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 3, "prevLogTerm": 1,
        "transmission": "start", "data": data[:10]})
    with pytest.raises(ValueError, match="an entry sent in parts"):
        follower.node._SyncObj__onMessageReceived(LEADER, {
            "type": "append_entries", "term": 1, "commit_index": 1, "prevLogIdx": 3, "prevLogTerm": 1,
            "transmission": "finish", "data": data[10:]})
    assert follower.log() == held and follower.deletes == []


def test_an_append_that_would_delete_committed_entries_is_refused(follower) -> None:  # noqa: ANN001
    # Only a sender lying as the leader conflicts with a committed entry: pysyncobj logged it (CRITICAL) and
    # deleted the entries, leaving the applied state no longer the log's. Past the commit index, Raft's truncation
    # goes on as before.
    follower.append(term=1, prev=(1, 0), entries=_run(2, 8, 1), commit=5)
    held = follower.log()
    assert follower.commit_index == 5
    with pytest.raises(ValueError, match="delete committed entries from index 4"):
        follower.append(term=2, prev=(3, 1), entries=_run(4, 9, 2), commit=5)
    assert follower.log() == held and follower.deletes == []
    answer = follower.append(term=2, prev=(5, 1), entries=_run(6, 9, 2), commit=5)
    assert answer["success"] and follower.log() == held[:5] + _run(6, 9, 2)
    assert follower.deletes == [5]  # the position of entry 6


def test_what_the_follower_cannot_match_is_refused_as_before(follower) -> None:  # noqa: ANN001
    follower.append(term=1, prev=(1, 0), entries=_run(2, 6, 1), commit=1)
    held = follower.log()
    # Its entry 4 has term 1, not 2: pysyncobj's refusal, asking from there.
    assert follower.append(term=2, prev=(4, 2), entries=_run(5, 8, 2), commit=1) == \
        {"type": "next_node_idx", "next_node_idx": 4, "reset": True, "success": False, "term": 2}
    # Past its end: asks from its end.
    assert follower.append(term=2, prev=(9, 2), entries=[], commit=1) == \
        {"type": "next_node_idx", "next_node_idx": 7, "reset": True, "success": False, "term": 2}
    assert follower.log() == held and follower.deletes == []



class _AcknowledgingTransport(TCPTransport):  # type: ignore[misc]
    """pysyncobj's transport, checking at each send that the voter holds every entry it has told a leader it holds
    (its success answers), and recording when it did not."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.acknowledged_up_to = 0
        self.shortfalls: list[tuple[int, int]] = []  # (acknowledged up to, held up to) when it held less

    def send(self, node: Any, message: Any) -> Any:
        held = self._syncObj._SyncObj__getCurrentLogIndex()
        if held < self.acknowledged_up_to:
            self.shortfalls.append((self.acknowledged_up_to, held))
        if isinstance(message, dict) and message.get("type") == "next_node_idx" and message["success"]:
            self.acknowledged_up_to = max(self.acknowledged_up_to, message["next_node_idx"] - 1)
        return super().send(node, message)


def test_a_voter_catching_up_from_an_empty_log_never_holds_less_than_it_acknowledged() -> None:
    # A voter replaced by one with an empty log gets 20,000 entries in pipelined batches. Each batch sent past its
    # end earns a "reset" answer, and the leader, going back once per answer, sends it batches it already holds.
    # pysyncobj's own handling deleted what followed such a batch: up to a few thousand acknowledged entries, in
    # about half the runs (the order of answers and resends is the scheduler's; the first six tests fix it).
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    conf = SyncObjConf(raftMinTimeout=0.4, raftMaxTimeout=0.8, appendEntriesPeriod=0.05,
                       dynamicMembershipChange=False, appendEntriesUseBatch=False)
    lists = [ReplList() for _ in addresses]

    def voter(i: int) -> QuorumSyncObj:
        return QuorumSyncObj(addresses[i], [a for a in addresses if a != addresses[i]], conf, consumers=[lists[i]],
                             transportClass=_AcknowledgingTransport)
    nodes = [voter(i) for i in range(3)]
    try:
        leader = wait_for(lambda: next((n for n in nodes if n._isLeader()), None), 10, "a leader")
        replaced = (nodes.index(leader) + 1) % 3
        nodes[replaced].destroy()
        for _ in range(20_000):
            lists[nodes.index(leader)].append("x" * 400, sync=False)
        wait_for(lambda: leader.raftCommitIndex >= 20_001, 30,
                 lambda: f"the other two commit the writes (commit index {leader.raftCommitIndex})")
        lists[replaced] = ReplList()
        nodes[replaced] = voter(replaced)
        wait_for(lambda: nodes[replaced].raftLastApplied >= leader.raftCommitIndex, 30, lambda: "the new voter "
                 f"catches up (applied {nodes[replaced].raftLastApplied} of {leader.raftCommitIndex})")
        shortfalls = nodes[replaced]._SyncObj__transport.shortfalls
        assert shortfalls == [], f"(acknowledged up to, then held up to): {shortfalls[:5]}, {len(shortfalls)} in all"
        assert lists[replaced].rawData() == lists[nodes.index(leader)].rawData()
    finally:
        for n in nodes:
            n.destroy()
