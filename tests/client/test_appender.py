"""The producer's compiled send() (storage/_record_walk.c Appender) against its Python reference.

The Appender takes an ordinary record (bytes or None key and value, no headers, no explicit
partition) straight into the partition's open batch; whatever else it declines must leave
everything as it was, so that send()'s Python path decides as it always did.
"""

from __future__ import annotations

import inspect
import random
import threading

import pytest
from clientkit import KAFKA_MURMUR2

from client import accumulator, errors
from client.accumulator import RECORD_OVERHEAD_BYTES, RecordAccumulator, estimate_record_bytes
from client.partitioner import murmur2, murmur2_py, to_positive
from client.producer import Producer
from client.types import TopicPartition
from storage.record_batch import decode_batch

pytestmark = pytest.mark.skipif(accumulator._APPENDER is None,
                                reason="storage._record_walk is not built (no C compiler at install time?)")

TOPIC = "t"
TPS = tuple(TopicPartition(TOPIC, p) for p in range(6))
TS = 1_700_000_000_000


class Snapshot:
    """A metadata snapshot: the Appender compares only its identity with the cluster's ``_meta``."""


class Cluster:
    def __init__(self) -> None:
        self._meta = Snapshot()


def make_acc(**overrides) -> RecordAccumulator:
    params = dict(batch_size=100_000, linger_ms=50, buffer_memory=1 << 20, compression=0, max_block_ms=200,
                  delivery_timeout_ms=60_000, retry_backoff_ms=10)
    params.update(overrides)
    return RecordAccumulator(**params)


def connect(acc: RecordAccumulator, cluster: Cluster, *, max_request_size: int = 1 << 20):
    """What Producer.__init__ and _partitions set up: metadata, the sticky and keyed tables, enabled."""
    a = acc.appender
    a.cluster = cluster
    a.meta = cluster._meta
    a.max_request_size = max_request_size
    a.sticky[TOPIC] = 0
    a.keyed[TOPIC] = TPS
    a.enabled = 1
    return a


def py_append(acc: RecordAccumulator, tp: TopicPartition, key: bytes | None, value: bytes | None, ts: int | None):
    size = estimate_record_bytes(key, value, ())
    return acc.append(tp, ts, key, value, (), size, -1 if key is None else len(key), -1 if value is None else len(value))


def state(acc: RecordAccumulator) -> tuple:
    return acc.used_bytes, {tp: (b.size_bytes, b.record_count) for tp, b in acc.open_batches.items()}


def records(acc: RecordAccumulator, tp: TopicPartition) -> list[tuple]:
    (batch,) = acc.batches[tp]
    _, decoded = decode_batch(batch.build())
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded]


def test_a_record_appended_by_the_appender_is_the_one_the_python_path_appends() -> None:
    rng = random.Random(5)
    sends = [(None if rng.random() < 0.3 else rng.randbytes(rng.randrange(0, 20)),
              None if rng.random() < 0.1 else rng.randbytes(rng.randrange(0, 300)),
              None if rng.random() < 0.5 else TS + rng.randrange(-5000, 5000)) for _ in range(200)]
    py, fast = make_acc(), make_acc()
    appender = connect(fast, Cluster())
    appender.keyed[TOPIC] = (TPS[0],)  # keyed records too: one partition, one batch to compare
    py_append(py, TPS[0], None, b"first", TS)
    py_append(fast, TPS[0], None, b"first", TS)  # the Python path opens the batch
    py_futures, fast_futures = [], []
    for key, value, ts in sends:
        py_futures.append(py_append(py, TPS[0], key, value, ts))
        f = appender.send(TOPIC, key, value, ts)
        assert f is not None, "an ordinary record to an open batch with room was declined"
        fast_futures.append(f)
    assert state(fast) == state(py)
    fields = [(f._delta, f._key_size, f._value_size, f._timestamp if ts is not None else None)
              for f, (_, _, ts) in zip(fast_futures, sends, strict=True)]
    assert fields == [(f._delta, f._key_size, f._value_size, f._timestamp if ts is not None else None)
                      for f, (_, _, ts) in zip(py_futures, sends, strict=True)]
    assert all(f._completion is fast.open_batches[TPS[0]].completion for f in fast_futures)
    fast_records, py_records = records(fast, TPS[0]), records(py, TPS[0])
    no_ts = {i + 1 for i, (_, _, ts) in enumerate(sends) if ts is None}  # stamped with each path's own clock
    assert [r for r in fast_records if r[0] not in no_ts] == [r for r in py_records if r[0] not in no_ts]
    assert [r[2:] for r in fast_records] == [r[2:] for r in py_records]


