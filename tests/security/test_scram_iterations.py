"""SCRAM iterations: new credentials at most Kafka's 16,384; older ones still load and authenticate.

The server runs PBKDF2 at a credential's stored iteration count for every SASL PLAIN attempt, a wrong
password from an unauthenticated client included: with up to 1,000,000 iterations allowed, one attempt cost
0.9 CPU-s (audit #15). New credentials are capped at Kafka's ScramMechanism maxIterations (16,384) by the
controller and the client library; the metadata state keeps accepting what it accepted before (1,000,000),
so journals and snapshots written before the cap replay to the same state, and such users still log in.
The work is counted (PBKDF2 computations, commands proposed), never timed.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import pytest
import scramp

from broker.sasl import ScramAuthenticator
from metadata_quorum import commands as c
from metadata_quorum import security as sec
from metadata_quorum.security_service import QuorumSecurityAdmin, credential_record, salted_credential
from metadata_quorum.state import ApplyResult, MetadataState
from proto import errors
from proto import security_pb2 as spb
from proto.errors import ErrorCode


def legacy_credential(user: str, mechanism: str, password: str, iterations: int) -> sec.ScramCredential:
    """A credential as a version before the cap could store it (no validation on the way)."""
    salt, stored_key, server_key, i = scramp.ScramMechanism(mechanism).make_auth_info(password,
                                                                                      iteration_count=iterations)
    return sec.ScramCredential(user, mechanism, salt, stored_key, server_key, i)


def count_pbkdf2(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The iterations of each PBKDF2 computed from now on (scramp's and the PLAIN check's)."""
    calls: list[int] = []
    real: Callable[..., bytes] = hashlib.pbkdf2_hmac

    def counting(hash_name: str, password: bytes, salt: bytes, iterations: int, *args: Any) -> bytes:
        calls.append(iterations)
        return real(hash_name, password, salt, iterations, *args)
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counting)
    return calls


def test_kafkas_bounds() -> None:
    assert (sec.MIN_ITERATIONS, sec.MAX_ITERATIONS) == (4096, 16_384)  # Kafka's ScramMechanism
    assert sec.MAX_STORED_ITERATIONS == 1_000_000  # what the state accepted before the cap, kept


def test_the_client_library_refuses_more_iterations_before_computing_them(monkeypatch: pytest.MonkeyPatch) -> None:
    pbkdf2 = count_pbkdf2(monkeypatch)
    for mechanism in sec.MECHANISMS:
        with pytest.raises(errors.InvalidRequestError, match=r"4096\.\.16384"):
            salted_credential("ivy", mechanism, "pw", 16_385)
    with pytest.raises(errors.InvalidRequestError):
        salted_credential("ivy", "SCRAM-SHA-256", "pw", 1_000_000)
    assert pbkdf2 == []
    cred = salted_credential("ivy", "SCRAM-SHA-512", "pw", 16_384)
    assert cred.iterations == 16_384 and pbkdf2 == [16_384]


class Proposing:
    """Stands in for QuorumController: records what the security admin proposes."""

    def __init__(self) -> None:
        self.proposed: list[Any] = []
        self.waits: list[tuple[int, float]] = []  # (commands submitted by then, the timeout given)

    def is_active(self) -> bool:
        return True

    def _propose(self, cmd: Any, timeout_s: float) -> ApplyResult:
        self.proposed.append(cmd)
        return ApplyResult()

    def _submit(self, cmd: Any) -> Any:
        self.proposed.append(cmd)
        return Applied(self)


class Applied:
    """A proposal the quorum applied: its wait answers at once (``waits`` records the timeouts given)."""

    def __init__(self, controller: Proposing) -> None:
        self.controller = controller

    def wait(self, timeout_s: float) -> ApplyResult:
        self.controller.waits.append((len(self.controller.proposed), timeout_s))
        return ApplyResult()


def test_the_controller_refuses_a_new_credential_above_kafkas_maximum() -> None:
    controller = Proposing()
    admin = QuorumSecurityAdmin(controller, raft=None, redirect=lambda: None)
    heavy = legacy_credential("ivy", "SCRAM-SHA-256", "pw", 16_385)
    fine = legacy_credential("joe", "SCRAM-SHA-256", "pw", 16_384)
    answer = admin.upsert_credentials([credential_record(heavy), credential_record(fine)], 5)
    assert [(r.name, r.error_code) for r in answer.results] == [("ivy", ErrorCode.INVALID_REQUEST), ("joe", 0)]
    assert "4096..16384" in answer.results[0].error_message and "16385" in answer.results[0].error_message
    assert [cmd.user for cmd in controller.proposed] == ["joe"]


