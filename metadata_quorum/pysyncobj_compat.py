"""pysyncobj, with the one thing its import does to the rest of the process undone, unpickling data only.

``pysyncobj.win_inet_pton`` (imported by ``import pysyncobj``) replaces ``socket.inet_ntop`` on every
platform with a Windows-only version: its ``os.name == 'nt'`` check guards only ``inet_pton``. After it,
any ``socket.inet_ntop`` call in the process raises TypeError (``not_windows() takes 0 positional
arguments``); asn1crypto (SCRAM channel binding, through scramp) is one caller. Every module of ours that
imports pysyncobj imports this first, so the process keeps the real function.

The same import makes pysyncobj unpickle data only (metadata_quorum/quorum_pickle.py): its frames, journal
entries and snapshots can no longer name a callable to run.
"""

import _socket
import socket

import pysyncobj  # noqa: F401  (the import whose side effect is undone below)

from metadata_quorum import quorum_pickle

socket.inet_ntop = _socket.inet_ntop
quorum_pickle.install()
