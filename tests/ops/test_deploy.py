"""deploy/: Prometheus config and rules pass promtool, manifests parse, example configs are valid."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from broker.config import ConfigError, load_config
from deploy.local.certs import CertificateAuthority
from deploy.local.tools import debian_tool

yaml = pytest.importorskip("yaml", reason="PyYAML (dev dependency) is needed to parse the manifests")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PASSWORD_ENV = {"BROOK_CONTROLLER_QUORUM_PASSWORD": "test-secret-Xq83Lm-pW29zR"}


def _promtool() -> str:
    """promtool from PATH; installed with apt-get (Debian package `prometheus`) when root."""
    found, why = debian_tool("promtool", "prometheus")
    if found is None:
        pytest.skip(why)
    return found


@pytest.fixture(scope="module")
def promtool() -> str:
    return _promtool()


def run(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("config", ["prometheus.yml", "prometheus-compose.yml"])
def test_promtool_check_config(promtool: str, config: str, tmp_path: Path) -> None:
    """promtool reads the scraper's client certificate (the nodes require one on /metrics): the config is
    checked with a real one from a test CA where it will be mounted."""
    text = (DEPLOY / "prometheus" / config).read_text()
    assert "cert_file: /etc/prometheus/brook-prometheus.pem" in text, "the scraper shows no client certificate"
    ca = CertificateAuthority.create(tmp_path / "tls")
    issued = ca.issue(tmp_path / "tls", "prometheus", hosts=(), server=False)
    text = text.replace("/etc/prometheus/brook-prometheus.pem", str(issued.cert)) \
        .replace("/etc/prometheus/brook-prometheus.key", str(issued.key)) \
        .replace("/etc/prometheus/brook-ca.pem", str(issued.ca))
    (tmp_path / config).write_text(text)
    shutil.copy(DEPLOY / "prometheus" / "alerts.yml", tmp_path / "alerts.yml")
    out = run([promtool, "check", "config", config], tmp_path)
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
            # Probes go to the health listener, a port no client load reaches (broker/health.py).
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            paths = {"readinessProbe": "/readyz", "livenessProbe": "/livez", "startupProbe": "/livez"}
            for probe, path in paths.items():
                assert c[probe].get("httpGet") == {"path": path, "port": "health"}, \
                    f"{d['metadata']['name']} {probe}: {c[probe]}"
            assert f"--override health.listener=0.0.0.0:{ports['health']}" in " ".join(c["args"])
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
    """mTLS on every listener, node identity enforced, ACLs enforced (denied unless allowed, User:admin the
    only super user), /metrics over HTTPS and not on 0.0.0.0."""
    for listener in cfg.listeners.values():
        assert listener.protocol == "SSL", f"{where}: {listener.name} is {listener.protocol}"
    assert cfg["ssl.client.auth"] == "required", where
    assert cfg["authorizer.class.name"] == "StandardAuthorizer", f"{where}: no authorizer: every client may do anything"
    assert cfg["allow.everyone.if.no.acl.found"] is False, where
    assert cfg["super.users"] == "User:admin", where
    assert cfg["security.plaintext.loopback.trusted"] is False, where
    assert cfg["metrics.ssl.enable"] is True, where
    assert cfg["metrics.ssl.client.auth"] == "required", f"{where}: /metrics (every topic and group) to anyone"
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


# ---------------------------------------------------------------- offline Kubernetes schemas


def _k8s_validate(doc: dict) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (dev dependency) is needed")
    kv.validate(doc, kv.latest_version(), strict=True)


def test_k8s_manifests_match_the_kubernetes_schemas() -> None:
    """Strict: an unknown or misplaced field (a typo) fails, as kubeconform -strict would."""
    docs = k8s_docs()
    for d in docs:
        _k8s_validate(d)  # raises with the field path on the first violation
    # The check can fail: the same StatefulSet with a misspelt probe field is refused.
    broken = next(d for d in docs if d["kind"] == "StatefulSet")
    broken = json.loads(json.dumps(broken))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecond"] = 10
    with pytest.raises(Exception, match="periodSecond"):
        _k8s_validate(broken)


def _quantity_bytes(q: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, factor in units.items():
        if q.endswith(suffix):
            return int(float(q[:-len(suffix)]) * factor)
    return int(q)


def test_k8s_broker_memory_limit_holds_its_bounded_buffers(tmp_path: Path) -> None:
    """The container limit holds the process plus 3x queued.max.request.bytes (the README's sizing)."""
    p = tmp_path / "broker.toml"
    p.write_text(_k8s_config("brook-broker-config"))
    cfg = load_config(p, ["node.id=1", "listeners=BROKER://brook-broker-0:9092"], env=PASSWORD_ENV)
    queued = int(cfg["queued.max.request.bytes"])
    assert int(cfg["fetch.max.bytes"]) <= queued
    broker = next(d for d in k8s_docs() if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "brook-broker")
    limit = _quantity_bytes(broker["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"])
    assert limit >= (250 << 20) + 3 * queued, f"memory limit {limit} < 250 MiB + 3 x {queued}"


# ---------------------------------------------------------------- Grafana


def test_grafana_dashboard_is_valid_and_its_queries_parse(promtool: str, tmp_path: Path) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "brook-dashboard.json").read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and len(ids) >= 15
    exprs = []
    for p in dashboard["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        exprs += [t["expr"] for t in p["targets"]]
    # promtool parses every query (as recording rules): a PromQL typo fails here, not on a wall screen.
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"brook:dashboard_query_{i}", "expr": e}
                                                          for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard-rules.yml").write_text(yaml.safe_dump(rules))
    out = run([promtool, "check", "rules", "dashboard-rules.yml"], tmp_path)
    assert f"SUCCESS: {len(exprs)} rules found" in out, out


