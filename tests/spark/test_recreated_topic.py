"""A topic deleted, or deleted and recreated under its name, while a query reads it: data loss, at once.

Found by review: offsets carried no topic id, so a recreated topic's new log was read at the deleted
topic's offsets (or, when it was shorter, the task waited out kafkaConsumer.pollTimeoutMs), and a task
learnt of a deleted topic only after ClusterClient.fetch had retried UNKNOWN_TOPIC_OR_PARTITION for
request.timeout.ms. As Spark's Kafka source, both are data loss: failOnDataLoss=true fails the query,
naming the topic; failOnDataLoss=false skips what is gone, and the stream reads the recreated topic
from its earliest offset. The checkpoint keeps the Kafka source's offsets shape (no ids), so old
checkpoints load and new ones stay readable.
"""

from __future__ import annotations

import json
import time

import pytest
from waiting import wait_for as wait_until

from client.types import ClusterMetadata, FetchResult, PartitionMetadata, TopicMetadata
from spark_source import fetcher, planning
from spark_source.fetcher import DataLossError, RangeTask, read_range
from spark_source.options import FetchSettings, parse_read_options
from spark_source.planning import OffsetRange, from_json_offsets, plan_ranges, to_json_offsets
from spark_source.source import BrookBatchReader, BrookStreamReader

# ----------------------------------------------------------------------------- planning (pure)


def test_planned_ranges_carry_topic_ids_and_the_checkpoint_shape_is_unchanged() -> None:
    start, end = {("a", 0): 0, ("b", 0): 5}, {("a", 0): 10, ("b", 0): 9}
    ranges = plan_ranges(start, end, min_partitions=4, topic_ids={"a": "id-a", "b": "id-b"})
    assert len(ranges) == 4 and {r.topic_id for r in ranges if r.topic == "a"} == {"id-a"}
    assert {r.topic_id for r in ranges if r.topic == "b"} == {"id-b"}
    assert plan_ranges(start, end) == [OffsetRange("a", 0, 0, 10), OffsetRange("b", 0, 5, 9)]  # ids unknown: ""
    # Checkpointed offsets stay in the Kafka source's shape: what older versions wrote loads, and they read ours.
    assert to_json_offsets(end) == {"a": {"0": 10}, "b": {"0": 9}}
    assert from_json_offsets(json.loads('{"a": {"0": 10}, "b": {"0": 9}}')) == end


def test_recreated_topics_are_those_with_a_new_id() -> None:
    known = {"a": "1", "b": "2", "c": "3"}
    now = {"a": "1", "b": "9", "d": "4"}  # b recreated, c deleted, d new
    assert planning.recreated_topics(known, now, {"a", "b", "c", "d"}) == {"b": ("2", "9")}
    assert planning.recreated_topics({}, now, {"a", "b"}) == {}  # a restarted query: no ids in the checkpoint


# ----------------------------------------------------------------------------- the driver (a fake cluster)


class _FakeOffsets:
    """OffsetReader's answers for one topic "t" whose id, partitions and offsets a test changes."""

    def __init__(self, topic_id: str, earliest: dict[int, int], latest: dict[int, int]) -> None:
        self.topic_ids = {"t": topic_id}
        self.earliest_offsets, self.latest_offsets = earliest, latest
        self.metadata_version = 1

    def recreate(self, topic_id: str, earliest: dict[int, int], latest: dict[int, int]) -> None:
        self.topic_ids = {"t": topic_id}
        self.earliest_offsets, self.latest_offsets = earliest, latest
        self.metadata_version += 10

    def partitions(self, *, strict: bool = False) -> set[tuple[str, int]]:
        return {("t", p) for p in self.latest_offsets}

    def earliest(self, tps) -> dict:  # type: ignore[no-untyped-def]
        return {tp: self.earliest_offsets[tp[1]] for tp in tps}

    def latest(self, tps) -> dict:  # type: ignore[no-untyped-def]
        return {tp: self.latest_offsets[tp[1]] for tp in tps}

    def resolve(self, spec, tps, *, what: str) -> dict:  # type: ignore[no-untyped-def]
        return self.earliest(tps)

    def close(self) -> None:
        pass


