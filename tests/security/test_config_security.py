"""Node config: listener protocols, TLS keys and principal settings are validated at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config import ConfigError, load_config

BASE = {
    "process.roles": "controller,broker",
    "node.id": "1",
    "cluster.id": "c",
    "listeners": "BROKER://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093",
    "controller.quorum.voters": "1@127.0.0.1:19093:19193",
    "log.dirs": "/tmp/brook-cfg-test/data",
    "metadata.log.dir": "/tmp/brook-cfg-test/meta",
    "controller.quorum.password": "q7-Hv2pLx9-RtZ4mWc8NbK3s",
}
TLS = {"listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SSL", "ssl.certificate.location": "/t/node.pem",
       "ssl.key.location": "/t/node.key", "ssl.ca.location": "/t/ca.pem"}


def cfg(**overrides: str):  # type: ignore[no-untyped-def]
    return load_config(None, {**BASE, **{k.replace("_", "."): v for k, v in overrides.items()}}, env={})


def refused(overrides: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(None, {**BASE, **overrides}, env={})
    return info.value


def test_default_is_plaintext_with_loopback_trust() -> None:
    c = cfg()
    assert {n: lst.protocol for n, lst in c.listeners.items()} == {"BROKER": "PLAINTEXT", "CONTROLLER": "PLAINTEXT"}
    assert c.server_tls("BROKER") is None and c.node_security("CONTROLLER").protocol == "PLAINTEXT"
    assert c["security.plaintext.loopback.trusted"] is True


def test_mtls_node_builds_server_and_client_tls() -> None:
    c = load_config(None, {**BASE, **TLS}, env={})
    tls = c.server_tls("BROKER")
    assert tls.cert == Path("/t/node.pem") and tls.client_auth == "required"
    sec = c.node_security("BROKER")
    assert sec.protocol == "SSL" and sec.ssl_certificate_location == "/t/node.pem"
    assert c.broker_settings().inter_broker_security == sec


def test_extra_named_listener_with_its_own_protocol_and_advertised_address() -> None:
    c = load_config(None, {**BASE, **TLS, "listeners": BASE["listeners"] + ",LOCAL://127.0.0.1:19094",
                           "listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SSL,LOCAL:PLAINTEXT",
                           "advertised.listeners": "BROKER://broker-1.example:9092"}, env={})
    assert c.listeners["LOCAL"].protocol == "PLAINTEXT"
    assert c.listeners["BROKER"].advertised == ("broker-1.example", 9092)
    settings = c.broker_settings()
    assert [(x.name, x.port, x.tls) for x in settings.extra_listeners] == [("LOCAL", 19094, None)]
    assert settings.advertised == ("broker-1.example", 9092)


@pytest.mark.parametrize(("overrides", "key"), [
    ({"listener.security.protocol.map": "BROKER:TLS"}, "listener.security.protocol.map"),
    ({"listener.security.protocol.map": "BROKER:SASL_SSL,CONTROLLER:SSL"}, "listener.security.protocol.map"),
    ({"listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SSL"}, "ssl.certificate.location"),
    ({**TLS, "ssl.ca.location": ""}, "ssl.ca.location"),
    ({"advertised.listeners": "OTHER://h:1"}, "advertised.listeners"),
    ({"listeners": "BROKER://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093,x-y://h:1"}, "listeners"),
    ({"ssl.principal.mapping.rules": "RULE:(/x/"}, "ssl.principal.mapping.rules"),
    ({"broker.principal.format": "User:broker"}, "broker.principal.format"),
    ({"ssl.client.auth": "sometimes"}, "ssl.client.auth"),
    ({"process.roles": "broker", "listeners": "BROKER://127.0.0.1:19092",
      "controller.quorum.voters": "1001@127.0.0.1:19093:19193",
      "listener.security.protocol.map": "BROKER:PLAINTEXT,CONTROLLER:SSL"}, "ssl.certificate.location"),
])
def test_bad_security_config_is_refused_naming_the_key(overrides: dict[str, str], key: str) -> None:
    assert refused(overrides).key == key


@pytest.mark.parametrize(("listeners", "trusted"), [
    ("BROKER://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093", True),
    ("BROKER://0.0.0.0:19092,CONTROLLER://127.0.0.1:19093", False),
    ("BROKER://broker-1.example:19092,CONTROLLER://127.0.0.1:19093", False),
    ("BROKER://localhost:19092,CONTROLLER://[::1]:19093", True),
])
def test_plaintext_trust_needs_every_plaintext_listener_on_loopback(listeners: str, trusted: bool) -> None:
    from broker import principal

    voters = "1@" + listeners.split("CONTROLLER://")[1].replace("[::1]", "::1") + ":19193"
    c = load_config(None, {**BASE, "listeners": listeners, "controller.quorum.voters": voters}, env={})
    try:
        c.configure_principals()
        assert principal._settings.trust_loopback_plaintext is trusted
    finally:
        principal.configure(trust_loopback_plaintext=True)


def test_a_replication_listener_speaks_the_broker_listeners_protocol() -> None:
    listeners = BASE["listeners"] + ",REPLICATION://127.0.0.1:19096"
    c = load_config(None, {**BASE, **TLS, "listeners": listeners,
                           "listener.security.protocol.map": "BROKER:SSL,CONTROLLER:SSL,REPLICATION:SSL"}, env={})
    [replication] = c.broker_settings().extra_listeners
    assert (replication.name, replication.wire, replication.port) == ("REPLICATION", "replication", 19096)
    assert replication.tls is not None and replication.tls.client_auth == "required"
    for protocol_map, why in (("BROKER:SSL,CONTROLLER:SSL,REPLICATION:PLAINTEXT", "REPLICATION must use BROKER's"),
                              ("BROKER:SSL,CONTROLLER:SSL,REPLICATION:SASL_SSL", "node-to-node traffic")):
        e = refused({**TLS, "listeners": listeners, "listener.security.protocol.map": protocol_map})
        assert e.key == "listener.security.protocol.map" and why in str(e), str(e)
    e = refused({"listeners": listeners, "kafka.listener.names": "KAFKA,REPLICATION",
                 "listener.security.protocol.map": "BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT,REPLICATION:PLAINTEXT"})
    assert e.key == "kafka.listener.names", str(e)
