"""A follower keeps the log entries a leader's AppendEntries repeats (Raft §5.3), instead of truncating them.

pysyncobj's follower, on an ``append_entries`` whose previous entry it holds with the right term, deletes every
entry it holds after that previous entry and then appends the ones sent, whether or not they differ. Raft deletes
an entry only where it conflicts (same index, another term), and keeps entries past those sent, because an
AppendEntries may arrive late: a resend, or one sent before the follower's answer to a later one came back.

How a late one comes about with pysyncobj: a follower far behind answers each of the leader's pipelined batches
with "reset, send from my end". The leader goes back for the first answer, sends the follower everything again
(the follower appends it and acknowledges it), then goes back once more for the second answer, and the follower
receives a batch it already holds. pysyncobj truncated the entries after that batch and answered success: the
follower then held fewer entries than it had acknowledged, and the leader, which never lowers what it counts a
follower as holding (its match index), counted them toward commits. A leader lost at that moment could leave a
majority without an entry that was committed and answered.

``LogMatchingSyncObj`` rewrites such a message before pysyncobj handles it:

- the entries sent that the follower holds with the same term are dropped from it, so the message starts at the
  first entry that differs or is new, and pysyncobj deletes only from a conflict on;
- when every entry sent is already held and the follower holds more, the message becomes a heartbeat at the
  follower's last entry (nothing deleted), its commit index is bounded by the last entry sent (Raft: commit up to
  min(leader commit, index of the last new entry); entries past it may be an old leader's and differ from this
  one's), and the success answer names the entry after the last one sent, never more.

The leader's own view (``leader_commit_idx`` in pysyncobj's status) keeps the commit index the leader sent.
A message in pieces (pysyncobj's ``transmission``, for one entry larger than the batch size) is gathered by
pysyncobj; its last piece is rewritten as the whole entry would be.
Everything here runs on pysyncobj's tick thread, as its message callbacks do.
"""

from __future__ import annotations

import logging
from typing import Any

import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj import SyncObj

from metadata_quorum import (
    pysyncobj_compat,  # noqa: F401  (undoes pysyncobj's socket.inet_ntop)
    raft_messages,
)
from metadata_quorum.prevote import follow_term

log = logging.getLogger(__name__)
_RAFT = pysyncobj_syncobj._RAFT_STATE


def _is_snapshot_append(message: Any) -> bool:
    return isinstance(message, dict) and message.get("type") == "append_entries" and "prevLogIdx" not in message


