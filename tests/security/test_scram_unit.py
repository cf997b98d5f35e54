"""SCRAM over gRPC in one process: a real server socket, the real client interceptor."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
import pytest
import scramp

from broker.authorizer import ALLOW_ALL
from broker.sasl import ScramAuthenticator, SessionInterceptor, principal_of
from client.sasl import ScramCredentials, scram_channel
from metadata_quorum.security import ScramCredential
from metadata_quorum.security_service import SecurityService, salted_credential
from proto import errors
from proto import security_pb2 as spb
from proto import security_pb2_grpc as spb_grpc
from proto.errors import ErrorCode

WHO = "/brook.test.Echo/Who"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Server:
    address: str
    users: dict[tuple[str, str], ScramCredential]
    auth: ScramAuthenticator
    clock: Clock
    not_ready_answers: list[int]  # [n]: the next n exchanges find the node still loading its users


@pytest.fixture
def server() -> Iterator[Server]:
    users: dict[tuple[str, str], ScramCredential] = {}
    clock = Clock()
    not_ready = [0]

    def ready() -> bool:
        if not_ready[0] > 0:
            not_ready[0] -= 1
            return False
        return True

    auth = ScramAuthenticator(lambda u, m: users.get((u, m)), session_lifetime_ms=60_000, clock=clock, ready=ready)
    auth.install()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(4), interceptors=[SessionInterceptor(auth)])
    spb_grpc.add_SecurityServiceServicer_to_server(SecurityService(auth, ALLOW_ALL), grpc_server)
    echo = grpc.unary_unary_rpc_method_handler(lambda req, ctx: str(principal_of(ctx)).encode())
    grpc_server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("brook.test.Echo", {"Who": echo})])
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        yield Server(f"127.0.0.1:{port}", users, auth, clock, not_ready)
    finally:
        grpc_server.stop(0)
        auth.uninstall()


def who(channel: grpc.Channel) -> str:
    return channel.unary_unary(WHO)(b"", timeout=10).decode()


def add_user(s: Server, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> None:
    s.users[(user, mechanism)] = salted_credential(user, mechanism, password)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_right_password_gives_a_session_as_that_user(server: Server, mechanism: str) -> None:
    add_user(server, "alice", "pencil", mechanism)
    with scram_channel(server.address, ScramCredentials("alice", "pencil", mechanism)) as ch:
        assert who(ch) == "User:alice"
        assert who(ch) == "User:alice"  # the session is reused: one exchange
    assert server.auth.succeeded_total == 1
    with grpc.insecure_channel(server.address) as plain:
        assert who(plain) == "User:ANONYMOUS"


def test_wrong_password_and_unknown_user_fail_the_same_way(server: Server) -> None:
    add_user(server, "alice", "pencil")
    for creds in (ScramCredentials("alice", "wrong"), ScramCredentials("mallory", "pencil")):
        with scram_channel(server.address, creds) as ch, pytest.raises(errors.BrookError) as caught:
            who(ch)
        assert caught.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert server.auth.failed_total == 2 and server.auth.succeeded_total == 0


def test_failed_attempts_per_user_are_bounded(server: Server) -> None:
    add_user(server, "alice", "pencil")
    for _ in range(10):
        with scram_channel(server.address, ScramCredentials("alice", "guess")) as ch, pytest.raises(errors.BrookError):
            who(ch)
    # Even the right password is refused until the window passes: guessing is rate limited.
    with scram_channel(server.address, ScramCredentials("alice", "pencil")) as ch, pytest.raises(errors.BrookError):
        who(ch)
    server.clock.now += 61
    with scram_channel(server.address, ScramCredentials("alice", "pencil")) as ch:
        assert who(ch) == "User:alice"


def test_expired_session_is_refused_and_the_client_reauthenticates(server: Server) -> None:
    add_user(server, "alice", "pencil")
    with scram_channel(server.address, ScramCredentials("alice", "pencil")) as ch:
        assert who(ch) == "User:alice"
        server.clock.now += 61  # past the server's session lifetime; the client's clock has not moved
        assert who(ch) == "User:alice"
    assert server.auth.succeeded_total == 2


def test_stale_token_from_elsewhere_gets_unauthenticated(server: Server) -> None:
    with grpc.insecure_channel(server.address) as plain, pytest.raises(grpc.RpcError) as caught:
        plain.unary_unary(WHO)(b"", timeout=10, metadata=[("x-brook-session", "forged")])
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_deleted_user_cannot_start_a_new_session(server: Server) -> None:
    add_user(server, "alice", "pencil")
    server.users.clear()
    with scram_channel(server.address, ScramCredentials("alice", "pencil")) as ch, pytest.raises(errors.BrookError):
        who(ch)


def test_a_live_session_ends_when_its_user_is_deleted(server: Server) -> None:
    add_user(server, "alice", "pencil")
    add_user(server, "bob", "bob-pw")
    with scram_channel(server.address, ScramCredentials("alice", "pencil")) as alice, \
            scram_channel(server.address, ScramCredentials("bob", "bob-pw")) as bob:
        assert who(alice) == "User:alice" and who(bob) == "User:bob"
        del server.users[("alice", "SCRAM-SHA-256")]
        # The session is refused at its next use (the client logs in again, and that fails), well before it
        # would expire; another user's session is untouched.
        with pytest.raises(errors.BrookError) as caught:
            who(alice)
        assert caught.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED, caught.value
        assert who(bob) == "User:bob"
    assert server.auth.revoked_total == 1
    assert server.auth.succeeded_total == 2


def test_a_live_session_ends_when_its_password_changes_and_the_new_one_logs_in(server: Server) -> None:
    add_user(server, "alice", "pencil")
    with scram_channel(server.address, ScramCredentials("alice", "pencil")) as old:
        assert who(old) == "User:alice"
        add_user(server, "alice", "crayon")  # the password changed (a new salt and keys)
        with pytest.raises(errors.BrookError) as caught:
            who(old)
        assert caught.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED, caught.value
    with scram_channel(server.address, ScramCredentials("alice", "crayon")) as new:
        assert who(new) == "User:alice"
        add_user(server, "alice", "pencil", "SCRAM-SHA-512")  # another mechanism's credential: not the one proved
        assert who(new) == "User:alice"
    assert server.auth.revoked_total == 1


def test_plain_credential_holds_until_the_user_changes() -> None:
    users = {("rita", "SCRAM-SHA-512"): salted_credential("rita", "SCRAM-SHA-512", "rita-pw")}
    auth = ScramAuthenticator(lambda u, m: users.get((u, m)))
    proved = auth.plain_credential(b"\0rita\0rita-pw")
    assert (proved.user, proved.mechanism) == ("rita", "SCRAM-SHA-512") and auth.holds(proved)
    users[("rita", "SCRAM-SHA-512")] = salted_credential("rita", "SCRAM-SHA-512", "new-pw")
    assert not auth.holds(proved)
    del users[("rita", "SCRAM-SHA-512")]
    assert not auth.holds(proved)


def test_bad_messages_get_clear_errors(server: Server) -> None:
    with grpc.insecure_channel(server.address) as plain:
        stub = spb_grpc.SecurityServiceStub(plain)
        r = stub.SaslAuthenticate(spb.SaslAuthenticateRequest(mechanism="PLAIN", auth_bytes=b"x"), timeout=10)
        assert r.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
        r = stub.SaslAuthenticate(spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256", auth_bytes=b"\xff"),
                                  timeout=10)
        assert r.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
        r = stub.SaslAuthenticate(spb.SaslAuthenticateRequest(exchange_id="nope", auth_bytes=b"c=biws"), timeout=10)
        assert r.error_code == ErrorCode.ILLEGAL_SASL_STATE
        r = stub.SaslAuthenticate(spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256", auth_bytes=b"n" * 5000),
                                  timeout=10)
        assert r.error_code == ErrorCode.INVALID_REQUEST


def test_rfc7677_test_vector_against_a_stored_credential() -> None:
    """RFC 7677 section 3: user "user", password "pencil", the RFC's salt, nonces and messages."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    m = scramp.ScramMechanism("SCRAM-SHA-256")
    salt_, stored_key, server_key, iterations = m.make_auth_info("pencil", iteration_count=4096, salt=salt)
    cred = ScramCredential("user", "SCRAM-SHA-256", salt_, stored_key, server_key, iterations)
    server = m.make_server(lambda u: (cred.salt, cred.stored_key, cred.server_key, cred.iterations),
                           s_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    server.set_client_first("n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert server.get_server_first() == ("r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                                         "s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    server.set_client_final("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                            "p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert server.get_server_final() == "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _librdkafka_style_login(auth: ScramAuthenticator, user: str, password: str, *, prefix: str | None = None,
                            mechanism: str = "SCRAM-SHA-256") -> spb.SaslAuthenticateResponse:
    """A SCRAM client written as librdkafka's built-in one is (the form Debian 12's kcat sends): its final
    message carries r=<client nonce><server's whole nonce> and its proof is over that message as sent.
    ``prefix`` replaces the repeated client nonce, for the forms that must still be refused."""
    digest = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
    client_nonce = "7z5e1F/A\\F9m]G1bZ;CmeQ=n^<H]p.A\\"  # librdkafka 2.0's nonces include '=' and backslashes
    first_bare = f"n={user},r={client_nonce}"
    first = auth.authenticate(spb.SaslAuthenticateRequest(mechanism=mechanism, auth_bytes=f"n,,{first_bare}".encode()))
    assert first.error_code == 0, first.error_message
    server_first = first.auth_bytes.decode()
    attrs = dict(part.split("=", 1) for part in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    without_proof = f"c=biws,r={client_nonce if prefix is None else prefix}{attrs['r']}"
    signature = hmac.new(hashlib.new(digest, client_key).digest(),
                         f"{first_bare},{server_first},{without_proof}".encode(), digest).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()
    return auth.authenticate(spb.SaslAuthenticateRequest(exchange_id=first.exchange_id,
                                                         auth_bytes=f"{without_proof},p={proof}".encode()))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_librdkafka_repeated_client_nonce_logs_in(server: Server, mechanism: str) -> None:
    add_user(server, "carol", "carol-secret", mechanism)
    final = _librdkafka_style_login(server.auth, "carol", "carol-secret", mechanism=mechanism)
    assert final.error_code == 0, final.error_message
    assert final.session_token and server.auth.session(final.session_token) is not None
    # The server's signature is over the message as the client signed it, so the client can check it.
    assert final.auth_bytes.startswith(b"v=")


def test_librdkafka_form_still_needs_the_password_and_exactly_that_nonce(server: Server) -> None:
    add_user(server, "carol", "carol-secret")
    wrong = _librdkafka_style_login(server.auth, "carol", "guess")
    assert wrong.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED and not wrong.session_token
    # Kafka's old rule took any nonce ending with the server's; Brook takes only the doubled one.
    for prefix in ("x", "AAAA", "7z5e1F"):
        other = _librdkafka_style_login(server.auth, "carol", "carol-secret", prefix=prefix)
        assert other.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED, prefix
        assert not other.session_token
    assert server.auth.succeeded_total == 0


def test_aio_server_refuses_stale_sessions_and_serves_live_ones() -> None:
    """The grpc.aio flavour of the session check (the broker's client-facing server is aio)."""
    import asyncio
    import threading

    from broker.sasl import AioSessionInterceptor

    users = {("alice", "SCRAM-SHA-256"): salted_credential("alice", "SCRAM-SHA-256", "pencil")}
    auth = ScramAuthenticator(lambda u, m: users.get((u, m)))
    auth.install()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)  # the test owns the loop: stop, then join
    thread.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=[AioSessionInterceptor(auth)])

        async def sasl(request: spb.SaslAuthenticateRequest, context: object) -> spb.SaslAuthenticateResponse:
            return auth.authenticate(request)

        async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            return str(principal_of(context)).encode()
        server.add_generic_rpc_handlers([
            grpc.method_handlers_generic_handler("brook.test.Echo", {"Who": grpc.unary_unary_rpc_method_handler(echo)}),
            grpc.method_handlers_generic_handler("brook.SecurityService", {
                "SaslAuthenticate": grpc.unary_unary_rpc_method_handler(
                    sasl, spb.SaslAuthenticateRequest.FromString, spb.SaslAuthenticateResponse.SerializeToString)}),
        ])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    box: dict[str, object] = {"port": port}
    address = f"127.0.0.1:{box['port']}"
    try:
        with scram_channel(address, ScramCredentials("alice", "pencil")) as ch:
            assert who(ch) == "User:alice"
        with grpc.insecure_channel(address) as plain, pytest.raises(grpc.RpcError) as caught:
            plain.unary_unary(WHO)(b"", timeout=10, metadata=[("x-brook-session", "forged")])
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(0), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        auth.uninstall()


def test_a_node_that_has_not_loaded_its_users_answers_retriable_not_invalid_credentials() -> None:
    # A restarted broker serves before its first metadata: a user it will know in a moment must get a
    # retriable answer (the client backs off and authenticates again), not "invalid credentials".
    users = {("rita", "SCRAM-SHA-256"): salted_credential("rita", "SCRAM-SHA-256", "rita-pw")}
    loaded = [False]
    auth = ScramAuthenticator(lambda u, m: users.get((u, m)) if loaded[0] else None, ready=lambda: loaded[0])
    client = scramp.ScramClient(["SCRAM-SHA-256"], "rita", "rita-pw")
    first = auth.authenticate(spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256",
                                                          auth_bytes=client.get_client_first().encode()))
    assert first.error_code == ErrorCode.BROKER_NOT_AVAILABLE and errors.error_for(first.error_code, "").retriable
    with pytest.raises(errors.BrookError) as caught:
        auth.authenticate_plain(b"\0rita\0rita-pw")
    assert caught.value.code == ErrorCode.BROKER_NOT_AVAILABLE
    loaded[0] = True
    assert auth.authenticate_plain(b"\0rita\0rita-pw") == "rita"
    with pytest.raises(errors.BrookError) as caught:
        auth.authenticate_plain(b"\0rita\0wrong")
    assert caught.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_the_client_authenticates_again_while_a_starting_node_loads_its_users(server: Server) -> None:
    # A restarted broker answers BROKER_NOT_AVAILABLE until its first metadata: the call waits it out
    # (within its timeout) instead of failing with an error no caller retries.
    add_user(server, "rita", "rita-pw")
    server.not_ready_answers[0] = 3
    channel = scram_channel(server.address, ScramCredentials("rita", "rita-pw"))
    assert who(channel) == "User:rita"
    assert server.not_ready_answers[0] == 0, "the node was asked while it was not ready"