def _stream_reader(fake: _FakeOffsets, *, fail: bool) -> BrookStreamReader:
    options = parse_read_options({"bootstrap.servers": "127.0.0.1:1", "subscribe": "t", "startingOffsets": "earliest",
                                  "failOnDataLoss": str(fail).lower()}, streaming=True)
    reader = BrookStreamReader(options)
    reader._reader = fake  # type: ignore[assignment]
    return reader


def _ranges(reader: BrookStreamReader, start: dict, end: dict) -> list[tuple[int, int, int, str]]:
    return [(p.task.partition, p.task.from_offset, p.task.until_offset, p.task.topic_id)  # type: ignore[attr-defined]
            for p in reader.partitions(start, end)]


def test_driver_fails_the_query_naming_a_recreated_topic() -> None:
    fake = _FakeOffsets("old", {0: 0, 1: 0}, {0: 15, 1: 15})
    reader = _stream_reader(fake, fail=True)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 15, "1": 15}}
    assert _ranges(reader, start, end) == [(0, 0, 15, "old"), (1, 0, 15, "old")]
    # Recreated with more records than the query has read: the old code went on at offsets 15.. of the new log.
    fake.recreate("new", {0: 0, 1: 0}, {0: 25, 1: 25})
    with pytest.raises(DataLossError) as info:
        reader.latestOffset(end, reader.getDefaultReadLimit())
    message = str(info.value)
    assert "topic 't' was deleted and recreated" in message and "old" in message and "new" in message, message
    assert "failOnDataLoss=false" in message, message


def test_driver_reads_a_recreated_topic_from_its_start_without_fail_on_data_loss() -> None:
    fake = _FakeOffsets("old", {0: 0, 1: 0}, {0: 15, 1: 15})
    reader = _stream_reader(fake, fail=False)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    reader.commit(end)
    for new_end in ({0: 25, 1: 25}, {0: 5, 1: 5}):  # more, then fewer records than were read
        fake.recreate(f"new-{new_end[0]}", {0: 0, 1: 0}, new_end)
        after = reader.latestOffset(end, reader.getDefaultReadLimit())
        assert after == {"t": {"0": new_end[0], "1": new_end[1]}}
        topic_id = fake.topic_ids["t"]
        assert _ranges(reader, end, after) == [(0, 0, new_end[0], topic_id), (1, 0, new_end[1], topic_id)]
        # The batch is planned and run: the next one goes on from its end, nothing read twice.
        reader.commit(after)
        fake.latest_offsets = {0: new_end[0] + 3, 1: new_end[1]}
        following = reader.latestOffset(after, reader.getDefaultReadLimit())
        assert _ranges(reader, after, following) == [(0, new_end[0], new_end[0] + 3, topic_id)]
        reader.commit(following)
        end = following


def test_driver_restarted_from_an_old_checkpoint_learns_ids() -> None:
    """A checkpoint has no topic ids (old ones never had): it loads, and the topic's id is learnt from then on."""
    fake = _FakeOffsets("first", {0: 0}, {0: 40})
    reader = _stream_reader(fake, fail=True)
    checkpoint = {"t": {"0": 30}}  # written before this version, or by it: the same shape
    end = reader.latestOffset(checkpoint, reader.getDefaultReadLimit())
    assert end == {"t": {"0": 40}} and _ranges(reader, checkpoint, end) == [(0, 30, 40, "first")]
    fake.recreate("second", {0: 0}, {0: 50})
    with pytest.raises(DataLossError, match="topic 't' was deleted and recreated"):
        reader.latestOffset(end, reader.getDefaultReadLimit())