# ---------------------------------------------------------------- systemd, as its README says


def _build_wheel(tmp_path: Path) -> Path:
    root = DEPLOY.parent
    out = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "-w", str(out), str(root)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheels = list(out.glob("brook-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_wheel_installs_brook_and_runs(tmp_path: Path) -> None:
    """make wheel's output holds every package, the compiled record walk and both commands, and
    runs from where it is unpacked (the dependencies come from this environment)."""
    wheel = _build_wheel(tmp_path)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(site)
    assert not [n for n in names if n.startswith("tests/") or "__pycache__" in n]
    assert any(n.startswith("storage/_record_walk") and n.endswith(".so") for n in names)
    assert "deploy/k8s/brokers.yaml" in names and "proto/broker.proto" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    text = (site / entry).read_text()
    assert "brook-server = broker.node:main" in text and "brook = admin_cli.main:main" in text
    code = ("import broker.node, admin_cli.main, storage._record_walk, deploy.healthcheck, spark_source; "
            "import sys; print(broker.node.__file__); print(storage._record_walk.__file__)")
    env = {**os.environ, "PYTHONPATH": str(site)}
    # cwd: not the checkout (its root is on sys.path first when Python runs from it).
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert all(line.startswith(str(site)) for line in proc.stdout.split()), proc.stdout
    config = DEPLOY / "config" / "combined" / "node-1.toml"
    # --check reads the TLS files as the start does (systemd runs it before each start): the example's
    # /etc/brook/tls files are made here, as its header says, under tmp_path.
    from deploy.local.certs import CertificateAuthority

    ca = CertificateAuthority.create(tmp_path / "tls", "test CA")
    node = ca.issue(tmp_path / "tls" / "node-1", "node-1", hosts=("brook-1",))
    tls = [f"ssl.certificate.location={node.cert}", f"ssl.key.location={node.key}", f"ssl.ca.location={ca.path}"]
    check = [sys.executable, "-m", "broker.node", "--config", str(config), "--check"]
    proc = subprocess.run([*check, *[a for t in tls for a in ("--override", t)]], capture_output=True, text=True,
                          env={**env, **PASSWORD_ENV}, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run(check, capture_output=True, text=True, env={**env, **PASSWORD_ENV}, timeout=60,
                          cwd=tmp_path)  # where the files are not (yet): one line naming the key, exit 2
    assert proc.returncode == 2 and "ssl.certificate.location /etc/brook/tls/node.pem" in proc.stderr, proc.stderr


def test_systemd_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed here")
    venv_bin = Path(sys.executable).parent
    assert (venv_bin / "brook-server").exists()
    unit = (DEPLOY / "systemd" / "brook-server@.service").read_text()
    # The one host-specific path: where the wheel was installed (/opt/brook/venv in the README).
    (tmp_path / "brook-server@.service").write_text(unit.replace("/opt/brook/venv", str(venv_bin.parent)))
    proc = subprocess.run([analyze, "verify", str(tmp_path / "brook-server@node-1.service")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), proc.stdout + proc.stderr


def test_systemd_readme_creates_what_the_unit_uses() -> None:
    readme = (DEPLOY / "systemd" / "README.md").read_text()
    unit = (DEPLOY / "systemd" / "brook-server@.service").read_text()
    assert "User=brook" in unit and "Group=brook" in unit and "EnvironmentFile=-/etc/brook/%i.env" in unit
    steps = [line.strip() for line in readme.splitlines() if line.strip().startswith(("sudo", "make", "echo"))]
    text = "\n".join(steps)
    assert "useradd --system" in text and " brook" in text
    assert "install -d -o root -g brook -m 0750 /etc/brook" in text
    assert "make wheel" in text and "/opt/brook/venv/bin/pip install dist/brook-*.whl" in text
    assert "pip install brook" not in text, "PyPI's brook is someone else's project"
    # The config and env file land where the unit reads them, readable by the brook group only.
    assert "-g brook -m 0640 deploy/config/combined/node-1.toml /etc/brook/node-1.toml" in text
    assert "/etc/brook/node-1.env" in text and "ExecStart=/opt/brook/venv/bin/brook-server" in unit
