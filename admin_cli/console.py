"""``brook produce`` and ``brook consume``: console producer and consumer (kcat-style)."""

from __future__ import annotations

import base64
import binascii
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated, Any, BinaryIO, TextIO

import typer
from rich.text import Text

from admin_cli.common import (
    INT32_MAX,
    INT64_MAX,
    BootstrapOpt,
    CliError,
    OutputOpt,
    err,
    ok,
    parse_pairs,
    state,
)
from admin_cli.timeparse import parse_timestamp_ms
from client.config import COMPRESSION_CODECS
from client.security import excerpt
from client.types import ConsumerRecord, TopicPartition

EXIT_SIGINT, EXIT_SIGTERM = 130, 143  # 128 + signal number, what a shell reports for a killed process
MAX_LINE_BYTES = 16 * 1024 * 1024  # a bound on one input line (a record cannot exceed message.max.bytes anyway)
POLL_MS = 200


class Format(StrEnum):
    text = "text"
    json = "json"
    hex = "hex"
    base64 = "base64"


def encode(text: str, fmt: Format, what: str) -> bytes:
    """Console text -> record bytes."""
    try:
        if fmt == Format.hex:
            return bytes.fromhex(text)
        if fmt == Format.base64:
            return base64.b64decode(text, validate=True)
        if fmt == Format.json:
            return json.dumps(json.loads(text), separators=(",", ":")).encode()
    except (ValueError, binascii.Error) as e:
        raise CliError(f"{what} {excerpt(text, 40)} is not valid {fmt.value}: {e}", code=2) from None
    return text.encode()


def decode(data: bytes | None, fmt: Format) -> str | None:
    """Record bytes -> console text (None for a null key/value)."""
    if data is None:
        return None
    if fmt == Format.hex:
        return data.hex()
    if fmt == Format.base64:
        return base64.b64encode(data).decode()
    text = data.decode("utf-8", errors="replace")
    if fmt == Format.json:
        try:
            return json.dumps(json.loads(text), separators=(",", ":"))
        except ValueError:
            return text
    return text


class _BadLine(Exception):
    """An input record that cannot be produced: line ``number`` (1-based; 0 for a -v value) and why."""

    def __init__(self, number: int, problem: str) -> None:
        super().__init__(problem)
        self.number = number
        self.problem = problem


