"""Unpickling for the quorum: data, never code.

pysyncobj unpickles every frame a voter receives, every journal entry it applies and every snapshot it
loads. Unpickling runs whatever callable a pickle names (``os.system`` is 73 bytes away), so before this
anyone holding ``controller.quorum.password`` could run code on every voter, and a snapshot received from
the leader was a program the follower ran. What the quorum exchanges is data: Brook's commands travel as
dicts of builtins (``commands.to_dict``), the state is dumped as builtins, and pysyncobj's own messages are
dicts of str, int, bytes, lists and tuples. Pickle builds those without naming any callable, except these
few, which protocol 2 (pysyncobj's) names for builtin types:

- ``_codecs.encode(text, "latin1")``: how protocol 2 writes non-empty bytes; only that codec is allowed;
- ``bytes()``: how it writes empty bytes; no argument is allowed (``bytes(n)`` would allocate n bytes);
- ``set`` and ``frozenset``, from the list the pickle holds;
- ``pysyncobj.node.TCPNode``: pysyncobj's own fields in a snapshot name the voters with it (made with
  ``__new__`` and its attributes set from a dict: nothing of it runs).

Any other global is refused with ``UnpicklingError``: a frame that names one is dropped and its connection
closed (pysyncobj's reader does so for any frame that does not decode), a snapshot that names one does not
read back and is refused. There is no fall-back to pysyncobj's pure-Python unpickler (for Python 2 peers).

Frames and commands (``loads``) are read by Python's pure-Python unpickler, not the C one: the C unpickler keeps
its memo in an array it grows to twice the index a PUT names, zeroing it, so a 10-byte pickle naming index 10**8
made it allocate and touch 1.5 GiB (the quorum fuzz target found it). The pure-Python one keeps a dict. It is
about ten times slower (2.5 ms for a 32 KiB batch of entries here, 0.2 ms in C): metadata is small and rare next to
that. Snapshot files (``load``), written by this voter or its leader, are read by the C one.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections.abc import Callable
from typing import Any, BinaryIO

from pysyncobj.node import TCPNode


def _latin1(text: Any, encoding: Any) -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"_codecs.encode is allowed only from str to latin1, not {encoding!r}")
    return text.encode("latin1")


def _empty_bytes(*args: Any) -> bytes:
    if args:
        raise pickle.UnpicklingError("bytes() is allowed only without arguments (empty bytes)")
    return b""


ALLOWED: dict[tuple[str, str], Callable[..., Any] | type] = {
    ("_codecs", "encode"): _latin1,
    ("__builtin__", "bytes"): _empty_bytes,
    ("builtins", "bytes"): _empty_bytes,
    ("__builtin__", "set"): set,
    ("builtins", "set"): set,
    ("__builtin__", "frozenset"): frozenset,
    ("builtins", "frozenset"): frozenset,
    ("pysyncobj.node", "TCPNode"): TCPNode,
}


def _find_data_class(module: str, name: str) -> Any:
    found = ALLOWED.get((module, name))
    if found is None:
        raise pickle.UnpicklingError(f"the quorum unpickles data only; refused the global {module}.{name}")
    return found


class DataUnpickler(pickle.Unpickler):
    """An unpickler that builds data only: ``find_class`` answers the names in ``ALLOWED`` and refuses the rest."""

    def find_class(self, module: str, name: str) -> Any:
        return _find_data_class(module, name)


def _load_bytearray8(self: Any) -> None:
    """BYTEARRAY8 (protocol 5), whose bytes are read before the bytearray is made: Python's own makes a bytearray of
    the length the pickle declares first (16 bytes declared 2 GiB: the fuzz target again)."""
    (size,) = struct.unpack("<Q", self.read(8))
    data = self.read(size)  # what the input holds, at most
    if len(data) != size:
        raise pickle.UnpicklingError(f"BYTEARRAY8 declares {size} bytes, the pickle holds {len(data)}")
    self.append(bytearray(data))


class _BoundedMemoDataUnpickler(pickle._Unpickler):  # type: ignore[name-defined,misc]
    """The same, on Python's pure-Python unpickler, whose memo is a dict: what a PUT names costs one entry. What it
    allocates follows what the pickle holds, not what it declares (``_load_bytearray8``)."""

    dispatch = {**pickle._Unpickler.dispatch, pickle.BYTEARRAY8[0]: _load_bytearray8}  # type: ignore[attr-defined]

    def find_class(self, module: str, name: str) -> Any:
        return _find_data_class(module, name)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """pysyncobj's ``pickle.loads``, restricted to data (frames, commands: see the module doc)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    return _BoundedMemoDataUnpickler(io.BytesIO(data)).load()


def load(file: BinaryIO) -> Any:
    """pysyncobj's ``pickle.load``, restricted to data."""
    return DataUnpickler(file).load()


def install() -> None:
    """Make pysyncobj unpickle with ``loads``/``load``: its modules call them through ``pysyncobj.pickle``, its
    journal through the names it imported."""
    import pysyncobj.journal
    import pysyncobj.pickle

    pysyncobj.pickle.loads = loads
    pysyncobj.pickle.load = load
    pysyncobj.journal.loads = loads
