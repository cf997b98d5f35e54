"""No user enumeration before login: an unknown user name must be answered exactly as a known one.

In process, with the real ScramAuthenticator. Work is compared by counting PBKDF2 computations
(never by timing), and replies by their error codes and messages with the user name taken out.
"""

from __future__ import annotations

import base64
import hashlib
import sys
from collections.abc import Callable
from typing import Any

import pytest
import scramp

from broker import sasl
from broker.sasl import FAILURE_WINDOW_S, MAX_FAILURES_PER_USER, ScramAuthenticator
from metadata_quorum.security import MECHANISMS, ScramCredential
from metadata_quorum.security_service import salted_credential
from proto import errors
from proto import security_pb2 as spb
from proto.errors import ErrorCode

PEER = "203.0.113.9"
KNOWN, UNKNOWN = "alice", "mallory"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_auth(mechanisms: tuple[str, ...] = tuple(MECHANISMS)) -> tuple[ScramAuthenticator, Clock]:
    """An authenticator that knows KNOWN (password "pencil") for ``mechanisms`` and nobody else."""
    users: dict[tuple[str, str], ScramCredential] = {
        (KNOWN, m): salted_credential(KNOWN, m, "pencil") for m in mechanisms}
    clock = Clock()
    return ScramAuthenticator(lambda u, m: users.get((u, m)), clock=clock), clock


def plain_reply(auth: ScramAuthenticator, user: str, password: str, peer: str = PEER) -> tuple[int, str]:
    """(error code, message) of a PLAIN login; (0, user) when it succeeds."""
    try:
        return 0, auth.authenticate_plain(f"\0{user}\0{password}".encode(), peer)
    except errors.BrookError as exc:
        return exc.code, exc.message


def scram_reply(auth: ScramAuthenticator, user: str, password: str, peer: str = PEER,
                mechanism: str = "SCRAM-SHA-256") -> tuple[int, str]:
    """(error code, message) of a whole SCRAM exchange, from whichever step refused it; (0, "") on success."""
    client = scramp.ScramClient([mechanism], user, password)
    first = auth.authenticate(spb.SaslAuthenticateRequest(mechanism=mechanism,
                                                          auth_bytes=client.get_client_first().encode()), peer)
    if first.error_code:
        return first.error_code, first.error_message
    client.set_server_first(first.auth_bytes.decode())
    final = auth.authenticate(spb.SaslAuthenticateRequest(exchange_id=first.exchange_id,
                                                          auth_bytes=client.get_client_final().encode()), peer)
    return final.error_code, final.error_message


def cheap_scram_failure(auth: ScramAuthenticator, user: str, peer: str = PEER) -> tuple[int, str]:
    """A SCRAM exchange with a made-up proof: fails in the final step without anyone running PBKDF2,
    as an attacker flooding the server with names would do it."""
    first = auth.authenticate(spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256",
                                                          auth_bytes=f"n,,n={user},r=clientnonce".encode()), peer)
    if first.error_code:
        return first.error_code, first.error_message
    nonce = dict(part.split("=", 1) for part in first.auth_bytes.decode().split(","))["r"]
    proof = base64.b64encode(bytes(32)).decode()
    final = auth.authenticate(spb.SaslAuthenticateRequest(exchange_id=first.exchange_id,
                                                          auth_bytes=f"c=biws,r={nonce},p={proof}".encode()), peer)
    return final.error_code, final.error_message


def without_name(reply: tuple[int, str], user: str) -> tuple[int, str]:
    code, message = reply
    return code, message.replace(repr(user), "<user>")


