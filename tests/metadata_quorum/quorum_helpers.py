"""Shared helpers for the quorum tests (imported by path-based test modules)."""

from __future__ import annotations

import contextlib
import secrets
import types
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from waiting import wait_for

from broker.authorizer import Authorizer
from broker.principal import Authentication, Principal
from deploy.local.cluster import free_port
from metadata_quorum.client import ControllerClient
from metadata_quorum.controller import ControllerConfig, QuorumController
from metadata_quorum.raft import MetadataRaft, RaftTiming
from metadata_quorum.service import ControllerService, no_redirect
from proto import common_pb2
from proto import controller_pb2 as pb


def register_brokers(client: ControllerClient, ids: list[int], cluster_id: str, *, rack: str = "") -> dict[int, int]:
    """Register and unfence brokers; returns broker id -> broker epoch."""
    epochs = {}
    for b in ids:
        r = client.call("RegisterBroker", pb.RegisterBrokerRequest(
            node_id=b, incarnation_id=f"incarnation-{b}", cluster_id=cluster_id, rack=rack,
            endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19000 + b)]))
        epochs[b] = r.broker_epoch
        h = client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(
            node_id=b, broker_epoch=r.broker_epoch, current_metadata_version=r.broker_epoch))
        assert not h.is_fenced, f"broker {b} still fenced after catching up: {h}"
    return epochs


def heartbeat_all(client: ControllerClient, epochs: dict[int, int]) -> None:
    for b, e in epochs.items():
        client.call("BrokerHeartbeat", pb.BrokerHeartbeatRequest(node_id=b, broker_epoch=e,
                                                                 current_metadata_version=1 << 40))


def create_topic(client: ControllerClient, name: str, partitions: int, rf: int, **kw: object) -> pb.TopicResult:
    r = client.call("CreateTopics", pb.CreateTopicsRequest(
        topics=[pb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf,
                                  configs=kw.get("configs") or {},  # type: ignore[arg-type]
                                  request_id=kw.get("request_id", uuid.uuid4().hex))]))  # type: ignore[arg-type]
    return r.results[0]


def caller(name: str, method: str) -> types.SimpleNamespace:
    """A call's context as the Kafka listener's connections carry it: a fixed authentication."""
    return types.SimpleNamespace(brook_authentication=Authentication(Principal("User", name), method, "kafka:10.0.0.5"),
                                 time_remaining=lambda: None)


@contextlib.contextmanager
def single_voter(directory: Path, config: ControllerConfig, **kwargs: object) -> Iterator[QuorumController]:
    """One real voter (pysyncobj on loopback) and its QuorumController, active once this yields."""
    raft = MetadataRaft(f"127.0.0.1:{free_port()}", [], directory, password=secrets.token_urlsafe(24))
    try:
        raft.wait_bound()
        ctl = QuorumController(config, raft, **kwargs)  # type: ignore[arg-type]

        def active() -> bool:
            ctl.tick()
            return ctl.is_active()

        wait_for(active, 30, "the single voter to become the active controller")
        yield ctl
    finally:
        raft.destroy_synchronous()


# Generous timing for in-process voters: the machine is shared, a spurious election would only add noise.
GENEROUS_TIMING = RaftTiming(election_timeout_min_s=1.0, election_timeout_max_s=2.0, leader_fallback_timeout_s=6.0)


@contextlib.contextmanager
def three_voters(directory: Path, controller: Callable[[int, MetadataRaft, list[str]], QuorumController]
                 ) -> Iterator[list[tuple[MetadataRaft, QuorumController]]]:
    """Three real voters (pysyncobj on loopback, one process) and their controllers, ``controller(node id, raft,
    every voter's address)``, whose ticks the caller calls itself."""
    password = secrets.token_urlsafe(24)
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    out: list[tuple[MetadataRaft, QuorumController]] = []
    try:
        for i, address in enumerate(addresses, start=1):
            raft = MetadataRaft(address, [a for a in addresses if a != address], directory / f"v{i}",
                                password=password, timing=GENEROUS_TIMING)
            out.append((raft, controller(i, raft, addresses)))
        for raft, _ in out:
            raft.wait_bound()
        yield out
    finally:
        for raft, _ in out:
            raft.destroy_synchronous()


def register_on(ctl: QuorumController, ids: Iterable[int], cluster_id: str, *, supported: int = 0) -> None:
    """Register and heartbeat brokers on an in-process controller (``supported``: the highest feature level their
    release reports; 0: none, as a release before feature levels)."""
    for b in ids:
        r = ctl.register_broker(pb.RegisterBrokerRequest(
            node_id=b, incarnation_id=f"i{b}", cluster_id=cluster_id, supported_metadata_level=supported,
            endpoints=[common_pb2.Endpoint(name="BROKER", host="127.0.0.1", port=19000 + b)]), 30)
        ctl.heartbeat(pb.BrokerHeartbeatRequest(node_id=b, broker_epoch=r.broker_epoch,
                                                current_metadata_version=1 << 40), 30)


@contextlib.contextmanager
def in_process_service(directory: Path, cluster_id: str, authorizer: Authorizer, defaults: dict[str, str],
                       clock: Callable[[], float] | None = None) -> Iterator[ControllerService]:
    """One real voter (pysyncobj on loopback), its active QuorumController with brokers 1 and 2 registered, and the
    ControllerService in front of it, called in-process with a caller's identity (``caller``)."""
    with single_voter(directory, ControllerConfig(1, cluster_id, defaults=defaults),
                      **({"clock": clock} if clock is not None else {})) as ctl:
        register_on(ctl, (1, 2), cluster_id)
        yield ControllerService(ctl, ctl.raft, no_redirect, cluster_id=cluster_id, voter_ids={}, default_timeout_s=30,
                                authorizer=authorizer)
