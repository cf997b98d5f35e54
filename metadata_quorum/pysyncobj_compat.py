"""pysyncobj, with the one thing its import does to the rest of the process undone.

``pysyncobj.win_inet_pton`` (imported by ``import pysyncobj``) replaces ``socket.inet_ntop`` on every
platform with a Windows-only version: its ``os.name == 'nt'`` check guards only ``inet_pton``. After it,
any ``socket.inet_ntop`` call in the process raises TypeError (``not_windows() takes 0 positional
arguments``); asn1crypto (SCRAM channel binding, through scramp) is one caller. Every module of ours that
imports pysyncobj imports this first, so the process keeps the real function.
"""

import _socket
import socket

import pysyncobj  # noqa: F401  (the import whose side effect is undone below)

socket.inet_ntop = _socket.inet_ntop
