"""The quorum's unpickling builds data only (metadata_quorum/quorum_pickle.py): what the quorum exchanges reads back,
and a pickle that names anything else is refused before it is called."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pysyncobj.journal
import pysyncobj.pickle
import pytest
from pysyncobj.node import TCPNode

from metadata_quorum import (
    pysyncobj_compat,  # noqa: F401  (installs the data-only unpickling)
    quorum_pickle,
)
from metadata_quorum.commands import RegisterBroker, to_dict


class _Runs:
    """Unpickling this calls ``os.open`` (a marker file), as an attacker's pickle would call a shell."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, int]]:
        return (os.open, (str(self.path), os.O_CREAT | os.O_WRONLY))


class _Reduces:
    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (self.func, self.args)


def _data() -> dict[str, Any]:
    """What the quorum pickles: pysyncobj's messages and entries, Brook's commands, the state's builtins."""
    return {
        "type": "append_entries", "term": 7, "commit_index": 12,
        "entries": [(b"\x01" + pickle.dumps(to_dict(RegisterBroker(1, "inc-1", [["BROKER", "h", 9092]]))), 12, 7),
                    (b"", 13, 7)],
        "sets": {1, 2, 3}, "frozen": frozenset({"a"}), "none": None, "float": 1.5, "big": 1 << 80,
        "nested": [[{"k": (1, "v", b"\xff\x00")}]], "node": TCPNode("127.0.0.1:9193"),
    }


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_what_the_quorum_pickles_reads_back(protocol: int) -> None:
    data = _data()
    assert quorum_pickle.loads(pickle.dumps(data, protocol)) == data


def test_pysyncobj_unpickles_through_it() -> None:
    assert pysyncobj.pickle.loads is quorum_pickle.loads
    assert pysyncobj.pickle.load is quorum_pickle.load
    assert pysyncobj.journal.loads is quorum_pickle.loads
    data = _data()
    assert pysyncobj.pickle.loads(pysyncobj.pickle.dumps(data)) == data  # pysyncobj's own protocol (2)


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_pickle_that_names_a_callable_is_refused_before_it_runs(tmp_path: Path, protocol: int) -> None:
    marker = tmp_path / "ran"
    frame = pickle.dumps({"type": "request_vote", "x": [_Runs(marker)]}, protocol)
    with pytest.raises(pickle.UnpicklingError, match="posix.open"):
        pysyncobj.pickle.loads(frame)
    assert not marker.exists()


@pytest.mark.parametrize(("func", "args", "refusal"), [
    (eval, ("1+1",), "builtins.eval"),
    (getattr, ("abc", "upper"), "builtins.getattr"),
    (bytes, (10**9,), r"bytes\(\) is allowed only without arguments"),  # 1 GB from a few bytes of pickle
    (__import__("codecs").encode, ("x", "rot13"), "only from str to latin1"),
    (__import__("_codecs").encode, ("x", "zlib"), "only from str to latin1"),
    (TCPNode.__init__, (None, "a:1"), "TCPNode.__init__"),
], ids=["eval", "getattr", "bytes-n", "codecs-rot13", "_codecs-zlib", "dotted-name"])
def test_only_the_named_builtins_are_allowed_and_only_as_protocol_2_uses_them(func: Any, args: tuple[Any, ...],
                                                                              refusal: str) -> None:
    with pytest.raises(pickle.UnpicklingError, match=refusal):
        quorum_pickle.loads(pickle.dumps(_Reduces(func, *args), 4))


def test_a_snapshot_file_is_read_as_data_only(tmp_path: Path) -> None:
    import gzip

    from metadata_quorum.raft import load_snapshot_file

    marker = tmp_path / "ran"
    path = tmp_path / "quorum.snapshot"
    with gzip.open(path, "wb") as f:
        pickle.dump((_Runs(marker), None, None), f, protocol=4)
    with pytest.raises(pickle.UnpicklingError, match="posix.open"):
        load_snapshot_file(path)
    assert not marker.exists()


@pytest.mark.parametrize("put", [b"r" + (10**7).to_bytes(4, "little"), b"p10000000\n"], ids=["LONG_BINPUT", "PUT"])
def test_a_memo_index_costs_one_entry_not_an_array_that_long(put: bytes) -> None:
    # The C unpickler grows its memo array to twice the index a PUT names, zeroed: this 10-byte pickle made it
    # allocate 160 MB (1.5 GiB at 10**8) before reading on. Frames and commands are read with a dict memo.
    import tracemalloc

    tracemalloc.start()
    try:
        assert quorum_pickle.loads(b"\x80\x02K\x07" + put + b".") == 7
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"unpickling a memo index took {peak / 2**20:.0f} MiB"


def test_a_declared_length_allocates_nothing_the_pickle_does_not_hold() -> None:
    # BYTEARRAY8: Python's unpickler made a bytearray of the declared length before reading (2 GiB from 16 bytes).
    import tracemalloc

    assert quorum_pickle.loads(pickle.dumps(bytearray(b"abc"), 5)) == bytearray(b"abc")
    tracemalloc.start()
    try:
        with pytest.raises(pickle.UnpicklingError, match="declares 1073741824 bytes, the pickle holds 1"):
            quorum_pickle.loads(b"\x80\x05\x96" + (1 << 30).to_bytes(8, "little") + b".")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"a declared length took {peak / 2**20:.0f} MiB"
