"""The shape of every Raft message a voter takes: checked before pysyncobj (or Brook's layers over it) reads one.

pysyncobj reads a message's fields as they come: a term, an index or a count is compared, added and stored as it
is. A message of the right keys with a value of the wrong type or range therefore did more than fail: a term of
``2**64`` (or a negative one) was stored as the voter's term and then failed to pack into the journal with the
first entry of the next term, a float term of ``1e300`` made every election at ``term + 1`` run at the same term,
and an entry of the wrong shape raised only after the follower's entries past ``prevLogIdx`` had been deleted. Only a holder of the quorum password can send
a message at all (raft_transport.py), and Raft trusts its leader; but what a voter stores, it must be able to write
and read back, whoever sent it.

``problem(message)`` says what is wrong with a message of a kind this release knows (None: nothing), by the fields
pysyncobj and Brook's layers read: types, and integers within ``0 <= n < INT_MAX`` (the journal packs indexes and
terms as unsigned 64-bit). A message of a kind it does not know is left to pysyncobj, which ignores it. Entries
must be consecutive from ``prevLogIdx + 1`` and of a term no later than the message's, as a leader's log is.
"""

from __future__ import annotations

from typing import Any

from metadata_quorum.prevote import PRE_VOTE, PRE_VOTE_RESPONSE

INT_MAX = 1 << 63  # terms and indexes: the journal packs them as '<Q'; a bound well inside it


def _count(message: dict[Any, Any], key: str, *, optional: bool = False) -> str | None:
    value = message.get(key)
    if value is None and optional and key not in message:
        return None
    if type(value) is not int or not 0 <= value < INT_MAX:  # not a bool either: no legit sender uses one
        return f"{key} is {_shown(value)}, not an integer in [0, 2**63)"
    return None


def _flag(message: dict[Any, Any], key: str) -> str | None:
    value = message.get(key)
    return None if type(value) is bool else f"{key} is {_shown(value)}, not a bool"


def _shown(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.40}" if isinstance(value, (int, float, str, bytes)) else \
        type(value).__name__


def _first(*problems: str | None) -> str | None:
    return next((p for p in problems if p is not None), None)


def entry_problem(entry: Any, index: int, term: int) -> str | None:
    """Why a log entry may not be stored at ``index`` by a leader of ``term`` (None: it may)."""
    if not isinstance(entry, (tuple, list)) or len(entry) != 3:
        return f"an entry is {_shown(entry)}, not (command, index, term)"
    command, at, of = entry
    if not isinstance(command, bytes):
        return f"an entry's command is {_shown(command)}, not bytes"
    if type(at) is not int or at != index:
        return f"an entry's index is {_shown(at)} where {index} comes next"
    if type(of) is not int or not 0 <= of <= term:
        return f"an entry's term is {_shown(of)}, not in [0, {term}] (the leader's)"
    return None


def _append_entries(message: dict[Any, Any]) -> str | None:
    problem = _first(_count(message, "term"), _count(message, "commit_index"))
    if problem is not None:
        return problem
    if "prevLogIdx" not in message:  # a piece of a snapshot, or a heartbeat to a follower waiting for one
        piece = message.get("serialized")
        if piece is None:
            return None
        if not isinstance(piece, (tuple, list)) or len(piece) != 3 or not isinstance(piece[0], bytes) or \
                type(piece[1]) is not bool or type(piece[2]) is not bool:
            return f"a snapshot piece is {_shown(piece)}, not (bytes, first, last)"
        return None
    problem = _first(_count(message, "prevLogIdx"), _count(message, "prevLogTerm"))
    if problem is not None or message.get("transmission") is not None:
        return problem  # an entry sent in parts: raft_transport checks the parts, log_matching the whole
    entries = message.get("entries", [])
    if not isinstance(entries, (list, tuple)):
        return f"entries is {_shown(entries)}, not a list"
    first = message["prevLogIdx"] + 1
    term = message["term"]
    for i, entry in enumerate(entries):
        problem = entry_problem(entry, first + i, term)
        if problem is not None:
            return problem
    return None


def _apply_command_response(message: dict[Any, Any]) -> str | None:
    if type(message.get("request_id")) is not int:
        return f"request_id is {_shown(message.get('request_id'))}, not an integer"
    if message.get("error") is not None:
        return None if type(message["error"]) is int else f"error is {_shown(message['error'])}, not an integer"
    return _first(_count(message, "log_idx"), _count(message, "log_term"))


def _apply_command(message: dict[Any, Any]) -> str | None:
    if not isinstance(message.get("command"), bytes):
        return f"command is {_shown(message.get('command'))}, not bytes"
    if "request_id" in message and type(message["request_id"]) is not int:
        return f"request_id is {_shown(message['request_id'])}, not an integer"
    return None


_CHECKS: dict[str, Any] = {
    "append_entries": _append_entries,
    "request_vote": lambda m: _first(_count(m, "term"), _count(m, "last_log_term"), _count(m, "last_log_index")),
    "response_vote": lambda m: _count(m, "term"),
    "timeout_now": lambda m: _count(m, "term"),
    "next_node_idx": lambda m: _first(_count(m, "next_node_idx"), _flag(m, "reset"), _flag(m, "success"),
                                      _count(m, "term", optional=True)),
    "apply_command": _apply_command,
    "apply_command_response": _apply_command_response,
    PRE_VOTE: lambda m: _first(_count(m, "round"), _count(m, "term"), _count(m, "last_log_term"),
                               _count(m, "last_log_index")),
    PRE_VOTE_RESPONSE: lambda m: _first(_count(m, "round"), _count(m, "term"), _flag(m, "granted")),
}


def problem(message: Any) -> str | None:
    """What is wrong with a Raft message as a voter receives it (None: nothing this release can tell)."""
    if not isinstance(message, dict):
        return f"a message that is {_shown(message)}, not a dict"
    kind = message.get("type")
    if not isinstance(kind, str):
        return f"a message whose type is {_shown(kind)}"
    check = _CHECKS.get(kind)
    return None if check is None else check(message)
