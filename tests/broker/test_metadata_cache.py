"""MetadataCache applying WatchMetadata snapshots and deltas."""

from __future__ import annotations

import pytest

from broker.metadata_cache import MetadataCache
from proto import common_pb2, controller_pb2


def broker(node_id: int, port: int, *, fenced: bool = False) -> controller_pb2.BrokerRecord:
    return controller_pb2.BrokerRecord(
        node_id=node_id, broker_epoch=10 + node_id, fenced=fenced,
        endpoints=[common_pb2.Endpoint(name="CONTROLLER", host="127.0.0.1", port=port + 1),
                   common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=port)])


def part(topic: str, tid: str, p: int, leader: int, epoch: int, isr: list[int]) -> controller_pb2.PartitionRecord:
    return controller_pb2.PartitionRecord(topic=topic, topic_id=tid, partition=p, replicas=[1, 2, 3], isr=isr,
                                          leader=leader, leader_epoch=epoch, partition_epoch=epoch)


def snapshot() -> controller_pb2.MetadataUpdate:
    return controller_pb2.MetadataUpdate(
        version=5, is_snapshot=True, cluster_id="c1", active_controller_id=2,
        brokers=[broker(1, 9001), broker(2, 9002), broker(3, 9003, fenced=True)],
        topics=[controller_pb2.TopicRecord(name="t", topic_id="T1", partition_count=2,
                                           configs={"min.insync.replicas": "2"})],
        partitions=[part("t", "T1", 0, 1, 0, [1, 2, 3]), part("t", "T1", 1, 2, 0, [1, 2, 3])])


def test_snapshot_then_reads() -> None:
    c = MetadataCache(1)
    d = c.apply(snapshot())
    assert d.is_snapshot and len(d.changed_partitions) == 2
    assert c.version == 5 and c.cluster_id == "c1" and c.controller_id == 2
    assert c.broker(2).port == 9002  # the BROKER listener, not the controller's
    assert c.is_broker_usable(1) and not c.is_broker_usable(3) and not c.is_broker_usable(9)
    assert c.topic("t").configs == {"min.insync.replicas": "2"}
    assert [p.leader for p in c.partitions_of("t")] == [1, 2]
    le = c.leader_and_epoch("t", 1)
    assert (le.leader_id, le.leader_epoch) == (2, 0)
    assert c.leader_and_epoch("nope", 0).leader_id == -1


def test_delta_upserts_partitions_and_deletes_topics() -> None:
    c = MetadataCache(1)
    c.apply(snapshot())
    d = c.apply(controller_pb2.MetadataUpdate(version=6, partitions=[part("t", "T1", 0, 2, 1, [2, 3])]))
    assert [(p.partition, p.leader) for p in d.changed_partitions] == [(0, 2)]
    p0 = c.partition("t", 0)
    assert (p0.leader, p0.leader_epoch, p0.isr) == (2, 1, (2, 3))
    d = c.apply(controller_pb2.MetadataUpdate(version=7, deleted_topic_ids=["T1"]))
    assert [t.name for t in d.deleted_topics] == ["t"]
    assert c.topic("t") is None and c.partition("t", 0) is None and c.version == 7


def test_recreated_topic_with_same_name_replaces_old_incarnation() -> None:
    c = MetadataCache(1)
    c.apply(snapshot())
    d = c.apply(controller_pb2.MetadataUpdate(
        version=8, topics=[controller_pb2.TopicRecord(name="t", topic_id="T2", partition_count=1)],
        partitions=[part("t", "T2", 0, 3, 0, [3])]))
    assert [t.topic_id for t in d.deleted_topics] == ["T1"]
    assert c.topic("t").topic_id == "T2" and c.partition("t", 1) is None
    assert c.partition("t", 0).topic_id == "T2"


def test_snapshot_reports_topics_gone_since_last_view() -> None:
    c = MetadataCache(1)
    c.apply(snapshot())
    d = c.apply(controller_pb2.MetadataUpdate(version=20, is_snapshot=True, brokers=[broker(1, 9001)]))
    assert [t.name for t in d.deleted_topics] == ["t"]
    assert c.brokers()[0].node_id == 1 and len(c.brokers()) == 1


def test_wait_for_wakes_on_update() -> None:
    import threading
    c = MetadataCache(1)
    t = threading.Timer(0.1, lambda: c.apply(snapshot()))
    t.start()
    assert c.wait_for(lambda cache: cache.topic("t") is not None, 5)
    t.join()


def test_a_snapshot_never_shows_a_user_as_gone_while_it_is_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    # Live SASL sessions are checked against the cache on every call, without its lock (broker/sasl.py): a
    # snapshot that emptied the users before filling them again ended every session read meanwhile.
    from broker import metadata_cache
    from metadata_quorum.security_service import credential_record, salted_credential
    from proto import security_pb2

    creds = [salted_credential(user, "SCRAM-SHA-256", f"{user}-pw") for user in ("ann", "ben")]
    c = MetadataCache(1)
    c.apply(controller_pb2.MetadataUpdate(version=5, is_snapshot=True, security=security_pb2.SecurityDelta(
        credentials=[credential_record(cr) for cr in creds])))
    seen: list[object] = []
    real = metadata_cache.sec.ScramCredential

    def reading_meanwhile(*args: object) -> object:  # runs while the snapshot is being applied
        seen.extend(c.scram_credential(cr.user, cr.mechanism) for cr in creds)
        return real(*args)
    monkeypatch.setattr(metadata_cache.sec, "ScramCredential", reading_meanwhile)
    c.apply(controller_pb2.MetadataUpdate(version=9, is_snapshot=True, security=security_pb2.SecurityDelta(
        credentials=[credential_record(cr) for cr in creds])))
    assert seen and None not in seen, f"a user was missing while the snapshot was applied: {seen}"
    monkeypatch.undo()
    assert c.scram_credential("ann", "SCRAM-SHA-256") == creds[0]