def _input_lines(source: BinaryIO | TextIO) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-empty line of ``source``; _BadLine for one that is too long or not UTF-8.

    Lines are decoded one at a time (a text stream decodes ahead in 8 KB chunks, so its error would
    surface before lines that were fine) and read with a bound (iterating a file reads a line whole,
    however long it is).
    """
    number = 0
    while True:
        raw = source.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n" if isinstance(raw, bytes) else "\n"):
            raise _BadLine(number, f"longer than {MAX_LINE_BYTES} bytes")
        if isinstance(raw, bytes):
            try:
                text = raw.decode()
            except UnicodeDecodeError as e:
                raise _BadLine(number, f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})") \
                    from None
        else:
            text = raw
        line = text.rstrip("\r\n")
        if line:
            yield number, line


def _record(line: str, number: int, key: bytes | None, key_separator: str | None, key_format: Format,
            value_format: Format) -> tuple[bytes | None, bytes]:
    """(key, value) bytes of one input line; _BadLine when it does not parse."""
    try:
        if key_separator is None:
            return key, encode(line, value_format, "value")
        k_text, sep, v_text = line.partition(key_separator)
        if not sep:
            raise CliError(f"no key separator {key_separator!r} in {excerpt(line, 40)}", code=2)
        return encode(k_text, key_format, "key"), encode(v_text, value_format, "value")
    except CliError as e:
        raise _BadLine(number, e.message) from None


def _records_word(n: int) -> str:
    return f"{n} record{'s' if n != 1 else ''}"


# ----------------------------------------------------------------------------- produce


def produce(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to write to.")],
    value: Annotated[list[str] | None, typer.Option("--value", "-v",
                                                    help="A record value (repeatable); default: read stdin lines.")]
    = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", help="Read records from this file, one per line.")]
    = None,
    key: Annotated[str | None, typer.Option("--key", "-k", help="Key of every record.")] = None,
    key_separator: Annotated[str | None, typer.Option(
        "--key-separator", "-K", help="Split each line into key and value at the first SEP (kcat -K).")] = None,
    header: Annotated[list[str] | None, typer.Option("--header", "-H", help="Header key=value (repeatable).")]
    = None,
    partition: Annotated[int | None, typer.Option("--partition", "-p", help="Write to this partition.",
                                                  min=0, max=INT32_MAX)] = None,
    key_format: Annotated[Format, typer.Option(help="How keys are given.")] = Format.text,
    value_format: Annotated[Format, typer.Option(help="How values are given.")] = Format.text,
    acks: Annotated[str, typer.Option(help="0, 1 or all.")] = "all",
    compression: Annotated[str, typer.Option(help="none, gzip, snappy, lz4 or zstd.")] = "none",
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Produce records from arguments, a file or stdin (one record per line).

    -v values are all checked before anything is sent: one that does not parse (e.g. not hex with
    --value-format hex) is a usage error (exit 2) and nothing is produced. Lines of a file or stdin
    are sent as they are read: a line that does not parse (not UTF-8, not valid for --key-format or
    --value-format, no --key-separator, longer than 16 MiB) stops the command there. The records of
    the lines before it are still produced, and the error says how many (exit 1; exit 2 when there
    were none). Empty lines are skipped.
    """
    from client.producer import Producer

    st = state(ctx, bootstrap, output)
    if key is not None and key_separator is not None:
        raise CliError("give --key or --key-separator, not both", code=2)
    if key_separator == "":
        raise CliError("--key-separator must not be empty", code=2)
    if acks not in ("0", "1", "all", "-1"):
        raise CliError(f"--acks must be 0, 1 or all, got {acks!r}", code=2)
    if compression.lower() not in COMPRESSION_CODECS:  # the producer would refuse it, as a failure (exit 1)
        raise CliError(f"--compression must be one of {', '.join(COMPRESSION_CODECS)}, got {compression!r}", code=2)
    headers = [(k, v.encode()) for k, v in parse_pairs(header or [], "--header").items()]
    fixed_key = encode(key, key_format, "--key") if key is not None else None
    given: list[tuple[bytes | None, bytes]] = []
    if value:  # every -v is checked before anything is sent
        try:
            given = [_record(v, 0, fixed_key, key_separator, key_format, value_format) for v in value]
        except _BadLine as e:
            raise CliError(f"-v: {e.problem}; nothing produced", code=2) from None
    meta = st.backend.topic(topic)  # unknown topic: one clear error before anything is sent
    if partition is not None and partition not in meta.partitions:
        raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic '{topic}' has no partition {partition} "
                       f"(it has {len(meta.partitions)})")
    where = "stdin"
    stream: BinaryIO | TextIO | None = None
    if not value:
        if file is not None:
            where = str(file)
            try:
                stream = file.open("rb")
            except OSError as e:
                raise CliError(f"cannot read {file}: {e.strerror}", code=2) from None
        else:
            stream = getattr(sys.stdin, "buffer", sys.stdin)  # bytes: each line is decoded (and checked) alone
    producer = Producer(bootstrap_servers=st.bootstrap, acks=acks, compression_type=compression,
                        client_id="brook-cli", allow_auto_create_topics=False,
                        request_timeout_ms=int(st.timeout_s * 1000), **st.client_config())
    futures = []
    bad: _BadLine | None = None
    try:
        try:
            records: Iterator[tuple[bytes | None, bytes]] = iter(given) if stream is None else (
                _record(line, number, fixed_key, key_separator, key_format, value_format)
                for number, line in _input_lines(stream))
            for k, v in records:
                futures.append(producer.send(topic, v, key=k, partition=partition, headers=headers))
        except _BadLine as e:
            bad = e  # the lines before it are produced all the same: flushed below, then counted
        producer.flush(timeout=st.timeout_s)
        results = [f.result(timeout=st.timeout_s) for f in futures]
    finally:
        producer.close(timeout=st.timeout_s)
        if stream is not None and file is not None:
            stream.close()
    parts = sorted({r.partition for r in results})
    on_parts = f" (partitions {','.join(map(str, parts))})" if parts else ""
    if bad is not None:
        # Exit 1 once records were written (the input was not all refused up front); 2 when nothing was.
        were = "was" if len(results) == 1 else "were"
        done = (f"stopped there: the {_records_word(len(results))} before it {were} produced to '{topic}'{on_parts}, "
                "none after it" if results else "nothing produced")
        raise CliError(f"line {bad.number} of {where}: {bad.problem}; {done}", code=1 if results else 2)
    ok(st, f"produced {_records_word(len(results))} to '{topic}'" + on_parts,
       {"topic": topic, "count": len(results),
        "records": [{"partition": r.partition, "offset": r.offset, "timestamp": r.timestamp} for r in results]})


