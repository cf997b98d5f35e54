"""The Kafka listener's codec (kio schemas + Brook's bounds check), without a cluster."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pytest
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_reader, entity_writer

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