def test_a_node_that_stays_unready_fails_the_call_within_its_timeout(server: Server) -> None:
    add_user(server, "rita", "rita-pw")
    server.not_ready_answers[0] = 1_000_000
    channel = scram_channel(server.address, ScramCredentials("rita", "rita-pw"))
    with pytest.raises(errors.BrookError) as caught:
        channel.unary_unary(WHO)(b"", timeout=0.5)
    assert caught.value.code == ErrorCode.BROKER_NOT_AVAILABLE and caught.value.retriable, caught.value
    assert server.not_ready_answers[0] < 1_000_000 - 1, "it was tried again before giving up"


def test_failed_logins_lock_a_user_out_from_that_address_only() -> None:
    # Kafka has no lockout; Brook limits guessing, but per client address, so nobody can lock a user out for all.
    users = {("rita", "SCRAM-SHA-512"): salted_credential("rita", "SCRAM-SHA-512", "rita-pw")}
    auth = ScramAuthenticator(lambda u, m: users.get((u, m)))
    for _ in range(10):
        with pytest.raises(errors.BrookError):
            auth.authenticate_plain(b"\0rita\0guess", "203.0.113.9")
    with pytest.raises(errors.BrookError) as caught:
        auth.authenticate_plain(b"\0rita\0rita-pw", "203.0.113.9")  # the right password, locked out there
    # Said as a wrong password is (a lockout message would tell that the name exists: the log says it).
    assert "invalid credentials" in caught.value.message
    assert auth.authenticate_plain(b"\0rita\0rita-pw", "198.51.100.7") == "rita"  # from elsewhere: fine


