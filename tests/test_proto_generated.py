"""The committed gRPC modules must match proto/*.proto (run `make proto` to fix)."""

from proto import errors, generate


def test_generated_modules_are_fresh() -> None:
    stale = generate.stale_files()
    assert not stale, f"generated modules are stale, run `make proto`: {stale}"


def test_error_codes_round_trip_with_kafka_numbers() -> None:
    e = errors.error_for(6, "leader is broker 2")
    assert isinstance(e, errors.NotLeaderOrFollowerError)
    assert e.code == 6 and e.retriable and "leader is broker 2" in str(e)
    assert not errors.error_for(17).retriable  # INVALID_TOPIC_EXCEPTION
    unknown = errors.error_for(9999, "from a newer server")
    assert unknown.code == 9999 and isinstance(unknown, errors.BrookError)
