"""Three real controller processes under real faults: SIGKILL, SIGSTOP, full restart.

The module shares one quorum; each test leaves it with all three voters running.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from quorum_helpers import create_topic, register_brokers
from waiting import wait_for

from client.admin import Admin, NewTopic
from deploy.local.processes import thread_states
from metadata_quorum.client import ControllerClient
from metadata_quorum.local_quorum import LocalQuorum
from proto import controller_pb2 as pb
from proto import errors
from proto.errors import ErrorCode

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalQuorum]:
    # Fake brokers heartbeat only now and then: a long session keeps them unfenced.
    q = LocalQuorum(tmp_path_factory.mktemp("procs"), extra_args=["--session-timeout-ms", "120000"])
    try:
        q.start()
        yield q
    finally:
        q.stop()


@pytest.fixture(scope="module")
def client(quorum: LocalQuorum) -> Iterator[ControllerClient]:
    with quorum.client(timeout_s=20) as c:
        register_brokers(c, [1, 2, 3], quorum.cluster_id)
        yield c


def topics_of(client: ControllerClient) -> dict[str, tuple[str, int, dict[int, tuple[int, ...]]]]:
    """name -> (topic id, partition count, partition -> replicas)."""
    cluster = client.call("DescribeCluster", pb.DescribeClusterRequest())
    out: dict[str, tuple[str, int, dict[int, tuple[int, ...]]]] = {
        t.name: (t.topic_id, t.partition_count, {}) for t in cluster.topics}
    for p in cluster.partitions:
        out[p.topic][2][p.partition] = tuple(p.replicas)
    return out


def wait_all_caught_up(client: ControllerClient, timeout_s: float = 30) -> pb.DescribeQuorumResponse:
    def caught_up() -> pb.DescribeQuorumResponse | None:
        try:
            q = client.call("DescribeQuorum", pb.DescribeQuorumRequest(), timeout_s=3)
        except errors.BrookError:
            return None
        return q if len(q.voters) == 3 and all(v.connected and v.lag == 0 for v in q.voters) else None

    return wait_for(caught_up, timeout_s, "all three voters connected and caught up")


def test_kill_9_of_the_active_controller_elects_a_new_one_that_keeps_serving(
        quorum: LocalQuorum, client: ControllerClient) -> None:
    for i in range(5):
        assert create_topic(client, f"before-{i}", 4, 3).error_code == ErrorCode.NONE
    before = topics_of(client)
    old = quorum.active_id()
    killed_at = time.monotonic()
    quorum.kill(old, signal.SIGKILL)
    new = quorum.active_id(timeout_s=30, exclude={old})
    elected_s = time.monotonic() - killed_at
    result = create_topic(client, "after-failover", 2, 2)  # a write through the new controller
    write_s = time.monotonic() - killed_at
    assert result.error_code == ErrorCode.NONE, result
    print(f"\ncontroller failover: controller {old} killed -> controller {new} active in {elected_s:.2f}s, "
          f"first write committed after {write_s:.2f}s")
    after = topics_of(client)
    for name, value in before.items():
        assert after.get(name) == value, f"committed topic {name} changed or vanished: {after.get(name)}"
    quorum.start_node(old)
    wait_all_caught_up(client)


def test_writes_time_out_with_two_of_three_frozen_and_nothing_half_applied_appears(
        quorum: LocalQuorum, client: ControllerClient) -> None:
    assert create_topic(client, "doomed", 5, 3).error_code == ErrorCode.NONE
    leader = quorum.active_id()
    followers = [n for n in quorum.voters if n != leader]
    for n in followers:
        quorum.pause(n)
    try:
        request = pb.CreateTopicsRequest(timeout_ms=1500, topics=[
            pb.CreatableTopic(name=f"frozen-{i}", num_partitions=50, replication_factor=3) for i in range(3)])
        sent_at = time.monotonic()
        response = client.call_endpoint(quorum.endpoint(leader), "CreateTopics", request, timeout_s=10)
        if any(r.error_code != ErrorCode.REQUEST_TIMED_OUT for r in response.results):
            # Seen once in CI when pause() only sent SIGSTOP: kill() returns while the target's other
            # threads still run, and a follower's tick thread acknowledged the first entry before it
            # stopped (pause() now waits until every thread has stopped). Should it recur, say what the
            # processes and the leader's Raft view were when the answer came.
            states = {n: thread_states(quorum.procs[n].pid) for n in followers}
            view = client.call_endpoint(quorum.endpoint(leader), "DescribeQuorum",
                                        pb.DescribeQuorumRequest(any_voter=True), timeout_s=5)
            raise AssertionError(f"CreateTopics answered after {time.monotonic() - sent_at:.2f} s with "
                                 f"{[(r.name, r.error_code, r.error_message) for r in response.results]}; "
                                 f"leader {leader}, followers' process states {states}; leader's view: {view}")
        for r in response.results:
            assert "did not commit" in r.error_message, r
        # Through the client: either the per-topic result times out, or (once the lone leader
        # has stepped down for lack of a majority) the client finds no active controller.
        try:
            deleted = client.call("DeleteTopics", pb.DeleteTopicsRequest(names=["doomed"], timeout_ms=1000),
                                  timeout_s=3)
            assert deleted.results[0].error_code == ErrorCode.REQUEST_TIMED_OUT, deleted
        except errors.RequestTimedOutError as exc:
            assert "within" in str(exc), exc
    finally:
        for n in followers:
            quorum.resume(n)
    wait_all_caught_up(client)
    after = topics_of(client)
    for i in range(3):
        name = f"frozen-{i}"
        if name in after:  # committed after the quorum came back: must be whole
            _, count, parts = after[name]
            assert count == 50 and sorted(parts) == list(range(50)), (name, count, sorted(parts))
            assert all(len(r) == 3 for r in parts.values()), parts
    if "doomed" in after:
        assert after["doomed"][1] == 5 and sorted(after["doomed"][2]) == list(range(5)), after["doomed"]
    # The quorum serves writes again.
    assert create_topic(client, "after-thaw", 1, 3).error_code == ErrorCode.NONE


def wait_until(t: float) -> None:
    """Let a fault (or an idle period) last until monotonic time ``t``."""
    wait_for(lambda: time.monotonic() >= t, max(0.0, t - time.monotonic()) + 5, "the period to pass")


# (freeze seconds, wait for another controller to take over before resuming). 7 s as in the reported
# outage; the short ones resume the frozen leader while the election is still running, the timing of
# the flaky CI failure (test_producer_faults.py freezes a combined node that was also the active
# controller for ~1.5 s). Before the fix the first short round left the cluster with no active
# controller: the resumed node's activation for the new term was committed first.
FREEZES = ((7.0, True), (1.0, False), (1.2, False), (1.4, False), (1.6, False), (1.8, False), (2.0, False),
           (2.2, False))


def _answer_of_the_active(client: ControllerClient, within_s: float) -> pb.DescribeQuorumResponse:
    seen: list[pb.DescribeQuorumResponse] = []

    def active_answer() -> pb.DescribeQuorumResponse | None:
        seen.append(client.describe_quorum(timeout_s=10))
        return seen[-1] if seen[-1].responder_is_active else None
    return wait_for(active_answer, within_s, lambda: f"a controller to answer as the active one: {seen[-1:]}")


def test_sigstop_of_the_active_controller_and_resume_leaves_one_active_controller(
        quorum: LocalQuorum, client: ControllerClient) -> None:
    """Each round freezes the active controller, resumes it (after a takeover, or in the middle of the
    election) and immediately writes through the admin client (which retries NOT_CONTROLLER and
    leadership-change answers); then exactly one controller must be active and the journal idle."""
    register_brokers(client, [1, 2, 3], quorum.cluster_id)  # same incarnations: idempotent, re-unfenced
    admin = Admin("127.0.0.1:1", controller_endpoints=quorum.endpoints, request_timeout_ms=60_000)
    try:
        for round_, (freeze_s, takeover) in enumerate(FREEZES):
            old = quorum.active_id()
            quorum.pause(old)
            frozen_at = time.monotonic()
            try:
                if takeover:
                    quorum.active_id(timeout_s=30, exclude={old})
                wait_until(frozen_at + freeze_s)
            finally:
                quorum.resume(old)
            resumed_at = time.monotonic()
            result = admin.create_topics([NewTopic(f"after-resume-{round_}", 1, 1)], wait_for_leaders=False)
            write_s = time.monotonic() - resumed_at
            assert result == {f"after-resume-{round_}": None}, result
            active = quorum.active_id(timeout_s=20)
            active_s = time.monotonic() - resumed_at
            # The voter found active may be between two of its own terms by the next call (a heavily loaded
            # machine: its tick thread late, an election it wins again); one controller is active within a bound.
            # The voter just found active may be between two of its terms by the next call (seen once on a
            # loaded machine: an election it won again); one controller answers as active within a bound.
            q = _answer_of_the_active(client, within_s=20)
            assert q.active_controller_id == q.responder_id, q
            print(f"\nround {round_}: controller {old} frozen {resumed_at - frozen_at:.1f}s; "
                  f"after resume controller {active} active within {active_s:.2f}s, admin write took {write_s:.2f}s")
            # No activation loop: idle, the journal barely moves (it grew by one entry per tick before).
            start = client.describe_quorum(timeout_s=10).commit_index
            wait_until(time.monotonic() + 1)
            grown = client.describe_quorum(timeout_s=10).commit_index - start
            print(f"round {round_}: the journal grew by {grown} entries in 1 idle second")
            assert grown < 5, f"the journal grew by {grown} entries in 1 idle second (a tick is 0.1 s)"
    finally:
        admin.close()
    wait_all_caught_up(client)


def test_full_restart_of_all_three_keeps_every_topic(quorum: LocalQuorum, client: ControllerClient) -> None:
    for i in range(3):
        assert create_topic(client, f"durable-{i}", 3, 3).error_code == ErrorCode.NONE
    before = topics_of(client)
    version = client.call("DescribeCluster", pb.DescribeClusterRequest()).metadata_version
    for n in quorum.voters:
        quorum.kill(n, signal.SIGKILL)
    started = time.monotonic()
    quorum.start()
    quorum.active_id(timeout_s=30)
    after = topics_of(client)
    restart_s = time.monotonic() - started
    print(f"\nfull restart of 3 controllers (SIGKILL all): serving {len(after)} topics again after {restart_s:.2f}s")
    assert after == before, (sorted(before), sorted(after))
    # Each voter's journal, checked entry by entry at the start (metadata_quorum/journal_repair.py), was sound.
    assert not [n for n in quorum.voters if "is damaged at entry" in quorum.log_path(n).read_text()]
    assert client.call("DescribeCluster", pb.DescribeClusterRequest()).metadata_version >= version
    assert create_topic(client, "after-restart", 1, 3).error_code == ErrorCode.NONE


def _damage_a_middle_entry(journal: Path) -> int:
    """Overwrite part of the command of an entry in the middle of a FileJournal (its framing intact, as a
    changed disk block leaves it); that entry's index."""
    from pysyncobj.journal import FileJournal

    j = FileJournal(str(journal))
    try:
        entries = [j[i] for i in range(len(j))]
    finally:
        j._destroy()
    regular = [i for i, (command, _idx, _term) in enumerate(entries) if command[:1] == b"\x00" and len(command) > 40]
    assert len(regular) >= 3, f"too few entries to damage one in the middle: {len(entries)}"
    target = regular[len(regular) // 2]
    command, idx, _term = entries[target]
    data = bytearray(journal.read_bytes())
    at = data.find(bytes(command))
    assert at > 0, "the entry's bytes are not in the file"
    data[at + 10:at + 30] = b"\xff" * 20
    journal.write_bytes(bytes(data))
    return idx


def test_a_voter_whose_journal_was_damaged_catches_up_and_counts_in_the_quorum(
        quorum: LocalQuorum, client: ControllerClient) -> None:
    """One changed block in a follower's journal (pysyncobj keeps no checksum) made its tick thread fail on
    that entry about 20 times a second, for good, while the node ran: the quorum had one voter less than it
    showed, and with one more voter down the cluster took no writes (a probe measured 38-45 s). The journal
    is now cut before the damaged entry when the voter starts; the leader sends the rest again."""
    for i in range(4):
        assert create_topic(client, f"journaled-{i}", 1, 3).error_code == ErrorCode.NONE
    active = quorum.active_id(timeout_s=30)
    damaged, other = [n for n in quorum.voters if n != active][:2]
    quorum.kill(damaged, signal.SIGKILL)
    idx = _damage_a_middle_entry(quorum.data_dir(damaged) / "quorum.journal")
    quorum.start_node(damaged)
    wait_all_caught_up(client)
    assert "is damaged at entry" in quorum.log_path(damaged).read_text() and f"(index {idx})" in \
        quorum.log_path(damaged).read_text(), quorum.log_tail(damaged)
    quorum.kill(other, signal.SIGKILL)  # the quorum is now the active controller and the repaired voter
    try:
        assert create_topic(client, "after-repair", 1, 1).error_code == ErrorCode.NONE
    finally:
        quorum.start_node(other)
        wait_all_caught_up(client)