class LogMatchingSyncObj(SyncObj):  # type: ignore[misc]
    """pysyncobj's SyncObj whose follower truncates only conflicting entries (see the module doc).

    It reads SyncObj's private fields (``_SyncObj__*``); pyproject.toml pins pysyncobj below 0.4 and
    tests/metadata_quorum/test_log_matching.py runs it against the installed version."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lm_answer_limit: int | None = None  # while handling a rewritten message: the most its answer claims
        self.repeated_appends_total = 0  # append_entries that repeated entries this follower held past them
        super().__init__(*args, **kwargs)

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 - overrides SyncObj's
        kind = message.get("type") if isinstance(message, dict) else None
        term = message.get("term") if kind is not None else None
        current = self._SyncObj__raftCurrentTerm
        if kind == "next_node_idx" and term is not None and term != current:
            if isinstance(term, int) and term > current:
                self._lm_deposed(term)
            return  # an answer to a leader of another term (see _SyncObj__sendNextNodeIdx)
        if kind == "append_entries" and isinstance(term, int) and term < current:
            # Raft: answer a leader of an earlier term with this voter's term, so that it steps down at once.
            # pysyncobj answered nothing: a deposed leader (paused, then resumed) went on as leader until its
            # leaderFallbackTimeout, committing nothing and answering from its old state meanwhile.
            self._SyncObj__sendNextNodeIdx(node)  # neither success nor reset: only its term counts
            return
        if _is_snapshot_append(message):
            self._lm_snapshot_append(node, message)
            return
        rewritten, answer_limit = self._lm_rewrite(message)
        self._lm_refuse_truncating_committed(rewritten)
        if answer_limit is None:
            super()._SyncObj__onMessageReceived(node, rewritten)
            return
        self._lm_answer_limit = answer_limit
        try:
            super()._SyncObj__onMessageReceived(node, rewritten)
        finally:
            self._lm_answer_limit = None
        self._SyncObj__leaderCommitIndex = message["commit_index"]

    def _lm_refuse_truncating_committed(self, message: Any) -> None:
        """Raise ValueError (the quorum port drops the message with its connection) for an append_entries that would
        have pysyncobj delete committed entries: it deletes every entry after ``prevLogIdx`` once the entry there
        matches (after ``_lm_rewrite``, only when a later one conflicts). A leader holds every committed entry
        (Raft's Leader Completeness; pysyncobj commits only entries of the leader's term by counting), so only a
        sender lying as the leader asks that; pysyncobj logged it and went on, with the applied state no longer
        the log's. etcd's follower panics on it; this one keeps its log and refuses the sender."""
        if not isinstance(message, dict) or message.get("type") != "append_entries" or "prevLogIdx" not in message \
                or message.get("transmission") not in (None, "finish"):
            return
        prev, commit = message["prevLogIdx"], self._SyncObj__raftCommitIndex
        if prev >= commit or prev >= self._SyncObj__getCurrentLogIndex():
            return
        held = self._SyncObj__getEntries(prev, 1)
        if not held or held[0][2] != message.get("prevLogTerm"):
            return  # pysyncobj refuses it and asks from where
        log.error("refused an append_entries at term %s that would delete committed entries from index %d (commit "
                  "index %d): no leader of this quorum sends one", message.get("term"), prev + 1, commit)
        raise ValueError(f"an append_entries that would delete committed entries from index {prev + 1}")

    def _lm_deposed(self, term: int) -> None:
        """A voter answered with a later term: take it and follow."""
        if self._SyncObj__raftState == _RAFT.LEADER:
            log.info("stepping down: a voter answered with term %d, this leader's is %d", term,
                     self._SyncObj__raftCurrentTerm)
        follow_term(self, term)

    def _lm_snapshot_append(self, node: Any, message: dict[str, Any]) -> None:
        """An append_entries that carries (a piece of) the leader's snapshot, or nothing while the leader writes
        one. It has no previous entry, so nothing of this follower's log was matched against the leader's:
        pysyncobj still raised its commit index to the leader's, bounded by its own last entry, and applied
        entries it held that the leader may never have committed (an old leader's). Its commit index stays; a
        snapshot loaded by it is committed up to the snapshot's last entry."""
        commit_index = message.get("commit_index")
        own = self._SyncObj__raftCommitIndex
        bounded = min(commit_index, own) if isinstance(commit_index, int) else commit_index
        try:
            super()._SyncObj__onMessageReceived(node, dict(message, commit_index=bounded))
        finally:
            self._lm_answer_limit = None  # set by _SyncObj__loadDumpFile for its answer
        applied = self._SyncObj__raftLastApplied
        if self._SyncObj__raftCommitIndex < applied:
            self._SyncObj__raftCommitIndex = applied
            self._SyncObj__raftLog.setRaftCommitIndex(applied)
        if isinstance(commit_index, int):
            self._SyncObj__leaderCommitIndex = commit_index

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:  # noqa: N802, N803 - overrides SyncObj's
        """Load a dump keeping the journal entries after it when the journal holds its last entry (Raft §7).

        pysyncobj emptied the journal for a leader's snapshot whatever the follower held; a late "reset" answer
        has a leader send its snapshot to a follower that already holds more, which then held less than it had
        acknowledged and applied its state backwards (audit). Its own condition still empties a journal that does
        not start with the dump's last two entries (the dump loader, raft.py, trims one that holds them there).
        The answer to a leader's snapshot names the entry after the snapshot's last, however far the journal
        goes: the entries after it may be an old leader's."""
        super()._SyncObj__loadDumpFile(False)
        if clearJournal:
            self._lm_answer_limit = self._SyncObj__raftLastApplied + 1

    def _SyncObj__sendNextNodeIdx(self, node: Any, reset: bool = False,  # noqa: N802 - overrides SyncObj's
                                  nextNodeIdx: int | None = None, success: bool = False) -> None:  # noqa: N803
        limit = self._lm_answer_limit
        if nextNodeIdx is None:
            nextNodeIdx = self._SyncObj__getCurrentLogIndex() + 1
        if limit is not None and success and not reset and nextNodeIdx > limit:
            nextNodeIdx = limit
        # pysyncobj's answer, with this voter's term: a leader counts a success toward its match index, and one
        # answering a leader of an earlier term (delayed on its link) could count entries since overwritten
        # (five voters: an acknowledged write then lost; audit). A leader drops answers of another term;
        # answers without one (a voter of an older version) count as before.
        self._SyncObj__transport.send(node, {"type": "next_node_idx", "next_node_idx": nextNodeIdx, "reset": reset,
                                            "success": success, "term": self._SyncObj__raftCurrentTerm})

    def _SyncObj__sendAppendEntries(self) -> None:  # noqa: N802 - overrides SyncObj's
        """pysyncobj's, except for followers that need the snapshot while this leader writes it. pysyncobj sends
        them ``{'serialized': None}`` again and again for all of ``appendEntriesPeriod`` (11,112 messages in one
        call: audit), each pickled and encrypted on this tick thread. They get one such heartbeat a call."""
        serializer = self._SyncObj__serializer
        first = self._SyncObj__raftLog[0][1]
        connected = self._SyncObj__connectedNodes
        waiting = set()
        if serializer._Serializer__pid != 0:  # a snapshot is being written: none can be sent yet
            waiting = {n for n in connected if self._SyncObj__raftNextIndex.get(n, first + 1) <= first}
        if not waiting:
            super()._SyncObj__sendAppendEntries()
            return
        others = connected - waiting
        self._SyncObj__connectedNodes = others
        try:
            super()._SyncObj__sendAppendEntries()
        finally:
            now = self._SyncObj__connectedNodes  # pysyncobj may have seen one go meanwhile
            connected.difference_update(others - now)
            connected.update(now - others)
            self._SyncObj__connectedNodes = connected
        for n in waiting & connected:
            self._SyncObj__transport.send(n, {"type": "append_entries", "term": self._SyncObj__raftCurrentTerm,
                                             "commit_index": self._SyncObj__raftCommitIndex, "serialized": None})

    def _lm_rewrite(self, message: Any) -> tuple[Any, int | None]:
        """(the message pysyncobj should handle, the highest next index its success answer may name or None)."""
        if not isinstance(message, dict) or message.get("type") != "append_entries" or "prevLogIdx" not in message:
            return message, None
        if message.get("transmission") is None:
            return self._lm_rewrite_entries(message)
        if message["transmission"] != "finish":
            return message, None  # a piece of one large entry: pysyncobj gathers them
        # The last piece: the entry is whole, and handled as if sent in one message when it is rewritten.
        gathered = self._SyncObj__recvTransmission
        try:
            entry = pysyncobj_pickle.loads(gathered + message["data"])
        except Exception:  # noqa: BLE001
            # pysyncobj's leader labels a piece "finish" by the command's length, not the pickled entry's, so a
            # command just under a multiple of the batch size has a "finish" before its last piece, which then
            # failed to unpickle in the tick thread. It is gathered as the piece it is.
            return dict(message, transmission="process"), None
        problem = raft_messages.entry_problem(entry, message["prevLogIdx"] + 1, message["term"])
        if problem is not None:
            raise ValueError(f"an entry sent in parts: {problem}")  # the transport drops it with its connection
        whole = {k: v for k, v in message.items() if k not in ("transmission", "data")}
        whole["entries"] = [entry]
        rewritten, answer_limit = self._lm_rewrite_entries(whole)
        if rewritten is whole:
            return message, None  # nothing to change: pysyncobj gathers it as it would
        self._SyncObj__recvTransmission = ""  # as pysyncobj does once an entry is whole
        return rewritten, answer_limit

    def _lm_rewrite_entries(self, message: dict[str, Any]) -> tuple[Any, int | None]:
        term, prev_index, prev_term = message.get("term"), message.get("prevLogIdx"), message.get("prevLogTerm")
        if not isinstance(term, int) or term < self._SyncObj__raftCurrentTerm or not isinstance(prev_index, int):
            return message, None
        last = self._SyncObj__getCurrentLogIndex()
        if prev_index >= last:
            return message, None  # nothing held past the previous entry: pysyncobj deletes nothing
        held = self._SyncObj__getEntries(prev_index)  # held[k] is entry prev_index + k
        if not held or held[0][2] != prev_term:
            return message, None  # pysyncobj refuses it (and asks from where)
        entries = message.get("entries") or []
        same = 0
        for entry in entries:
            position = same + 1
            if not isinstance(entry, (tuple, list)) or len(entry) != 3 or entry[1] != prev_index + position:
                return message, None  # not what pysyncobj sends: its own handling
            if position >= len(held) or held[position][2] != entry[2]:
                break
            same += 1
        if same < len(entries):
            if same == 0:
                return message, None  # the first entry sent differs or is new: pysyncobj's handling is Raft's
            base = held[same]  # the last entry sent that is held: the rest goes after it
            return dict(message, prevLogIdx=base[1], prevLogTerm=base[2], entries=entries[same:]), None
        sent_up_to = prev_index + len(entries)
        self.repeated_appends_total += 1
        log.debug("kept entries %d..%d: an append_entries at term %d repeated entries %d..%d (a resend or a late one)",
                  sent_up_to + 1, last, term, prev_index + 1, sent_up_to)
        commit_index = message.get("commit_index")
        bounded = min(commit_index, sent_up_to) if isinstance(commit_index, int) else commit_index
        return dict(message, prevLogIdx=last, prevLogTerm=held[-1][2], entries=[], commit_index=bounded), \
            sent_up_to + 1
