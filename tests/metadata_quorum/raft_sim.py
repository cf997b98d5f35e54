"""Voters of the quorum's own SyncObj class (metadata_quorum.raft.QuorumSyncObj) on a network the test drives.

No sockets and no tick threads: each voter's transport hands its messages to a router, which keeps one queue per
link in order (as TCP does) and delivers them, pickled on the way as on the wire, only when the test says so. The
election timers are pushed out of reach, so nothing happens unless the test makes it happen: a test can hold a
message on a slow link for as long as it needs, which real voters only do by chance.
"""

from __future__ import annotations

import collections
import pickle
import time
from collections.abc import Callable
from typing import Any

import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj import SyncObjConf
from pysyncobj.batteries import ReplList
from pysyncobj.node import TCPNode
from pysyncobj.transport import Transport
from quorum_helpers import free_port

from metadata_quorum import raft_messages
from metadata_quorum.raft import QuorumSyncObj

RAFT = pysyncobj_syncobj._RAFT_STATE


class Router:
    """One ordered queue of pickled messages per (sender, receiver) address pair."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, str], collections.deque[bytes]] = collections.defaultdict(collections.deque)
        self.voters: dict[str, Voter] = {}  # by address

    def send(self, sender: str, to: Any, message: Any) -> None:
        # What a voter sends, a voter takes: no message of this release trips the receiving check.
        problem = raft_messages.problem(message)
        assert problem is None, f"{sender} sent a message voters drop ({problem}): {message!r:.300}"
        self.queues[(sender, getattr(to, "id", str(to)))].append(pickle.dumps(message))

    def deliver(self, sender: str, receiver: str, count: int | None = None,
                kinds: tuple[str, ...] | None = None) -> int:
        """Deliver up to ``count`` (all if None) of the link's messages in order; with ``kinds``, stop at the first
        message of another type."""
        queue = self.queues[(sender, receiver)]
        delivered = 0
        while queue and (count is None or delivered < count):
            message = pickle.loads(queue[0])
            if kinds is not None and message.get("type") not in kinds:
                break
            queue.popleft()
            delivered += 1
            self.voters[receiver].obj._SyncObj__onMessageReceived(TCPNode(sender), message)
        return delivered


class _RoutedTransport(Transport):  # type: ignore[misc]
    router: Router  # set on a class made per network

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:  # noqa: N803 - pysyncobj's names
        super().__init__(syncObj, selfNode, otherNodes)
        self._me = selfNode.id

    @property
    def ready(self) -> bool:
        return True

    def tryGetReady(self) -> None:  # noqa: N802 - pysyncobj's name
        pass

    def waitReady(self) -> None:  # noqa: N802 - pysyncobj's name
        pass

    def addNode(self, node: Any) -> None:  # noqa: N802 - pysyncobj's name
        pass

    def dropNode(self, node: Any) -> None:  # noqa: N802 - pysyncobj's name
        pass

    def send(self, node: Any, message: Any) -> bool:
        self.router.send(self._me, node, message)
        return True

    def destroy(self) -> None:
        pass


def conf(**extra: Any) -> SyncObjConf:
    """MetadataRaft's settings where they matter to what is tested, timers out of reach."""
    settings: dict[str, Any] = {"autoTick": False, "dynamicMembershipChange": False, "appendEntriesUseBatch": False,
                                "raftMinTimeout": 100.0, "raftMaxTimeout": 200.0, "appendEntriesPeriod": 0.05,
                                "leaderFallbackTimeout": 1000.0, "connectionTimeout": 300.0}
    settings.update(extra)
    return SyncObjConf(**settings)


class CopyingList(ReplList):  # type: ignore[misc]
    """A replicated list whose snapshot is a copy (as MetadataState's is): Brook's dump writer pickles it on a
    thread of its own while the list goes on changing."""

    def _serialize(self) -> Any:
        import copy
        return copy.deepcopy(super()._serialize())


