"""``kafka.sasl.jaas.config`` read the way Kafka's clients read it.

Kafka parses the option with ``org.apache.kafka.common.security.JaasConfig``: a
``java.io.StreamTokenizer`` set up so that

* characters 0-32 are white space (line ends included);
* ``;`` and ``=`` are single-character tokens, and so are characters 129-159;
* ``"`` and ``'`` quote a value; inside quotes a backslash escapes as in Java (``\\n``,
  ``\\t``, octal ``\\101``, anything else stands for itself) and a quoted value ends at
  its closing quote, at a line end or at the end of the text;
* ``/`` starts a comment: ``/* ... */``, ``// ...`` and a lone ``/`` up to the line end;
* every other character (33-128, 160 and up) belongs to an unquoted word,

and then reads ``<LoginModule> <flag> (<key>=<value>)* ;`` entries, where the flag is
``required``, ``requisite``, ``sufficient`` or ``optional`` in any case and a value is a
word or a quoted string. A key given twice keeps its last value (Kafka's ``HashMap``).
A client (``JaasContext``) takes exactly one entry. :func:`parse` accepts and refuses
the same texts, with messages that never repeat a value: a refused text may hold a
password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

EOF = "EOF"
WORD = "WORD"
_FLAGS = ("REQUIRED", "REQUISITE", "SUFFICIENT", "OPTIONAL")  # compared upper-cased, as Kafka does
_ESCAPES = {"a": "\x07", "b": "\b", "f": "\x0c", "n": "\n", "r": "\r", "t": "\t", "v": "\x0b"}
# Option names of Kafka's ScramLoginModule: safe to name in an error. Any other token of a refused
# text is shown only by its position (a misplaced password is a token too).
KNOWN_KEYS = frozenset({"username", "password", "tokenauth"})
_JAVA_CLASS = re.compile(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)+")


class JaasConfigError(ValueError):
    """A text Kafka's JaasConfig/JaasContext refuses; the message holds no option value."""


@dataclass(frozen=True)
class JaasEntry:
    login_module: str
    flag: str  # lower case
    options: dict[str, str] = field(repr=False)  # values may be passwords


@dataclass(frozen=True)
class _Token:
    kind: str  # EOF, WORD, the quote character of a quoted string, or the ordinary character itself
    text: str | None  # a word or a quoted string's contents (StreamTokenizer's sval), else None
    pos: int  # 1-based character position where the token starts (0 at the end)


_NEED = ""  # StreamTokenizer's NEED_CHAR: the next token starts with a fresh read


def _kind_of(c: str) -> str:
    code = ord(c)
    if code >= 256:
        return "alpha"
    if code <= 32:
        return "space"
    if c in ";=" or 129 <= code <= 159:
        return "ordinary"
    if c in "\"'":
        return "quote"
    if c == "/":
        return "comment"
    return "alpha"


