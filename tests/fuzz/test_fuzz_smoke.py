"""A small, bounded fuzz run of every target in the normal suite (``make fuzz`` runs long ones).

Every seed in tests/fuzz/corpus/<target>/ is replayed, then a few thousand seeded
mutations of them (byte flips, inserts, deletes, splices, truncation, interesting
integers) go through the same target. No atheris needed here: the mutator is small and
deterministic, so a failure reproduces with the printed input.
"""

from __future__ import annotations

import random
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import targets
from waiting import wait_for

CORPUS = Path(__file__).resolve().parent / "corpus"
MUTATIONS = {"batch_header": 3000, "records": 3000, "rpc": 2000, "controller": 1500, "kafka": 6000, "quorum": 3000}
_INTERESTING = [struct.pack(">i", v) for v in (-1, 0, 1, 0x7FFFFFFF, -0x80000000, 1_000_000)] + [
    b"\x00", b"\xff", b"\x80" * 10, b"\x01"]


def seeds(target: str) -> list[bytes]:
    files = sorted((CORPUS / target).iterdir())
    assert files, f"empty corpus for {target}"
    return [f.read_bytes() for f in files]


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(7)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and buf:
            buf[min(pos, len(buf) - 1)] = rng.randrange(256)
        elif op == 2:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 8))
        elif op == 3:
            del buf[pos:pos + rng.randint(1, 16)]
        elif op == 4:
            other = rng.choice(corpus)
            start = rng.randrange(len(other) + 1)
            buf[pos:pos] = other[start:start + rng.randint(1, 64)]
        elif op == 5:
            del buf[pos:]
        else:
            value = rng.choice(_INTERESTING)
            buf[pos:pos + len(value)] = value
    return bytes(buf)


@pytest.mark.parametrize("target", sorted(targets.TARGETS))
def test_corpus_replays_without_crash(target: str) -> None:
    for data in seeds(target):
        targets.TARGETS[target](data)


@pytest.mark.parametrize("target", sorted(targets.TARGETS))
def test_seeded_mutations_do_not_crash(target: str) -> None:
    corpus = seeds(target)
    fn = targets.TARGETS[target]
    rng = random.Random(f"brook-fuzz-{target}")
    for n in range(MUTATIONS[target]):
        data = mutate(rng, rng.choice(corpus), corpus)
        try:
            fn(data)
        except Exception as exc:
            raise AssertionError(f"{target} input #{n} crashed: {data.hex()}") from exc


def test_rpc_harness_really_appends_and_refuses() -> None:
    # The rpc target must reach the log, or its fuzzing proves nothing.
    from proto import broker_pb2
    from proto.errors import ErrorCode
    from storage.record_batch import RecordBatchBuilder

    h = targets.RpcHarness()
    try:
        builder = RecordBatchBuilder()
        builder.append(1, b"k", b"v")
        req = broker_pb2.ProduceRequest(acks=1, timeout_ms=100, partitions=[
            broker_pb2.ProducePartitionData(topic="t", partition=0, records=builder.build())])
        resp = h.loop.run_until_complete(h.service.Produce(req, targets._Context()))
        assert resp.partitions[0].error_code == ErrorCode.NONE, resp
        req.partitions[0].records = req.partitions[0].records[:-1]  # one byte short: CRC / truncation
        resp = h.loop.run_until_complete(h.service.Produce(req, targets._Context()))
        assert resp.partitions[0].error_code == ErrorCode.CORRUPT_MESSAGE, resp
        assert h.size_bytes() > 0
        # InitProducerId allocates a block from the in-process controller: fresh ids, never a caller's.
        init = broker_pb2.InitProducerIdRequest(producer_id=7, producer_epoch=3)
        ids = [h.loop.run_until_complete(h.service.InitProducerId(init, targets._Context())) for _ in range(2)]
        assert all(r.error_code == ErrorCode.NONE for r in ids), ids
        assert ids[0].producer_id != ids[1].producer_id and 7 not in (ids[0].producer_id, ids[1].producer_id)
    finally:
        h.close()


