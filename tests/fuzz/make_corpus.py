"""Write the seed corpus of the fuzz targets into tests/fuzz/corpus/<target>/ (committed).

    python tests/fuzz/make_corpus.py

Seeds are valid inputs of every shape the targets take (so mutations start from deep
in the parsers) plus the attacks of issue 11. Deterministic: re-running rewrites the
same files.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "storage"))

from batch_forge import batch, record, records, valid  # noqa: E402

from proto import broker_pb2  # noqa: E402
from storage import record_batch as rb  # noqa: E402

CODECS = [rb.CODEC_NONE, rb.CODEC_GZIP, rb.CODEC_SNAPPY, rb.CODEC_LZ4, rb.CODEC_ZSTD]


def _with_headers(n: int) -> bytes:
    return b"".join(record(i, b"k%d" % i if i % 3 else None, b"v" * i, ts_delta=i - 2,
                           headers=[(b"trace", b"%d" % i), (b"n", None)] if i % 2 else ()) for i in range(n))


def batch_header_seeds() -> dict[str, bytes]:
    seeds = {f"valid-codec{c}": valid(5, codec=c) for c in CODECS}
    seeds["two-batches"] = valid(2) + valid(3, codec=rb.CODEC_GZIP)
    seeds["control"] = rb.build_control_batch(True, producer_id=3, producer_epoch=0, timestamp_ms=1)
    seeds["torn-tail"] = valid(4) + valid(4)[:40]
    seeds["headers"] = batch(_with_headers(6), count=6)
    return seeds


def records_seeds() -> dict[str, bytes]:
    seeds: dict[str, bytes] = {}
    for c in CODECS:
        flags = c | (8 if c else 0)  # bit 3: the target compresses the section itself
        seeds[f"codec{c}"] = bytes([flags]) + (5).to_bytes(2, "big") + records(5)
        seeds[f"codec{c}-headers"] = bytes([flags]) + (6).to_bytes(2, "big") + _with_headers(6)
    seeds["compacted"] = bytes([16]) + (4).to_bytes(2, "big") + records(4)
    seeds["compacted-keyless"] = bytes([16]) + (4).to_bytes(2, "big") + records(4, keys=False)
    seeds["count-overstated"] = bytes([0]) + (9).to_bytes(2, "big") + records(3)
    seeds["transactional"] = bytes([1 << 5]) + (3).to_bytes(2, "big") + records(3)
    seeds["many"] = bytes([0]) + (300).to_bytes(2, "big") + records(300)
    return seeds


def rpc_seeds() -> dict[str, bytes]:
    pb = broker_pb2
    seeds: dict[str, bytes] = {}

    def produce(name: str, topic: str, records_: bytes, acks: int = 1) -> None:
        req = pb.ProduceRequest(acks=acks, timeout_ms=100, partitions=[
            pb.ProducePartitionData(topic=topic, partition=0, records=records_)])
        seeds[f"produce-{name}"] = b"\x00" + req.SerializeToString()

    for c in CODECS:
        produce(f"codec{c}", "t", valid(4, codec=c))
    produce("compacted", "c", valid(3))
    produce("compacted-keyless", "c", valid(3, keys=False))
    produce("bad-count", "t", batch(records(3), count=5), acks=-1)
    produce("unknown-topic", "nope", valid(1))
    fetch = pb.FetchRequest(replica_id=-1, replica_epoch=-1, max_bytes=1 << 20, partitions=[
        pb.FetchPartition(topic="t", partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                          current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])
    seeds["fetch-consumer"] = b"\x01" + fetch.SerializeToString()
    fetch.replica_id, fetch.replica_epoch = 1, 1
    seeds["fetch-follower"] = b"\x01" + fetch.SerializeToString()
    for ts in (-1, -2, -3, 1_700_000_000_000):
        req = pb.ListOffsetsRequest(replica_id=-1, partitions=[
            pb.ListOffsetsPartition(topic="t", partition=0, timestamp=ts, current_leader_epoch=-1)])
        seeds[f"list-offsets{ts}"] = b"\x02" + req.SerializeToString()
    epochs = pb.OffsetsForLeaderEpochRequest(replica_id=-1, partitions=[
        pb.OffsetForLeaderPartition(topic="t", partition=0, current_leader_epoch=0, leader_epoch=0)])
    seeds["offsets-for-epoch"] = b"\x03" + epochs.SerializeToString()
    seeds["metadata-all"] = b"\x04" + pb.MetadataRequest(all_topics=True).SerializeToString()
    seeds["metadata-some"] = b"\x04" + pb.MetadataRequest(topics=["t", "c", "x"]).SerializeToString()
    return seeds


def main() -> None:
    for target, seeds in (("batch_header", batch_header_seeds()), ("records", records_seeds()),
                          ("rpc", rpc_seeds())):
        out = HERE / "corpus" / target
        out.mkdir(parents=True, exist_ok=True)
        for old in out.iterdir():
            old.unlink()
        for name, data in seeds.items():
            digest = hashlib.sha1(data).hexdigest()[:8]
            (out / f"{name}-{digest}").write_bytes(data)
        print(f"{target}: {len(seeds)} seeds in {out}")


if __name__ == "__main__":
    main()
