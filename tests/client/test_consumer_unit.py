"""Consumer behaviour that needs no cluster: config validation and API misuse."""

from __future__ import annotations

import pytest

from client import errors
from client.consumer import Consumer
from client.types import TopicPartition

BOOT = "127.0.0.1:1"  # nothing listens: these calls must fail before any network use


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"auto.offset.reset": "smallest"}, "auto.offset.reset"),
        ({"heartbeat.interval.ms": 5000, "session.timeout.ms": 5000}, "heartbeat.interval.ms"),
        ({"max.poll.records": 0}, "max.poll.records"),
        ({"fetch.max.bytes": "lots"}, "fetch.max.bytes"),
        ({"group.instance.idd": "x"}, "unknown consumer config"),
    ],
)
def test_consumer_config_validation(config: dict, match: str) -> None:
    with pytest.raises(errors.InvalidConfigError, match=match):
        Consumer(config=config, bootstrap_servers=BOOT)


def test_group_operations_need_group_id() -> None:
    with Consumer(bootstrap_servers=BOOT) as consumer:
        with pytest.raises(errors.InvalidGroupIdError):
            consumer.subscribe(["t"])
        consumer.assign([TopicPartition("t", 0)])
        with pytest.raises(errors.InvalidGroupIdError):
            consumer.commit()
        with pytest.raises(errors.InvalidGroupIdError):
            consumer.committed(TopicPartition("t", 0))


def test_assign_and_subscribe_do_not_mix() -> None:
    with Consumer(bootstrap_servers=BOOT, group_id="g") as consumer:
        consumer.assign([TopicPartition("t", 0)])
        with pytest.raises(errors.InvalidRequestError, match="unsubscribe"):
            consumer.subscribe(["t"])
        assert consumer.assignment() == {TopicPartition("t", 0)}
        with pytest.raises(errors.InvalidRequestError):
            consumer.subscribe(["t"], pattern="t.*")


def test_seek_validation_and_unassigned_partitions() -> None:
    with Consumer(bootstrap_servers=BOOT) as consumer:
        tp = TopicPartition("t", 0)
        consumer.assign([tp])
        with pytest.raises(errors.InvalidRequestError):
            consumer.seek(tp, -5)
        with pytest.raises(errors.InvalidRequestError, match="not assigned"):
            consumer.seek(TopicPartition("t", 1), 3)
        consumer.seek(tp, 7)
        assert consumer.position(tp) == 7, "an explicit seek needs no broker round trip"
        consumer.pause(tp)
        assert consumer.paused() == {tp}
        consumer.resume(tp)
        assert consumer.paused() == set()


def test_closed_consumer_refuses_calls() -> None:
    consumer = Consumer(bootstrap_servers=BOOT)
    consumer.close()
    with pytest.raises(errors.ConsumerClosedError):
        consumer.poll(timeout_ms=0)
    consumer.close()  # idempotent


def test_a_fetch_answered_corrupt_message_is_raised_not_retried() -> None:
    """A leader answers CORRUPT_MESSAGE when the batch at the position is corrupt on its disk and no other replica
    is in sync to take over (broker/replica_manager.py): Kafka's consumer raises it from poll; retrying it (the
    code is retriable for producers) would leave the consumer stuck without a word."""
    from proto import broker_pb2

    tp = TopicPartition("t", 0)
    with Consumer(bootstrap_servers="127.0.0.1:1") as consumer:
        consumer.assign([tp])
        answer = broker_pb2.FetchPartitionResponse(topic="t", partition=0, error_code=errors.ErrorCode.CORRUPT_MESSAGE,
                                                   error_message="corrupt batch at position 0 (base offset 0)")
        consumer._handle_partition(tp, consumer._state(tp), answer, 0.0)
        with pytest.raises(errors.CorruptMessageError, match="corrupt batch"):
            consumer._raise_pending()
