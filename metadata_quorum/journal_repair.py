"""A voter's Raft journal checked before pysyncobj opens it: damaged entries are dropped, not replayed.

pysyncobj's FileJournal frames each entry with its length but keeps no checksum, and it decodes an
entry's command only when it applies it, on its tick thread. One damaged entry (bytes changed on
disk, as after a failing disk or a stray write) made every tick fail ("failed _onTick": pickle data
was truncated) about 20 times a second for good: the node ran, its broker served, but its voter
applied nothing and answered nobody, so the quorum had one voter less than it showed, and the next
single-node fault stopped every write of the cluster (found by a probe: 38-45 s without an
acknowledged write while a second node was down).

Before the SyncObj is built, every entry is read as pysyncobj will read it: consecutive indexes, terms
that never go down, and a command whose type pysyncobj knows and whose payload decodes. The journal is
cut before the first entry that fails, as etcd cuts a damaged write-ahead-log tail: the leader sends
those entries again (or its snapshot) as to any follower that is behind. A journal whose framing itself
cannot be read is set aside (``quorum.journal.damaged-<time>``) and the voter starts from its snapshot.
Cutting a voter's log is safe as long as the entries it drops are held by a majority without it (one
damaged voter of three or five); a node whose whole metadata directory is lost is the same case.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from pysyncobj import pickle as pysyncobj_pickle
from pysyncobj.journal import FileJournal

from metadata_quorum import pysyncobj_compat  # noqa: F401  (undoes pysyncobj's socket.inet_ntop)

log = logging.getLogger(__name__)

# pysyncobj's _COMMAND_TYPE: REGULAR, NO_OP, MEMBERSHIP, VERSION; all but NO_OP carry a pickled payload.
_REGULAR, _NO_OP, _MEMBERSHIP, _VERSION = 0, 1, 2, 3


def _entry_problem(command: bytes, idx: int, term: int, prev: tuple[int, int] | None) -> str | None:
    if prev is not None and (idx != prev[0] + 1 or term < prev[1]):
        return f"index {idx} and term {term} do not follow index {prev[0]} and term {prev[1]}"
    if not command:
        return "an empty command"
    kind = command[0]
    if kind == _NO_OP:
        return None
    if kind not in (_REGULAR, _MEMBERSHIP, _VERSION):
        return f"unknown command type {kind}"
    try:
        pysyncobj_pickle.loads(command[1:])  # this voter's own journal, decoded as pysyncobj's apply decodes it
    except Exception as exc:
        return f"its command does not decode ({type(exc).__name__}: {exc})"
    return None


def repair_journal(path: Path) -> int:
    """Check ``path`` (a FileJournal) entry by entry; cut it before the first damaged entry. How many entries
    were dropped (or set aside with an unreadable journal); 0 when it is sound or absent."""
    if not path.exists():
        return 0
    try:
        journal = FileJournal(str(path))
    except Exception as exc:  # the framing itself (a length, the header) cannot be read
        aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
        path.rename(aside)
        log.warning("the quorum journal %s cannot be read (%s: %s): set aside as %s; this voter starts from its "
                    "snapshot and the leader sends it what came after", path, type(exc).__name__, exc, aside.name)
        return 1
    try:
        prev: tuple[int, int] | None = None
        for i in range(len(journal)):
            command, idx, term = journal[i]
            problem = _entry_problem(bytes(command), idx, term, prev)
            if problem is not None:
                dropped = len(journal) - i
                journal.deleteEntriesFrom(i)
                if i > 0 and journal.getRaftCommitIndex() > prev[0]:  # type: ignore[index]
                    journal.setRaftCommitIndex(prev[0])  # type: ignore[index]
                    journal.onOneSecondTimer()  # stores the journal's meta file
                journal.flush()
                log.warning("the quorum journal %s is damaged at entry %d (index %d): %s; dropped it and the %d "
                            "after it, which the leader sends again", path, i, idx, problem, dropped - 1)
                return dropped
            prev = (idx, term)
        return 0
    finally:
        journal._destroy()  # closes the file (pysyncobj's own name for it)
