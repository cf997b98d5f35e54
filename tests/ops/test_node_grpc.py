"""brook-server plumbing that needs no roles: gRPC instrumentation (metrics interceptor, health,
reflection) on a real server, the metrics HTTP endpoint, and config refusal by the real command."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import NodeMetrics
from broker.node import GrpcInstrumentation
from proto import controller_pb2, controller_pb2_grpc


class _Describe(controller_pb2_grpc.ControllerServiceServicer):
    """A real servicer answering DescribeCluster (the instrumentation under test is around it)."""

    def DescribeCluster(self, request, context):  # noqa: N802 (gRPC method name)
        return controller_pb2.DescribeClusterResponse(cluster_id="c1", active_controller_id=7)

    def DescribeQuorum(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no quorum here")


def scrape(url: str) -> dict[str, list]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def sample(families: dict[str, list], name: str, **labels: str) -> float:
    for fam in families.values():
        for s in fam:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {name}{labels}; families: {sorted(families)}")


def test_instrumented_server_has_health_reflection_and_rpc_metrics(caplog: pytest.LogCaptureFixture) -> None:
    metrics = NodeMetrics.create(7, ["controller"], "c1")
    inst = GrpcInstrumentation(metrics.interceptor)
    inst.install()
    server = None
    try:
        with inst.role("controller"):
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
            controller_pb2_grpc.add_ControllerServiceServicer_to_server(_Describe(), server)
            port = server.add_insecure_port("127.0.0.1:0")
            server.start()
        metrics_port = metrics.serve("127.0.0.1", 0)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            req = health_pb2.HealthCheckRequest(service="")
            assert health.Check(req, timeout=5).status == health_pb2.HealthCheckResponse.NOT_SERVING
            inst.role_up("controller")
            assert health.Check(req, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
            named = health_pb2.HealthCheckRequest(service="brook.ControllerService")
            assert health.Check(named, timeout=5).status == health_pb2.HealthCheckResponse.SERVING

            refl = reflection_pb2_grpc.ServerReflectionStub(ch)
            answers = list(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
                list_services="")]), timeout=5))
            services = {s.name for s in answers[0].list_services_response.service}
            assert {"brook.ControllerService", "grpc.health.v1.Health"} <= services, services
            # Reflection is added before the server starts: grpcio warns of (and drops) method
            # handlers registered on a started server.
            late = [r.getMessage() for r in caplog.records if "once server has started" in r.getMessage()]
            assert not late, late

            stub = controller_pb2_grpc.ControllerServiceStub(ch)
            for _ in range(3):
                assert stub.DescribeCluster(controller_pb2.DescribeClusterRequest(), timeout=5).cluster_id == "c1"
            with pytest.raises(grpc.RpcError):
                stub.DescribeQuorum(controller_pb2.DescribeQuorumRequest(), timeout=5)
        fams = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        assert sample(fams, "brook_rpc_requests_total", method="DescribeCluster", code="OK") == 3
        assert sample(fams, "brook_rpc_requests_total", method="DescribeQuorum",
                      code="FAILED_PRECONDITION") == 1
        assert sample(fams, "brook_rpc_request_duration_seconds_count", service="brook.ControllerService",
                      method="DescribeCluster") == 3
        assert sample(fams, "brook_node_info", node_id="7", roles="controller") == 1
        inst.role_down("controller")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        inst.uninstall()
        if server is not None:
            server.stop(None)
        metrics.close()
    assert grpc.server is not inst._make_server  # the process-wide wrapper is gone after uninstall


def test_brook_server_refuses_bad_config_with_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text('"process.roles" = "broker"\n"node.id" = 1\n"num.partitons" = 3\n')
    proc = subprocess.run([sys.executable, "-m", "broker.node", "--config", str(cfg)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "num.partitons" in lines[0] and "did you mean 'num.partitions'" in lines[0]
    assert "Traceback" not in proc.stderr


def test_brook_server_check_flag_and_override(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text('"process.roles" = "broker"\n"node.id" = 4\n"cluster.id" = "c"\n'
                   '"listeners" = "BROKER://127.0.0.1:1234"\n"controller.quorum.voters" = "1@127.0.0.1:1235:1236"\n')
    proc = subprocess.run([sys.executable, "-m", "broker.node", "--config", str(cfg), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "log.dirs" in proc.stderr, proc  # broker role without log.dirs
    proc = subprocess.run([sys.executable, "-m", "broker.node", "--config", str(cfg), "--check",
                           "--override", f"log.dirs={tmp_path}"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "is valid" in proc.stdout, proc


def test_taken_metrics_port_fails_the_start_before_any_role(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = tmp_path / "node.toml"
        cfg.write_text('"process.roles" = "broker"\n"node.id" = 4\n"cluster.id" = "c"\n'
                       '"listeners" = "BROKER://127.0.0.1:1"\n"controller.quorum.voters" = "1@127.0.0.1:2:3"\n'
                       f'"log.dirs" = "{tmp_path / "data"}"\n"metrics.listener" = "127.0.0.1:{port}"\n')
        proc = subprocess.run([sys.executable, "-m", "broker.node", "--config", str(cfg)], capture_output=True,
                              text=True, timeout=60)
    assert proc.returncode == 1, proc
    # One line naming the key, no traceback (docs audit).
    line = f"failed to start: INVALID_CONFIG: metrics.listener 127.0.0.1:{port} cannot be bound: Address already in use"
    assert line in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    # No role started: the log directory holds only its lock, taken first (a second copy of a running node stops
    # at the lock with one line, not on this port).
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [".lock"], "a role started"


def test_brook_server_checks_its_tls_files_before_it_starts(tmp_path: Path) -> None:
    """A key file that holds no key (or another certificate's key) passed --check; a start failed only when it
    opened the listener: exit 1, the certificate named instead of the key, and tracebacks from the stop."""
    from deploy.local.certs import CertificateAuthority

    ca = CertificateAuthority.create(tmp_path / "ca", "test CA")
    node, other = ca.issue(tmp_path / "node", "node-4"), ca.issue(tmp_path / "other", "node-5")
    not_a_key = tmp_path / "hostname.txt"
    not_a_key.write_text("a-host-name\n")
    cfg = tmp_path / "node.toml"

    def check(key: Path) -> subprocess.CompletedProcess:
        cfg.write_text('"process.roles" = "broker"\n"node.id" = 4\n"cluster.id" = "c"\n'
                       '"listeners" = "BROKER://127.0.0.1:1234"\n"controller.quorum.voters" = "1@127.0.0.1:1235:1236"\n'
                       '"listener.security.protocol.map" = "BROKER:SSL"\n'
                       f'"ssl.certificate.location" = "{node.cert}"\n"ssl.key.location" = "{key}"\n'
                       f'"ssl.ca.location" = "{ca.path}"\n"log.dirs" = "{tmp_path / "data"}"\n')
        return subprocess.run([sys.executable, "-m", "broker.node", "--config", str(cfg), "--check"],
                              capture_output=True, text=True, timeout=60)
    assert check(node.key).returncode == 0
    for key, said in ((not_a_key, "holds no unencrypted PEM private key"), (other.key, "is not the private key of")):
        proc = check(key)
        assert proc.returncode == 2, proc
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and f"ssl.key.location {key}" in lines[0] and said in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr
