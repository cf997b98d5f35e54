"""brooksim: a deterministic simulator of Brook's metadata quorum, controller and replication.

One seeded ``random.Random`` picks every event; the clock is simulated; there are no
threads or sockets. The real ``MetadataState``, ``QuorumController`` and ``Partition``
(with the real leader-epoch cache and the real follower fetch handling) run against an
abstract Raft log (``quorum.py``) and an in-memory partition log (``memlog.py``).
"""