def test_an_added_partition_that_lost_records_before_the_query_read_them_is_data_loss(
        caplog: pytest.LogCaptureFixture) -> None:
    """As Spark's Kafka source ("Added partition ... starts from ... instead of 0"): a partition added while the
    query runs whose records before some offset were removed before the query saw it. It was read from there
    without a word, failOnDataLoss=true or not (Spark source audit)."""
    for fail in (True, False):
        fake = _FakeOffsets("id", {0: 0}, {0: 10})
        reader = _stream_reader(fake, fail=fail)
        start = reader.initialOffset()
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        reader.commit(end)
        fake.earliest_offsets, fake.latest_offsets = {0: 0, 1: 60, 2: 0}, {0: 10, 1: 100, 2: 5}
        if fail:
            with pytest.raises(DataLossError, match="added partition t-1 starts at offset 60, not 0"):
                reader.latestOffset(end, reader.getDefaultReadLimit())
            continue
        caplog.clear()
        after = reader.latestOffset(end, reader.getDefaultReadLimit())
        assert _ranges(reader, end, after) == [(1, 60, 100, "id"), (2, 0, 5, "id")]
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert any("added partition t-1 starts at offset 60" in m for m in warned), warned
        assert not any("t-2" in m for m in warned), warned  # one that starts at 0 lost nothing


# ----------------------------------------------------------------------------- a task (a fake cluster)


class _Client:
    """A ClusterClient answering metadata for topic "t" (id and partitions set by the test), fetches (from
    ``answers``, then nothing) and the leader's own view of the topic (from ``views``, then the metadata's)."""

    def __init__(self, topic_id: str | None, version: int = 10, answers: list[FetchResult] | None = None,
                 views: list[tuple[int, int, str]] | None = None) -> None:
        self.topic_id, self.version = topic_id, version
        self.answers = list(answers or [])
        self.views = list(views or [])
        self.fetches = self.views_asked = 0
        self.snapshot = ClusterMetadata("", -1, -1, {}, {}, [])

    def metadata(self, topics=None, *, refresh: bool = False, timeout_ms=None) -> ClusterMetadata:  # type: ignore[no-untyped-def]
        shown = {} if self.topic_id is None else {
            "t": TopicMetadata("t", self.topic_id, False, {0: PartitionMetadata("t", 0, 1, 0, (1,), (1,))})}
        self.snapshot = ClusterMetadata("c", 1, self.version, {}, shown, [])
        return self.snapshot

    def metadata_snapshot(self) -> ClusterMetadata:
        return self.snapshot

    def request_update(self) -> None:
        pass


def _fetching(monkeypatch: pytest.MonkeyPatch, client: _Client) -> None:
    def fetch_once(c: _Client, tp, offset: int, settings: FetchSettings) -> tuple[FetchResult, int]:  # type: ignore[no-untyped-def]
        c.fetches += 1
        return (c.answers.pop(0) if c.answers else FetchResult(b"", 0, 0)), 1

    def leader_view(c: _Client, leader: int, topic: str, settings: FetchSettings) -> tuple[int, int, str]:
        c.views_asked += 1
        return c.views.pop(0) if c.views else (c.version, 0, c.topic_id or "")

    monkeypatch.setattr(fetcher, "_client", lambda settings: client)
    monkeypatch.setattr(fetcher, "_fetch_once", fetch_once)
    monkeypatch.setattr(fetcher, "_leader_view", leader_view)


def _task(*, fail: bool, topic_id: str = "planned", version: int = 5) -> RangeTask:
    settings = FetchSettings("127.0.0.1:1", poll_timeout_ms=500, fail_on_data_loss=fail)
    return RangeTask("t", 0, 3, 10, settings, topic_id=topic_id, metadata_version=version)


def _records(base: int, n: int) -> FetchResult:
    from storage.record_batch import CODEC_NONE, RecordBatchBuilder

    b = RecordBatchBuilder(CODEC_NONE, base_offset=base)
    for i in range(n):
        b.append(1_700_000_000_000 + i, None, f"v{base + i}".encode())
    return FetchResult(b.build(), 100, 0)


def _offsets(batches) -> list[int]:  # type: ignore[no-untyped-def]
    return [o for b in batches for o in b.column("offset").to_pylist()]


