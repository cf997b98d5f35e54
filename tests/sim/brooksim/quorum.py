"""An abstract Raft quorum: terms, leaders, a log of proposals that commit or are discarded.

Nothing here replicates bytes: the quorum is one ordered log applied to one real
``MetadataState`` (every voter applies the same log, so one copy stands for all). What
is modelled is what the controller can observe of pysyncobj:

- a leader per term (``leader_of_term``), elections, a leader stepping down;
- ``submit`` from any voter; with ``commandsWaitLeader`` a non-leader's command is
  forwarded to the leader (or waits for one), so a deposed leader's proposal can
  commit under the next term;
- on a leadership change each uncommitted entry either survives into the new leader's
  log (and commits later) or is discarded (its proposer sees DISCARDED);
- a voter that was deposed may go on believing it leads its old term for a while;
- ``is_leader`` and ``term`` are two separate reads, as on ``MetadataRaft``: an
  ``on_is_leader`` hook lets the scheduler run an election between them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from metadata_quorum import commands as c
from metadata_quorum.state import ApplyResult, MetadataState
from proto import errors

T = TypeVar("T")

MAX_LOG_ENTRIES = 100_000  # uncommitted + waiting; a simulation never gets near it


class SimProposal:
    """What ``MetadataRaft.submit`` returns: waits are answered from the simulated log."""

    def __init__(self, quorum: SimQuorum, what: str) -> None:
        self._quorum = quorum
        self.what = what
        self.done = False
        self.result: Any = None
        self.failure = ""

    def resolve(self, result: Any) -> None:
        self.done, self.result = True, result

    def fail(self, reason: str) -> None:
        self.done, self.failure = True, reason

    def wait(self, timeout_s: float) -> Any:
        # A blocking wait lets the quorum commit up to this entry if it can (it has a
        # leader); a poll (timeout 0) only looks. No simulated time passes either way.
        if not self.done and timeout_s > 0:
            self._quorum.drain(self)
        if not self.done:
            raise errors.RequestTimedOutError(f"{self.what}: not committed (simulated quorum)")
        if self.failure:
            raise errors.NotControllerError(f"{self.what}: not committed, leadership changed ({self.failure})")
        return self.result


@dataclass(slots=True)
class Entry:
    payload: dict[str, Any]
    controller_epoch: int | None
    proposal: SimProposal
    origin: int


class SimQuorum:
    def __init__(self, voter_ids: list[int]) -> None:
        self.voter_ids = list(voter_ids)
        self.state = MetadataState()
        self.term = 0
        self.leader: int | None = None
        self.leader_of_term: dict[int, int] = {}
        self.up: dict[int, bool] = dict.fromkeys(voter_ids, True)
        # A deposed voter that has not heard of the new term yet: node -> the term it believes it leads.
        self.stale_belief: dict[int, int] = {}
        self.uncommitted: deque[Entry] = deque()
        self.waiting: deque[Entry] = deque()  # submitted while there was no leader
        self.on_is_leader: Callable[[int], None] | None = None
        self.on_commit: Callable[[Entry, ApplyResult], None] | None = None
        self.step_down_requested: set[int] = set()
        self.commits = 0

    # ---- Raft events ----
    def majority_up(self) -> bool:
        return sum(self.up.values()) * 2 > len(self.voter_ids)

    def elect(self, node_id: int) -> int:
        if self.leader is not None:
            raise AssertionError(f"elect({node_id}) while {self.leader} leads term {self.term}")
        if not self.up[node_id] or not self.majority_up():
            raise AssertionError(f"{node_id} cannot win an election (up={self.up})")
        self.term += 1
        self.leader = node_id
        self.leader_of_term[self.term] = node_id
        self.stale_belief.pop(node_id, None)
        while self.waiting:  # pysyncobj forwards commands that waited for a leader
            self.uncommitted.append(self.waiting.popleft())
        return self.term

    def step_down(self, keep: Callable[[Entry], bool], stale: bool) -> None:
        """The leader loses leadership; ``keep`` says which uncommitted entries the next leader has."""
        old = self.leader
        if old is None:
            return
        self.leader = None
        if stale and self.up[old]:
            self.stale_belief[old] = self.term
        survivors: deque[Entry] = deque()
        for e in self.uncommitted:
            if keep(e):
                survivors.append(e)
            else:
                e.proposal.fail("DISCARDED")
        self.uncommitted = survivors

    def learn_term(self, node_id: int) -> None:
        self.stale_belief.pop(node_id, None)

    def crash(self, node_id: int) -> None:
        self.up[node_id] = False
        self.stale_belief.pop(node_id, None)

    # ---- proposals ----
    def submit(self, origin: int, cmd: c.Command, controller_epoch: int | None) -> SimProposal:
        if len(self.uncommitted) + len(self.waiting) >= MAX_LOG_ENTRIES:
            raise AssertionError("simulated Raft log grew without bound (a proposal loop?)")
        proposal = SimProposal(self, type(cmd).__name__)
        entry = Entry(c.to_dict(cmd), controller_epoch, proposal, origin)
        if self.leader is None:
            self.waiting.append(entry)
        else:
            self.uncommitted.append(entry)
        return proposal

    def commit_next(self) -> tuple[Entry, ApplyResult] | None:
        if self.leader is None or not self.uncommitted:
            return None
        e = self.uncommitted.popleft()
        result = self.state.apply(e.payload, controller_epoch=e.controller_epoch)
        self.commits += 1
        e.proposal.resolve(result)
        if self.on_commit is not None:
            self.on_commit(e, result)
        return e, result

    def drain(self, proposal: SimProposal) -> None:
        while not proposal.done and self.commit_next() is not None:
            pass


class SimRaft:
    """One voter's ``MetadataRaft`` surface, as QuorumController uses it."""

    def __init__(self, quorum: SimQuorum, node_id: int) -> None:
        self.quorum = quorum
        self.node_id = node_id

    def leadership(self) -> tuple[bool, int]:
        """(is leader, term) read together: what the controller branch's MetadataRaft adds."""
        q = self.quorum
        return (q.up[self.node_id] and (q.leader == self.node_id or self.node_id in q.stale_belief)), self.term

    def request_step_down(self) -> None:
        """Ask to give up leadership; the scheduler honours it on a later step (``ev_step_down``)."""
        self.quorum.step_down_requested.add(self.node_id)

    def is_leader(self) -> bool:
        q = self.quorum
        answer = q.up[self.node_id] and (q.leader == self.node_id or self.node_id in q.stale_belief)
        if q.on_is_leader is not None:
            q.on_is_leader(self.node_id)  # the tick thread may run right here
        return answer

    def ticking(self) -> bool:
        """A simulated voter's tick never stalls: stale leaders are modelled by ``stale_belief``."""
        return True

    @property
    def term(self) -> int:
        q = self.quorum
        return q.stale_belief.get(self.node_id, q.term)

    def read(self, fn: Callable[[MetadataState], T]) -> T:
        return fn(self.quorum.state)

    def submit(self, cmd: c.Command, controller_epoch: int | None = None) -> SimProposal:
        return self.quorum.submit(self.node_id, cmd, controller_epoch)

    def propose(self, cmd: c.Command, timeout_s: float, controller_epoch: int | None = None) -> ApplyResult:
        return self.submit(cmd, controller_epoch).wait(timeout_s)

    @property
    def version(self) -> int:
        return self.quorum.state.version
