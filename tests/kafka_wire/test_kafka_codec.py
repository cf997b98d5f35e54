"""The Kafka listener's codec (kio schemas + Brook's bounds check), without a cluster."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer
from wire_bytes import uvarint

from broker.kafka_wire import apis, codec

SERVED = [(k, v) for k, (lo, hi) in sorted(apis.SUPPORTED.items()) for v in range(lo, hi + 1)]
CORPUS = Path(__file__).resolve().parents[1] / "fuzz" / "corpus" / "kafka"


def _frame(api_key: int, version: int, body: object) -> bytes:
    cls = codec.request_schema(api_key, version)
    header_cls = HeaderV2 if cls.__flexible__ else HeaderV1
    buf = io.BytesIO()
    entity_writer(header_cls)(buf, header_cls(request_api_key=api_key, request_api_version=version,
                                              correlation_id=42, client_id="codec-test"))
    entity_writer(cls)(buf, body)
    return buf.getvalue()


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_every_served_version_round_trips(api_key: int, version: int) -> None:
    cls = codec.request_schema(api_key, version)
    req = codec.parse_request(_frame(api_key, version, codec.build(cls, {})), api_key, version)
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (api_key, version, 42, "codec-test")
    body = codec.response(api_key, version, {})
    out = codec.encode_response_bytes(api_key, version, 42, body)
    assert struct.unpack(">i", out[:4])[0] == len(out) - 4
    header = 4 if not body.__flexible__ or api_key == apis.API_VERSIONS else 5
    decoded, used = entity_reader(type(body))(out, 4 + header)
    assert decoded == body and 4 + header + used == len(out)


def test_an_array_claiming_billions_of_elements_is_refused_before_the_reader_allocates() -> None:
    # Found by the kafka fuzz target: OffsetFetch v7 whose topics array claims ~2^41 elements made kio's
    # compiled reader ask for 253 GB, and the failed allocation aborted the broker process.
    frame = bytes.fromhex("0009000700000001000466757a5a000267d5a1e1857690d2020274030000000000000001000000")
    with pytest.raises(codec.MalformedRequest):
        codec.parse_request(frame, 9, 7)


@pytest.mark.parametrize("claim", [0x7FFFFFFF, 1 << 20, 100])
def test_legacy_arrays_and_strings_longer_than_the_frame_are_refused(claim: int) -> None:
    head = struct.pack(">hhih", apis.PRODUCE, 3, 1, 0)  # Produce v3: legacy encodings
    body = struct.pack(">hhii", -1, 1, 1000, claim)  # null transactional id, acks, timeout, topics count
    with pytest.raises(codec.MalformedRequest):
        codec.parse_request(head + body, apis.PRODUCE, 3)
    records = struct.pack(">hhii", -1, 1, 1000, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">iii", 1, 0, claim)
    with pytest.raises(codec.MalformedRequest):
        codec.parse_request(head + records, apis.PRODUCE, 3)


def test_null_in_a_non_nullable_field_is_refused() -> None:
    head = struct.pack(">hhih", apis.DESCRIBE_GROUPS, 0, 1, 0)
    with pytest.raises(codec.MalformedRequest):
        codec.parse_request(head + struct.pack(">i", -1), apis.DESCRIBE_GROUPS, 0)  # groups: null
    with pytest.raises(codec.MalformedRequest):
        codec.parse_request(head + struct.pack(">ih", 1, -1), apis.DESCRIBE_GROUPS, 0)  # groups: [null]


def test_every_fuzz_seed_passes_the_bounds_check() -> None:
    seeds = sorted(CORPUS.iterdir())
    assert seeds
    for path in seeds:
        frame = path.read_bytes()
        api_key, version, _ = codec.peek_header(frame)
        codec.parse_request(frame, api_key, version)  # no MalformedRequest for well-formed requests


def test_more_tagged_fields_than_any_client_sends_are_refused_before_they_are_walked() -> None:
    """An audit sent an ApiVersions (allowed before login) of 4.2M empty tagged fields: walking them took
    3.5 s of the event loop. 64 an entity are read (Kafka's clients send a handful); more is malformed."""
    from broker.kafka_wire import bounds

    def api_versions_with_header_tags(count: int, distinct: bool = True) -> bytes:
        head = struct.pack(">hhih", apis.API_VERSIONS, 3, 42, 4) + b"test"
        # Past the bound, what the fields hold does not matter (the count refuses the frame): 4M copies of one
        # are built in a moment, where 4M distinct ones took the test 8 s.
        fields = b"".join(uvarint(tag) + uvarint(0) for tag in range(count)) if distinct else b"\x00\x00" * count
        return head + uvarint(count) + fields + b"\x01\x01\x00"  # empty software name and version, no body tags

    # Up to the bound the walk goes through them and kio's reader then refuses tags it does not know...
    with pytest.raises(codec.MalformedRequest, match="Unknown tagged field"):
        codec.parse_request(api_versions_with_header_tags(bounds.MAX_TAGGED_FIELDS), apis.API_VERSIONS, 3)
    # ...past it the count alone refuses the frame.
    with pytest.raises(codec.MalformedRequest, match=f"at most {bounds.MAX_TAGGED_FIELDS} are read"):
        codec.parse_request(api_versions_with_header_tags(4_000_000, distinct=False), apis.API_VERSIONS, 3)


def test_a_frame_of_more_elements_than_the_walk_takes_is_refused_and_fixed_arrays_cost_one_step() -> None:
    """An 8 MiB OffsetFetch naming 2.8M empty topics held the event loop 10 s in the bounds walk. A frame may
    hold at most MAX_ELEMENTS entities and elements; an array of fixed-size values is checked in one step
    whatever its length, its elements counted (test_int32_arrays_count_against_the_element_bound)."""
    from broker.kafka_wire import bounds

    def offset_fetch(topics: int, partitions: int = 0) -> bytes:
        cls = codec.request_schema(apis.OFFSET_FETCH, 7)
        head = struct.pack(">hhih", apis.OFFSET_FETCH, 7, 42, 0) + b"\x00"
        topic = b"\x02t" + uvarint(partitions + 1) + struct.pack(">i", 0) * partitions + b"\x00"
        assert cls.__flexible__
        return head + b"\x02g" + uvarint(topics + 1) + topic * topics + b"\x00\x00"

    assert codec.parse_request(offset_fetch(bounds.MAX_ELEMENTS), apis.OFFSET_FETCH, 7)
    with pytest.raises(codec.MalformedRequest, match="array elements"):
        codec.parse_request(offset_fetch(bounds.MAX_ELEMENTS + 1), apis.OFFSET_FETCH, 7)
    # The listener passes a bound from the cluster's size (bounds.MIN_ELEMENTS for a small one).
    assert codec.parse_request(offset_fetch(bounds.MIN_ELEMENTS), apis.OFFSET_FETCH, 7, bounds.MIN_ELEMENTS)
    with pytest.raises(codec.MalformedRequest, match=f"more than {bounds.MIN_ELEMENTS} array elements"):
        codec.parse_request(offset_fetch(bounds.MIN_ELEMENTS + 1), apis.OFFSET_FETCH, 7, bounds.MIN_ELEMENTS)
    walked = []
    real = bounds._scan_value
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bounds, "_scan_value", lambda *a: (walked.append(1), real(*a))[1])
        req = codec.parse_request(offset_fetch(1, bounds.MAX_ELEMENTS - 1), apis.OFFSET_FETCH, 7)
    assert len(req.body.topics[0].partition_indexes) == bounds.MAX_ELEMENTS - 1
    assert len(walked) < 20, f"{len(walked)} steps for one array of {bounds.MAX_ELEMENTS - 1} int32"


