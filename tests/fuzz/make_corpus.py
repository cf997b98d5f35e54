"""Write the seed corpus of the fuzz targets into tests/fuzz/corpus/<target>/ (committed).

    python tests/fuzz/make_corpus.py

Seeds are valid inputs of every shape the targets take (so mutations start from deep
in the parsers) plus the attacks of issue 11. Deterministic: re-running writes the same
files. Nothing already in a corpus is removed: the inputs a fuzz run found and a commit added
by hand (``DescribeQuorumRequest-fuzzed``, ``ProduceRequest-acks0-refused``: the smoke test
replays them) stay, and so do seeds of versions the generator has since moved past.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "storage"))

from batch_forge import batch, record, records, valid  # noqa: E402

from proto import broker_pb2, common_pb2  # noqa: E402
from proto import controller_pb2 as cpb  # noqa: E402
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
    # Stamped 20 years after the batch's base timestamp: past message.timestamp.after.max.ms (INVALID_TIMESTAMP).
    seeds["future-timestamp"] = bytes([0]) + (1).to_bytes(2, "big") + record(0, b"k", b"v", ts_delta=20 * 365 * 86_400_000)
    return seeds


def rpc_seeds() -> dict[str, bytes]:
    pb = broker_pb2
    seeds: dict[str, bytes] = {}
    from targets import BROKER_RPCS, GROUP_RPCS

    def produce(name: str, topic: str, records_: bytes, acks: int = 1) -> None:
        req = pb.ProduceRequest(acks=acks, timeout_ms=100, partitions=[
            pb.ProducePartitionData(topic=topic, partition=0, records=records_)])
        seeds[f"produce-{name}"] = b"\x00" + req.SerializeToString(deterministic=True)

    for c in CODECS:
        produce(f"codec{c}", "t", valid(4, codec=c))
    produce("compacted", "c", valid(3))
    produce("compacted-keyless", "c", valid(3, keys=False))
    produce("bad-count", "t", batch(records(3), count=5), acks=-1)
    produce("unknown-topic", "nope", valid(1))
    fetch = pb.FetchRequest(replica_id=-1, replica_epoch=-1, max_bytes=1 << 20, partitions=[
        pb.FetchPartition(topic="t", partition=0, fetch_offset=0, partition_max_bytes=1 << 20,
                          current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)])
    seeds["fetch-consumer"] = b"\x01" + fetch.SerializeToString(deterministic=True)
    fetch.replica_id, fetch.replica_epoch = 1, 1
    seeds["fetch-follower"] = b"\x01" + fetch.SerializeToString(deterministic=True)
    for ts in (-1, -2, -3, 1_700_000_000_000):
        req = pb.ListOffsetsRequest(replica_id=-1, partitions=[
            pb.ListOffsetsPartition(topic="t", partition=0, timestamp=ts, current_leader_epoch=-1)])
        seeds[f"list-offsets{ts}"] = b"\x02" + req.SerializeToString(deterministic=True)
    epochs = pb.OffsetsForLeaderEpochRequest(replica_id=-1, partitions=[
        pb.OffsetForLeaderPartition(topic="t", partition=0, current_leader_epoch=0, leader_epoch=0)])
    seeds["offsets-for-epoch"] = b"\x03" + epochs.SerializeToString(deterministic=True)
    seeds["metadata-all"] = b"\x04" + pb.MetadataRequest(all_topics=True).SerializeToString(deterministic=True)
    seeds["metadata-some"] = b"\x04" + pb.MetadataRequest(topics=["t", "c", "x"]).SerializeToString(deterministic=True)
    seeds["init-producer-id"] = b"\x05" + pb.InitProducerIdRequest(producer_id=7, producer_epoch=3).SerializeToString(deterministic=True)
    for offset in (-1, 0, 3, 1 << 40):
        req = pb.DeleteRecordsRequest(timeout_ms=100, partitions=[
            pb.DeleteRecordsPartition(topic="t", partition=0, offset=offset),
            pb.DeleteRecordsPartition(topic="__consumer_offsets", partition=0, offset=0)])
        seeds[f"delete-records{offset}"] = b"\x06" + req.SerializeToString(deterministic=True)
    # A follower fetch session of broker 2 for topic r (RF 2): from 0, then further on, a consumer's
    # fetch (refused on the stream), then partitions that are not its and an offset out of range.
    def follower(offset: int, epoch: int = 0) -> object:
        return pb.FetchRequest(replica_id=2, replica_epoch=1, max_bytes=1 << 20, partitions=[
            pb.FetchPartition(topic="r", partition=0, fetch_offset=offset, partition_max_bytes=1 << 20,
                              current_leader_epoch=epoch, last_fetched_epoch=epoch if offset else -1,
                              log_start_offset=0)])
    session = [follower(0), follower(3), follower(0), pb.FetchRequest(replica_id=2, replica_epoch=1, max_bytes=1 << 20,
                                                                     partitions=[
        pb.FetchPartition(topic="t", partition=0, fetch_offset=0, partition_max_bytes=1 << 20, current_leader_epoch=0,
                          last_fetched_epoch=-1, log_start_offset=0),
        pb.FetchPartition(topic="c", partition=0, fetch_offset=0, partition_max_bytes=1 << 20, current_leader_epoch=0,
                          last_fetched_epoch=-1, log_start_offset=0)]),
        pb.FetchRequest(replica_id=-1, max_bytes=1 << 20, partitions=[
            pb.FetchPartition(topic="t", partition=1, fetch_offset=0, partition_max_bytes=1 << 20)]),
        pb.FetchRequest(replica_id=2, replica_epoch=1, max_bytes=1 << 20, partitions=[
            pb.FetchPartition(topic="nope", partition=0, fetch_offset=0, partition_max_bytes=1 << 20),
            pb.FetchPartition(topic="r", partition=0, fetch_offset=1 << 40, partition_max_bytes=1 << 20,
                              current_leader_epoch=9, last_fetched_epoch=9)])]
    seeds["replica-fetch-session"] = bytes([len(BROKER_RPCS) + len(GROUP_RPCS)]) + b"".join(
        len(m).to_bytes(2, "big") + m for m in (r.SerializeToString(deterministic=True) for r in session))

    def part(topic: str, partition: int, offset: int = 0) -> object:
        return pb.FetchPartition(topic=topic, partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20,
                                 current_leader_epoch=0, last_fetched_epoch=0 if offset else -1, log_start_offset=0)
    # A fetch session (broker/fetch_session.py): full, then incremental requests naming what changed,
    # a duplicate, a partition forgotten, one never held forgotten, and a full request starting over.
    incremental = [
        pb.FetchRequest(replica_id=2, replica_epoch=1, max_bytes=1 << 20,
                        partitions=[part("r", 0), part("t", 0), part("t", 1)]),
        pb.FetchRequest(replica_id=2, replica_epoch=1, max_bytes=1 << 20, incremental=True,
                        partitions=[part("r", 0, 3), part("r", 0, 3)]),
        pb.FetchRequest(replica_id=2, replica_epoch=1, max_bytes=1 << 20, incremental=True),
        pb.FetchRequest(replica_id=2, replica_epoch=1, max_bytes=1 << 20, incremental=True,
                        partitions=[part("nope", 0)],
                        forgotten=[pb.FetchForgotten(topic="t", partition=1), pb.FetchForgotten(topic="x", partition=9)]),
        pb.FetchRequest(replica_id=2, replica_epoch=1, max_bytes=1 << 20, partitions=[part("c", 0)])]
    seeds["replica-fetch-incremental"] = bytes([len(BROKER_RPCS) + len(GROUP_RPCS)]) + b"".join(
        len(m).to_bytes(2, "big") + m for m in (r.SerializeToString(deterministic=True) for r in incremental))
    produce_session = [
        pb.ProduceRequest(acks=1, timeout_ms=100, partitions=[pb.ProducePartitionData(
            topic="t", partition=0, records=valid(3))]),
        pb.ProduceRequest(acks=-1, timeout_ms=100, partitions=[
            pb.ProducePartitionData(topic="t", partition=1, records=valid(2, codec=rb.CODEC_LZ4)),
            pb.ProducePartitionData(topic="r", partition=0, records=valid(2))]),
        pb.ProduceRequest(acks=0, timeout_ms=100, partitions=[pb.ProducePartitionData(
            topic="nope", partition=0, records=valid(1))]),
        pb.ProduceRequest(acks=7, partitions=[pb.ProducePartitionData(topic="t", partition=2, records=b"\x00" * 61)]),
        pb.ProduceRequest(acks=1, timeout_ms=100, partitions=[pb.ProducePartitionData(
            topic="c", partition=0, records=valid(2))])]
    seeds["produce-stream-session"] = bytes([len(BROKER_RPCS) + len(GROUP_RPCS) + 1]) + b"".join(
        len(m).to_bytes(2, "big") + m for m in (r.SerializeToString(deterministic=True) for r in produce_session))
    def consumer(*parts: object, **fields: int) -> object:
        return pb.FetchRequest(**{"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, **fields},
                               partitions=parts)
    fetch_session = [
        consumer(part("t", 0)),
        consumer(part("t", 1), part("nope", 0), part("c", 0, 1 << 40)),
        consumer(part("r", 0), replica_id=2),  # a follower's fetch on a consumer stream: refused
        consumer(part("t", 2, 0), part("t", 2, 0), max_bytes=0),
        consumer()]
    seeds["fetch-stream-session"] = bytes([len(BROKER_RPCS) + len(GROUP_RPCS) + 2]) + b"".join(
        len(m).to_bytes(2, "big") + m for m in (r.SerializeToString(deterministic=True) for r in fetch_session))
    seeds["log-dirs-all"] = b"\x07" + pb.DescribeLogDirsRequest().SerializeToString(deterministic=True)
    seeds["log-dirs-some"] = b"\x07" + pb.DescribeLogDirsRequest(topics=["t", "nope"]).SerializeToString(deterministic=True)

    from proto import group_pb2 as g

    def group(name: str, msg: object) -> None:
        index = len(BROKER_RPCS) + GROUP_RPCS.index(type(msg).__name__.removesuffix("Request"))
        seeds[f"group-{name}"] = bytes([index]) + msg.SerializeToString(deterministic=True)  # type: ignore[attr-defined]

    protocols = [g.GroupProtocol(name="range", metadata=b"\x00\x01"), g.GroupProtocol(name="cooperative-sticky")]
    group("find", g.FindCoordinatorRequest(group_id="g"))
    group("join-new", g.JoinGroupRequest(group_id="g", protocol_type="consumer", session_timeout_ms=10000,
                                         rebalance_timeout_ms=10000, protocols=protocols))
    group("join-member", g.JoinGroupRequest(group_id="g", member_id="member-1", protocol_type="consumer",
                                            session_timeout_ms=10000, rebalance_timeout_ms=10000,
                                            protocols=protocols))
    group("sync", g.SyncGroupRequest(group_id="g", member_id="member-1", generation_id=1, assignments=[
        g.SyncGroupAssignment(member_id="member-1", assignment=b"a")]))
    group("heartbeat", g.HeartbeatRequest(group_id="g", member_id="member-1", generation_id=1))
    group("leave", g.LeaveGroupRequest(group_id="g", member_ids=["member-1", "x"]))
    group("commit", g.OffsetCommitRequest(group_id="g", generation_id=-1, partitions=[
        g.OffsetCommitPartition(topic="t", partition=0, offset=5, metadata="m"),
        g.OffsetCommitPartition(topic="nope", partition=9, offset=-7)]))
    group("fetch", g.OffsetFetchRequest(group_id="g"))
    group("list", g.ListGroupsRequest(states=["Stable", "Empty"]))
    group("describe", g.DescribeGroupsRequest(group_ids=["g", "x"], include_offsets=True))
    group("delete", g.DeleteGroupsRequest(group_ids=["g"]))
    group("offset-delete", g.OffsetDeleteRequest(group_id="g", partitions=[g.TopicPartitionRef(topic="t")]))
    group("alter", g.AlterGroupOffsetsRequest(group_id="g", specs=[
        g.OffsetResetSpec(topic="t", partition=-1, kind=g.RESET_EXPLICIT, value=3)], dry_run=True))
    return seeds


def controller_seeds() -> dict[str, bytes]:
    """One valid request per ControllerService RPC (first byte: which RPC, in targets.CONTROLLER_RPCS
    order; second byte: bit 0 set for a remote, untrusted peer)."""
    from targets import CONTROLLER_RPCS

    def seed(name: str, msg: object, remote: bool = False) -> None:
        seeds[f"{name}{'-remote' if remote else ''}"] = (
            bytes([CONTROLLER_RPCS.index(type(msg).__name__.removesuffix("Request")), int(remote)])
            + msg.SerializeToString(deterministic=True))  # type: ignore[attr-defined]

    seeds: dict[str, bytes] = {}
    endpoint = common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=9002)
    seed("register", cpb.RegisterBrokerRequest(node_id=2, incarnation_id="inc-2", cluster_id="fuzz",
                                               endpoints=[endpoint]))
    seed("register", cpb.RegisterBrokerRequest(node_id=3, incarnation_id="forged", cluster_id="fuzz",
                                               endpoints=[endpoint]), remote=True)
    seed("heartbeat", cpb.BrokerHeartbeatRequest(node_id=1, broker_epoch=1, current_metadata_version=5))
    seed("shutdown", cpb.ControlledShutdownRequest(node_id=3, broker_epoch=3))
    seed("alter", cpb.AlterPartitionRequest(broker_id=1, broker_epoch=1, items=[cpb.AlterPartitionItem(
        topic="t", partition=0, leader_epoch=0, partition_epoch=0, new_isr=[1, 2])]))
    seed("create", cpb.CreateTopicsRequest(timeout_ms=1000, topics=[
        cpb.CreatableTopic(name="t", num_partitions=3, replication_factor=3, configs={"cleanup.policy": "compact"}),
        cpb.CreatableTopic(name="m", assignments=[cpb.ReplicaList(replicas=[1, 2])])]))
    seed("create-huge", cpb.CreateTopicsRequest(topics=[cpb.CreatableTopic(name="h", num_partitions=1_000_000,
                                                                           replication_factor=3)]))
    seed("delete", cpb.DeleteTopicsRequest(names=["t", "__consumer_offsets", "x"]))
    seed("partitions", cpb.CreatePartitionsRequest(topics=[cpb.CreatePartitionsTopic(name="t", count=5)]))
    seed("alter-configs", cpb.AlterConfigsRequest(resources=[cpb.AlterConfigsResource(
        topic="t", set={"retention.ms": "1000", "min.insync.replicas": "9"}, delete=["cleanup.policy"])]))
    seed("describe-configs", cpb.DescribeConfigsRequest(topics=["t", "nope"]))
    seed("describe-cluster", cpb.DescribeClusterRequest())
    seed("describe-quorum", cpb.DescribeQuorumRequest())
    seed("producer-ids", cpb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=1))
    seed("watch", cpb.WatchMetadataRequest(broker_id=1, since_version=0))
    seed("watch", cpb.WatchMetadataRequest(broker_id=2, since_version=3), remote=True)
    seed("elect-all", cpb.ElectLeadersRequest(election_type=cpb.PREFERRED))
    seed("elect-some", cpb.ElectLeadersRequest(election_type=cpb.UNCLEAN, topic_partitions=[
        cpb.TopicPartitions(topic="t", partitions=[0, 7]), cpb.TopicPartitions(topic="nope")]), remote=True)
    seed("move", cpb.AlterPartitionReassignmentsRequest(partitions=[
        cpb.ReassignablePartition(topic="t", partition=0, replicas=[2, 1, 3]),
        cpb.ReassignablePartition(topic="t", partition=1, cancel=True),
        cpb.ReassignablePartition(topic="t", partition=2, replicas=[9, 9])]))
    seed("moves", cpb.ListPartitionReassignmentsRequest(topic_partitions=[cpb.TopicPartitions(topic="t")]))
    seed("unregister", cpb.UnregisterBrokerRequest(broker_id=3), remote=True)
    seed("cluster-configs", cpb.AlterClusterConfigsRequest(set={"log.retention.ms": "1000",
                                                                "follower.replication.throttled.rate": "x"},
                                                           delete=["min.insync.replicas"]))
    seed("describe-cluster-configs", cpb.DescribeClusterConfigsRequest())
    from targets import SECURITY_RPCS

    from proto import security_pb2 as spb

    def sec(name: str, msg: object, remote: bool = False) -> None:
        index = len(CONTROLLER_RPCS) + SECURITY_RPCS.index(type(msg).__name__.removesuffix("Request"))
        seeds[f"security-{name}{'-remote' if remote else ''}"] = (
            bytes([index, int(remote)]) + msg.SerializeToString(deterministic=True))  # type: ignore[attr-defined]

    sec("sasl-first", spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256", auth_bytes=b"n,,n=admin,r=abc"))
    sec("sasl-final", spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-512", auth_bytes=b"c=biws,r=abcdef,p=AAAA",
                                                  exchange_id="x"))
    sec("upsert", spb.UpsertScramCredentialsRequest(credentials=[spb.ScramCredentialRecord(
        user="alice", mechanism="SCRAM-SHA-256", salt=b"s" * 16, iterations=4096,
        stored_key=b"k" * 32, server_key=b"v" * 32)]))
    sec("delete-user", spb.DeleteScramCredentialsRequest(items=[
        spb.DeleteScramCredentialsRequest.Item(user="alice")]))
    sec("users", spb.DescribeUsersRequest())
    sec("create-acls", spb.CreateAclsRequest(acls=[spb.AclBinding(
        resource_type="TOPIC", resource_name="t", pattern_type="PREFIXED", principal="User:alice", host="*",
        operation="READ", permission="ALLOW")]))
    sec("describe-acls", spb.DescribeAclsRequest(filter=spb.AclFilter(resource_type="TOPIC")))
    sec("delete-acls", spb.DeleteAclsRequest(filters=[spb.AclFilter(principal="User:alice")]))
    sec("quotas", spb.AlterClientQuotasRequest(entity="User:alice", set={"producer_byte_rate": 1024.0},
                                               remove=["request_rate"]))
    sec("describe-quotas", spb.DescribeClientQuotasRequest())
    return seeds


def kafka_seeds() -> dict[str, bytes]:
    """Frames (size prefix off) of every Kafka API the listener serves, at its lowest and highest version."""
    import io

    from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
    from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
    from kio.serial import entity_writer

    from broker.kafka_wire import admin_apis, apis, codec, txn_apis
    from storage.record_batch import RecordBatchBuilder

    batch_bytes = valid(3)
    txn_builder = RecordBatchBuilder(producer_id=0, producer_epoch=0, base_sequence=0, is_transactional=True)
    txn_builder.append(0, b"k", b"v")
    transactional_batch = txn_builder.build()
    group = {"group_id": "g", "member_id": "", "generation_id": -1, "generation_id_or_member_epoch": -1,
             "protocol_type": "consumer", "session_timeout": 6000, "rebalance_timeout": 6000}
    values: dict[int, dict[str, object]] = {
        apis.PRODUCE: {"acks": 1, "timeout": 0, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": batch_bytes}, {"index": 9, "records": b"x"}]},
            {"name": "c", "partition_data": [{"index": 0, "records": batch_bytes}]}]},
        apis.FETCH: {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "session_epoch": -1,
                     "topics": [{"topic": "t", "partitions": [
                         {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                          "current_leader_epoch": -1, "log_start_offset": -1, "last_fetched_epoch": -1}]}]},
        apis.LIST_OFFSETS: {"replica_id": -1, "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "timestamp": -1, "current_leader_epoch": -1},
            {"partition_index": 1, "timestamp": -2, "current_leader_epoch": -1}]}]},
        apis.METADATA: {"topics": [{"name": "t"}, {"name": "nope"}], "allow_auto_topic_creation": False},
        apis.OFFSET_COMMIT: {**group, "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "committed_offset": 3, "committed_metadata": "m"}]}]},
        apis.OFFSET_FETCH: {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0, 1]}]},
        apis.FIND_COORDINATOR: {"key": "g", "key_type": 0, "coordinator_keys": ["g", "h"]},
        apis.JOIN_GROUP: {**group, "protocols": [{"name": "range", "metadata": b"\0\0\0\0\0\1\0\1t\0\0\0\0"}]},
        apis.HEARTBEAT: group,
        apis.LEAVE_GROUP: {**group, "members": [{"member_id": "m"}]},
        apis.SYNC_GROUP: {**group, "protocol_name": "range", "assignments": [{"member_id": "m", "assignment": b""}]},
        apis.DESCRIBE_GROUPS: {"groups": ["g", "h"]},
        apis.LIST_GROUPS: {"states_filter": ["Stable"]},
        apis.API_VERSIONS: {"client_software_name": "fuzz", "client_software_version": "1"},
        apis.INIT_PRODUCER_ID: {"transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1},
        # Transactions: ids, a partition added, an end; a transactional Produce (verified before it is appended)
        txn_apis.ADD_PARTITIONS_TO_TXN: {"v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": 0,
                                         "v3_and_below_producer_epoch": 0, "v3_and_below_topics": [
                                             {"name": "t", "partitions": [0, 1]}, {"name": "nope", "partitions": [0]}]},
        txn_apis.END_TXN: {"transactional_id": "tx", "producer_id": 0, "producer_epoch": 0, "committed": True},
        txn_apis.ADD_OFFSETS_TO_TXN: {"transactional_id": "tx", "producer_id": 0, "producer_epoch": 1, "group_id": "g"},
        txn_apis.TXN_OFFSET_COMMIT: {"transactional_id": "tx", "group_id": "g", "producer_id": 0, "producer_epoch": 1,
                                     "generation_id": -1, "member_id": "", "topics": [{"name": "t", "partitions": [
                                         {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                                          "committed_metadata": "m"}]}]},
        txn_apis.DESCRIBE_TRANSACTIONS: {"transactional_ids": ["tx", "nope"]},
        txn_apis.WRITE_TXN_MARKERS: {"markers": [{"producer_id": 0, "producer_epoch": 0, "transaction_result": False,
                                                  "coordinator_epoch": -1, "topics": [
                                                      {"name": "t", "partition_indexes": [0, 1]},
                                                      {"name": "nope", "partition_indexes": [0]}]}]},
        txn_apis.LIST_TRANSACTIONS: {"state_filters": ["Ongoing", "Bogus"], "producer_id_filters": [0],
                                     "duration_filter": -1, "transactional_id_pattern": "t.*"},
        apis.OFFSET_FOR_LEADER_EPOCH: {"replica_id": -1, "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]},
        apis.DELETE_GROUPS: {"groups_names": ["g"]},
        apis.OFFSET_DELETE: {"group_id": "g", "topics": [{"name": "t", "partitions": [{"partition_index": 0}]}]},
        admin_apis.LIST_CONFIG_RESOURCES: {"resource_types": [2, 4, 8, 64]},
        # KIP-848: a join naming a topic, and a heartbeat owning partitions of a made-up topic id
        apis.CONSUMER_GROUP_HEARTBEAT: {"group_id": "g", "member_id": "m", "member_epoch": 0,
                                        "rebalance_timeout": 30000, "subscribed_topic_names": ["t"],
                                        "subscribed_topic_regex": "t.*", "topic_partitions": [
                                            {"topic_id": "00000000000000000000000000000001", "partitions": [0]}]},
        apis.CONSUMER_GROUP_DESCRIBE: {"group_ids": ["g", "h"], "include_authorized_operations": True},
    }
    extra = {  # a second seed of an API, named apart
        "InitProducerIdTxn": (apis.INIT_PRODUCER_ID, {"transactional_id": "tx", "transaction_timeout": 60000,
                                                       "producer_id": -1, "producer_epoch": -1}),
        "FindCoordinatorTxn": (apis.FIND_COORDINATOR, {"key": "tx", "key_type": 1, "coordinator_keys": ["tx"]}),
        "ProduceTxn": (apis.PRODUCE, {"transactional_id": "tx", "acks": -1, "timeout": 0, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": transactional_batch}]}]}),
    }
    seeds: dict[str, bytes] = {}
    for name, (api_key, fields) in extra.items():
        lo, hi = apis.SUPPORTED[api_key]
        for version in sorted({max(lo, 3), hi}):
            cls = codec.request_schema(api_key, version)
            header_cls = HeaderV2 if cls.__flexible__ else HeaderV1
            buf = io.BytesIO()
            entity_writer(header_cls)(buf, header_cls(request_api_key=api_key, request_api_version=version,
                                                      correlation_id=1, client_id="fuzz"))
            entity_writer(cls)(buf, codec.build(cls, fields))
            seeds[f"{name}-v{version}"] = buf.getvalue()
    for api_key, (lo, hi) in sorted(apis.SUPPORTED.items()):
        if api_key not in values:
            continue
        for version in sorted({lo, hi}):
            cls = codec.request_schema(api_key, version)
            header_cls = HeaderV2 if cls.__flexible__ else HeaderV1
            buf = io.BytesIO()
            entity_writer(header_cls)(buf, header_cls(request_api_key=api_key, request_api_version=version,
                                                      correlation_id=1, client_id="fuzz"))
            entity_writer(cls)(buf, codec.build(cls, values[api_key]))
            seeds[f"{cls.__name__}-v{version}"] = buf.getvalue()
    return seeds


def quorum_seeds() -> dict[str, bytes]:
    """A byte (bit 0: to the leader A, else to follower B; bit 1: from C, else from the other of A and B), then the
    pickled Raft message, at the terms and indexes the harness's voters hold (term 1, entries 1-5)."""
    import pickle

    from metadata_quorum.prevote import PRE_VOTE, PRE_VOTE_RESPONSE

    command = b"\x00" + pickle.dumps((0, ("w",)), 2)  # a replicated list's append, as the harness's entries
    big = pickle.dumps((command + b"p" * 200, 6, 1), 2)
    to_b, to_b_from_c, to_a_from_b, to_a_from_c = b"\x00", b"\x02", b"\x01", b"\x03"

    def append(**fields: object) -> dict[str, object]:
        return {"type": "append_entries", "term": 1, "commit_index": 5, "prevLogIdx": 5, "prevLogTerm": 1, **fields}

    messages = {
        "heartbeat": (to_b, append()),
        "entries": (to_b, append(entries=[(command, 6, 1), (b"\x01", 7, 1)], commit_index=6)),
        "conflict": (to_b, append(term=2, prevLogIdx=3, entries=[(command, 4, 2)])),
        "repeat": (to_b, append(prevLogIdx=2, entries=[(command, 3, 1)])),
        "gap": (to_b, append(prevLogIdx=9, prevLogTerm=1)),
        "in-parts-start": (to_b, append(transmission="start", data=big[:100])),
        "in-parts-finish": (to_b, append(transmission="finish", data=big[100:])),
        "snapshot-piece": (to_b, {"type": "append_entries", "term": 1, "commit_index": 5,
                                  "serialized": (b"snapshot", True, False)}),
        "request-vote": (to_b_from_c, {"type": "request_vote", "term": 2, "last_log_term": 1, "last_log_index": 5}),
        "timeout-now": (to_b, {"type": "timeout_now", "term": 1}),
        "pre-vote": (to_b_from_c, {"type": PRE_VOTE, "round": 1, "term": 2, "last_log_term": 1, "last_log_index": 5}),
        "apply-command-response": (to_b, {"type": "apply_command_response", "request_id": 1, "log_idx": 6,
                                          "log_term": 1}),
        "next-node-idx": (to_a_from_b, {"type": "next_node_idx", "next_node_idx": 6, "reset": False, "success": True,
                                        "term": 1}),
        "next-node-idx-reset": (to_a_from_c, {"type": "next_node_idx", "next_node_idx": 2, "reset": True,
                                              "success": False, "term": 1}),
        "response-vote": (to_a_from_b, {"type": "response_vote", "term": 1}),
        "pre-vote-response": (to_a_from_c, {"type": PRE_VOTE_RESPONSE, "round": 1, "term": 1, "granted": True}),
        "apply-command": (to_a_from_b, {"type": "apply_command", "command": command, "request_id": 1}),
        "higher-term-vote": (to_a_from_c, {"type": "request_vote", "term": 5, "last_log_term": 1,
                                           "last_log_index": 5}),
        # Hostile: what the quorum port must drop.
        "term-2-64": (to_b, append(term=1 << 64)),
        "term-float": (to_b_from_c, {"type": "request_vote", "term": 2.5, "last_log_term": 1, "last_log_index": 5}),
        "entry-str": (to_b, append(entries=[("text", 6, 1)])),
        "not-a-dict": (to_a_from_b, [1, 2]),
    }
    seeds = {}
    for name, (head, message) in messages.items():
        for protocol in (2, 4):
            seeds[f"{name}-p{protocol}"] = head + pickle.dumps(message, protocol)
    return seeds


def main() -> None:
    sys.path.insert(0, str(HERE))
    for target, seeds in (("batch_header", batch_header_seeds()), ("records", records_seeds()),
                          ("rpc", rpc_seeds()), ("controller", controller_seeds()), ("kafka", kafka_seeds()),
                          ("quorum", quorum_seeds())):
        out = HERE / "corpus" / target
        out.mkdir(parents=True, exist_ok=True)
        added = 0
        for name, data in seeds.items():
            path = out / f"{name}-{hashlib.sha1(data).hexdigest()[:8]}"
            added += not path.exists()
            path.write_bytes(data)
        print(f"{target}: {len(seeds)} seeds ({added} new) in {out}")


if __name__ == "__main__":
    main()
