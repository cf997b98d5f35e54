"""One SparkSession for the whole Spark suite (JVM start-up is the expensive part)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

_SESSION: object | None = None
_STARTED = False  # a JVM was started in this process (the session fixture stops it)
JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
MASTER = "local-cluster[1,2,1024]"  # one worker with one executor of 2 cores and 1 GiB


def _start_spark() -> object:
    global _STARTED
    _STARTED = True
    import spark_source

    # Executors in processes of their own (a master, a worker and an executor JVM beside the driver's), as on a
    # real Spark cluster: every test of the folder shows the source needs nothing of the driver's memory.
    session = spark_source.local_session("brook-spark-tests", master=MASTER, conf={
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        "spark.executor.extraJavaOptions": JVM_OPTIONS,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.ui.showConsoleProgress": "false",
        # As local[N]: a failed task fails its job at once (a cluster master's default is 4 attempts, which
        # multiplies the time of every test that expects a job to fail).
        "spark.task.maxFailures": "1",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        # The suite's JVM lives for minutes and runs small jobs: the client compiler alone warms up
        # sooner (the Spark folder took 182 instead of 200 s, excluding the local-cluster test).
        "spark.driver.extraJavaOptions": JVM_OPTIONS,
    })
    spark_source.register(session)
    return session


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the JVM before the first test, while no gRPC thread runs in this process.

    Once earlier tests have used gRPC here (clients, in-process brokers), starting it would risk
    the crash ``spark_source.local_session`` describes (64 of 300 such forks segfaulted in a
    reproduction with live calls), and every Spark test would error with JAVA_GATEWAY_EXITED.
    Collection imports modules but opens no channel, so this is the last safe moment.
    """
    global _SESSION
    if session.config.option.collectonly:
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Under pytest-xdist every worker collects every test, but only one runs this folder, as the
        # first thing it runs (tests/conftest.py puts it first): its first test's setup starts the
        # JVM (below), before that process has used gRPC, and the other worker starts none.
        return
    if _SESSION is None and any("spark" in getattr(item, "fixturenames", ()) for item in session.items):
        _SESSION = _start_spark()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under pytest-xdist: the JVM starts before the first test of this folder, before any fixture
    (the ``brook`` cluster's clients use gRPC)."""
    global _SESSION, _STARTED
    if not _STARTED and os.environ.get("PYTEST_XDIST_WORKER"):
        _SESSION = _start_spark()


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    global _SESSION
    session = _SESSION if _SESSION is not None else _start_spark()
    _SESSION = None
    try:
        yield session
    finally:
        session.stop()  # type: ignore[attr-defined]


class BrookTestCluster:
    """A real 3-node local cluster plus the few admin/produce helpers the Spark tests need."""

    def __init__(self, cluster: object) -> None:
        from metadata_quorum.client import ControllerClient

        self.cluster = cluster
        self.bootstrap: str = cluster.bootstrap_servers  # type: ignore[attr-defined]
        self.controller = ControllerClient(cluster.controller_endpoints, timeout_s=30)  # type: ignore[attr-defined]

    def create_topic(self, name: str, partitions: int, rf: int = 3, configs: dict[str, str] | None = None) -> None:
        from proto import controller_pb2

        req = controller_pb2.CreateTopicsRequest(
            topics=[controller_pb2.CreatableTopic(
                name=name, num_partitions=partitions, replication_factor=rf, configs=configs or {})],
            timeout_ms=30_000,
        )
        resp = self.controller.call("CreateTopics", req)
        for r in resp.results:
            assert r.error_code == 0, (r.name, r.error_code, r.error_message)
        self.wait_partitions(name, partitions)

    def add_partitions(self, name: str, total: int) -> None:
        from proto import controller_pb2

        req = controller_pb2.CreatePartitionsRequest(
            topics=[controller_pb2.CreatePartitionsTopic(name=name, count=total)], timeout_ms=30_000)
        resp = self.controller.call("CreatePartitions", req)
        for r in resp.results:
            assert r.error_code == 0, (r.name, r.error_code, r.error_message)
        self.wait_partitions(name, total)

    def wait_partitions(self, name: str, count: int, timeout_s: float = 30.0) -> None:
        """Until every broker's metadata shows ``count`` partitions with leaders: the Spark job's own
        clients may ask any of them, and a broker can be a moment behind another."""
        from client.admin import Admin
        from client.errors import BrookError

        with Admin(self.bootstrap) as admin:
            try:
                admin.wait_for_topics([name], timeout_ms=int(timeout_s * 1000), min_partitions={name: count})
            except BrookError as e:
                raise AssertionError(f"topic {name} did not get {count} led partitions in {timeout_s} s: {e}") from None
            admin.wait_for_brokers(admin.cluster.metadata_snapshot().version, timeout_ms=int(timeout_s * 1000))

    def producer(self, **config: object):  # type: ignore[no-untyped-def]
        from client.producer import Producer

        return Producer(bootstrap_servers=self.bootstrap, **{"acks": "all", "linger_ms": 2, **config})

    def produce(self, topic: str, values: list[bytes], *, partition: int | None = None,
                keys: list[bytes | None] | None = None, **config: object) -> dict[tuple[int, int], bytes]:
        """Produce with acks=all; returns {(partition, offset): value} of the acknowledged records."""
        with self.producer(**config) as p:
            futures = [p.send(topic, v, key=(keys[i] if keys else None), partition=partition)
                       for i, v in enumerate(values)]
            p.flush(timeout=60)
            out = {}
            for v, f in zip(values, futures, strict=True):
                md = f.result(timeout=60)
                out[(md.partition, md.offset)] = v
        return out

    def high_watermarks(self, topic: str) -> dict[int, int]:
        from client.cluster import ClusterClient
        from client.types import TopicPartition

        with ClusterClient(self.bootstrap) as client:
            parts = client.partitions_for(topic, refresh=True)
            res = client.list_offsets({TopicPartition(topic, p): -1 for p in parts})
        return {tp.partition: off for tp, (off, _) in res.items()}

    def close(self) -> None:
        self.controller.close()


@pytest.fixture(scope="session")
def brook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrookTestCluster]:
    """One 3-node cluster for the Spark suite (topics are per test)."""
    from deploy.local.cluster import LocalCluster

    # A paused follower stays registered and in the ISR for a while, so a test can hold the
    # HW below the LEO.
    overrides = {
        "replica.lag.time.max.ms": "60000",
        "broker.session.timeout.ms": "60000",
        "log.retention.check.interval.ms": "1000",
        # The tests write records stamped in 2023 (fixed timestamps to read by): as Kafka does, retention takes
        # a whole log, its active segment too, once its newest record is past retention.ms. Topics that test
        # retention set their own.
        "log.retention.ms": "-1",
    }
    with LocalCluster(tmp_path_factory.mktemp("brook-spark"), nodes=3, overrides=overrides) as cluster:
        helper = BrookTestCluster(cluster)
        try:
            yield helper
        finally:
            helper.close()