# ----------------------------------------------------------------------------- consume

DEFAULT_FORMAT = "%v"
FORMAT_TOKENS = "tpoTkvh%"  # what render() replaces after a %


def check_format(fmt: str) -> str:
    """A usage error for a % token render() does not know (kcat: "Unsupported formatter"): it used to be
    printed literally, so a typo showed up only in the output, once per record."""
    i = 0
    while i < len(fmt):
        if fmt[i] == "%":
            token = fmt[i + 1:i + 2]
            if not token or token not in FORMAT_TOKENS:
                shown = f"%{token}" if token else "a lone % at the end"
                raise CliError(f"--format: unsupported formatter {shown} (supported: "
                               f"{' '.join('%' + t for t in FORMAT_TOKENS)}; %% for a literal %)", code=2)
            i += 2
        else:
            i += 1
    return fmt


def render(rec: ConsumerRecord, fmt: str, key_format: Format, value_format: Format) -> str:
    """kcat-style format: %t topic, %p partition, %o offset, %T timestamp, %k key, %v value, %h headers."""
    fields = {
        "t": rec.topic, "p": str(rec.partition), "o": str(rec.offset), "T": str(rec.timestamp),
        "k": decode(rec.key, key_format) or "", "v": decode(rec.value, value_format) or "",
        "h": ",".join(f"{k}={decode(v, Format.text) or ''}" for k, v in rec.headers),
        "%": "%",
    }
    parts = []
    i = 0
    while i < len(fmt):  # a single left-to-right pass: record text is never re-scanned for tokens
        ch = fmt[i]
        if ch == "%" and i + 1 < len(fmt) and fmt[i + 1] in fields:
            parts.append(fields[fmt[i + 1]])
            i += 2
        elif ch == "\\" and i + 1 < len(fmt) and fmt[i + 1] in "nt":
            parts.append("\n" if fmt[i + 1] == "n" else "\t")
            i += 2
        else:
            parts.append(ch)
            i += 1
    return "".join(parts)


def record_json(rec: ConsumerRecord, key_format: Format, value_format: Format) -> dict[str, Any]:
    return {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset, "timestamp": rec.timestamp,
            "timestamp_type": "LogAppendTime" if rec.timestamp_type == 1 else "CreateTime",
            "key": decode(rec.key, key_format), "value": decode(rec.value, value_format),
            "headers": {k: decode(v, Format.text) for k, v in rec.headers}}