def test_controller_harness_really_creates_refuses_and_fences() -> None:
    # The controller target must reach the state machine, or its fuzzing proves nothing.
    from broker import principal
    from proto import controller_pb2 as cpb
    from proto.errors import ErrorCode

    principal.configure(trust_loopback_plaintext=True)  # another test may have loaded a non-loopback config
    h = targets.ControllerHarness()
    try:
        def call(name: str, msg: object, remote: bool = False) -> object:
            data = bytes([targets.CONTROLLER_RPCS.index(name), int(remote)]) + msg.SerializeToString()  # type: ignore[attr-defined]
            return h.call(data)

        resp = call("CreateTopics", cpb.CreateTopicsRequest(topics=[cpb.CreatableTopic(
            name="t", num_partitions=3, replication_factor=3)]))
        assert resp.results[0].error_code == ErrorCode.NONE, resp  # type: ignore[attr-defined]
        assert h.partitions() == 3
        resp = call("CreateTopics", cpb.CreateTopicsRequest(topics=[cpb.CreatableTopic(
            name="huge", num_partitions=1_000_000, replication_factor=3)]))
        assert resp.results[0].error_code != ErrorCode.NONE and h.partitions() == 3, resp  # type: ignore[attr-defined]
        resp = call("RegisterBroker", cpb.RegisterBrokerRequest(node_id=3, incarnation_id="forged", cluster_id="fuzz"),
                    remote=True)
        assert resp.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, resp  # type: ignore[attr-defined]
        first = call("WatchMetadata", cpb.WatchMetadataRequest(broker_id=1))
        assert first.is_snapshot and len(first.topics) == 1, first  # type: ignore[attr-defined]
        from proto import security_pb2 as spb

        names = [n for n, _, _ in h.handlers]
        acl = spb.AclBinding(resource_type="TOPIC", resource_name="t", pattern_type="LITERAL",
                             principal="User:alice", host="*", operation="READ", permission="ALLOW")
        h.call(bytes([names.index("CreateAcls"), 0]) + spb.CreateAclsRequest(acls=[acl]).SerializeToString())
        described = h.call(bytes([names.index("DescribeAcls"), 0]) + spb.DescribeAclsRequest().SerializeToString())
        assert list(described.acls) == [acl], described  # type: ignore[attr-defined]
    finally:
        h.close()


def test_rpc_harness_reaches_the_group_coordinator() -> None:
    # The group RPCs in the rpc target must run the real coordinator, or their fuzzing proves nothing.
    from proto import group_pb2 as g
    from proto.errors import ErrorCode

    h = targets.RpcHarness()
    try:
        def run(name: str, msg: object) -> object:
            return h.loop.run_until_complete(getattr(h.groups, name)(msg, targets._Context()))

        commit = g.OffsetCommitRequest(group_id="g", generation_id=-1, partitions=[
            g.OffsetCommitPartition(topic="t", partition=0, offset=5)])
        # The coordinator loads __consumer_offsets in the background: wait until it answers.
        resp = wait_for(lambda: (r := run("OffsetCommit", commit)).partitions[0].error_code == ErrorCode.NONE and r,
                        30, "the coordinator to load __consumer_offsets")
        fetched = run("OffsetFetch", g.OffsetFetchRequest(group_id="g"))
        assert [(p.topic, p.offset) for p in fetched.partitions] == [("t", 5)], (resp, fetched)  # type: ignore[attr-defined]
        join = g.JoinGroupRequest(group_id="g2", protocol_type="consumer", session_timeout_ms=10000,
                                  rebalance_timeout_ms=10000, protocols=[g.GroupProtocol(name="range")])
        first = run("JoinGroup", join)
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED, first  # type: ignore[attr-defined]
        join.member_id = first.member_id  # type: ignore[attr-defined]
        assert run("JoinGroup", join).generation_id == 1  # type: ignore[attr-defined]
    finally:
        h.close()


def produce_to_r0(h: targets.RpcHarness, records: int) -> None:
    """One batch of ``records`` appended to the harness broker's r-0, which it leads."""
    from proto import broker_pb2
    from storage.record_batch import RecordBatchBuilder

    builder = RecordBatchBuilder()
    for i in range(records):
        builder.append(1, b"k%d" % i, b"v")
    req = broker_pb2.ProduceRequest(acks=1, timeout_ms=100, partitions=[
        broker_pb2.ProducePartitionData(topic="r", partition=0, records=builder.build())])
    assert h.loop.run_until_complete(h.service.Produce(req, targets._Context())).partitions[0].error_code == 0


