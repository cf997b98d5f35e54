"""Leader side of a follower's fetch session: one per ReplicaFetch stream (KIP-227, scoped to the stream).

Without it a follower that follows N partitions from this leader sends all N in every fetch,
and the leader reads all N in every answer (the follower's progress, the high watermark, the
data after it), and watches all N while the fetch waits: at each acks=all write, O(N) work on
both sides, although one partition changed. With 306 partitions on three brokers that cost
20 ms of produce p50 at 10k records/s and doubled the brokers' CPU (README, "Incremental
fetch sessions").

The stream is the session: its messages arrive in order, so no session id or epoch is needed,
and a new stream starts a new session with a full request. The session keeps the follower's
latest FetchPartition of every partition; an incremental request lists only the partitions
added or changed (the follower moved: its progress may move the high watermark) and those it
no longer fetches. The session is registered, per partition, in the broker's SessionIndex:
whatever wakes fetches for a partition (an append, a high watermark or ISR move, a role
change: ReplicaManager._complete_delayed) marks it in the sessions that hold it, in O(1).

- *dirty*: the partition has data (or a role) the follower was not sent: a parked fetch of
  the session wakes for it;
- *stale*: something else moved (the high watermark): read at the next answer, but no wake
  (an acks=all commit moves the HW once per batch; waking every follower for it would only
  make them re-read nothing).

A read covers the dirty and stale partitions and the ones the request listed, and, in turns,
every partition once per ``refresh_s``: a follower caught up on an idle partition stays caught
up, and that read records it (its caught-up time) well within ``replica.lag.time.max.ms``; it
also carries log start moves, which mark nothing. The turns are spread over the reads (each
takes its share of the session, by the time since the previous one) rather than one read of
every partition of the session per period: with 1,206 partitions (about 400 a session) those
bursts held the event loop long enough to make the produce p99 at 10k records/s 68–83 ms, and
12–19 ms spread. A read whose answer is not sent (the fetch waits on) leaves its partitions
stale. Answers carry only what was read.

Thread-safety: the session's sets change under its lock; ``changed`` comes from any thread, the
read of a woken fetch from the thread that woke it, the rest from the broker's event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from proto import broker_pb2, errors

Key = tuple[str, int]

# A follower fetches from this leader partitions this broker hosts (a few more while their metadata
# reaches the two brokers). A session holds at most twice the partitions the broker hosts, and at
# least this many: more is a broken peer, and the request is refused with the session as it was.
MIN_SESSION_BOUND = 1000


class SessionIndex:
    """The sessions holding each partition. Lookups are lock-free (tuples replaced, never changed)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[Key, tuple[FollowerFetchSession, ...]] = {}
        self._open: set[FollowerFetchSession] = set()

    def opened(self, session: FollowerFetchSession) -> None:
        with self._lock:
            self._open.add(session)

    def closed(self, session: FollowerFetchSession) -> None:
        with self._lock:
            self._open.discard(session)

    def parked(self) -> int:
        """Sessions whose fetch waits now (Kafka's NumDelayedOperations counts them as delayed fetches)."""
        with self._lock:
            sessions = list(self._open)
        return sum(1 for s in sessions if s.parked)

    def add(self, session: FollowerFetchSession, keys: Iterable[Key]) -> None:
        with self._lock:
            for k in keys:
                held = self._by_key.get(k, ())
                if session not in held:
                    self._by_key[k] = (*held, session)

    def remove(self, session: FollowerFetchSession, keys: Iterable[Key]) -> None:
        with self._lock:
            for k in keys:
                held = tuple(s for s in self._by_key.get(k, ()) if s is not session)
                if held:
                    self._by_key[k] = held
                else:
                    self._by_key.pop(k, None)

    def changed(self, key: Key, partition: Any) -> None:
        """``key`` changed (``partition`` its Partition, None when no longer hosted)."""
        for s in self._by_key.get(key, ()):
            s.changed(key, partition)

    def sessions(self, key: Key) -> int:
        return len(self._by_key.get(key, ()))


