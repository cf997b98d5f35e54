"""Principal mapping rules, node principals and client SecurityConfig parsing (pure, fast)."""

from __future__ import annotations

import pytest

from broker import principal
from broker.principal import ANONYMOUS, Principal, map_subject, parse_mapping_rules
from client.security import SecurityConfig
from proto import errors


@pytest.fixture(autouse=True)
def _default_rules():
    yield
    principal.configure(mapping_rules=principal.DEFAULT_MAPPING_RULES,
                        node_principal_format=principal.DEFAULT_NODE_PRINCIPAL_FORMAT, trust_loopback_plaintext=True)


def test_principal_text_and_parse() -> None:
    assert str(Principal("User", "alice")) == "User:alice"
    assert Principal.parse("User:CN=a,O=b") == Principal("User", "CN=a,O=b")
    assert str(ANONYMOUS) == "User:ANONYMOUS"
    with pytest.raises(errors.BrookError):
        Principal.parse("alice")


def test_kafka_rule_syntax_with_groups_and_case() -> None:
    rules = parse_mapping_rules(
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?)$/$1@$2/L,DEFAULT")
    assert map_subject("CN=kafka1,OU=ServiceUsers,O=Org", rules) == "kafka1"
    assert map_subject("CN=Duke,OU=JavaSoft,O=Sun", rules) == "duke@javasoft"
    assert map_subject("CN=x,O=y", rules) == "CN=x,O=y"  # DEFAULT: the whole DN


def test_upper_case_and_no_default_means_no_match() -> None:
    rules = parse_mapping_rules("RULE:^CN=([^,]*),.*$/$1/U")
    assert map_subject("CN=bob,O=z", rules) == "BOB"
    assert map_subject("O=z", rules) is None


def test_brook_default_takes_the_cn() -> None:
    rules = parse_mapping_rules(principal.DEFAULT_MAPPING_RULES)
    assert map_subject("CN=node-3,O=Brook", rules) == "node-3"
    assert map_subject("CN=alice", rules) == "alice"
    assert map_subject("O=NoCn", rules) == "O=NoCn"


def test_bad_rules_are_config_errors() -> None:
    for text in ("RULE:(/x/", "RULE:abc", "NOPE"):
        with pytest.raises(errors.BrookError) as info:
            parse_mapping_rules(text)
        assert info.value.code == errors.ErrorCode.INVALID_CONFIG


def test_node_principal_round_trip_and_format() -> None:
    assert principal.node_principal(3) == Principal("User", "node-3")
    assert principal.node_id_of(Principal("User", "node-3")) == 3
    assert principal.node_id_of(Principal("User", "node-x")) is None
    assert principal.node_id_of(Principal("User", "alice")) is None
    principal.configure(node_principal_format="User:broker{id}.example")
    assert str(principal.node_principal(7)) == "User:broker7.example"
    assert principal.node_id_of(Principal("User", "broker7.example")) == 7
    with pytest.raises(errors.BrookError):
        principal.configure(node_principal_format="User:fixed")


@pytest.mark.parametrize("peer,expected", [
    ("ipv4:127.0.0.1:5000", True), ("ipv4:127.8.0.2:1", True), ("ipv6:[::1]:5000", True),
    ("ipv4:10.0.0.1:5000", False), ("ipv6:[fe80::1]:1", False), ("", False), ("unix:/tmp/s", True),
])
def test_loopback_peers(peer: str, expected: bool) -> None:
    assert principal.is_loopback_peer(peer) is expected