def test_a_bulk_change_submits_every_item_before_it_waits_and_waits_within_one_deadline() -> None:
    """Each item was proposed and waited for in turn, each with the whole timeout: 1,000 items took 52 s, and
    went on being proposed long after the caller's deadline (audit)."""
    controller = Proposing()
    admin = QuorumSecurityAdmin(controller, raft=None, redirect=lambda: None)
    records = [credential_record(salted_credential(f"u{i}", "SCRAM-SHA-256", "pw")) for i in range(50)]
    answer = admin.upsert_credentials(records, 5)
    assert [r.error_code for r in answer.results] == [0] * 50
    assert controller.waits and all(submitted == 50 for submitted, _ in controller.waits), \
        "a wait came before every item was submitted"
    assert all(timeout <= 5 for _, timeout in controller.waits)
    controller.waits.clear()
    items = [spb.DeleteScramCredentialsRequest.Item(user=f"u{i}", mechanism="SCRAM-SHA-256") for i in range(50)]
    assert [r.error_code for r in admin.delete_credentials(items, 5).results] == [0] * 50
    assert all(submitted == 100 for submitted, _ in controller.waits)


def test_items_not_applied_by_the_deadline_are_timed_out_not_waited_for_each() -> None:
    class Stuck:
        def wait(self, timeout_s: float) -> ApplyResult:
            waited.append(timeout_s)
            raise errors.RequestTimedOutError(f"not committed within {timeout_s:.1f} s")

    waited: list[float] = []
    controller = Proposing()
    controller._submit = lambda cmd: Stuck()  # type: ignore[method-assign]
    admin = QuorumSecurityAdmin(controller, raft=None, redirect=lambda: None)
    items = [spb.DeleteScramCredentialsRequest.Item(user=f"u{i}") for i in range(20)]
    answer = admin.delete_credentials(items, 0.0)
    assert [r.error_code for r in answer.results] == [ErrorCode.REQUEST_TIMED_OUT] * 20
    assert waited == [0.0] * 20, "each item waited a timeout of its own"


def test_the_state_still_applies_and_loads_credentials_stored_before_the_cap() -> None:
    """The state must replay an older journal (and load an older snapshot) to the same state: what it
    accepted before, it accepts still; only the controller is stricter."""
    old = legacy_credential("olga", "SCRAM-SHA-256", "olga-pw", 100_000)
    s = MetadataState()
    assert s.apply(c.UpsertScramCredential(*old.to_plain())).ok  # type: ignore[arg-type]
    assert s.scram[("olga", "SCRAM-SHA-256")] == old
    restored = MetadataState.from_snapshot(s.to_snapshot())
    assert restored == s and restored.scram[("olga", "SCRAM-SHA-256")].iterations == 100_000
    # What it refused before, it refuses still.
    over = c.UpsertScramCredential("olga", "SCRAM-SHA-512", "00" * 16, "00" * 64, "00" * 64, 1_000_001)
    before = s.version
    assert s.apply(over).error_code == ErrorCode.INVALID_REQUEST and s.version == before


def test_a_credential_stored_before_the_cap_still_authenticates_and_is_warned_about_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    users = {("olga", "SCRAM-SHA-256"): legacy_credential("olga", "SCRAM-SHA-256", "olga-pw", 20_000),
             ("kim", "SCRAM-SHA-256"): salted_credential("kim", "SCRAM-SHA-256", "kim-pw", 16_384)}
    auth = ScramAuthenticator(lambda u, m: users.get((u, m)))
    with caplog.at_level(logging.WARNING, logger="broker.sasl"):
        assert auth.authenticate_plain(b"\0olga\0olga-pw", "198.51.100.7") == "olga"
        with pytest.raises(errors.BrookError) as failed:
            auth.authenticate_plain(b"\0olga\0wrong", "198.51.100.7")
        assert failed.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert auth.authenticate_plain(b"\0kim\0kim-pw", "198.51.100.7") == "kim"
    # SCRAM too (the client computes the PBKDF2 there).
    client = scramp.ScramClient(["SCRAM-SHA-256"], "olga", "olga-pw")
    first = auth.authenticate(spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256",
                                                          auth_bytes=client.get_client_first().encode()))
    client.set_server_first(first.auth_bytes.decode())
    final = auth.authenticate(spb.SaslAuthenticateRequest(mechanism="SCRAM-SHA-256", exchange_id=first.exchange_id,
                                                          auth_bytes=client.get_client_final().encode()))
    assert final.error_code == ErrorCode.NONE and final.session_token, final
    warnings = [r.getMessage() for r in caplog.records if "PBKDF2 iterations" in r.getMessage()]
    assert len(warnings) == 1, warnings  # once per credential, not per attempt; none for kim's 16,384
    assert "'olga'" in warnings[0] and "20000" in warnings[0] and "16384" in warnings[0], warnings[0]
