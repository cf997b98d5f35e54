"""``brook features`` and ``brook acl --transactional-id`` on a SASL cluster with the authorizer on (the voters ask
each other which levels their release supports over SASL_PLAINTEXT with the nodes' own SCRAM user)."""

from __future__ import annotations

import json

import pytest

from admin_cli.main import main as brook_main
from deploy.local.cluster import LocalCluster
from metadata_quorum import features

TXN = ["--allow-principal", "User:etl", "--operation", "WRITE", "--transactional-id", "orders-",
       "--resource-pattern-type", "prefixed"]


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    capsys.readouterr()
    assert brook_main(["-o", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_brook_features_describe_and_upgrade(secure_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("BROOK_BOOTSTRAP", secure_cluster.bootstrap_servers)
    monkeypatch.setenv("BROOK_SASL_USERNAME", "admin")
    monkeypatch.setenv("BROOK_SASL_PASSWORD", "admin-secret")
    described = _json(capsys, "features", "describe")
    assert (described["feature"], described["finalized_level"]) == (features.METADATA_VERSION, 1)
    assert {(n["role"], n["node_id"], n["supported_max"], n["problem"]) for n in described["nodes"]} == {
        (role, n, features.SUPPORTED_MAX, None) for n in secure_cluster.node_ids for role in ("controller", "broker")}

    capsys.readouterr()
    assert brook_main(["acl", "create", *TXN]) == 1
    assert "needs brook.metadata.version 2" in capsys.readouterr().err
    # A replication factor change needs level 5: refused whole, nothing moved.
    assert brook_main(["topic", "create", "rf-level", "-p", "2", "-r", "1"]) == 0
    capsys.readouterr()
    for dry_run in ([], ["--dry-run"]):  # a dry run says it would be refused (it showed the moves)
        assert brook_main(["topic", "set-replication-factor", "rf-level", "2", *dry_run]) == 1
        refused = capsys.readouterr().err
        assert "needs brook.metadata.version 5" in refused and "nothing moved" in refused, (dry_run, refused)
    assert [len(p["replicas"]) for p in _json(capsys, "topic", "describe", "rf-level")["partitions"]] == [1, 1]
    assert _json(capsys, "features", "upgrade", "--level", "2", "--dry-run")["finalized_level"] == 1
    assert _json(capsys, "features", "describe")["finalized_level"] == 1

    assert _json(capsys, "features", "upgrade", "--level", "2")["finalized_level"] == 2
    assert brook_main(["acl", "create", *TXN]) == 0
    listed = _json(capsys, "acl", "list", "--transactional-id", "orders-", "--resource-pattern-type", "prefixed")
    assert [(a["resource_type"], a["resource_name"], a["operation"]) for a in listed] == [
        ("TRANSACTIONAL_ID", "orders-", "WRITE")]

    capsys.readouterr()
    assert brook_main(["acl", "create", "--allow-principal", "User:etl", "--operation", "READ",
                       "--transactional-id", "x"]) == 2  # Kafka's supported operations: DESCRIBE, WRITE
    assert "only supports operations DESCRIBE, WRITE, ALL" in capsys.readouterr().err
    assert brook_main(["features", "upgrade", "--level", "1"]) == 1
    assert "cannot be lowered" in capsys.readouterr().err
    assert brook_main(["acl", "delete", "--transactional-id", "orders-", "--resource-pattern-type", "prefixed"]) == 0