def consume(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic to read.")],
    group: Annotated[str | None, typer.Option("--group", "-g", help="Consume as this group (commits offsets).")]
    = None,
    partition: Annotated[list[int] | None, typer.Option("--partition", "-p", help="Only these partitions.",
                                                                   min=0, max=INT32_MAX)]
    = None,
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="Start at the oldest record.")] = False,
    offset: Annotated[int | None, typer.Option("--offset", help="Start at this offset (each partition).",
                                                          min=0, max=INT64_MAX)] = None,
    from_timestamp: Annotated[str | None, typer.Option(
        "--from-timestamp", help="Start at the first record at/after this time: epoch ms, ISO 8601, -15m.")] = None,
    max_messages: Annotated[int | None, typer.Option("--max-messages", "-n", help="Stop after N records.",
                                                                min=1, max=INT64_MAX)]
    = None,
    exit_at_end: Annotated[bool, typer.Option("--exit", "-e",
                                              help="Stop at the end of the partitions (as of the start).")] = False,
    idle_timeout_ms: Annotated[int | None, typer.Option(help="Stop after this long without records.", min=0,
                                                        max=INT64_MAX)] = None,
    fmt: Annotated[str, typer.Option("--format", "-F", help="Line format: %t %p %o %T %k %v %h, \\n \\t.")]
    = DEFAULT_FORMAT,
    key_format: Annotated[Format, typer.Option(help="How keys are shown.")] = Format.text,
    value_format: Annotated[Format, typer.Option(help="How values are shown.")] = Format.text,
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Consume records and print them (JSON lines with -o json). Ctrl-C stops."""
    from client.consumer import Consumer

    st = state(ctx, bootstrap, output)
    starts = [n for n, v in (("--from-beginning", from_beginning or None), ("--offset", offset),
                             ("--from-timestamp", from_timestamp)) if v is not None]
    if len(starts) > 1:
        raise CliError(f"give at most one of {', '.join(starts)}", code=2)
    if offset is not None and offset < 0:
        raise CliError(f"--offset must be >= 0, got {offset}", code=2)
    if group is not None and not group.strip():  # it read as no group at all: unassigned, nothing committed
        raise CliError("--group must not be empty (Kafka's INVALID_GROUP_ID)", code=2)
    if group and (offset is not None or from_timestamp or partition):
        raise CliError("--offset, --from-timestamp and --partition need manual assignment: drop --group "
                       "(or move the group with `brook group seek`)", code=2)
    if max_messages is not None and max_messages < 1:
        raise CliError(f"--max-messages must be at least 1, got {max_messages}", code=2)
    check_format(fmt)
    ts_ms = parse_timestamp_ms(from_timestamp, "--from-timestamp") if from_timestamp else None
    meta = st.backend.topic(topic)
    wanted = sorted(set(partition or meta.partitions))
    for p in wanted:
        if p not in meta.partitions:
            raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic '{topic}' has no partition {p} "
                           f"(it has {len(meta.partitions)})")
    consumer = Consumer(bootstrap_servers=st.bootstrap, group_id=group, client_id="brook-cli",
                        auto_offset_reset="earliest" if from_beginning else "latest",
                        enable_auto_commit=bool(group), request_timeout_ms=int(st.timeout_s * 1000),
                        **st.client_config())
    count = 0
    stop = _StopSignals()
    try:
        with stop:  # from here a signal ends the loop below (or prevents it) and the group is left cleanly
            tps = [TopicPartition(topic, p) for p in wanted]
            if group:
                _note_group_start(consumer, group, topic, tps, from_beginning)
                consumer.subscribe([topic])
            else:
                consumer.assign(tps)
                _seek(consumer, tps, from_beginning, offset, ts_ms)
            ends = consumer.end_offsets(tps) if exit_at_end else {}
            last_record = time.monotonic()
            while stop.signum is None:
                batch = consumer.poll(timeout_ms=POLL_MS,
                                      max_records=None if max_messages is None else max_messages - count)
                for _tp, records in sorted(batch.items()):
                    for rec in records:
                        _print_record(st.json, rec, fmt, key_format, value_format)
                        count += 1
                if batch:
                    last_record = time.monotonic()
                if max_messages is not None and count >= max_messages:
                    break
                if exit_at_end and _at_end(consumer, ends):
                    break
                if idle_timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= idle_timeout_ms:
                    break
    except KeyboardInterrupt:  # a second signal: stop waiting for the poll, still commit and leave
        stop.signum = stop.signum or signal.SIGINT
    finally:
        if group:
            try:
                consumer.commit()
            except Exception as e:  # the records are printed already; say why the commit failed and go on
                err.print(Text(f"warning: final commit failed: {e}"), highlight=False)
        consumer.close()  # leaves the group at once: the next member need not wait out session.timeout.ms
    if not st.json:
        err.print(Text(f"consumed {count} record{'s' if count != 1 else ''}", style="dim"), highlight=False)
    if stop.signum is not None:
        raise typer.Exit(EXIT_SIGTERM if stop.signum == signal.SIGTERM else EXIT_SIGINT)


class _StopSignals:
    """SIGINT/SIGTERM during the poll loop: finish the current poll, commit, leave the group, exit 130/143.

    The handler only records the signal: raising inside poll() could interrupt the client
    while it holds a lock, and close() (which sends LeaveGroup) must still work. A second
    signal raises KeyboardInterrupt for a user who does not want to wait for the poll; the
    handlers are restored before the final commit, so a third one interrupts that too.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():  # signal handlers live on the main thread only
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *_exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


