"""max.connections: the broker port refuses connections past the bound, and takes new ones once
connections close (a connection flood cannot exhaust the broker's file descriptors)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from waiting import wait_for

from deploy.local.cluster import LocalCluster
from proto import broker_pb2, broker_pb2_grpc

pytestmark = pytest.mark.slow

LIMIT = 3


def metadata_ok(channel: grpc.Channel) -> bool:
    try:
        broker_pb2_grpc.BrokerServiceStub(channel).Metadata(broker_pb2.MetadataRequest(), timeout=3)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e  # refused at accept, nothing else
        return False
    return True


def test_connections_past_max_connections_are_refused_then_accepted_again(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "c", nodes=1, overrides={"max.connections": str(LIMIT)}) as cluster:
        address = cluster.broker_address(1)
        # A separate subchannel pool per channel: each channel is its own TCP connection.
        channels = [grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(LIMIT + 3)]
        try:
            served = [metadata_ok(ch) for ch in channels]
            assert 0 < sum(served) <= LIMIT, served
            assert not all(served), f"all {len(channels)} connections were served with max.connections={LIMIT}"
            # The port is full: a gRPC health probe there is refused too, but the health listener (its own
            # port and thread) still says the broker is alive and ready: no restart for being busy.
            with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as probe:
                assert not metadata_ok(probe), "a new connection was served on a full port"
            assert cluster.probe(1, "/livez")[0] == 200
            assert cluster.probe(1, "/readyz")[0] == 200
        finally:
            for ch in channels:
                ch.close()

        def fresh_client_served() -> bool:
            with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
                return metadata_ok(ch)
        wait_for(fresh_client_served, 30, "a new connection to be served once the others closed")