def test_records_go_to_the_callers_partition_else_kafkas_for_the_key_else_the_sticky_one() -> None:
    acc = make_acc()
    appender = connect(acc, Cluster())
    for tp in TPS:
        py_append(acc, tp, None, b"open", TS)
    for key, h in KAFKA_MURMUR2.items():
        f = appender.send(TOPIC, key, b"v", TS)
        assert f._completion.partition == (h & 0x7FFFFFFF) % len(TPS), key
    appender.sticky[TOPIC] = 4
    assert appender.send(TOPIC, None, b"v", TS)._completion.partition == 4
    for p in range(len(TPS)):  # the caller's partition over the key's and the sticky one
        assert appender.produce(TOPIC, b"v", b"foobar", partition=p)._completion.partition == p
        assert appender.send(TOPIC, None, b"v", TS, p)._completion.partition == p


@pytest.mark.parametrize("case", [
    "disabled", "no open batch", "keyed, no open batch", "unknown topic", "metadata changed", "key not bytes",
    "value not bytes", "timestamp not int", "topic not str", "batch would fill", "buffer memory short",
    "above max.request.size", "batch built", "partition not in the topic", "partition without an open batch",
])
def test_what_the_appender_declines_it_leaves_unchanged(case: str) -> None:
    acc = make_acc(batch_size=2000, buffer_memory=10_000)
    cluster = Cluster()
    appender = connect(acc, cluster, max_request_size=1000)
    py_append(acc, TPS[0], None, b"first", TS)  # keyless records go to TPS[0], which has an open batch
    topic, key, value, ts = TOPIC, None, b"v" * 100, TS
    if case == "disabled":
        appender.enabled = 0
    elif case == "no open batch":
        appender.sticky[TOPIC] = 1
    elif case == "keyed, no open batch":
        key = next(k for k in KAFKA_MURMUR2 if to_positive(KAFKA_MURMUR2[k]) % len(TPS) != 0)
    elif case == "unknown topic":
        topic = "other"
    elif case == "metadata changed":
        cluster._meta = Snapshot()
    elif case == "key not bytes":
        key = "k"
    elif case == "value not bytes":
        value = bytearray(value)
    elif case == "timestamp not int":
        ts = float(TS)
    elif case == "topic not str":
        topic = TOPIC.encode()
    elif case == "batch would fill":  # the record that fills a batch is the Python path's: it closes the batch
        value = b"v" * (2000 - acc.open_batches[TPS[0]].size_bytes - RECORD_OVERHEAD_BYTES)
    elif case == "buffer memory short":  # waiting for memory is the Python path's
        acc.used_bytes = 10_000 - 50
    elif case == "above max.request.size":
        value = b"v" * 1000
    elif case == "batch built":
        acc.open_batches[TPS[0]].build()
    partition = {"partition not in the topic": len(TPS), "partition without an open batch": 1}.get(case)
    before = state(acc)
    assert appender.send(topic, key, value, ts, partition) is None
    assert state(acc) == before, f"{case}: declined but changed the accumulator"
    if case not in ("disabled", "no open batch", "metadata changed", "batch built", "above max.request.size"):
        assert appender.send(TOPIC, None, b"v", TS) is not None, "an ordinary record after it was declined"


def test_the_appender_waits_for_the_accumulator_lock() -> None:
    acc = make_acc()
    appender = connect(acc, Cluster())
    py_append(acc, TPS[0], None, b"first", TS)
    got: list = []
    acc.lock.acquire()
    try:
        t = threading.Thread(target=lambda: got.append(appender.send(TOPIC, None, b"v", TS)))
        t.start()
        t.join(0.2)
        assert t.is_alive() and not got, "the record was appended while another thread held the accumulator lock"
    finally:
        acc.lock.release()
    t.join(5)
    assert got and got[0] is not None


class Recorder:
    def __init__(self, result=None, error: Exception | None = None) -> None:
        self.calls: list[tuple] = []
        self.result, self.error = result, error

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.error is not None:
            raise self.error
        return self.result