class Voter:
    def __init__(self, name: str, address: str, others: list[str], router: Router,
                 settings: Callable[[str, Voter], SyncObjConf] | None) -> None:
        self.name, self.address, self.router = name, address, router
        self.list = CopyingList()
        transport = type(f"RoutedTransport{name}", (_RoutedTransport,), {"router": router})
        self.obj = QuorumSyncObj(address, others, settings(name, self) if settings else conf(),
                                 consumers=[self.list], transportClass=transport)
        for node in self.obj._SyncObj__otherNodes:
            self.obj._SyncObj__transport._onNodeConnected(node)

    @property
    def state(self) -> int:
        return int(self.obj._SyncObj__raftState)

    @property
    def term(self) -> int:
        return int(self.obj._SyncObj__raftCurrentTerm)

    def log(self) -> list[tuple[int, int]]:
        """(index, term) of each entry held."""
        return [(entry[1], entry[2]) for entry in self.obj._SyncObj__raftLog[:]]

    def tick(self, times: int = 1) -> None:
        for _ in range(times):
            self.obj._onTick(0)

    def propose(self, value: Any) -> list[Any]:
        """Append ``value`` to the replicated list; the list gets the callback's error (0: committed)."""
        outcome: list[Any] = []
        self.list.append(value, callback=lambda _result, error: outcome.append(error))
        return outcome


class Network:
    def __init__(self, names: list[str], settings: Callable[[str, Voter], SyncObjConf] | None = None) -> None:
        self.router = Router()
        self.addresses = {name: f"127.0.0.1:{free_port()}" for name in names}
        self.voters = {name: Voter(name, address, [a for n, a in self.addresses.items() if n != name], self.router,
                                   settings)
                       for name, address in self.addresses.items()}
        self.router.voters = {v.address: v for v in self.voters.values()}

    def __getitem__(self, name: str) -> Voter:
        return self.voters[name]

    def deliver(self, sender: str, receiver: str, count: int | None = None,
                kinds: tuple[str, ...] | None = None) -> int:
        return self.router.deliver(self.addresses[sender], self.addresses[receiver], count, kinds)

    def pending(self, sender: str, receiver: str) -> list[dict[str, Any]]:
        return [pickle.loads(m) for m in self.router.queues[(self.addresses[sender], self.addresses[receiver])]]

    def drop(self, sender: str, receiver: str) -> None:
        self.router.queues[(self.addresses[sender], self.addresses[receiver])].clear()

    def elect(self, name: str, voters: list[str]) -> None:
        """``name``'s election timer runs out, its pre-vote round is taken as won, and ``voters`` answer it."""
        candidate = self.voters[name]
        candidate.obj._SyncObj__raftElectionDeadline = 0.0
        candidate.obj._pv_won_at = time.monotonic()
        candidate.tick()
        for voter in voters:
            self.deliver(name, voter, kinds=("request_vote",))
            self.deliver(voter, name, kinds=("response_vote",))
        assert candidate.state == RAFT.LEADER, f"{name} was not elected"

    def replicate(self, leader: str, to: list[str], rounds: int = 6) -> None:
        """The leader's heartbeats and appends to ``to``, and their answers, ``rounds`` times."""
        for _ in range(rounds):
            self.voters[leader].obj._SyncObj__newAppendEntriesTime = 0
            self.voters[leader].tick()
            for follower in to:
                self.deliver(leader, follower)
                self.deliver(follower, leader)
            for follower in to:
                self.voters[follower].tick()

    def write(self, leader: str, values: list[Any], to: list[str]) -> None:
        """The leader appends ``values`` to its replicated list and replicates them to ``to``."""
        for value in values:
            self.voters[leader].propose(value)
        self.voters[leader].tick()
        self.replicate(leader, to)

    def node_of(self, holder: str, name: str) -> Any:
        """The pysyncobj node object ``holder`` keeps for ``name``."""
        return next(n for n in self.voters[holder].obj._SyncObj__otherNodes if n.id == self.addresses[name])

    def destroy(self) -> None:
        for voter in self.voters.values():
            voter.obj.destroy()
