"""Incremental fetch sessions (KIP-227) for the Kafka listener's consumers.

A consumer that opens a session names its partitions once; its later fetches name only the partitions
whose fetch position changed (and the ones it forgets), and the answers carry only the partitions with
something new: records, a moved high watermark or log start, an error, or a replica to read from. A
consumer of many partitions then sends and receives a few of them a fetch instead of all of them. The
rules are Kafka's (``FetchSession.scala``):

- ``session_id`` 0 and epoch -1 (FINAL): a fetch without a session, as before sessions.
- epoch 0 (INITIAL): a full fetch that asks for a new session; a ``session_id`` it names is closed. The
  answer carries the new session's id, or 0 when the cache has no room for it (the client then goes on
  without one).
- a ``session_id`` and epoch -1: that session is closed, and the fetch is answered without one.
- a ``session_id`` and an epoch above 0: an incremental fetch. An unknown session is
  ``FETCH_SESSION_ID_NOT_FOUND``, another epoch than the session expects ``INVALID_FETCH_SESSION_EPOCH``
  (a duplicate or a lost answer: the client opens a new session). A session whose partitions are all
  forgotten is closed, and that fetch answered without one.

Defence, beyond Kafka's rules: a session answers only the principal and address that opened it (another
client naming its id is told it does not exist), an address holds at most an eighth of the slots (at its
share, a session of its own unused for ``EVICTION_S`` makes room for its new one), and the partitions all
sessions hold together are bounded. Eviction is Kafka's: a new session may take the
slot of one unused for ``EVICTION_S``, or of the smallest session older than that if the new one is
larger. Everything here runs on the listener's event loop: no locks.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH = 70, 71
INITIAL_EPOCH, FINAL_EPOCH = 0, -1
NO_SESSION = 0
MAX_SESSIONS = 1000  # Kafka's max.incremental.fetch.session.cache.slots
EVICTION_S = 120.0  # Kafka's min.incremental.fetch.session.eviction.ms
ADDRESS_SHARE = 8  # one client address holds at most 1/8 of the slots
MAX_CACHED_PARTITIONS = 100_000  # the partitions of all sessions together (each is a small object)

Key = tuple[str, int]


@dataclass(slots=True)
class CachedPartition:
    """What a session knows of one partition: the client's last fetch parameters, and what it was last told."""
    fetch_offset: int
    max_bytes: int
    leader_epoch: int
    high_watermark: int = -1  # -1 until an answer without error told it
    log_start_offset: int = -1


@dataclass(slots=True)
class Session:
    id: int
    owner: tuple[str, str]  # (principal, client address)
    parts: dict[Key, CachedPartition]  # in fetch order: partitions that returned records go to the end
    epoch: int
    created_s: float
    last_used_s: float


@dataclass(slots=True)
class Plan:
    """How one Fetch is served: ``kind`` is ``sessionless``, ``full`` (a new session is tried after it),
    ``incremental`` or ``error`` (``error_code``, nothing fetched); ``fetch``: the partitions to read, in order."""
    kind: str
    fetch: list[tuple[Key, CachedPartition]] = field(default_factory=list)
    session: Session | None = None
    epoch: int = 0  # the session's epoch once this fetch is served (incremental)
    error_code: int = 0


@dataclass(slots=True)
class Outcome:
    """One partition of an answer, as the session judges it."""
    error_code: int
    high_watermark: int
    log_start_offset: int
    has_records: bool
    read_elsewhere: bool  # a preferred read replica was named (KIP-392)


def next_epoch(epoch: int) -> int:
    """Kafka's FetchMetadata.nextEpoch: after the largest int32, 1 (0 and -1 are INITIAL and FINAL)."""
    return 1 if epoch >= 0x7FFFFFFF or epoch < 0 else epoch + 1