@pytest.mark.parametrize(("args", "kwargs"), [
    ((TOPIC, b"v"), {"headers": [("h", b"1")]}),
    ((TOPIC, b"v", None, None, 3), {}),
    ((TOPIC, b"v"), {"partition": 9}),
    ((TOPIC, b"v"), {"partition": 2**70}),
    ((TOPIC, b"v"), {"partition": -1}),
    ((TOPIC, b"v"), {"partition": "0"}),
    ((TOPIC, b"v"), {"colour": "red"}),
    ((TOPIC, b"v", None, None, None, None, "extra"), {}),
    ((), {}),
    ((TOPIC,), {"value": b"v", "topic": TOPIC}),
    ((TOPIC, "not bytes"), {}),
    (("unknown-topic", b"v"), {}),
])
def test_produce_hands_every_other_call_to_the_python_send_unchanged(args: tuple, kwargs: dict) -> None:
    acc = make_acc()
    appender = connect(acc, Cluster())
    py_append(acc, TPS[0], None, b"first", TS)
    fallback = appender.fallback = Recorder(result="from python")
    before = state(acc)
    assert appender.produce(*args, **kwargs) == "from python"
    assert fallback.calls == [(args, kwargs)]
    assert state(acc) == before


def test_produce_takes_an_ordinary_record_itself_and_passes_python_errors_through() -> None:
    acc = make_acc()
    appender = connect(acc, Cluster())
    py_append(acc, TPS[0], None, b"first", TS)
    fallback = appender.fallback = Recorder(error=errors.ProducerClosedError("send() after close()"))
    f = appender.produce(TOPIC, b"v", timestamp=TS)
    g = appender.produce(TOPIC, value=b"w", key=b"foobar")
    assert fallback.calls == [] and f._delta == 1 and g._completion.partition == 0  # foobar: 0 of 6
    seen = []
    h = appender.produce(TOPIC, b"x", on_delivery=lambda md, err: seen.append((md, err)))
    assert fallback.calls == [] and h._delta == 3
    h._completion.complete(100, -1, None)  # the batch answered: its records' callbacks run
    assert [(md.offset, err) for md, err in seen] == [(103, None)]
    appender.enabled = 0
    with pytest.raises(errors.ProducerClosedError):
        appender.produce(TOPIC, b"v")


def test_a_producer_uses_it_past_its_serializers_and_not_with_a_custom_partitioner() -> None:
    plain = Producer(bootstrap_servers="127.0.0.1:1", max_block_ms=100)
    serialized = Producer(bootstrap_servers="127.0.0.1:1", max_block_ms=100, value_serializer=str.encode)
    partitioned = Producer(bootstrap_servers="127.0.0.1:1", max_block_ms=100, partitioner=lambda k, a, b: a[0])
    try:
        assert plain.send == plain._appender.produce
        # The compiled send() hands what it declines to the Python path past the serializers.
        assert plain._appender.fallback == plain._send_serialized
        assert serialized.send == Producer.send.__get__(serialized, Producer)  # runs the serializers, then:
        assert serialized._deliver == serialized._appender.produce
        assert serialized._appender.enabled == 1 and serialized._appender.fallback == serialized._send_serialized
        assert partitioned._deliver == partitioned._send_serialized
        for send in (plain.send, serialized.send, plain._send_serialized):
            assert inspect.signature(send).parameters.keys() == \
                inspect.signature(Producer.send).parameters.keys() - {"self"}
        assert partitioned._appender is None and partitioned.send == Producer.send.__get__(partitioned, Producer)
    finally:
        for p in (plain, serialized, partitioned):
            p.close(timeout=5)
    assert plain._appender.enabled == 0 and serialized._appender.enabled == 0
    for p in (plain, serialized):
        with pytest.raises(errors.ProducerClosedError):
            p.send(TOPIC, "v" if p is serialized else b"v")


def test_a_serializer_that_returns_neither_bytes_nor_str_is_named_in_the_error() -> None:
    with Producer(bootstrap_servers="127.0.0.1:1", max_block_ms=100, key_serializer=len) as producer:
        with pytest.raises(TypeError, match="key_serializer returned int: it must return bytes, str or None"):
            producer.send(TOPIC, b"v", key="abc")
    with Producer(bootstrap_servers="127.0.0.1:1", max_block_ms=100) as producer:
        with pytest.raises(TypeError, match=r"value must be bytes, str or None \(or set value_serializer\), got int"):
            producer.send(TOPIC, 5)


def test_the_compiled_murmur2_is_the_reference_one() -> None:
    rng = random.Random(11)
    keys = [rng.randbytes(rng.randrange(0, 64)) for _ in range(2000)] + list(KAFKA_MURMUR2)
    assert murmur2 is not murmur2_py
    assert [murmur2(k) for k in keys] == [murmur2_py(k) for k in keys]
    assert murmur2(bytearray(b"foobar")) == murmur2(memoryview(b"foobar")) == KAFKA_MURMUR2[b"foobar"]
    assert to_positive(murmur2(b"")) == to_positive(murmur2_py(b""))
