"""Every (API, version) the Kafka listener advertises has kio schemas, and a response built by
``codec.response`` from nothing (every field at Kafka's zero value) encodes and decodes again."""

from __future__ import annotations

import struct

import pytest
from kio.serial import entity_reader

from broker.kafka_wire import admin_apis, apis, codec

ALL = [(key, version) for key, (lo, hi) in sorted(apis.SUPPORTED.items()) for version in range(lo, hi + 1)]


@pytest.mark.parametrize(("api_key", "version"), ALL, ids=[f"api{k}-v{v}" for k, v in ALL])
def test_zero_response_round_trips(api_key: int, version: int) -> None:
    codec.request_schema(api_key, version)  # the request can be parsed
    body = codec.response(api_key, version, {})
    frame = codec.encode_response_bytes(api_key, version, 7, body)
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    (correlation_id,) = struct.unpack_from(">i", frame, 4)
    assert correlation_id == 7
    header_bytes = 5 if body.__flexible__ and api_key != codec.API_VERSIONS_KEY else 4  # v1 adds empty tagged fields
    decoded, used = entity_reader(type(body))(frame, 4 + header_bytes)
    assert decoded == body
    assert 4 + header_bytes + used == len(frame)


def test_admin_apis_are_advertised_and_served() -> None:
    for key, versions in admin_apis.SUPPORTED.items():
        assert apis.SUPPORTED[key] == versions
    served = set(admin_apis.AdminApis(broker=None, listener="KAFKA").handlers())
    assert served == set(admin_apis.SUPPORTED)


def test_a_filled_create_topics_response_keeps_its_values() -> None:
    """The v7 shape a handler builds (uuid as hex, nested configs) survives the round trip."""
    values = {"throttle_time": 0, "topics": [{
        "name": "t", "topic_id": "0123456789abcdef0123456789abcdef", "error_code": 0, "num_partitions": 3,
        "replication_factor": 2, "configs": [{"name": "retention.ms", "value": "1000", "read_only": False,
                                              "config_source": 1, "is_sensitive": False}]}]}
    for version in range(2, 8):
        body = codec.response(19, version, values)
        frame = codec.encode_response_bytes(19, version, 1, body)
        decoded, _ = entity_reader(type(body))(frame, 4 + (5 if body.__flexible__ else 4))
        assert decoded.topics[0].name == "t"
        if version >= 5:
            assert decoded.topics[0].num_partitions == 3
            assert decoded.topics[0].configs[0].value == "1000"