class FetchSessions:
    def __init__(self, max_sessions: int = MAX_SESSIONS, eviction_s: float = EVICTION_S,
                 max_partitions: int = MAX_CACHED_PARTITIONS, clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        self.max_sessions = max_sessions
        self.per_address = max(1, max_sessions // ADDRESS_SHARE)
        self.eviction_s = eviction_s
        self.max_partitions = max_partitions
        self._clock = clock
        self._rng = rng or random.Random()
        self._sessions: dict[int, Session] = {}
        self._by_address: dict[str, int] = {}
        self.partitions = 0  # cached in all sessions
        self.evictions_total = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def plan(self, session_id: int, epoch: int, requested: Iterable[tuple[Key, CachedPartition]],
             forgotten: Iterable[Key], owner: tuple[str, str]) -> Plan:
        """How to serve a Fetch carrying ``session_id``/``epoch``, the partitions it names and those it forgets."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != NO_SESSION:
                found = self._sessions.get(session_id)
                if found is not None and found.owner == owner:
                    self._remove(found)  # any session a full fetch names is closed
            return Plan("full" if epoch == INITIAL_EPOCH else "sessionless", list(requested))
        session = self._sessions.get(session_id)
        if session is None or session.owner != owner:
            return Plan("error", error_code=FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return Plan("error", error_code=INVALID_FETCH_SESSION_EPOCH)
        before = len(session.parts)
        for key, part in requested:
            cached = session.parts.get(key)
            if cached is None:
                session.parts[key] = part
            else:
                cached.fetch_offset, cached.max_bytes, cached.leader_epoch = (part.fetch_offset, part.max_bytes,
                                                                              part.leader_epoch)
        for key in forgotten:
            session.parts.pop(key, None)
        self.partitions += len(session.parts) - before
        if not session.parts or self.partitions > self.max_partitions:
            # Emptied: answered without a session, as Kafka does. Grown past the cache's bound: closed (the
            # client's next incremental fetch is told it is gone and opens a new one, if there is room).
            self._remove(session)
            return Plan("sessionless", list(session.parts.items()))
        session.epoch = next_epoch(session.epoch)
        session.last_used_s = self._clock()
        return Plan("incremental", list(session.parts.items()), session, session.epoch)

    def respond(self, plan: Plan, outcomes: dict[Key, Outcome], owner: tuple[str, str]) -> tuple[int, int, set[Key]]:
        """After the fetch: (error code, session id, the partitions the answer carries) for the partitions
        fetched and what each returned (``outcomes``). A ``sessionless`` plan carries every partition (the
        listener does not ask, and builds no outcomes for it)."""
        if plan.kind == "full":
            return 0, self._maybe_create(plan, outcomes, owner), set(outcomes)
        if plan.kind != "incremental":
            return 0, NO_SESSION, set(outcomes)
        session = plan.session
        assert session is not None
        if self._sessions.get(session.id) is not session or session.epoch != plan.epoch:
            # Another fetch of the session came in while this one waited (a duplicate), or it was closed.
            return INVALID_FETCH_SESSION_EPOCH, NO_SESSION, set()
        carried = set()
        moved = []
        for key, out in outcomes.items():
            cached = session.parts.get(key)
            if cached is None:
                continue  # forgotten by a later request
            must = out.has_records or out.read_elsewhere or out.error_code != 0
            if cached.high_watermark != out.high_watermark:
                must = True
                cached.high_watermark = out.high_watermark
            if cached.log_start_offset != out.log_start_offset:
                must = True
                cached.log_start_offset = out.log_start_offset
            if out.error_code != 0:
                cached.high_watermark = -1  # told again once the error goes away
            if must:
                carried.add(key)
            if out.has_records:
                moved.append(key)
        for key in moved:  # the partitions that had records go last: the others get the next fetch's bytes first
            session.parts[key] = session.parts.pop(key)
        return 0, session.id, carried

    def _maybe_create(self, plan: Plan, outcomes: dict[Key, Outcome], owner: tuple[str, str]) -> int:
        size = len(plan.fetch)
        address = owner[1]
        if size == 0:
            return NO_SESSION
        now = self._clock()
        if self._by_address.get(address, 0) >= self.per_address:
            # At its share: only a session of its own that has gone unused (a consumer that left without
            # closing it, as they do) makes room, so that an address's restarted consumers get sessions again.
            own = min((s for s in self._sessions.values() if s.owner[1] == address), key=lambda s: s.last_used_s)
            if now - own.last_used_s <= self.eviction_s:
                return NO_SESSION
            self._remove(own, evicted=True)
        while len(self._sessions) >= self.max_sessions or self.partitions + size > self.max_partitions:
            if not self._evict_for(size, now):
                return NO_SESSION
        parts = {}
        for key, part in plan.fetch:
            out = outcomes.get(key)
            if out is not None and out.error_code == 0:
                part.high_watermark, part.log_start_offset = out.high_watermark, out.log_start_offset
            parts[key] = part
        session_id = self._rng.randint(1, 0x7FFFFFFF)
        while session_id in self._sessions:
            session_id = self._rng.randint(1, 0x7FFFFFFF)
        session = Session(session_id, owner, parts, next_epoch(INITIAL_EPOCH), now, now)
        self._sessions[session_id] = session
        self._by_address[address] = self._by_address.get(address, 0) + 1
        self.partitions += len(parts)
        return session_id

    def _evict_for(self, size: int, now: float) -> bool:
        """Kafka's rule: the session unused longest if it is stale, else the smallest one older than
        ``eviction_s`` if the new one (of ``size`` partitions) is larger. False: no slot for it."""
        if not self._sessions:
            return False
        oldest = min(self._sessions.values(), key=lambda s: s.last_used_s)
        if now - oldest.last_used_s > self.eviction_s:
            self._remove(oldest, evicted=True)
            return True
        settled = [s for s in self._sessions.values() if now - s.created_s > self.eviction_s]
        if not settled:
            return False
        smallest = min(settled, key=lambda s: (len(s.parts), s.id))
        if len(smallest.parts) >= size:
            return False
        self._remove(smallest, evicted=True)
        return True

    def _remove(self, session: Session, *, evicted: bool = False) -> None:
        """Drop ``session`` from the cache (``evicted``: to make room for another, which the metric counts)."""
        if self._sessions.pop(session.id, None) is None:
            return
        self.evictions_total += evicted
        self.partitions -= len(session.parts)
        left = self._by_address.get(session.owner[1], 1) - 1
        if left > 0:
            self._by_address[session.owner[1]] = left
        else:
            self._by_address.pop(session.owner[1], None)
