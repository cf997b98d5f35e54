"""When a voter may start: the quorum port must not be open to code execution.

pysyncobj (the Raft library under ``MetadataRaft``) unpickles every frame it reads
from the quorum port, so anyone who can send it an unauthenticated frame can run code
on the voter (a 73-byte pickle is enough). A password makes the port safe: pysyncobj
then wraps every frame in Fernet (AES-CBC + HMAC-SHA256, key from PBKDF2 of the password)
and checks the HMAC before it unpickles anything, so a frame from someone without the
password is dropped unread. pysyncobj derives the key with a *fixed* salt, so a captured
frame lets an attacker guess passwords offline: the password must be strong, not merely
present (``password_problem``).

There is no exemption for loopback: every local user (and anything a local process can be
made to connect for it) reaches a loopback port, and would run code as the controller and
read the metadata log (SCRAM credentials, ACLs) as a pysyncobj "readonly" node.

Behind the password, frames are unpickled as data only (``quorum_pickle``), and pysyncobj's admin
commands and readonly nodes are refused (``raft_transport``). Whoever holds it can still name
itself as a voter and speak Raft to the voters that voter dials (pysyncobj's identities are what a
caller says): it is as sensitive as a root credential of the controller hosts.
"""

from __future__ import annotations

import math
import string

from proto import errors

MIN_PASSWORD_CHARS = 16
MIN_DISTINCT_CHARS = 8
MIN_PASSWORD_BITS = 72  # estimated from length and character classes; a random 16-char password has ~95

_CLASSES = (string.ascii_lowercase, string.ascii_uppercase, string.digits)


def bind_address(self_address: str) -> str:
    """What pysyncobj should bind: exactly the configured ``host:port``, never 0.0.0.0."""
    return self_address


def password_problem(password: str) -> str | None:
    """Why ``password`` is too weak for the quorum, or None if it is strong enough.

    Strong means: at least 16 characters, at least 8 distinct ones, and an estimated
    strength (length x log2 of the character classes used) of at least 72 bits. A
    generated secret (``python -c 'import secrets; print(secrets.token_urlsafe(32))'``)
    passes; ``x``, ``changeme`` or a word repeated do not.
    """
    if len(password) < MIN_PASSWORD_CHARS:
        return f"it has {len(password)} characters, at least {MIN_PASSWORD_CHARS} are required"
    if len(set(password)) < MIN_DISTINCT_CHARS:
        return f"it uses only {len(set(password))} distinct characters, at least {MIN_DISTINCT_CHARS} are required"
    pool = sum(len(cls) for cls in _CLASSES if any(ch in cls for ch in password))
    if any(not any(ch in cls for cls in _CLASSES) for ch in password):
        pool += 33  # punctuation, space and anything else
    bits = len(password) * math.log2(pool)
    if bits < MIN_PASSWORD_BITS:
        return f"its estimated strength is {bits:.0f} bits, at least {MIN_PASSWORD_BITS} are required"
    return None


def check_quorum_protection(self_address: str, partner_addresses: list[str], password: str | None) -> None:
    """Raise InvalidConfigError unless this voter's quorum traffic is protected: a strong password
    (see the module doc). ``self_address`` and ``partner_addresses`` name the voters in the message."""
    if not password:
        raise errors.InvalidConfigError(
            f"controller.quorum.password is required (voters {[self_address, *partner_addresses]}): without it "
            f"anyone who reaches a quorum port, a local user on a loopback address included, can run code on "
            f"the voter (pysyncobj unpickles what it receives). Generate one, e.g. "
            f"`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    problem = password_problem(password)
    if problem is not None:
        raise errors.InvalidConfigError(
            f"controller.quorum.password is too weak: {problem}. The quorum port executes pickled frames, "
            f"the password is what keeps strangers out (generate one, e.g. "
            f"`python -c 'import secrets; print(secrets.token_urlsafe(32))'`)")
