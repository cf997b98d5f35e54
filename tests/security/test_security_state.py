"""Security records in MetadataState: commands, refusals that change nothing, deltas, snapshots."""

from __future__ import annotations

from metadata_quorum import commands as c
from metadata_quorum.security_service import salted_credential
from metadata_quorum.state import MetadataState
from proto.errors import ErrorCode


def cred_cmd(user: str = "alice", mechanism: str = "SCRAM-SHA-256") -> c.UpsertScramCredential:
    return c.UpsertScramCredential(*salted_credential(user, mechanism, "pw").to_plain())  # type: ignore[arg-type]


ACL = ["TOPIC", "orders", "LITERAL", "User:alice", "*", "WRITE", "ALLOW"]


def test_credentials_are_stored_salted_and_never_as_the_password() -> None:
    s = MetadataState()
    assert s.apply(cred_cmd()).ok
    stored = s.scram[("alice", "SCRAM-SHA-256")]
    assert stored.iterations >= 4096 and len(stored.salt) >= 8 and len(stored.stored_key) == 32
    assert b"pw" not in repr(s.to_snapshot()).encode()


def test_refused_commands_change_nothing_not_even_the_version() -> None:
    s = MetadataState()
    before = s.version
    bad = [
        c.UpsertScramCredential("alice", "SCRAM-SHA-1", "00" * 16, "00" * 32, "00" * 32, 4096),
        c.UpsertScramCredential("alice", "SCRAM-SHA-256", "00" * 16, "00" * 32, "00" * 32, 10),
        c.UpsertScramCredential("node-1", "SCRAM-SHA-256", "00" * 16, "00" * 32, "00" * 32, 4096),
        c.DeleteScramCredential("nobody"),
        c.CreateAcls([ACL, ["TOPIC", "x", "LITERAL", "bob", "*", "READ", "ALLOW"]]),  # one bad: none applied
        c.AlterClientQuota("User:alice", {"producer_byte_rate": -5}),
        c.AlterClientQuota("User:alice", {"bogus": 5}),
    ]
    for cmd in bad:
        assert not s.apply(cmd).ok, cmd
    assert s.version == before and not s.scram and not s.acls and not s.quotas
    assert s.apply(c.DeleteScramCredential("nobody")).error_code == ErrorCode.RESOURCE_NOT_FOUND


def test_deltas_carry_credentials_acls_and_quotas() -> None:
    s = MetadataState()
    s.apply(cred_cmd())
    v1 = s.version
    s.apply(c.CreateAcls([ACL]))
    s.apply(c.AlterClientQuota("User:alice", {"producer_byte_rate": 1000.0}))
    d = s.changes_since(v1)
    assert d is not None and not d.credentials
    assert d.acls is not None and [b.as_list() for b in d.acls] == [ACL]
    assert d.quotas == [("User:alice", {"producer_byte_rate": 1000.0})]
    s.apply(c.DeleteScramCredential("alice"))
    s.apply(c.AlterClientQuota("User:alice", remove=["producer_byte_rate"]))
    d2 = s.changes_since(v1)
    assert d2 is not None and d2.deleted_credentials == [("alice", "SCRAM-SHA-256")]
    assert ("User:alice", {}) in d2.quotas


def test_snapshot_round_trip_and_old_snapshots_without_security() -> None:
    s = MetadataState()
    s.apply(cred_cmd())
    s.apply(c.CreateAcls([ACL]))
    s.apply(c.AlterClientQuota("<default>", {"request_rate": 50.0}))
    restored = MetadataState.from_snapshot(s.to_snapshot())
    assert restored == s and restored.scram == s.scram and restored.acls == s.acls
    old = s.to_snapshot()
    del old["security"]
    assert not MetadataState.from_snapshot(old).acls


def test_delete_acls_returns_what_it_removed_and_is_idempotent() -> None:
    s = MetadataState()
    s.apply(c.CreateAcls([ACL]))
    version = s.version
    assert [b.as_list() for b in s.apply(c.DeleteAcls([ACL])).value] == [ACL]
    assert s.apply(c.DeleteAcls([ACL])).value == [] and s.version == version + 1


def test_a_users_credential_changes_apply_together_or_not_at_all() -> None:
    """AlterScramCredentials (brook.metadata.version 4): a missing deletion, a key named twice or the credential cap
    refuses the whole command, nothing changed; below level 4 it is refused."""
    from metadata_quorum import features
    from metadata_quorum import security as sec

    s = MetadataState()
    old = salted_credential("ann", "SCRAM-SHA-256", "pw").to_plain()
    new = salted_credential("ann", "SCRAM-SHA-512", "pw2").to_plain()
    assert s.apply(c.AlterScramCredentials([old], [])).error_code == ErrorCode.UNSUPPORTED_VERSION and not s.scram
    assert s.apply(c.UpdateFeature(features.METADATA_VERSION, features.ATOMIC_SCRAM)).ok
    assert s.apply(c.AlterScramCredentials([old], [])).ok
    version = s.version

    refused = s.apply(c.AlterScramCredentials([new], [["ann", "SCRAM-SHA-512"]]))  # ann has no SHA-512 yet
    assert refused.error_code == ErrorCode.RESOURCE_NOT_FOUND and set(s.scram) == {("ann", "SCRAM-SHA-256")}
    assert s.apply(c.AlterScramCredentials([old], [["ann", "SCRAM-SHA-256"]])).error_code == ErrorCode.INVALID_REQUEST
    assert s.version == version

    assert s.apply(c.AlterScramCredentials([new], [["ann", "SCRAM-SHA-256"]])).ok  # the password and mechanism moved
    assert set(s.scram) == {("ann", "SCRAM-SHA-512")} and s.version == version + 1

    s.scram.update({(f"u{i}", "SCRAM-SHA-256"): s.scram[("ann", "SCRAM-SHA-512")]
                    for i in range(sec.MAX_CREDENTIALS - len(s.scram))})
    two = [salted_credential("bo", m, "pw").to_plain() for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")]
    assert s.apply(c.AlterScramCredentials(two, [])).error_code == ErrorCode.INVALID_REQUEST
    assert not any(user == "bo" for user, _ in s.scram), "one of bo's two credentials was stored at the cap"
    assert s.apply(c.AlterScramCredentials(two[:1], [["u0", "SCRAM-SHA-256"]])).ok  # room made in the same command