def test_task_of_a_topic_recreated_after_planning_is_data_loss_before_any_fetch(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _Client("recreated")
    _fetching(monkeypatch, client)
    with pytest.raises(DataLossError) as info:
        list(read_range(_task(fail=True)))
    message = str(info.value)
    assert "t-0: topic 't' was deleted and recreated after this range was planned" in message, message
    assert "planned then, recreated now" in message and "offsets 3..9" in message, message
    assert list(read_range(_task(fail=False))) == []
    assert client.fetches == 0


def test_task_yields_only_what_the_leader_served_from_the_planned_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader's own metadata, asked after each fetch with records, still has the planned id: rows go out."""
    client = _Client("planned", answers=[_records(3, 4), _records(7, 3)])
    _fetching(monkeypatch, client)
    assert _offsets(read_range(_task(fail=True))) == list(range(3, 10))
    assert client.views_asked == 2
    # Recreated between the task's start and its second fetch, on the same leader, with records at offset 7.
    for fail in (True, False):
        client = _Client("planned", answers=[_records(3, 4), _records(7, 3)],
                         views=[(10, 0, "planned"), (12, 0, "recreated")])
        _fetching(monkeypatch, client)
        rows: list[int] = []
        if fail:
            with pytest.raises(DataLossError, match=r"t-0: topic 't' was deleted and recreated .* offsets 7\.\.9"):
                for batch in read_range(_task(fail=True)):
                    rows.extend(batch.column("offset").to_pylist())
        else:
            rows = _offsets(read_range(_task(fail=False)))
        assert rows == [3, 4, 5, 6], rows
    # Deleted meanwhile: the leader no longer knows the topic.
    client = _Client("planned", answers=[_records(3, 4)], views=[(12, 3, "")])
    _fetching(monkeypatch, client)
    with pytest.raises(DataLossError, match=r"t-0: the topic no longer exists, so offsets 3\.\.9"):
        list(read_range(_task(fail=True)))


def test_task_looks_the_leader_up_again_after_a_fetch_timed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A leader that does not answer (stopped, cut off) has likely been replaced: the next fetch asks for fresh
    metadata, as the client's consumer does. It was asked again at its request.timeout.ms a try (audit)."""
    from client import errors

    class Counting(_Client):
        updates = 0

        def request_update(self) -> None:
            self.updates += 1

    timed_out = FetchResult(b"", -1, -1, errors.RequestTimedOutError("Fetch t-0: deadline exceeded"))
    client = Counting("planned", answers=[timed_out, _records(3, 7)])
    _fetching(monkeypatch, client)
    assert _offsets(read_range(_task(fail=True))) == list(range(3, 10))
    assert client.updates == 1 and client.fetches == 2


def test_task_judges_metadata_older_than_the_plan_as_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker behind the driver's metadata (version 3 < 5 planned) proves nothing: no data loss, the fetch
    goes on (here to a leader with nothing, until kafkaConsumer.pollTimeoutMs)."""
    from proto import errors

    for topic_id in (None, "other"):
        client = _Client(topic_id, version=3)
        _fetching(monkeypatch, client)
        with pytest.raises(errors.RequestTimedOutError):
            list(read_range(_task(fail=True)))
        assert client.fetches > 1
    # A leader behind the plan: what it served is fetched again once it caught up, and yielded once.
    client = _Client("planned", answers=[_records(3, 7), _records(3, 7)], views=[(3, 0, "other"), (10, 0, "planned")])
    _fetching(monkeypatch, client)
    assert _offsets(read_range(_task(fail=True))) == list(range(3, 10))
    assert (client.fetches, client.views_asked) == (2, 2)


# ----------------------------------------------------------------------------- a real cluster

REQUEST_TIMEOUT_MS = 60_000  # long: the data loss must be seen well before it, through metadata
PROMPT_S = 20  # "well within": a third of the request timeout, for noisy 2-core machines


def _delete(brook, topic: str) -> None:  # type: ignore[no-untyped-def]
    from client.admin import Admin

    with Admin(brook.bootstrap) as admin:
        admin.delete_topics([topic])
        admin.wait_for_brokers(timeout_ms=30_000)
        wait_until(lambda: topic not in admin.describe_topics(None), 30, f"{topic} gone from the metadata")


def _topic(brook, topic: str):  # type: ignore[no-untyped-def]
    from client.cluster import ClusterClient

    with ClusterClient(brook.bootstrap) as client:
        return client.metadata([topic], refresh=True).topics[topic]


def _create_led_by(brook, topic: str, leader: int) -> None:  # type: ignore[no-untyped-def]
    """A 1-partition topic whose first (preferred) replica, so its leader, is ``leader``."""
    from proto import controller_pb2

    others = [n for n in brook.cluster.broker_ids if n != leader][:2]  # type: ignore[attr-defined]
    resp = brook.controller.call("CreateTopics", controller_pb2.CreateTopicsRequest(
        topics=[controller_pb2.CreatableTopic(name=topic, num_partitions=-1, replication_factor=-1,
                                              assignments=[controller_pb2.ReplicaList(replicas=[leader, *others])])],
        timeout_ms=30_000))
    assert [r.error_code for r in resp.results] == [0], resp
    brook.wait_partitions(topic, 1)
    wait_until(lambda: _topic(brook, topic).partitions[0].leader == leader, 30, f"{topic}-0 led by {leader}")


@pytest.mark.slow
@pytest.mark.parametrize("recreate", [False, True], ids=["deleted", "recreated"])
def test_task_notices_a_deleted_or_recreated_topic_within_a_metadata_refresh(brook, recreate: bool) -> None:  # type: ignore[no-untyped-def]
    """Ranges planned by the batch reader; each task has read its first batch when the topic goes (and comes
    back with 20 records, so offsets 5..9 exist again in a log that is not the planned one)."""
    topic = f"task-{'recreated' if recreate else 'deleted'}"
    brook.create_topic(topic, 1, rf=3)
    brook.produce(topic, [b"a" * 600 + b"%d" % i for i in range(5)], partition=0)
    brook.produce(topic, [b"b" * 600 + b"%d" % i for i in range(5)], partition=0)  # a second batch: offsets 5..9
    assert brook.high_watermarks(topic) == {0: 10}
    before = _topic(brook, topic)
    old_id = before.topic_id

    def task(fail: bool):  # type: ignore[no-untyped-def]
        # 1 KiB fetches: one ~3 KB batch per fetch. A long request timeout, as a real job may well have.
        options = parse_read_options({"bootstrap.servers": brook.bootstrap, "assign": json.dumps({topic: [0]}),
                                      "kafka.max.partition.fetch.bytes": "1024", "failOnDataLoss": str(fail).lower(),
                                      "kafka.request.timeout.ms": str(REQUEST_TIMEOUT_MS)}, streaming=False)
        reader = BrookBatchReader(options)
        [partition] = reader.partitions()
        return reader.read(partition)

    failing, skipping = task(True), task(False)
    assert next(failing).column("offset").to_pylist() == list(range(5))
    assert next(skipping).column("offset").to_pylist() == list(range(5))
    _delete(brook, topic)
    if recreate:
        # Led by the same broker: the tasks' next fetches (by name) reach the new log without an error.
        _create_led_by(brook, topic, before.partitions[0].leader)
        assert _topic(brook, topic).topic_id != old_id
        brook.produce(topic, [b"new%d" % i for i in range(20)], partition=0)
    started = time.monotonic()
    assert [b.num_rows for b in skipping] == []  # nothing of the new topic read at the old one's offsets
    with pytest.raises(DataLossError) as info:
        list(failing)
    took = time.monotonic() - started
    message = str(info.value)
    if recreate:
        assert f"{topic}-0: topic '{topic}' was deleted and recreated after this range was planned" in message
        assert old_id in message and "offsets 5..9" in message, message
    else:
        assert f"{topic}-0: the topic no longer exists, so offsets 5..9 cannot be read" in message, message
    assert took < PROMPT_S, f"data loss seen after {took:.1f} s (request.timeout.ms {REQUEST_TIMEOUT_MS})"


def _stream(spark, brook, topic: str, **options: str):  # type: ignore[no-untyped-def]
    reader = (spark.readStream.format("brook").option("bootstrap.servers", brook.bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load().select("partition", "offset", "value")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("fail", [True, False], ids=["failOnDataLoss", "skip"])
def test_stream_over_a_topic_recreated_while_the_query_runs(spark, brook, tmp_path, fail: bool) -> None:  # type: ignore[no-untyped-def]
    """The driver sees the new topic id when it plans the next batch (the recreation happens inside the
    first batch's foreachBatch, so no trigger sees the topic missing in between)."""
    topic = f"stream-recreated-{'fail' if fail else 'skip'}"
    brook.create_topic(topic, 2, rf=3)
    old = {**brook.produce(topic, [b"old%d" % i for i in range(15)], partition=0),
           **brook.produce(topic, [b"old%d" % i for i in range(15, 30)], partition=1)}
    rows: list[tuple[int, int, bytes]] = []
    new: dict[tuple[int, int], bytes] = {}

    def handle(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows.extend((r["partition"], r["offset"], bytes(r["value"])) for r in df.collect())
        if not new and len(rows) >= len(old):
            _delete(brook, topic)
            brook.create_topic(topic, 2, rf=3)
            # More records than were read: the old code went on reading the new log at offsets 15..24.
            for p in (0, 1):
                new.update(brook.produce(topic, [b"new%d-%d" % (p, i) for i in range(25)], partition=p))

    query = (_stream(spark, brook, topic, failOnDataLoss=str(fail).lower()).writeStream.foreachBatch(handle)
             .option("checkpointLocation", str(tmp_path / "cp")).trigger(processingTime="200 milliseconds").start())
    try:
        if fail:
            wait_until(lambda: not query.isActive, 45, lambda: f"the query to fail; rows {len(rows)}, new {len(new)}")
            message = str(query.exception())
            assert f"topic '{topic}' was deleted and recreated" in message, message[:3000]
            assert {(p, o): v for p, o, v in rows} == old
        else:
            wait_until(lambda: bool(new) and len(rows) >= len(old) + len(new) or not query.isActive, 45,
                       lambda: f"{len(old) + len(new)} rows; have {len(rows)}")
            assert query.exception() is None, query.exception()
            expected = {(p, o, v) for (p, o), v in old.items()} | {(p, o, v) for (p, o), v in new.items()}
            assert len(rows) == len(set(rows)) and set(rows) == expected, (
                f"missing {sorted(expected - set(rows))[:5]}, unexpected {sorted(set(rows) - expected)[:5]}")
    finally:
        query.stop()


@pytest.mark.spark
@pytest.mark.slow
def test_stream_task_notices_a_deleted_topic_well_before_the_request_timeout(spark, brook, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The batch is planned, then the topic deleted before its tasks read (inside foreachBatch, before the
    batch's data is collected): the query fails with data loss in a metadata refresh's time, not after
    request.timeout.ms (60 s here) of the client retrying UNKNOWN_TOPIC_OR_PARTITION."""
    topic = "stream-deleted-mid-batch"
    brook.create_topic(topic, 1, rf=3)
    brook.produce(topic, [b"d%d" % i for i in range(20)], partition=0)
    deleted: list[float] = []

    def handle(df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        if not deleted:
            _delete(brook, topic)
            deleted.append(time.monotonic())
        df.collect()

    query = (_stream(spark, brook, topic, **{"kafka.request.timeout.ms": str(REQUEST_TIMEOUT_MS)})
             .writeStream.foreachBatch(handle).option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_until(lambda: bool(deleted), 30, "the first batch")
        # Waited on past PROMPT_S only so that a failure says how long it took.
        wait_until(lambda: not query.isActive or time.monotonic() - deleted[0] > PROMPT_S + 5, PROMPT_S + 10,
                   "the query to end")
        took = time.monotonic() - deleted[0]
        assert not query.isActive, f"still running {took:.0f} s after the topic was deleted"
    finally:
        query.stop()
    message = str(query.exception())
    assert f"{topic}-0: the topic no longer exists" in message and "failOnDataLoss" in message, message[:3000]
    assert took < PROMPT_S, f"data loss seen after {took:.1f} s (request.timeout.ms {REQUEST_TIMEOUT_MS})"


def test_a_by_timestamp_option_that_misses_a_partition_is_named_as_given() -> None:
    """The error named startingOffsets for startingOffsetsByTimestamp (Spark source audit)."""
    from client import errors
    from spark_source.offsets import OffsetReader
    from spark_source.options import OffsetSpec

    reader = OffsetReader.__new__(OffsetReader)  # no cluster: the partitions named are checked first
    spec = OffsetSpec("timestamps", timestamps={("t", 0): 0})
    for what in ("startingOffsets", "endingOffsets"):
        with pytest.raises(errors.InvalidConfigError, match=f"option '{what}ByTimestamp': must name every partition"):
            reader.resolve(spec, {("t", 0), ("t", 1)}, what=what)
