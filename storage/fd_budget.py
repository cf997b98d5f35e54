"""How many file descriptors one kind of long-lived object holds in this process, against a share of
the process's limit (RLIMIT_NOFILE): segments may hold half of it (storage/segment.py), slices waiting
to be sent a quarter (storage/file_records.py). What is past a budget waits or takes another path."""

from __future__ import annotations

import resource
import threading

UNLIMITED = 1 << 30


class DescriptorBudget:
    """A count of objects each holding ``per_item`` descriptors, and the number that fit in 1/``share``
    of the descriptor limit."""

    def __init__(self, share: int, per_item: int = 1) -> None:
        self.share, self.per_item = share, per_item
        self._held = 0
        self._lock = threading.Lock()

    def held(self) -> int:
        return self._held

    def budget(self) -> int:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return UNLIMITED
        return max(1, soft // self.share // self.per_item)

    def add(self, delta: int, limit: int | None = None) -> bool:
        """Count ``delta`` objects more (or fewer); False, counting nothing, when ``limit`` is already held."""
        with self._lock:
            if limit is not None and self._held >= limit:
                return False
            self._held += delta
            return True


# ---- partition-replica capacity (what a broker reports when it registers; the controller enforces it) ----
# Every partition replica holds at least one segment (3 descriptors: log, offset and time index) for as
# long as it exists, and the segment budget (1/SEGMENT_SHARE of the limit, storage/segment.py) only stops
# rolls, never a new partition. A broker therefore takes at most as many replicas as fit in the segment
# budget with SEGMENTS_PER_PARTITION segments each: the other half of the limit stays for what
# broker/admission.py and storage/file_records.py bound separately (gRPC and Kafka connections, slices
# waiting to be sent, the controller's journal, checkpoints, sockets to peers), and each partition has
# room to roll once before retention deletes its oldest segment. limit // 12: 1,666 at 20,000, 87,381 at
# 1,048,576 (Redpanda's default, 1,000 per core, is lower still; Kafka has no bound and crashes).
SEGMENT_SHARE = 2  # = storage.segment.SEGMENT_FD_SHARE (not imported: segment.py imports this module)
FDS_PER_SEGMENT = 3
SEGMENTS_PER_PARTITION = 2
UNLIMITED_CAPACITY = 0  # what "no bound" is on the wire and in the metadata (an older broker reports 0)


def descriptor_limit() -> int | None:
    """The process's soft RLIMIT_NOFILE, None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


def partition_capacity_for(limit: int | None, configured: int = 0) -> int:
    """Partition replicas a process with descriptor ``limit`` may hold (at least 1), lowered to
    ``configured`` (``max.partitions.per.broker``) when that is set (> 0). 0 means unlimited."""
    derived = UNLIMITED_CAPACITY if limit is None else max(
        1, limit // SEGMENT_SHARE // FDS_PER_SEGMENT // SEGMENTS_PER_PARTITION)
    if configured > 0:
        return configured if derived == UNLIMITED_CAPACITY else min(configured, derived)
    return derived


def partition_capacity(configured: int = 0) -> int:
    """This process's partition-replica capacity, from its current descriptor limit."""
    return partition_capacity_for(descriptor_limit(), configured)


def minimum_descriptors_for(partitions: int) -> int:
    """The descriptor limit whose capacity holds ``partitions`` replicas (what to set ``ulimit -n`` to)."""
    return partitions * SEGMENT_SHARE * FDS_PER_SEGMENT * SEGMENTS_PER_PARTITION


def raise_soft_limit_to_hard() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard one (as the JVM does for Kafka, -XX:+MaxFDLimit): the soft
    limit is often 1,024 while the hard one allows far more. An unlimited hard limit raises the soft one
    to fs.nr_open (what the kernel accepts). Returns (before, after) soft limits; never fails."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:
        try:
            with open("/proc/sys/fs/nr_open", encoding="ascii") as f:
                target = int(f.read().strip())
        except (OSError, ValueError):
            return soft, soft
    if soft != resource.RLIM_INFINITY and soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        return soft, soft
    return soft, target


# ---- startup: the logs found must fit the descriptor limit ----
# At startup a broker opens every segment of every partition it finds (3 descriptors each). When they do not
# fit (the limit was lowered, or an older release placed too many partitions here), opening them used to run
# out of descriptors part-way: some logs were left unloaded, then a checkpoint or directory fsync failed with
# EMFILE and the broker exited, at every start. Now it refuses to start before opening or changing anything,
# naming the figures, when the segments would take more than 3/4 of the limit (a quarter stays for the
# controller's journal, checkpoints, peers and listeners, whose connection caps are shares of the limit).
STARTUP_RESERVE_SHARE = 4


class DescriptorLimitError(Exception):
    """The logs in this broker's directories need more file descriptors than its limit allows."""

    def __init__(self, message: str, *, limit: int, needed: int) -> None:
        super().__init__(message)
        self.message, self.limit, self.needed = message, limit, needed


def startup_descriptors_needed(segments: int) -> int:
    """The descriptor limit at which ``segments`` open segments fit in the startup share."""
    need = segments * FDS_PER_SEGMENT
    return need + -(-need // (STARTUP_RESERVE_SHARE - 1))  # need / (3/4), rounded up


def check_startup_descriptors(partitions: int, segments: int, limit: int | None) -> None:
    """Raise DescriptorLimitError if ``segments`` (of ``partitions`` logs) do not fit in ``limit``."""
    if limit is None:
        return
    usable = limit - limit // STARTUP_RESERVE_SHARE
    if segments * FDS_PER_SEGMENT <= usable:
        return
    needed = startup_descriptors_needed(segments)
    recommended = max(needed, minimum_descriptors_for(partitions))
    raise DescriptorLimitError(
        f"the log directories hold {partitions} partitions with {segments} segments, which need "
        f"{segments * FDS_PER_SEGMENT} file descriptors (3 a segment) out of a limit of {limit} (ulimit -n / "
        f"LimitNOFILE; at most 3/4 of it for segments): start the broker with a limit of at least {needed} "
        f"({recommended} to take new partitions: 12 per partition). Nothing was opened or changed; the "
        f"partitions stay offline on this broker until then", limit=limit, needed=needed)