def test_rpc_harness_runs_replica_fetch_sessions() -> None:
    # The ReplicaFetch stream in the rpc target must answer each message as a follower Fetch, and
    # its one-answer-per-request check must catch a stream that drops one, or it proves nothing.

    session = next((CORPUS / "rpc").glob("replica-fetch-session-*")).read_bytes()
    h = targets.RpcHarness()
    try:
        name, _, _ = h.handlers[session[0] % len(h.handlers)]
        assert name == targets.REPLICA_FETCH
        produce_to_r0(h, 3)
        partition = h.rm.leader_partition("r", 0)
        text = h._replica_fetch_session(session[1:])
        answers = text.split("partitions {")
        assert 'records: "' in answers[1], text[:600]  # broker 2, following r-0 from offset 0, gets the batch
        assert partition.log.high_watermark == 3  # its next fetch (from 3) moved the HW past the batch
        assert "error_code: INVALID_REQUEST" in text, text  # a consumer's fetch on the stream
        h.call(session)  # the whole input, as the fuzzer gives it: no failure

        async def drops_one(requests, context):  # type: ignore[no-untyped-def]
            async for request in requests:
                if request.replica_id < 0:
                    continue
                yield await h.service._replica_fetch(request, context)
        h.service.ReplicaFetch = drops_one  # type: ignore[method-assign]
        with pytest.raises(AssertionError, match="answered 5 of 6 requests"):
            h.call(session)
    finally:
        h.close()


def test_kafka_harness_reaches_the_handlers() -> None:
    # The kafka target must parse, append and answer, or its fuzzing proves nothing.
    seeds_by_name = {f.name: f.read_bytes() for f in (CORPUS / "kafka").iterdir()}
    produce = next(v for k, v in seeds_by_name.items() if k.startswith("ProduceRequest-v9"))
    h = targets._get_harness()
    before = h.size_bytes()
    targets.kafka(produce)
    assert h.size_bytes() > before
    parsed = 0
    rng = random.Random("kafka-reach")
    from broker.kafka_wire import codec

    corpus = list(seeds_by_name.values())
    for _ in range(500):
        data = mutate(rng, rng.choice(corpus), corpus)
        try:
            api_key, version, _ = codec.peek_header(data)
            codec.parse_request(data, api_key, version)
            parsed += 1
        except Exception:
            pass
    assert parsed > 20, f"only {parsed} of 500 mutations parse: the target barely reaches the handlers"


def test_rpc_harness_runs_incremental_fetch_sessions() -> None:
    # An incremental request names only what changed and an answer only what is new: the harness
    # must accept that, and still catch an answer naming a partition the session does not hold.
    from proto import broker_pb2

    session = next((CORPUS / "rpc").glob("replica-fetch-incremental-*")).read_bytes()
    h = targets.RpcHarness()
    try:
        produce_to_r0(h, 5)
        # 5 answers (full, incremental with a duplicate, empty, forgotten + unknown, full again), each
        # checked against the session by the harness
        text = h._replica_fetch_session(session[1:])
        assert text.count("incremental: true") == 5, text[:800]
        assert 'records: "' in text, text[:800]  # r-0's batch, from the full request
        assert 'topic: "nope"' in text and "UNKNOWN_TOPIC_OR_PARTITION" in text, text[:1500]
        h.call(session)  # the whole input, as the fuzzer gives it: no failure

        async def answers_outside_the_session(requests, context):  # type: ignore[no-untyped-def]
            async for _ in requests:
                yield broker_pb2.FetchResponse(partitions=[broker_pb2.FetchPartitionResponse(topic="zz", partition=0)])
        h.service.ReplicaFetch = answers_outside_the_session  # type: ignore[method-assign]
        with pytest.raises(AssertionError, match="ReplicaFetch answered partitions"):
            h.call(session)
    finally:
        h.close()


def test_rpc_harness_runs_produce_stream_sessions() -> None:
    # The ProduceStream seed reaches the stream handler: its valid requests are appended in order and
    # every request is answered once, and the one-answer-per-request check catches a stream that drops one.
    session = next((CORPUS / "rpc").glob("produce-stream-session-*")).read_bytes()
    h = targets.RpcHarness()
    try:
        name, _, _ = h.handlers[session[0] % len(h.handlers)]
        assert name == targets.PRODUCE_STREAM
        text = h._produce_stream_session(session[1:])
        answers = text.split("\npartitions {")
        assert len(text.split("partitions {")) == 1 + 6, text[:800]  # six partitions asked across five requests
        # The first request's batch is appended at t-0's start (offset 0, proto3's unprinted default).
        assert "error_code" not in answers[0] and h.rm.leader_partition("t", 0).log.log_end_offset == 3, text[:600]
        assert "INVALID_REQUIRED_ACKS" in text and "UNKNOWN_TOPIC_OR_PARTITION" in text, text
        h.call(session)  # the whole input, as the fuzzer gives it: no failure

        async def drops_one(requests, context):  # type: ignore[no-untyped-def]
            n = 0
            async for request in requests:
                n += 1
                if n != 2:
                    yield await h.service._produce_call(request, context, None)
        h.service.ProduceStream = drops_one  # type: ignore[method-assign]
        h.handlers[-1] = (targets.PRODUCE_STREAM, None, h._produce_stream_session)
        with pytest.raises(AssertionError, match="answered 4 of 5 requests"):
            h.call(session)
    finally:
        h.close()