def test_security_config_from_kafka_names_env_and_properties(tmp_path) -> None:
    sec = SecurityConfig.from_config({"security.protocol": "ssl", "ssl.ca.location": "/ca.pem",
                                      "ssl_certificate_location": "/c.pem", "ssl.key.location": "/k.pem",
                                      "bootstrap.servers": "ignored:1"})
    assert sec.protocol == "SSL" and sec.uses_ssl and not sec.uses_sasl
    assert sec.ssl_certificate_location == "/c.pem"
    env = {"BROOK_SECURITY_PROTOCOL": "SSL", "BROOK_SSL_CA_LOCATION": "/ca2.pem"}
    assert SecurityConfig.from_env(env).ssl_ca_location == "/ca2.pem"
    props = tmp_path / "client.properties"
    props.write_text("# comment\nsecurity.protocol=SSL\nssl.ca.location = /ca3.pem\n")
    assert SecurityConfig.from_properties(props).ssl_ca_location == "/ca3.pem"
    assert SecurityConfig.from_config(sec.to_config()) == sec


@pytest.mark.parametrize("config", [
    {"security.protocol": "TLS"},
    {"security.protocol": "SSL", "ssl.certificate.location": "/c.pem"},
    {"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": ""},
    {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"},
    {"security.protocol": "SASL_SSL"},
])
def test_bad_client_security_configs_are_refused(config) -> None:
    with pytest.raises(errors.BrookError) as info:
        SecurityConfig.from_config(config)
    assert info.value.code == errors.ErrorCode.INVALID_CONFIG


def test_sasl_protocols_use_scram_or_the_installed_wrapper() -> None:
    import grpc

    from client import security

    sec = SecurityConfig.from_config({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "alice",
                                      "sasl.password": "pw", "sasl.mechanism": "SCRAM-SHA-512"})
    assert "pw" not in repr(sec)
    # By default the SCRAM client of client/sasl.py authenticates the channel (interceptors on it).
    default = security.make_channel("127.0.0.1:1", sec)
    assert not isinstance(default, type(grpc.insecure_channel("127.0.0.1:1")))
    default.close()
    seen: list[tuple[str, str]] = []

    def wrap(channel: grpc.Channel, s: SecurityConfig, address: str) -> grpc.Channel:
        seen.append((s.sasl_username or "", address))
        return channel

    security.set_sasl_channel_wrapper(wrap)
    try:
        security.make_channel("127.0.0.1:1", sec).close()
    finally:
        security.set_sasl_channel_wrapper(None)
    assert seen == [("alice", "127.0.0.1:1")]


def test_session_resolver_gets_the_raw_metadata_and_certificates_win() -> None:
    class Ctx:
        def __init__(self, subject: bytes | None) -> None:
            self.subject = subject

        def peer(self) -> str:
            return "ipv4:10.1.2.3:5555"

        def auth_context(self) -> dict:
            return {"x509_subject": [self.subject]} if self.subject else {}

        def invocation_metadata(self) -> tuple:
            return (("x-brook-session", "tok"),)

    principal.set_session_resolver(lambda md: Principal("User", "bob") if ("x-brook-session", "tok") in md else None)
    try:
        assert principal.authenticate(Ctx(None)) == principal.Authentication(Principal("User", "bob"), "sasl",
                                                                             "ipv4:10.1.2.3:5555")
        assert principal.principal_of(Ctx(b"CN=alice,O=x")) == Principal("User", "alice")
        # A SASL user named like a node is not that node; a remote plaintext caller is nobody.
        principal.set_session_resolver(lambda md: Principal("User", "node-1"))
        with pytest.raises(errors.BrookError) as info:
            principal.require_node(Ctx(None), 1)
        assert info.value.code == errors.ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        principal.set_session_resolver(None)
        with pytest.raises(errors.BrookError):
            principal.require_node(Ctx(None), 1)
        assert principal.require_node(Ctx(b"CN=node-1,O=Brook"), 1) == Principal("User", "node-1")
        with pytest.raises(errors.BrookError):
            principal.require_node(Ctx(b"CN=node-2,O=Brook"), 1)
    finally:
        principal.set_session_resolver(None)


class _CountingContext:
    """A servicer context that counts how often its identity is read."""

    def __init__(self, subject: bytes | None = None, peer: str = "ipv4:10.1.2.3:5555") -> None:
        self.subject, self._peer = subject, peer
        self.reads = 0
        self.aborted: list[str] = []

    def peer(self) -> str:
        self.reads += 1
        return self._peer

    def auth_context(self) -> dict:
        self.reads += 1
        return {"x509_subject": [self.subject]} if self.subject else {}

    def invocation_metadata(self) -> tuple:
        self.reads += 1
        return (("x-brook-session", "tok"),)

    def abort(self, code: str) -> None:
        self.aborted.append(code)


def test_a_stream_reads_its_callers_identity_once_and_keeps_a_certificates_answer() -> None:
    raw = _CountingContext(b"CN=node-2,O=Brook")
    call = principal.CallIdentity(raw)
    assert raw.reads == 3, "peer, auth context and metadata are read when the stream starts"
    for _ in range(5):
        assert principal.require_node(call, 2) == Principal("User", "node-2")
        assert principal.principal_of(call) == Principal("User", "node-2")
        with pytest.raises(errors.BrookError) as info:
            principal.require_node(call, 1)
        assert info.value.code == errors.ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert raw.reads == 3, "no message of the stream reads them again"
    call.abort("UNAUTHENTICATED")
    assert raw.aborted == ["UNAUTHENTICATED"], "everything else is the wrapped context's"


def test_a_streams_sasl_session_is_resolved_for_every_message() -> None:
    valid = [True]
    principal.set_session_resolver(lambda md: Principal("User", "bob") if valid[0] and ("x-brook-session", "tok")
                                   in md else None)
    try:
        call = principal.CallIdentity(_CountingContext())
        assert principal.principal_of(call) == Principal("User", "bob")
        valid[0] = False  # the session expired while the stream was open
        assert principal.principal_of(call) == ANONYMOUS, "an expired session is not kept for the stream"
        valid[0] = True  # where sessions are served, an anonymous answer is not kept either
        assert principal.principal_of(call) == Principal("User", "bob")
    finally:
        principal.set_session_resolver(None)


@pytest.mark.parametrize(("peer", "host"), [
    ("ipv4:10.1.2.3:5555", "10.1.2.3"), ("ipv6:[2001:DB8:0::1]:5555", "2001:db8::1"),
    ("ipv6:[::ffff:10.1.2.3]:5555", "10.1.2.3"),  # an IPv4 client on a dual-stack socket is its IPv4
    ("kafka:10.1.2.3", "10.1.2.3"), ("unix:/run/brook.sock", ""), ("", ""), ("ipv4:no-address:1", ""),
])
def test_a_callers_acl_host_is_its_canonical_ip(peer: str, host: str) -> None:
    assert principal.acl_host_of(peer) == host


def test_a_callers_host_rides_on_its_principal_but_is_not_its_identity() -> None:
    class Ctx:
        def peer(self) -> str:
            return "ipv4:10.1.2.3:5555"

        def auth_context(self) -> dict:
            return {"x509_subject": [b"CN=alice,O=x"]}

        def invocation_metadata(self) -> tuple:
            return ()

    who = principal.principal_of(Ctx())
    assert who.host == "10.1.2.3"
    assert who == Principal("User", "alice") and hash(who) == hash(Principal("User", "alice"))
    assert str(who) == "User:alice"


def test_a_forwarded_caller_has_the_host_its_node_forwarded() -> None:
    class Forwarded:
        def __init__(self, metadata: tuple) -> None:
            self.metadata = metadata

        def peer(self) -> str:
            return "ipv4:10.0.0.2:5555"  # the forwarding broker

        def auth_context(self) -> dict:
            return {"x509_subject": [b"CN=node-2,O=Brook"]}

        def invocation_metadata(self) -> tuple:
            return self.metadata

    key, host_key = principal.FORWARDED_PRINCIPAL_KEY, principal.FORWARDED_HOST_KEY
    auth = principal.authenticate(Forwarded(((key, "User:carol"), (host_key, "192.0.2.7"))))
    assert (auth.method, auth.principal, auth.principal.host) == ("forwarded", Principal("User", "carol"), "192.0.2.7")
    # None sent, or not an address: unknown, never the forwarding node's own address.
    for metadata in (((key, "User:carol"),), ((key, "User:carol"), (host_key, "db.example"))):
        assert principal.authenticate(Forwarded(metadata)).principal.host == ""


def test_acl_hosts_match_the_callers_address_and_an_unknown_address_gets_only_denies() -> None:
    from broker.authorizer import AclIndex, Authorizer, AuthorizerConfig
    from metadata_quorum.security import acl_binding

    def binding(host: str, permission: str = "ALLOW") -> object:
        return acl_binding(["TOPIC", "t", "LITERAL", "User:ann", host, "READ", permission])

    def allowed(bindings: list, host: str) -> bool:
        index = AclIndex(bindings)
        authz = Authorizer(AuthorizerConfig(enabled=True), lambda: index)
        return authz.authorize(Principal("User", "ann", host), "READ", "TOPIC", "t")

    assert allowed([binding("*")], "10.0.0.1") and allowed([binding("*")], "")
    assert allowed([binding("10.0.0.1")], "10.0.0.1")
    assert not allowed([binding("10.0.0.1")], "10.0.0.2")
    assert not allowed([binding("10.0.0.1")], ""), "a host-specific ALLOW needs the address it names"
    assert not allowed([binding("*"), binding("10.0.0.1", "DENY")], "10.0.0.1")
    assert allowed([binding("*"), binding("10.0.0.1", "DENY")], "10.0.0.2")
    assert not allowed([binding("*"), binding("10.0.0.1", "DENY")], ""), "an unknown caller may be at that host"


def test_a_console_viewer_is_the_principal_at_its_connections_address() -> None:
    import socket

    from broker.console import principal_of_socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()):
            conn, _ = server.accept()
            with conn:
                viewer = principal_of_socket(conn)
    assert viewer == ANONYMOUS and viewer.host == "127.0.0.1"
    left, right = socket.socketpair()  # no IP address: unknown, so only ACLs on any host apply
    with left, right:
        assert principal_of_socket(left).host == ""