class _Tokenizer:
    """java.io.StreamTokenizer with JaasConfig's syntax table, char for char."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._i = 0
        self._peek: str | None = _NEED  # None: the end of the text was read

    def _read(self) -> str | None:
        if self._i >= len(self._text):
            self._i = len(self._text) + 1  # positions past the end stay past it
            return None
        c = self._text[self._i]
        self._i += 1
        return c

    def next(self) -> _Token:
        # A loop instead of StreamTokenizer's recursion after a comment.
        while True:
            c = self._peek
            self._peek = _NEED
            if not c:  # _NEED or None: read (StreamTokenizer treats a pending EOF the same way)
                c = self._read()
                if c is None:
                    return _Token(EOF, None, 0)
            while _kind_of(c) == "space":
                c = self._read()
                if c is None:
                    return _Token(EOF, None, 0)
            pos = self._i
            kind = _kind_of(c)
            if kind == "alpha":
                chars = [c]
                while (c := self._read()) is not None and _kind_of(c) == "alpha":
                    chars.append(c)
                self._peek = c
                return _Token(WORD, "".join(chars), pos)
            if kind == "quote":
                return self._quoted(c, pos)
            if kind == "comment":
                if self._comment():
                    continue
                return _Token(EOF, None, 0)
            return _Token(c, None, pos)

    def _quoted(self, quote: str, pos: int) -> _Token:
        chars: list[str] = []
        d = self._read()
        while d is not None and d != quote and d not in "\n\r":
            if d == "\\":
                c = self._read()
                first = c
                if c is not None and "0" <= c <= "7":
                    value = ord(c) - 48
                    c2 = self._read()
                    if c2 is not None and "0" <= c2 <= "7":
                        value = value * 8 + ord(c2) - 48
                        c2 = self._read()
                        if c2 is not None and "0" <= c2 <= "7" and first is not None and first <= "3":
                            value = value * 8 + ord(c2) - 48
                            d = self._read()
                        else:
                            d = c2
                    else:
                        d = c2
                    chars.append(chr(value))
                else:
                    # A backslash at the very end: Java stores (char) -1.
                    chars.append("\uffff" if c is None else _ESCAPES.get(c, c))
                    d = self._read()
            else:
                chars.append(d)
                d = self._read()
        self._peek = _NEED if d == quote else d
        return _Token(quote, "".join(chars), pos)

    def _comment(self) -> bool:
        """After a '/': skip the comment; False when it ran to the end of the text inside /* */."""
        c = self._read()
        if c == "*":
            prev = ""
            while True:
                c = self._read()
                if c == "/" and prev == "*":
                    return True
                if c == "\r":
                    c = self._read()
                    if c == "\n":
                        c = self._read()
                elif c == "\n":
                    c = self._read()
                if c is None:
                    return False
                prev = c
        # "//" or a lone "/" (JaasConfig makes '/' a comment character): up to the line end. For a
        # lone '/' the character after it is skipped too, even a line end, as StreamTokenizer does.
        while (c := self._read()) is not None and c not in "\n\r":
            pass
        self._peek = c
        return True


def _where(token: _Token) -> str:
    return f"at character {token.pos}" if token.pos else "at the end"


def _name(token: _Token) -> str:
    """A token for an error message: by name when it is one of the module's option names, else by position."""
    if token.kind == WORD and token.text in KNOWN_KEYS:
        return f"{token.text!r} ({_where(token)})"
    if token.kind not in (EOF, WORD) and token.text is None:  # ';', '=' ...
        return f"{token.kind!r} ({_where(token)})"
    return _where(token)


_QUOTING = "quote values that hold spaces, '/', ';', '=' or quotes"


def parse(text: str) -> list[JaasEntry]:
    """Every ``<LoginModule> <flag> key=value ... ;`` entry, or JaasConfigError where Kafka refuses."""
    tokens = _Tokenizer(text)
    entries = []
    token = tokens.next()
    while token.kind != EOF:
        entries.append(_entry(tokens, token))
        token = tokens.next()
    if not entries:
        raise JaasConfigError("no login module in it (expected '<LoginModule> required key=value ...;')")
    return entries


def _entry(tokens: _Tokenizer, first: _Token) -> JaasEntry:
    module = first.text
    token = tokens.next()
    if token.kind == EOF or token.text is None or token.text.upper() not in _FLAGS:
        found = _name(token)
        found = "nothing" if token.kind == EOF else found if found.startswith("'") else f"something else {found}"
        raise JaasConfigError(f"the login module's control flag (required, requisite, sufficient or optional) "
                              f"must follow its name; found {found}")
    flag = token.text.upper().lower()  # matched upper-cased, as Kafka does ("requıred" is "REQUIRED")
    options: dict[str, str] = {}
    token = tokens.next()
    while token.kind not in (EOF, ";"):
        key = token
        equals = tokens.next()
        value = tokens.next() if equals.kind == "=" else equals
        if equals.kind != "=" or value.kind == EOF or value.text is None:
            raise JaasConfigError(f"the key {_name(key)} has no value (key=value; {_QUOTING})")
        if key.text is not None:
            options[key.text] = value.text
        token = tokens.next()
    if token.kind != ";":
        raise JaasConfigError(f"the entry does not end with ';' (an unquoted '/' starts a comment: {_QUOTING})")
    if not module:
        raise JaasConfigError(f"the login module name is missing before the control flag ({_where(first)})")
    return JaasEntry(module, flag, options)


def shown_module(name: str) -> str:
    """A login module name for an error message (it is the caller's text: only a class name is repeated)."""
    return repr(name) if _JAVA_CLASS.fullmatch(name) and len(name) <= 200 else "another login module"