def count_pbkdf2(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Patch hashlib.pbkdf2_hmac to record (digest, salt length, iterations) of each computation."""
    calls: list[tuple[str, int, int]] = []
    real: Callable[..., bytes] = hashlib.pbkdf2_hmac

    def counting(hash_name: str, password: bytes, salt: bytes, iterations: int, *args: Any) -> bytes:
        calls.append((hash_name, len(salt), iterations))
        return real(hash_name, password, salt, iterations, *args)
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counting)
    return calls


# ---- (a) PLAIN does the same work for a wrong password and an unknown user ----
@pytest.mark.parametrize("mechanisms", [tuple(MECHANISMS), ("SCRAM-SHA-256",), ("SCRAM-SHA-512",)],
                         ids=["both", "sha256-only", "sha512-only"])
def test_plain_wrong_password_and_unknown_user_run_the_same_pbkdf2_work(
        monkeypatch: pytest.MonkeyPatch, mechanisms: tuple[str, ...]) -> None:
    # The audit's finding: PBKDF2 ran only for existing users, so "wrong password" answered ~10x slower
    # than "no such user". Counting the computations (digest, salt size, iterations) shows the work itself.
    auth, _ = make_auth(mechanisms)  # credentials are salted before the patch: only logins are counted
    calls = count_pbkdf2(monkeypatch)
    assert plain_reply(auth, KNOWN, "wrong")[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    known_work = sorted(calls)
    calls.clear()
    assert plain_reply(auth, UNKNOWN, "wrong")[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    unknown_work = sorted(calls)
    assert known_work == unknown_work and len(unknown_work) == len(MECHANISMS), (known_work, unknown_work)
    calls.clear()
    assert plain_reply(auth, KNOWN, "pencil") == (0, KNOWN)  # the right password still gets in
    assert 1 <= len(calls) <= len(mechanisms)


def test_plain_fake_credentials_never_let_an_unknown_user_in() -> None:
    auth, _ = make_auth()
    for password in ("", "pencil", "x" * 100):
        assert plain_reply(auth, UNKNOWN, password)[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert auth.succeeded_total == 0 and auth.failed_total == 3


# ---- SCRAM's first answer has the same shape for an unknown user ----
@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_scram_server_first_looks_the_same_for_an_unknown_user(mechanism: str) -> None:
    # The server-first message shows the salt (so its length) and the iteration count.
    auth, _ = make_auth()

    def salt_and_iterations(user: str) -> tuple[bytes, str]:
        first = auth.authenticate(spb.SaslAuthenticateRequest(
            mechanism=mechanism, auth_bytes=f"n,,n={user},r=clientnonce".encode()), PEER)
        assert first.error_code == 0, first.error_message
        attrs = dict(part.split("=", 1) for part in first.auth_bytes.decode().split(","))
        return base64.b64decode(attrs["s"]), attrs["i"]

    known_salt, known_i = salt_and_iterations(KNOWN)
    fake_salt, fake_i = salt_and_iterations(UNKNOWN)
    assert (len(fake_salt), fake_i) == (len(known_salt), known_i)
    assert salt_and_iterations(UNKNOWN)[0] == fake_salt  # stable per name: asking again gives nothing away


# ---- (b) a locked-out user is answered as a wrong password, as an unknown name is ----
def _transcripts(auth: ScramAuthenticator,
                 attempt: Callable[[ScramAuthenticator, str, str], tuple[int, str]]) -> dict[str, list[tuple[int, str]]]:
    """Each user's replies to MAX_FAILURES_PER_USER + 2 wrong guesses in a row, the name taken out."""
    out: dict[str, list[tuple[int, str]]] = {}
    for user in (KNOWN, UNKNOWN):
        out[user] = [without_name(attempt(auth, user, "guess"), user) for _ in range(MAX_FAILURES_PER_USER + 2)]
    return out


@pytest.mark.parametrize("via", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_lockout_is_answered_as_a_wrong_password_so_it_tells_nothing_of_who_exists(
        via: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lockout's own message (\"too many failed authentications\") reached existing users only: after ten
    guesses it told which names exist. Now every reply is \"invalid credentials\", for the same work, and the
    lockout still holds: the right password is refused until the window has passed."""
    auth, clock = make_auth()
    if via == "PLAIN":
        def attempt(a: ScramAuthenticator, user: str, password: str) -> tuple[int, str]:
            return plain_reply(a, user, password)
    else:
        def attempt(a: ScramAuthenticator, user: str, password: str) -> tuple[int, str]:
            return scram_reply(a, user, password, mechanism=via)

    replies = _transcripts(auth, attempt)
    assert replies[KNOWN] == replies[UNKNOWN], replies
    assert all(r == (ErrorCode.SASL_AUTHENTICATION_FAILED, "authentication failed for user <user>: invalid credentials")
               for r in replies[KNOWN]), replies[KNOWN]
    calls = count_pbkdf2(monkeypatch)
    # Locked out: the right password is refused, in the same words and for the same work as a wrong one.
    assert without_name(attempt(auth, KNOWN, "pencil"), KNOWN) == replies[KNOWN][0]
    locked_work = sorted(calls)
    calls.clear()
    attempt(auth, UNKNOWN, "pencil")
    assert locked_work == sorted(calls), (locked_work, sorted(calls))
    clock.now += FAILURE_WINDOW_S + 1  # the window passes
    assert attempt(auth, KNOWN, "pencil")[0] == 0


def test_a_locked_out_users_scram_exchange_shows_its_real_salt() -> None:
    """A fake salt while locked out would tell that the name is real (a made-up name's fake salt never
    changes): the exchange shows the real salt and iterations, and can only fail."""
    auth, _ = make_auth()

    def salt(user: str) -> str:
        first = auth.authenticate(spb.SaslAuthenticateRequest(
            mechanism="SCRAM-SHA-256", auth_bytes=f"n,,n={user},r=clientnonce".encode()), PEER)
        return dict(part.split("=", 1) for part in first.auth_bytes.decode().split(","))["s"]

    before = salt(KNOWN)
    for _ in range(MAX_FAILURES_PER_USER):
        cheap_scram_failure(auth, KNOWN)
    assert salt(KNOWN) == before


def test_unknown_names_are_not_counted_so_a_node_waiting_for_its_user_is_not_locked_out() -> None:
    """A node retrying before its bootstrap user exists fails as an unknown name many times a second: once
    the user is created, it logs in at once. Made-up names take no memory either."""
    users: dict[tuple[str, str], ScramCredential] = {}
    auth = ScramAuthenticator(lambda u, m: users.get((u, m)), clock=Clock())
    for i in range(5 * MAX_FAILURES_PER_USER):
        assert cheap_scram_failure(auth, "broker")[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert plain_reply(auth, f"made-up-{i}", "x")[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert len(auth._failures) == 0
    users[("broker", "SCRAM-SHA-256")] = salted_credential("broker", "SCRAM-SHA-256", "node-secret")
    assert scram_reply(auth, "broker", "node-secret") == (0, "")


# ---- (c) the failure table stays bounded ----
def test_failure_tracking_stays_bounded_with_many_users_at_many_addresses(monkeypatch: pytest.MonkeyPatch) -> None:
    cap = 64  # the real cap is large; a small one shows the bound without thousands of exchanges
    monkeypatch.setattr(sasl, "MAX_FAILURE_RECORDS", cap, raising=False)
    auth, clock = make_auth()
    for i in range(20 * cap):  # one known user failing from many addresses: one record each
        assert cheap_scram_failure(auth, KNOWN, f"10.0.{i // 250}.{i % 250}")[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert auth.failed_total == 20 * cap
    assert 0 < len(auth._failures) <= cap
    assert all(sys.getsizeof(key) < 200 for key in auth._failures)
    # The newest address is still counted, so the lockout still reaches it.
    newest = f"10.0.{(20 * cap - 1) // 250}.{(20 * cap - 1) % 250}"
    for _ in range(MAX_FAILURES_PER_USER - 1):
        cheap_scram_failure(auth, KNOWN, newest)
    assert scram_reply(auth, KNOWN, "pencil", peer=newest)[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    # Once the window has passed, the next failure sweeps out every stale record.
    clock.now += FAILURE_WINDOW_S + 1
    cheap_scram_failure(auth, KNOWN)
    assert len(auth._failures) == 1


# ---- sessions: one user cannot push the others' out ----
def test_one_user_logging_in_again_and_again_keeps_at_most_its_share_of_sessions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sasl, "MAX_SESSIONS_PER_USER", 5)
    monkeypatch.setattr(sasl, "MAX_SESSIONS", 8)
    users = {(name, "SCRAM-SHA-256"): salted_credential(name, "SCRAM-SHA-256", "pw") for name in ("alice", "eve")}
    auth = ScramAuthenticator(lambda u, m: users.get((u, m)), clock=Clock())

    def login(user: str) -> str:
        client = scramp.ScramClient(["SCRAM-SHA-256"], user, "pw")
        first = auth.authenticate(spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256",
                                                              auth_bytes=client.get_client_first().encode()), PEER)
        client.set_server_first(first.auth_bytes.decode())
        final = auth.authenticate(spb.SaslAuthenticateRequest(exchange_id=first.exchange_id,
                                                              auth_bytes=client.get_client_final().encode()), PEER)
        assert final.error_code == 0, final.error_message
        return final.session_token

    alice = [login("alice") for _ in range(3)]
    eve = [login("eve") for _ in range(50)]
    assert all(auth.session(t) is not None for t in alice), "eve's logins pushed alice's sessions out"
    assert sum(auth.session(t) is not None for t in eve) == 5  # her newest five
    assert auth.session(eve[-1]) is not None and auth.session(eve[0]) is None
    assert sum(len(q) for q in auth._user_sessions.values()) <= 3 + 5 + 1
    # A session ended by its holder (a Kafka-listener connection keeps its principal) leaves no trace.
    auth.end_session(alice[0])
    assert auth.session(alice[0]) is None and len(auth._sessions) == 2 + 5
