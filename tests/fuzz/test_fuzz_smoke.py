"""A small, bounded fuzz run of every target in the normal suite (``make fuzz`` runs long ones).

Every seed in tests/fuzz/corpus/<target>/ is replayed, then a few thousand seeded
mutations of them (byte flips, inserts, deletes, splices, truncation, interesting
integers) go through the same target. No atheris needed here: the mutator is small and
deterministic, so a failure reproduces with the printed input.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
import targets

CORPUS = Path(__file__).resolve().parent / "corpus"
MUTATIONS = {"batch_header": 3000, "records": 3000, "rpc": 2000}
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
    finally:
        h.close()
