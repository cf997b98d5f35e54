"""raft_messages.problem: the fields pysyncobj and Brook's layers read are checked before a voter reads them.

Legit traffic is checked wherever voters talk: tests/metadata_quorum/raft_sim.py's router asserts that every
message its voters send passes, and the real voters' tests run it on every message received. Here, each field of
each kind, one wrong value at a time.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from metadata_quorum import raft_messages
from metadata_quorum.prevote import PRE_VOTE, PRE_VOTE_RESPONSE

BIG = 1 << 64

LEGIT: list[dict[str, Any]] = [
    {"type": "request_vote", "term": 3, "last_log_term": 2, "last_log_index": 10},
    {"type": "response_vote", "term": 3},
    {"type": "timeout_now", "term": 3},
    {"type": "append_entries", "term": 3, "commit_index": 9, "prevLogIdx": 9, "prevLogTerm": 2,
     "entries": [(b"\x00", 10, 2), (b"\x01abc", 11, 3)]},
    {"type": "append_entries", "term": 3, "commit_index": 9, "prevLogIdx": 9, "prevLogTerm": 2, "entries": []},
    {"type": "append_entries", "term": 3, "commit_index": 9, "prevLogIdx": 9, "prevLogTerm": 2},
    {"type": "append_entries", "term": 3, "commit_index": 9, "prevLogIdx": 9, "prevLogTerm": 2,
     "transmission": "start", "data": b"part"},
    {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": (b"snapshot", True, False)},
    {"type": "append_entries", "term": 3, "commit_index": 9, "serialized": None},
    {"type": "next_node_idx", "next_node_idx": 11, "reset": False, "success": True, "term": 3},
    {"type": "next_node_idx", "next_node_idx": 11, "reset": True, "success": False},  # a release before terms
    {"type": "apply_command", "command": b"\x01cmd", "request_id": 4},
    {"type": "apply_command", "command": b"\x01cmd"},
    {"type": "apply_command_response", "request_id": 4, "log_idx": 12, "log_term": 3},
    {"type": "apply_command_response", "request_id": 4, "error": 4},
    {"type": PRE_VOTE, "round": 1, "term": 4, "last_log_term": 3, "last_log_index": 12},
    {"type": PRE_VOTE_RESPONSE, "round": 1, "term": 3, "granted": True},
    {"type": "a kind of a later release", "anything": object()},  # pysyncobj ignores it
]


@pytest.mark.parametrize("message", LEGIT, ids=lambda m: str(m["type"]))
def test_what_voters_send_passes(message: dict[str, Any]) -> None:
    assert raft_messages.problem(message) is None


def _with(index: int, **changes: Any) -> dict[str, Any]:
    return {**LEGIT[index], **changes}


HOSTILE: list[tuple[Any, str]] = [
    ([1, 2], "not a dict"),
    ({"no": "type"}, "type is NoneType"),
    (_with(0, term=BIG), "term is int"),
    (_with(0, term=-1), "term is int"),
    (_with(0, term=2.0), "term is float"),
    (_with(0, term=True), "term is bool"),
    (_with(0, last_log_index="10"), "last_log_index is str"),
    ({"type": "request_vote", "term": 3}, "last_log_term is NoneType"),
    (_with(1, term=None), "term is NoneType"),
    (_with(2, term=[3]), "term is list"),
    (_with(3, commit_index=BIG), "commit_index is int"),
    (_with(3, prevLogIdx=-1), "prevLogIdx is int"),
    (_with(3, entries="entries"), "entries is str"),
    (_with(3, entries=[(b"x", 10, 2), (b"y", 12, 3)]), "index is int 12 where 11 comes next"),
    (_with(3, entries=[(b"x", 10, 4)]), "term is int 4, not in [0, 3]"),
    (_with(3, entries=[("x", 10, 2)]), "command is str"),
    (_with(3, entries=[(b"x", 10)]), "not (command, index, term)"),
    (_with(3, entries=[(b"x", 10.0, 2)]), "index is float"),
    (_with(7, serialized=("chunk", True, True)), "snapshot piece"),
    (_with(7, serialized=(b"chunk", 1, 0)), "snapshot piece"),
    (_with(7, serialized=b"chunk"), "snapshot piece"),
    (_with(9, reset=1), "reset is int"),
    (_with(9, success=None), "success is NoneType"),
    (_with(9, term=BIG), "term is int"),
    (_with(9, next_node_idx=None), "next_node_idx is NoneType"),
    (_with(11, command="text"), "command is str"),
    (_with(11, request_id={}), "request_id is dict"),
    (_with(13, request_id=[4]), "request_id is list"),
    (_with(13, log_idx=BIG), "log_idx is int"),
    (_with(14, error="no"), "error is str"),
    (_with(15, round="x"), "round is str"),
    (_with(15, term=10**30), "term is int"),
    (_with(16, granted=1), "granted is int"),
]


@pytest.mark.parametrize("message,why", HOSTILE, ids=[w for _, w in HOSTILE])
def test_a_field_of_the_wrong_type_or_range_is_named(message: Any, why: str) -> None:
    problem = raft_messages.problem(message)
    assert problem is not None and why in problem, problem


@pytest.mark.parametrize("held,kind,refused", [
    ("", "start", None), ("", "process", "no start"), ("", "finish", "no start"), (b"pa", "process", None),
    (b"pa", "finish", None), (b"pa", "middle", "no kind"), (b"p" * 10, "process", "past 16 bytes"),
])
def test_an_entry_part_needs_its_start_and_fits_the_bound(monkeypatch: pytest.MonkeyPatch, held: object, kind: str,
                                                          refused: str | None) -> None:
    # pysyncobj joins a part to what it holds: '' (a str) when no start came, and bytes + str failed its tick
    # (the quorum fuzz target found it).
    from metadata_quorum import raft_transport

    monkeypatch.setattr(raft_transport, "ENTRY_IN_PARTS_MAX_BYTES", 16)
    voter = types.SimpleNamespace(_syncObj=types.SimpleNamespace(_SyncObj__recvTransmission=held))
    problem = raft_transport.BoundedTCPTransport._transmission_problem(
        voter, {"type": "append_entries", "transmission": kind, "data": b"rt" * 4})
    assert (problem is None) if refused is None else (problem is not None and refused in problem), problem