def test_a_node_caller_is_a_nodes_certificate_or_trusted_loopback_never_a_client_nor_what_a_node_forwards() -> None:
    """What the controller keeps workers for (broker/receiving.py SyncReceiveGate)."""
    class Ctx:
        def __init__(self, subject: bytes | None, peer: str, metadata: tuple = ()) -> None:
            self.subject, self._peer, self.metadata = subject, peer, metadata

        def peer(self) -> str:
            return self._peer

        def auth_context(self) -> dict:
            return {"x509_subject": [self.subject]} if self.subject else {}

        def invocation_metadata(self) -> tuple:
            return self.metadata

    remote, loopback = "ipv4:10.1.2.3:5555", "ipv4:127.0.0.2:5555"
    assert principal.is_node_caller(Ctx(b"CN=node-3,O=Brook", remote))
    assert not principal.is_node_caller(Ctx(b"CN=alice,O=Brook", remote))
    assert not principal.is_node_caller(Ctx(b"CN=alice,O=Brook", loopback)), "a certificate says who, not the address"
    assert not principal.is_node_caller(Ctx(None, remote))
    assert principal.is_node_caller(Ctx(None, loopback)), "the documented loopback trust of a plaintext cluster"
    forwarded = ((principal.FORWARDED_PRINCIPAL_KEY, "User:carol"),)
    assert not principal.is_node_caller(Ctx(b"CN=node-3,O=Brook", remote, forwarded)), "a client's request"
    principal.configure(trust_loopback_plaintext=False)
    try:
        assert not principal.is_node_caller(Ctx(None, loopback))
    finally:
        principal.configure(trust_loopback_plaintext=True)
    principal.set_session_resolver(lambda md: Principal("User", "node-1"))
    try:
        assert not principal.is_node_caller(Ctx(None, remote)), "a SASL user named like a node is not one"
    finally:
        principal.set_session_resolver(None)