def _note_group_start(consumer: Any, group: str, topic: str, tps: list[TopicPartition],
                      from_beginning: bool) -> None:
    """Say where a group without committed offsets starts (auto.offset.reset), so an empty screen is explained."""
    committed = consumer.committed(tps)
    fresh = [tp.partition for tp in tps if committed.get(tp) is None]
    if not fresh:
        return
    where = ("the earliest offset (--from-beginning)" if from_beginning
             else "the latest offset: only records produced from now on (--from-beginning reads the older ones)")
    which = "any partition" if len(fresh) == len(tps) else f"partition{'s' if len(fresh) > 1 else ''} " \
        f"{','.join(map(str, fresh))}"
    err.print(Text(f"note: group '{group}' has no committed offset on '{topic}' for {which}; starting at {where}",
                   style="dim"), highlight=False)


def _seek(consumer: Any, tps: list[TopicPartition], from_beginning: bool, offset: int | None,
          ts_ms: int | None) -> None:
    if from_beginning:
        consumer.seek_to_beginning(*tps)
    elif offset is not None:
        _seek_offset(consumer, tps, offset)
    elif ts_ms is not None:
        found = consumer.offsets_for_times({tp: ts_ms for tp in tps})
        ends = consumer.end_offsets(tps)
        for tp in tps:
            hit = found.get(tp)
            consumer.seek(tp, hit[0] if hit is not None else ends[tp])
    else:
        consumer.seek_to_end(*tps)


def _seek_offset(consumer: Any, tps: list[TopicPartition], offset: int) -> None:
    """--offset N, clamped to each partition's [log start, end] with a note: a position outside the log
    would otherwise be reset silently and the user would not know why nothing (or other records) shows."""
    starts = consumer.beginning_offsets(tps)
    ends = consumer.end_offsets(tps)
    for tp in tps:
        start, end = starts[tp], ends[tp]
        target = min(max(offset, start), end)
        if offset > end:
            err.print(Text(f"note: offset {offset} is past the end of {tp.topic}-{tp.partition} (end offset {end}); "
                           f"starting at {end}, the next record produced", style="dim"), highlight=False)
        elif offset < start:
            err.print(Text(f"note: offset {offset} is before the start of {tp.topic}-{tp.partition} (log start "
                           f"offset {start}: older records were deleted); starting at {start}", style="dim"),
                      highlight=False)
        consumer.seek(tp, target)


def _at_end(consumer: Any, ends: dict[TopicPartition, int]) -> bool:
    assigned = consumer.assignment()
    if not assigned:
        return False
    return all(consumer.position(tp) >= ends.get(tp, 0) for tp in assigned)


def _print_record(as_json: bool, rec: ConsumerRecord, fmt: str, key_format: Format, value_format: Format) -> None:
    if as_json:
        line = json.dumps(record_json(rec, key_format, value_format), separators=(",", ":"))
    else:
        line = render(rec, fmt, key_format, value_format)
    sys.stdout.write(line if line.endswith("\n") else line + "\n")
    sys.stdout.flush()