@pytest.mark.parametrize("mechanism", ["bogus", "scram-sha-256", "SCRAM-SHA3-512", ""])
def test_a_credential_of_an_unknown_mechanism_is_refused_before_salting(mechanism: str) -> None:
    """scramp raised its own ScramException (the CLI printed a traceback) or a misleading iteration-count error."""
    with pytest.raises(errors.BrookError) as refused:
        salted_credential("carol", mechanism, "pw")
    assert refused.value.code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert "SCRAM-SHA-256 or SCRAM-SHA-512" in refused.value.message


def test_half_finished_logins_from_many_addresses_push_out_their_own_exchanges_not_others() -> None:
    """All exchanges shared one table of MAX_EXCHANGES and the oldest went first: a flood of client-firsts from
    100 addresses, never finished, pushed out six of ten real logins whose client waited 2 s (audit). Now an
    address's exchanges past its share go first, and past the table the largest holder's oldest."""
    from broker.sasl import MAX_EXCHANGES, MAX_EXCHANGES_PER_ADDRESS

    users = {("alice", "SCRAM-SHA-256"): salted_credential("alice", "SCRAM-SHA-256", "pencil")}
    auth = ScramAuthenticator(lambda u, m: users.get((u, m)))
    client = scramp.ScramClient(["SCRAM-SHA-256"], "alice", "pencil")
    first = auth.authenticate(spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256",
                                                          auth_bytes=client.get_client_first().encode()), "198.51.100.7")
    assert first.error_code == 0, first.error_message
    flood = spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256", auth_bytes=b"n,,n=alice,r=flood")
    for i in range(2 * MAX_EXCHANGES):  # 100 addresses, 20 each, then one address far past its share
        answer = auth.authenticate(flood, f"10.0.{i % 100}.1" if i < 2000 else "10.1.0.1")
        assert answer.error_code == 0, answer.error_message
    assert len(auth._exchanges) <= MAX_EXCHANGES
    client.set_server_first(first.auth_bytes.decode())
    final = auth.authenticate(spb.SaslAuthenticateRequest(exchange_id=first.exchange_id,
                                                          auth_bytes=client.get_client_final().encode()), "198.51.100.7")
    assert final.error_code == 0, final.error_message  # the real login's exchange was kept
    assert "198.51.100.7" not in auth._exchanges_of  # finished: forgotten everywhere
    assert len(auth._exchanges_of["10.1.0.1"]) <= MAX_EXCHANGES_PER_ADDRESS  # the largest holder gives way
    alone = ScramAuthenticator(lambda u, m: users.get((u, m)))
    for _ in range(100):
        alone.authenticate(flood, "10.2.0.1")
    assert len(alone._exchanges) == MAX_EXCHANGES_PER_ADDRESS  # one address's own oldest go past its share