@pytest.mark.parametrize(("api_key", "version", "values"), [
    (apis.OFFSET_FETCH, 7, lambda n: {"group_id": "g", "topics": [{"name": "t", "partition_indexes": range(n)}]}),
    (35, 4, lambda n: {"topics": [{"topic": "t", "partitions": range(n)}]}),  # DescribeLogDirs
    (43, 2, lambda n: {"election_type": 0, "timeout": 1000,  # ElectLeaders
                       "topic_partitions": [{"topic": "t", "partitions": range(n)}]}),
    (46, 0, lambda n: {"timeout": 1000, "topics": [{"name": "t", "partition_indexes": range(n)}]}),
], ids=["OffsetFetch", "DescribeLogDirs", "ElectLeaders", "ListPartitionReassignments"])
def test_int32_arrays_count_against_the_element_bound(api_key: int, version: int, values: object) -> None:
    """An 8 MB frame holds 2M int32 partition indexes: they were checked in one step and never counted, and the
    handlers expanded them on the event loop before any bound or ACL check (audit: 1 s of the loop and 100 MB
    for each DescribeLogDirs or OffsetFetch). They count as elements now, still in one step."""
    from broker.kafka_wire import bounds

    def frame(n: int) -> bytes:
        body = codec.build(codec.request_schema(api_key, version), values(n))  # type: ignore[operator]
        return _frame(api_key, version, body)

    # The request's one topic entity is an element too.
    assert codec.parse_request(frame(bounds.MIN_ELEMENTS - 1), api_key, version, bounds.MIN_ELEMENTS)
    with pytest.raises(codec.MalformedRequest, match=f"more than {bounds.MIN_ELEMENTS} array elements"):
        codec.parse_request(frame(bounds.MIN_ELEMENTS), api_key, version, bounds.MIN_ELEMENTS)
    with pytest.raises(codec.MalformedRequest, match=f"more than {bounds.MAX_ELEMENTS} array elements"):
        codec.parse_request(frame(2_000_000), api_key, version)  # the audit's 8 MB frame


def test_long_bytes_values_are_sent_as_they_are_and_the_frame_stays_whole() -> None:
    # A JoinGroup answer of 64 members' metadata of 1 MiB (what one address may hold) was copied three times into
    # one buffer on the event loop: 200-300 ms. Values of OWN_PART_MIN_BYTES or more are now parts of their own.
    join_group = 11
    big, small = bytes(range(256)) * (codec.OWN_PART_MIN_BYTES // 256), b"short metadata"
    members = [{"member_id": f"m{i}", "group_instance_id": None, "metadata": big if i % 2 else small} for i in range(6)]
    body = codec.response(join_group, 7, {"throttle_time": 0, "error_code": 0, "generation_id": 3,
                                          "protocol_type": "consumer", "protocol_name": "range", "leader": "m0",
                                          "member_id": "m0", "members": members})
    parts = codec.encode_response(join_group, 7, 42, body)
    assert sum(p is big for p in parts) == 3, [len(p) for p in parts]  # the very objects, not copies
    assert all(isinstance(p, bytes) for p in parts)
    frame = b"".join(parts)  # type: ignore[arg-type]
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    decoded, _ = entity_reader(codec.response_schema(join_group, 7))(frame[4:], 5)  # correlation id, no tags
    assert [(m.member_id, m.metadata) for m in decoded.members] == [(m["member_id"], m["metadata"]) for m in members]

