"""deploy/: Prometheus config and rules pass promtool, manifests parse, example configs are valid."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from broker.config import ConfigError, load_config

yaml = pytest.importorskip("yaml", reason="PyYAML (dev dependency) is needed to parse the manifests")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PASSWORD_ENV = {"BROOK_CONTROLLER_QUORUM_PASSWORD": "test-secret-Xq83Lm-pW29zR"}


def _promtool() -> str:
    """promtool from PATH; installed with apt-get (Debian package `prometheus`) when root."""
    found = shutil.which("promtool")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("promtool is missing and cannot be installed here (needs root and apt-get): "
                    "apt-get install prometheus")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:  # package lists may be missing on a fresh machine
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=600)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    found = shutil.which("promtool")
    if not found:
        pytest.skip(f"promtool could not be installed with apt-get: {proc.stderr.strip()[-300:]}")
    return found


@pytest.fixture(scope="module")
def promtool() -> str:
    return _promtool()


def run(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus-compose.yml"])
def test_promtool_check_config(promtool: str, config: str) -> None:
    out = run([promtool, "check", "config", config], DEPLOY / "prometheus")
    assert "SUCCESS" in out and "alerts.yml" in out, out


def test_promtool_check_and_unit_test_rules(promtool: str) -> None:
    out = run([promtool, "check", "rules", "alerts.yml"], DEPLOY / "prometheus")
    assert "SUCCESS" in out, out
    out = run([promtool, "test", "rules", "alerts_test.yml"], DEPLOY / "prometheus")
    assert "SUCCESS" in out, out


def test_alert_rules_cover_the_required_conditions() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    wanted = {
        "BrookOfflinePartitions": "brook_offline_partitions",
        "BrookUnderReplicatedPartitions": "brook_under_replicated_partitions",
        "BrookNoActiveController": "brook_controller_active",
        "BrookIsrShrinkRateHigh": "brook_isr_shrinks_total",
        "BrookFencedBrokers": "brook_fenced_brokers",
        "BrookDiskUsageHigh": "brook_log_dir_free_bytes",
    }
    for alert, metric in wanted.items():
        assert metric in exprs.get(alert, ""), f"{alert}: {exprs.get(alert)}"


def k8s_docs() -> list[dict]:
    docs = []
    for f in sorted((DEPLOY / "k8s").glob("*.yaml")):
        if f.name == "kustomization.yaml":
            continue
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def test_k8s_manifests_parse_and_have_the_required_objects() -> None:
    docs = k8s_docs()
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for want in [("StatefulSet", "brook-controller"), ("StatefulSet", "brook-broker"),
                 ("Service", "brook-controller"), ("Service", "brook-broker"),
                 ("PodDisruptionBudget", "brook-controller"), ("PodDisruptionBudget", "brook-broker")]:
        assert want in kinds, f"missing {want}; have {sorted(kinds)}"
    for d in docs:
        if d["kind"] == "Service" and d["metadata"]["name"] in ("brook-controller", "brook-broker"):
            assert d["spec"]["clusterIP"] == "None" and d["spec"]["publishNotReadyAddresses"] is True
        if d["kind"] == "StatefulSet":
            c = d["spec"]["template"]["spec"]["containers"][0]
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                # kubelet's gRPC probe cannot speak TLS: the gRPC health check runs as an exec probe.
                command = c[probe].get("exec", {}).get("command", [])
                assert command[:3] == ["python", "-m", "deploy.healthcheck"], \
                    f"{d['metadata']['name']} {probe} is not a gRPC health check: {c[probe]}"
            assert d["spec"]["serviceName"] == d["metadata"]["name"]
    kustom = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    for res in kustom["resources"]:
        assert (DEPLOY / "k8s" / res).exists(), res


def _k8s_config(name: str) -> str:
    for d in k8s_docs():
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name:
            return next(iter(d["data"].values()))
    raise AssertionError(f"no ConfigMap {name}")


@pytest.mark.parametrize(("configmap", "overrides"), [
    ("brook-controller-config", ["node.id=1001",
                                 "listeners=CONTROLLER://brook-controller-0.brook-controller.brook.svc.cluster.local:9093",
                                 "metrics.listener=brook-controller-0.brook-controller.brook.svc.cluster.local:9100"]),
    ("brook-broker-config", ["node.id=1", "listeners=BROKER://brook-broker-0.brook-broker.brook.svc.cluster.local:9092",
                             "metrics.listener=brook-broker-0.brook-broker.brook.svc.cluster.local:9100"]),
])
def test_k8s_node_configs_are_valid_with_the_pod_overrides(tmp_path: Path, configmap: str,
                                                           overrides: list[str]) -> None:
    p = tmp_path / "node.toml"
    p.write_text(_k8s_config(configmap))
    cfg = load_config(p, overrides, env=PASSWORD_ENV)
    assert cfg.node_id in (1, 1001)
    _assert_secured(cfg, configmap)
    for d in k8s_docs():  # the pods pass the same overrides
        if d["kind"] == "StatefulSet" and configmap.startswith(d["metadata"]["name"]):
            args = " ".join(d["spec"]["template"]["spec"]["containers"][0]["args"])
            assert "--override metrics.listener=${HOSTNAME}" in args


def test_k8s_network_policy_guards_the_quorum_and_controller_ports() -> None:
    policies = {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == "NetworkPolicy"}
    ctl = policies["brook-controller"]["spec"]
    assert ctl["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "controller"
    by_port = {rule["ports"][0]["port"]: rule for rule in ctl["ingress"]}
    raft_from = by_port[9193]["from"]
    assert raft_from == [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "brook",
                                                          "app.kubernetes.io/component": "controller"}}}]
    assert by_port[9093]["from"], "the controller gRPC port must not be open to everyone"
    assert set(by_port) == {9093, 9193, 9100}, "no other controller port may be reachable"


def test_compose_and_k8s_keep_the_ca_key_out_of_the_nodes() -> None:
    compose = (DEPLOY / "docker" / "compose.yaml").read_text()
    assert "ca.key:" not in compose
    for d in k8s_docs():
        if d["kind"] == "StatefulSet":
            spec = d["spec"]["template"]["spec"]
            mounts = spec["containers"][0]["volumeMounts"]
            assert "ca" not in {m["name"] for m in mounts}, "only the certs init container may see the CA key"
            assert any(m["name"] == "ca" for m in spec["initContainers"][0]["volumeMounts"])


def _assert_secured(cfg, where: str) -> None:
    """mTLS on every listener, node identity enforced, /metrics over HTTPS and not on 0.0.0.0."""
    for listener in cfg.listeners.values():
        assert listener.protocol == "SSL", f"{where}: {listener.name} is {listener.protocol}"
    assert cfg["ssl.client.auth"] == "required", where
    assert cfg["security.plaintext.loopback.trusted"] is False, where
    assert cfg["metrics.ssl.enable"] is True, where
    host = (cfg.metrics_address or ("", 0))[0]
    assert host not in ("0.0.0.0", "::", ""), f"{where}: /metrics binds {host!r}"
    if cfg.is_broker:
        assert cfg.node_security("CONTROLLER").protocol == "SSL", where


@pytest.mark.parametrize("path", sorted((DEPLOY / "config").rglob("*.toml")), ids=lambda p: p.name)
def test_example_node_configs_are_valid(path: Path) -> None:
    cfg = load_config(path, env=PASSWORD_ENV)
    assert cfg.cluster_id == "brook-prod"
    _assert_secured(cfg, path.name)
    if cfg.is_controller:  # the examples ship without a password: refused until one is provided
        with pytest.raises(ConfigError) as info:
            load_config(path, env={})
        assert info.value.key == "controller.quorum.password"


def test_example_cluster_configs_agree() -> None:
    """Every node of an example cluster names the same voters and cluster id."""
    for layout in ("combined", "split"):
        voters = {tomllib.loads(p.read_text())["controller.quorum.voters"]
                  for p in (DEPLOY / "config" / layout).glob("*.toml")}
        assert len(voters) == 1, f"{layout}: different voter lists {voters}"


def test_compose_cluster_parses_and_each_node_config_is_valid(tmp_path: Path) -> None:
    compose = yaml.safe_load((DEPLOY / "docker" / "compose.yaml").read_text())
    nodes = [name for name in compose["services"] if name.startswith("brook-")]
    assert nodes == ["brook-1", "brook-2", "brook-3"]
    for name in nodes:
        svc = compose["services"][name]
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} beyond localhost"
        env = {k: str(v) for k, v in svc["environment"].items()}
        env.update(PASSWORD_ENV)  # compose takes it from the operator's shell
        cfg = load_config(DEPLOY / "docker" / "node.toml", env=env)
        assert cfg.node_id == int(name.split("-")[1]) and cfg.is_broker and cfg.is_controller
        _assert_secured(cfg, name)
        mounted = {v.split(":")[1] for v in svc["volumes"] if isinstance(v, str)}
        for key in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
            assert cfg[key] in mounted, f"{name}: {key} {cfg[key]} is not mounted"


def test_dockerfile_and_systemd_unit_run_brook_server() -> None:
    docker = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["brook-server"]' in docker and "HEALTHCHECK" in docker
    unit = (DEPLOY / "systemd" / "brook-server@.service").read_text()
    assert "ExecStart=/opt/brook/venv/bin/brook-server --config /etc/brook/%i.toml" in unit
    assert "KillSignal=SIGTERM" in unit and "RestartPreventExitStatus=2" in unit
