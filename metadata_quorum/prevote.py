"""Pre-vote for the metadata quorum (Raft thesis §9.6; Kafka's KIP-996): a voter asks before it disrupts.

pysyncobj starts an election whenever a voter's election timer runs out: it takes the next term and asks for
votes. A voter that cannot hear the leader but reaches another voter (the leader cut from it alone) then moved
the quorum to ever higher terms: the voter in the middle took each new term and deposed the leader it still
heard, once per election timeout, until the leadership landed on a voter both sides reach. Measured on a split
cluster (tests/faults/test_split_asymmetric_cuts.py): leader 5 at term 1, then 4 at term 2, then 6 at term 4
within 20 s of cutting 5 from 4; each change is a stretch without metadata writes.

``PreVoteSyncObj`` puts a round of pre-votes before every election that its timer starts. The would-be
candidate keeps its term and sends ``brook_pre_vote`` (the term it would take, its last log term and index) to
the other voters, pushing its own timer back by a fresh election timeout. A voter grants a pre-vote only if it
has not heard from a leader within the shortest election timeout (a leader never grants one), the candidate's
log is at least as up to date as its own, and the would-be term is not behind its own; it changes nothing of its
own state either way, and answers with its term. Only once a majority (itself included) granted does the
candidate's next tick start the real election, within the shortest election timeout. A voter that learns a
higher term from an answer takes it (as from any Raft message), so one left behind catches up instead of
asking at a term nobody will vote for.

Not delayed: an election the leader asked for (a leadership transfer, ``timeout_now``), and a quorum of one.
Mixed versions: a voter without pre-vote ignores the message (pysyncobj drops unknown types), so a candidate with
pre-vote can win only with the grants of voters that have it; the others still run their own elections, so a
quorum mid-upgrade keeps electing leaders.

Everything here runs on pysyncobj's tick thread: ticks and message callbacks both happen there.
"""

from __future__ import annotations

import logging
from typing import Any

import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj import SyncObj

from metadata_quorum import pysyncobj_compat  # noqa: F401  (undoes pysyncobj's socket.inet_ntop)

log = logging.getLogger(__name__)

PRE_VOTE = "brook_pre_vote"
PRE_VOTE_RESPONSE = "brook_pre_vote_response"
_RAFT = pysyncobj_syncobj._RAFT_STATE
_now = pysyncobj_syncobj.monotonicTime


def follow_term(obj: SyncObj, term: int) -> None:
    """Raft's rule for a message of a later term: take the term (no vote cast) and become a follower with no
    leader known, whatever this voter was (as pysyncobj does for a vote request of a later term)."""
    obj._SyncObj__setCurrentTerm(term, None)
    if obj._SyncObj__raftState != _RAFT.FOLLOWER:
        obj._SyncObj__setState(_RAFT.FOLLOWER)
    obj._SyncObj__raftLeader = None


class PreVoteSyncObj(SyncObj):  # type: ignore[misc]
    """pysyncobj's SyncObj with a pre-vote round before each election its timer starts (see the module doc).

    It reads and sets SyncObj's private fields (``_SyncObj__*``); pyproject.toml pins pysyncobj below 0.4 and
    tests/metadata_quorum/test_prevote.py runs it against the installed version."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Before SyncObj's constructor: its tick thread starts inside it.
        self._pv_round = 0
        self._pv_grants: set[Any] = set()
        self._pv_won_at = float("-inf")  # when a round last won: the election it allows may start until then + min
        self._pv_leader_heard_at = float("-inf")  # the last append_entries at (or above) this voter's term
        self._pv_losing = False  # the rounds since the last win lost (logged once per streak)
        self._pv_to_grant: dict[Any, dict[str, Any]] = {}  # pre-votes to grant at the next tick, by candidate
        self.pre_vote_rounds_total = 0
        self.pre_vote_rounds_won_total = 0
        super().__init__(*args, **kwargs)

    # ---- the candidate side ----
    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802 - pysyncobj's name
        self._pv_grant_held()
        self._pv_before_tick()
        super()._onTick(timeToWait)

    def _pv_before_tick(self) -> None:
        """If this tick would start an election no pre-vote round allowed, run a round instead: push the election
        timer back and ask the other voters."""
        if self._SyncObj__raftState not in (_RAFT.FOLLOWER, _RAFT.CANDIDATE) or self._SyncObj__selfNode is None:
            return
        now = _now()
        if self._SyncObj__raftElectionDeadline >= now or self._SyncObj__transferInProgress:
            return
        others = self._SyncObj__otherNodes
        if not others or not self._SyncObj__transport.ready or not self._SyncObj__connectedToAnyone():
            return  # SyncObj's own rules then (a quorum of one elects itself; no election while it reaches no one)
        if self._pv_won_recently(now):
            return  # a majority granted: the election goes ahead
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        if self._pv_round and not self._pv_majority():
            self._pv_note_lost_round()
        self._pv_round += 1
        self._pv_grants = set()
        self.pre_vote_rounds_total += 1
        request = {"type": PRE_VOTE, "round": self._pv_round, "term": self._SyncObj__raftCurrentTerm + 1,
                   "last_log_index": self._SyncObj__getCurrentLogIndex(),
                   "last_log_term": self._SyncObj__getCurrentLogTerm()}
        for node in others:
            self._SyncObj__transport.send(node, request)

    def _pv_answered(self, node: Any, message: dict[str, Any]) -> None:
        term = message.get("term")
        if isinstance(term, int) and term > self._SyncObj__raftCurrentTerm:
            # A higher term, as from any Raft message: taken (no vote cast), so the next round asks at it, and a
            # leader or candidate steps down. An answer arrives late if its link was slow: this voter may have
            # been elected since, and another at that higher term, whose leader it must not also be (two leaders
            # in one term, and different commands committed at one index: audit).
            follow_term(self, term)
        if message.get("round") != self._pv_round or not message.get("granted") or self._pv_won_recently(_now()):
            return
        self._pv_grants.add(node)
        if self._pv_majority():
            self._pv_won_at = _now()
            self.pre_vote_rounds_won_total += 1
            self._SyncObj__raftElectionDeadline = 0  # the next tick starts the election
            if self._pv_losing:
                log.info("pre-vote won at term %d after rounds that found a leader still heard",
                         self._SyncObj__raftCurrentTerm + 1)
            self._pv_losing = False

    def _pv_won_recently(self, now: float) -> bool:
        """Did a round win within the shortest election timeout (its election may still be starting)?"""
        return now - self._pv_won_at < self._SyncObj__conf.raftMinTimeout

    def _pv_majority(self) -> bool:
        """Do this round's grants, with this voter's own, make a majority?"""
        return len(self._pv_grants) + 1 > (len(self._SyncObj__otherNodes) + 1) / 2

    # ---- the voter side ----
    def _pv_grants_now(self, message: dict[str, Any]) -> bool | None:
        """Would this voter grant the pre-vote now? None for a message that is not one this code sent."""
        try:
            candidate = (int(message["last_log_term"]), int(message["last_log_index"]))
            would_be = int(message["term"])
        except (KeyError, TypeError, ValueError):
            return None
        leader_heard = self._SyncObj__raftState == _RAFT.LEADER or \
            _now() - self._pv_leader_heard_at < self._SyncObj__conf.raftMinTimeout
        mine = (self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex())
        return not leader_heard and candidate >= mine and would_be >= self._SyncObj__raftCurrentTerm

    def _pv_answer(self, node: Any, message: dict[str, Any]) -> None:
        """Refuse a pre-vote now, or hold a grant for the next tick; nothing of this voter's own state changes.

        A grant waits until this tick's poll has read everything that arrived: a voter whose thread stalled (CPU,
        a pause of the process) finds the candidate's request and the leader's heartbeats waiting together, and
        took the request first, when the last heartbeat it had read was older than an election timeout. It granted
        a pre-vote the leader's next message would have refused, and the cut voter deposed a leader a majority
        still heard (CI: tests/faults/test_split_asymmetric_cuts.py). Deciding after the poll costs an election at
        most one tick."""
        granted = self._pv_grants_now(message)
        if granted is None:
            return  # not a pre-vote this code sent: no answer
        if granted:
            self._pv_to_grant.pop(node, None)  # one held answer per candidate, its latest request's
            self._pv_to_grant[node] = message
            while len(self._pv_to_grant) > len(self._SyncObj__otherNodes) + 1:  # bounded: the voters, or a few more
                self._pv_to_grant.pop(next(iter(self._pv_to_grant)))
            return
        self._pv_send_answer(node, message, False)

    def _pv_grant_held(self) -> None:
        """The held grants, each decided again now that the last poll's messages are read."""
        held, self._pv_to_grant = self._pv_to_grant, {}
        for node, message in held.items():
            self._pv_send_answer(node, message, bool(self._pv_grants_now(message)))

    def _pv_send_answer(self, node: Any, message: dict[str, Any], granted: bool) -> None:
        self._SyncObj__transport.send(node, {"type": PRE_VOTE_RESPONSE, "round": message.get("round"),
                                             "term": self._SyncObj__raftCurrentTerm, "granted": granted})

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802 - overrides SyncObj's
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == PRE_VOTE:
            if self._SyncObj__selfNode is not None:  # a read-only node has no vote
                self._pv_answer(node, message)
            return
        if kind == PRE_VOTE_RESPONSE:
            self._pv_answered(node, message)
            return
        if kind == "append_entries" and isinstance(message.get("term"), int) and \
                message["term"] >= self._SyncObj__raftCurrentTerm:
            self._pv_leader_heard_at = _now()
        super()._SyncObj__onMessageReceived(node, message)

    def _pv_note_lost_round(self) -> None:
        if not self._pv_losing:
            log.info("pre-vote lost at term %d: a leader is still heard by a majority, so this voter does not start "
                     "an election (its own link to the leader may be cut)", self._SyncObj__raftCurrentTerm + 1)
            self._pv_losing = True