def test_an_address_that_keeps_failing_plain_logins_is_refused_without_the_pbkdf2(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each PLAIN attempt costs the server two PBKDF2s; the per-user limit never counted made-up users, so wrong
    passwords for them from 100 addresses, 200 a second, made a real login take 0.8-2.5 s (audit). Past
    MAX_PLAIN_FAILED_NAMES_PER_ADDRESS names in the window, an address is refused at once, whoever the user; a client
    retrying one user's deleted password (librdkafka: 150 times a minute) does not get there."""
    from broker import sasl
    from broker.sasl import FAILURE_WINDOW_S, MAX_PLAIN_FAILED_NAMES_PER_ADDRESS

    hashed: list[str] = []
    matches = sasl._plain_matches
    monkeypatch.setattr(sasl, "_plain_matches", lambda *a: (hashed.append(a[1]), matches(*a))[1])
    clock = Clock()
    users = {("rita", "SCRAM-SHA-512"): salted_credential("rita", "SCRAM-SHA-512", "rita-pw")}
    auth = ScramAuthenticator(lambda u, m: users.get((u, m)), clock=clock)
    # One user's gone password retried (a client's reconnect loop): the address's other users still log in.
    for _ in range(200):
        with pytest.raises(errors.BrookError):
            auth.authenticate_plain(b"\0deleted-user\0old-pw", "192.0.2.1")
    assert auth.authenticate_plain(b"\0rita\0rita-pw", "192.0.2.1") == "rita"
    # Made-up names sprayed from one address.
    for i in range(MAX_PLAIN_FAILED_NAMES_PER_ADDRESS):
        with pytest.raises(errors.BrookError):
            auth.authenticate_plain(f"\0made-up-{i}\0guess".encode(), "203.0.113.9")
    assert len(hashed) >= 2 * MAX_PLAIN_FAILED_NAMES_PER_ADDRESS
    hashed.clear()
    with pytest.raises(errors.BrookError) as refused:
        auth.authenticate_plain(b"\0rita\0rita-pw", "203.0.113.9")  # even the right password, from there
    assert "invalid credentials" in refused.value.message and hashed == []
    assert auth.authenticate_plain(b"\0rita\0rita-pw", "198.51.100.7") == "rita"  # from elsewhere: fine
    clock.now += FAILURE_WINDOW_S
    assert auth.authenticate_plain(b"\0rita\0rita-pw", "203.0.113.9") == "rita"  # once the window has passed