class FollowerFetchSession:
    def __init__(self, index: SessionIndex, refresh_s: float, hosted: Callable[[], int] = lambda: 0) -> None:
        self.refresh_s = refresh_s
        self._index = index
        self._hosted = hosted  # how many partitions this broker hosts now
        self._lock = threading.Lock()
        self._fetches: dict[Key, broker_pb2.FetchPartition] = {}
        self._seen: dict[Key, int] = {}  # the partition's data_seq when last read for this session
        self._dirty: set[Key] = set()
        self._stale: set[Key] = set()
        self._waiter: Callable[[], None] | None = None
        # the refresh: a turn through the session's partitions, taken a share per read
        self._rotation: list[Key] = []
        self._rotation_pos = 0
        self._refresh_credit = 0.0  # partitions due for their refresh read
        self._refreshed_at: float | None = None
        self._template = broker_pb2.FetchRequest()
        self._template_fields: tuple[int, ...] = ()
        self._closed = False
        # The connection's own writer of an answer, when it has one (the replication listener): a
        # parked fetch woken on the event loop is answered from the wake itself, as Kafka's
        # purgatory completes a follower's fetch from the appending thread, not a loop turn later.
        self.send_now: Callable[[broker_pb2.FetchResponse], None] | None = None
        index.opened(self)

    @property
    def parked(self) -> bool:
        return self._waiter is not None

    def __len__(self) -> int:
        return len(self._fetches)

    def keys(self) -> list[Key]:
        return list(self._fetches)

    def update(self, req: broker_pb2.FetchRequest) -> None:
        """Apply the follower's next request: a full one replaces the session, an incremental one
        changes the partitions it names. Refused (InvalidRequestError) past the bound (see
        MIN_SESSION_BOUND), changing nothing."""
        listed = [(fp.topic, fp.partition) for fp in req.partitions]
        if req.incremental and not req.forgotten and all(k in self._fetches for k in listed):
            # The usual request: the follower moved on partitions the session holds (at each acks=all
            # write). Their entries change in place: the session's partitions, its bound and the index
            # stay as they are.
            with self._lock:
                for key, fp in zip(listed, req.partitions, strict=True):
                    self._fetches[key] = fp
                self._dirty.update(listed)
            self._set_template(req)
            return
        fetches = dict(self._fetches) if req.incremental else {}
        for f in req.forgotten:
            fetches.pop((f.topic, f.partition), None)
        for key, fp in zip(listed, req.partitions, strict=True):
            fetches[key] = fp
        bound = max(MIN_SESSION_BOUND, 2 * self._hosted())
        if len(fetches) > bound:
            raise errors.InvalidRequestError(
                f"a fetch session holds at most {bound} partitions here; this request makes it {len(fetches)}")
        gone = self._fetches.keys() - fetches.keys()
        added = fetches.keys() - self._fetches.keys()
        with self._lock:
            self._fetches = fetches
            for k in gone:
                self._seen.pop(k, None)
                self._dirty.discard(k)
                self._stale.discard(k)
            self._dirty.update(listed)
        self._index.remove(self, gone)
        self._index.add(self, added)
        self._set_template(req)

    def _set_template(self, req: broker_pb2.FetchRequest) -> None:
        """The request's own fields, for the reads of the session (made again only when they change)."""
        fields = (req.replica_id, req.replica_epoch, req.max_wait_ms, req.min_bytes, req.max_bytes)
        if fields != self._template_fields:
            self._template_fields = fields
            self._template = broker_pb2.FetchRequest(
                replica_id=req.replica_id, replica_epoch=req.replica_epoch, max_wait_ms=req.max_wait_ms,
                min_bytes=req.min_bytes, max_bytes=req.max_bytes)

    def close(self) -> None:
        """The stream ended: no more marks."""
        self._closed = True
        self.send_now = None
        self._index.remove(self, list(self._fetches))
        self._index.closed(self)

    def changed(self, key: Key, partition: Any) -> None:
        """``key`` changed (any thread): dirty when its data_seq moved since this session read it
        (or it is gone), else stale; a dirty mark wakes the parked fetch, once."""
        with self._lock:
            if key not in self._fetches:
                return
            if partition is None or partition.data_seq != self._seen.get(key):
                self._dirty.add(key)
                waiter, self._waiter = self._waiter, None
            else:
                self._stale.add(key)
                return
        if waiter is not None:
            waiter()

    def park(self, waiter: Callable[[], None]) -> bool:
        """Wait for a dirty partition: ``waiter`` is called once, from the thread that marks one.
        False when one is dirty already (read it now instead)."""
        with self._lock:
            if self._dirty or self._closed:
                return False
            self._waiter = waiter
            return True

    def unpark(self) -> None:
        with self._lock:
            self._waiter = None

    def request(self, partitions: Mapping[Key, Any], now_s: float) -> tuple[broker_pb2.FetchRequest, list[Key]]:
        """The fetch to read now and the keys it reads (see the module doc). ``partitions`` maps a
        key to this broker's Partition (absent when not hosted: read, to answer with the error)."""
        with self._lock:
            keys: Collection[Key] = self._dirty | self._stale if self._stale else self._dirty
            due = self._due_for_refresh(now_s)
            if due:
                keys = keys | due
            self._dirty, self._stale = set(), set()
            fetches, seen = self._fetches, self._seen
            read = []
            for key in keys:
                fp = fetches.get(key)
                if fp is None:
                    continue
                p = partitions.get(key)
                seen[key] = -1 if p is None else p.data_seq  # before the read: a racing append marks it again
                read.append(fp)
        req = broker_pb2.FetchRequest()
        req.CopyFrom(self._template)
        req.partitions.extend(read)
        return req, [(fp.topic, fp.partition) for fp in read]

    def _due_for_refresh(self, now_s: float) -> set[Key]:
        """The next partitions of the turn: the session's share of the time since the last read. Caller
        holds the lock."""
        n = len(self._fetches)
        last, self._refreshed_at = self._refreshed_at, now_s
        if last is None or n == 0:
            return set()
        self._refresh_credit = min(float(n), self._refresh_credit + n * max(0.0, now_s - last) / self.refresh_s)
        take = int(self._refresh_credit)
        if take == 0:
            return set()
        self._refresh_credit -= take
        out: set[Key] = set()
        for _ in range(len(self._rotation) + 2 * n):  # bound: at most one partial turn and one whole one
            if len(out) >= take:
                break
            if self._rotation_pos >= len(self._rotation):
                self._rotation, self._rotation_pos = list(self._fetches), 0
            key = self._rotation[self._rotation_pos]
            self._rotation_pos += 1
            if key in self._fetches:  # forgotten since the turn began: not due
                out.add(key)
        return out

    def discarded(self, keys: Iterable[Key]) -> None:
        """The answer of a read of ``keys`` was not sent: read them again with the next answer."""
        with self._lock:
            self._stale.update(k for k in keys if k in self._fetches)

    def answered(self, resp: broker_pb2.FetchResponse) -> None:
        """``resp`` goes to the follower, marked ``incremental`` (this leader keeps the session's
        partitions: the next request may name its changes only). A partition answered with an error is
        read again with the next answer (the follower backs off and forgets it)."""
        resp.incremental = True
        failed = [(pr.topic, pr.partition) for pr in resp.partitions if pr.error_code]
        if failed:
            self.discarded(failed)