def test_rpc_harness_runs_fetch_stream_sessions() -> None:
    # The FetchStream seed reaches the stream handler: each of its five requests is answered once, in
    # order, as a unary consumer Fetch would be, and a follower's fetch on it is refused, not served.
    session = next((CORPUS / "rpc").glob("fetch-stream-session-*")).read_bytes()
    h = targets.RpcHarness()
    try:
        name, _, _ = h.handlers[session[0] % len(h.handlers)]
        assert name == targets.FETCH_STREAM
        text = h._fetch_stream_session(session[1:])
        assert "UNKNOWN_TOPIC_OR_PARTITION" in text and "OFFSET_OUT_OF_RANGE" in text, text[:800]
        assert "FetchStream carries consumer fetches" in text, text[:800]
        h.call(session)  # the whole input, as the fuzzer gives it: no failure
    finally:
        h.close()


def test_refused_fetches_name_each_partition_once() -> None:
    # Every Fetch answer names a partition once, as Kafka's fetch map does (one_entry_per_partition), and a
    # refused one too: a follower's fetch on a consumer's FetchStream and a consumer's on a follower's fetch
    # session answered each entry of the request, a partition named twice twice (found by `make fuzz`).
    from proto import broker_pb2
    from proto.errors import ErrorCode

    def twice(replica_id: int) -> broker_pb2.FetchRequest:
        return broker_pb2.FetchRequest(replica_id=replica_id, partitions=[
            broker_pb2.FetchPartition(topic=t, partition=0, fetch_offset=0) for t in ("t", "r", "t")])

    async def answers(stream_handler: Any, request: broker_pb2.FetchRequest) -> list[broker_pb2.FetchResponse]:
        async def one() -> AsyncIterator[broker_pb2.FetchRequest]:
            yield request
        return [r async for r in stream_handler(one(), targets._Context())]

    h = targets.RpcHarness()
    try:
        for handler, request in ((h.service.FetchStream, twice(2)), (h.service.ReplicaFetch, twice(-1))):
            [response] = h.loop.run_until_complete(answers(handler, request))
            named = [(p.topic, p.partition) for p in response.partitions]
            assert named == [("t", 0), ("r", 0)], response
            assert {p.error_code for p in response.partitions} == {ErrorCode.INVALID_REQUEST}, response
    finally:
        h.close()


def test_quorum_harness_really_appends_and_drops() -> None:
    # The quorum target must reach pysyncobj's handling, or its fuzzing proves nothing.
    import pickle

    h = targets.QuorumHarness()
    try:
        follower = h.net["B"].obj
        command = b"\x00" + pickle.dumps((0, ("w",)), 2)
        append = {"type": "append_entries", "term": 1, "commit_index": 6, "prevLogIdx": 5, "prevLogTerm": 1,
                  "entries": [(command, 6, 1)]}
        h.call(b"\x00" + pickle.dumps(append, 2))
        assert [(e[1], e[2]) for e in follower._SyncObj__raftLog[:]][-1] == (6, 1)
        assert follower._SyncObj__raftCommitIndex == 6
        h.call(b"\x02" + pickle.dumps({"type": "request_vote", "term": 1 << 64, "last_log_term": 1,
                                        "last_log_index": 6}, 2))
        assert follower._SyncObj__raftCurrentTerm == 1  # dropped, as the quorum port drops it
        h.call(b"\x02" + pickle.dumps({"type": "request_vote", "term": 7, "last_log_term": 1,
                                        "last_log_index": 6}, 2))
        assert follower._SyncObj__raftCurrentTerm == 7  # taken: Raft's rule for a higher term
    finally:
        h.close()
