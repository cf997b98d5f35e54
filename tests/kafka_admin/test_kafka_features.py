"""Finalized features on the Kafka listener (KIP-584): ApiVersions v3 lists brook.metadata.version, UpdateFeatures
raises it, and an ACL on a TRANSACTIONAL_ID, which librdkafka's admin creates as Kafka stores it, is refused until
the level allowing it is finalized, then stored and listed. Raw requests for what librdkafka's admin does not offer
(ApiVersions' features, UpdateFeatures), with the cluster's admin certificate."""

from __future__ import annotations

from typing import Any

import pytest
from kafka_raw import kafka_ask
from waiting import wait_for

from deploy.local.cluster import LocalCluster
from metadata_quorum import features

T = 30


def _features(cluster: LocalCluster, node: int) -> tuple[dict[str, tuple[int, int]], dict[str, int]]:
    r = kafka_ask(cluster, node, 18, 3, {"client_software_name": "features-test", "client_software_version": "1"})
    assert int(r.error_code) == 0
    return ({f.name: (int(f.min_version), int(f.max_version)) for f in r.supported_features},
            {f.name: int(f.max_version_level) for f in r.finalized_features})


def _update(cluster: LocalCluster, level: int, *, version: int = 1, **more: Any) -> tuple[int, str | None]:
    update = {"feature": features.METADATA_VERSION, "max_version_level": level, **more}
    r = kafka_ask(cluster, 1, 57, version, {"timeout": 30_000, "feature_updates": [update], "validate_only": False})
    assert int(r.error_code) == 0 and len(r.results) == 1
    return int(r.results[0].error_code), r.results[0].error_message


def test_update_features_unlocks_transactional_id_acls(kcluster: LocalCluster, confluent_admin: Any) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    supported, finalized = _features(kcluster, 1)
    assert supported == {features.METADATA_VERSION: (1, features.SUPPORTED_MAX)}
    assert finalized == {features.METADATA_VERSION: 1}

    txn = AclBinding(ResourceType.TRANSACTIONAL_ID, "orders-", ResourcePatternType.PREFIXED, "User:etl", "*",
                     AclOperation.WRITE, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as refused:
        confluent_admin.create_acls([txn], request_timeout=T)[txn].result(T)
    assert refused.value.args[0].name() == "UNSUPPORTED_VERSION", refused.value
    assert "brook features upgrade --level 2" in refused.value.args[0].str()

    # A downgrade, or a level no release has, is refused; the level is unchanged.
    assert _update(kcluster, 1, version=1, upgrade_type=2)[0] == 95  # INVALID_UPDATE_VERSION (SAFE_DOWNGRADE)
    assert _update(kcluster, features.SUPPORTED_MAX + 1)[0] == 95
    assert _update(kcluster, 2, version=0, allow_downgrade=False) == (0, None)
    wait_for(lambda: all(_features(kcluster, n)[1] == {features.METADATA_VERSION: 2} for n in kcluster.broker_ids),
             T, "every broker's ApiVersions to list level 2")

    confluent_admin.create_acls([txn], request_timeout=T)[txn].result(T)
    of_txn = AclBindingFilter(ResourceType.TRANSACTIONAL_ID, None, ResourcePatternType.ANY, None, None,
                              AclOperation.ANY, AclPermissionType.ANY)
    assert confluent_admin.describe_acls(of_txn, request_timeout=T).result(T) == [txn]
    assert confluent_admin.delete_acls([of_txn], request_timeout=T)[of_txn].result(T) == [txn]
