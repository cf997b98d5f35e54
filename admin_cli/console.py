"""``brook produce`` and ``brook consume``: console producer and consumer (kcat-style)."""

from __future__ import annotations

import base64
import binascii
import json
import sys
import time
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer
from rich.text import Text

from admin_cli.common import BootstrapOpt, CliError, OutputOpt, err, ok, parse_pairs, state
from admin_cli.timeparse import parse_timestamp_ms
from client.sasl import sasl_options_from_env
from client.types import ConsumerRecord, TopicPartition

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
        raise CliError(f"{what} {text[:40]!r} is not valid {fmt.value}: {e}", code=2) from None
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


def _lines(source: TextIO) -> Iterator[str]:
    for line in source:
        if len(line) > MAX_LINE_BYTES:
            raise CliError(f"an input line is longer than {MAX_LINE_BYTES} bytes", code=2)
        line = line.rstrip("\r\n")
        if line:
            yield line


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
    partition: Annotated[int | None, typer.Option("--partition", "-p", help="Write to this partition.")] = None,
    key_format: Annotated[Format, typer.Option(help="How keys are given.")] = Format.text,
    value_format: Annotated[Format, typer.Option(help="How values are given.")] = Format.text,
    acks: Annotated[str, typer.Option(help="0, 1 or all.")] = "all",
    compression: Annotated[str, typer.Option(help="none, gzip, snappy, lz4 or zstd.")] = "none",
    bootstrap: BootstrapOpt = None,
    output: OutputOpt = None,
) -> None:
    """Produce records from arguments, a file or stdin (one record per line)."""
    from client.producer import Producer

    st = state(ctx, bootstrap, output)
    if key is not None and key_separator is not None:
        raise CliError("give --key or --key-separator, not both", code=2)
    if acks not in ("0", "1", "all", "-1"):
        raise CliError(f"--acks must be 0, 1 or all, got {acks!r}", code=2)
    headers = [(k, v.encode()) for k, v in parse_pairs(header or [], "--header").items()]
    meta = st.backend.topic(topic)  # unknown topic: one clear error before anything is sent
    if partition is not None and partition not in meta.partitions:
        raise CliError(f"UNKNOWN_TOPIC_OR_PARTITION: topic '{topic}' has no partition {partition} "
                       f"(it has {len(meta.partitions)})")
    if value:
        source: Iterator[str] = iter(value)
    elif file is not None:
        try:
            source = _lines(file.open(encoding="utf-8"))
        except OSError as e:
            raise CliError(f"cannot read {file}: {e.strerror}", code=2) from None
    else:
        source = _lines(sys.stdin)
    producer = Producer(bootstrap_servers=st.bootstrap, acks=acks, compression_type=compression,
                        client_id="brook-cli", allow_auto_create_topics=False,
                        request_timeout_ms=int(st.timeout_s * 1000), **sasl_options_from_env())
    futures = []
    try:
        for line in source:
            k: bytes | None = encode(key, key_format, "key") if key is not None else None
            v_text = line
            if key_separator is not None:
                k_text, sep, v_text = line.partition(key_separator)
                if not sep:
                    raise CliError(f"line {line[:40]!r} has no key separator {key_separator!r}", code=2)
                k = encode(k_text, key_format, "key")
            futures.append(producer.send(topic, encode(v_text, value_format, "value"), key=k,
                                         partition=partition, headers=headers))
        producer.flush(timeout=st.timeout_s)
        results = [f.result(timeout=st.timeout_s) for f in futures]
    finally:
        producer.close(timeout=st.timeout_s)
    parts = sorted({r.partition for r in results})
    ok(st, f"produced {len(results)} record{'s' if len(results) != 1 else ''} to '{topic}'"
           + (f" (partitions {','.join(map(str, parts))})" if parts else ""),
       {"topic": topic, "count": len(results),
        "records": [{"partition": r.partition, "offset": r.offset, "timestamp": r.timestamp} for r in results]})


# ----------------------------------------------------------------------------- consume

DEFAULT_FORMAT = "%v"


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
    partition: Annotated[list[int] | None, typer.Option("--partition", "-p", help="Only these partitions.")]
    = None,
    from_beginning: Annotated[bool, typer.Option("--from-beginning", help="Start at the oldest record.")] = False,
    offset: Annotated[int | None, typer.Option("--offset", help="Start at this offset (each partition).")] = None,
    from_timestamp: Annotated[str | None, typer.Option(
        "--from-timestamp", help="Start at the first record at/after this time: epoch ms, ISO 8601, -15m.")] = None,
    max_messages: Annotated[int | None, typer.Option("--max-messages", "-n", help="Stop after N records.")]
    = None,
    exit_at_end: Annotated[bool, typer.Option("--exit", "-e",
                                              help="Stop at the end of the partitions (as of the start).")] = False,
    idle_timeout_ms: Annotated[int | None, typer.Option(help="Stop after this long without records.")] = None,
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
    if group and (offset is not None or from_timestamp or partition):
        raise CliError("--offset, --from-timestamp and --partition need manual assignment: drop --group "
                       "(or move the group with `brook group seek`)", code=2)
    if max_messages is not None and max_messages < 1:
        raise CliError(f"--max-messages must be at least 1, got {max_messages}", code=2)
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
                        **sasl_options_from_env())
    count = 0
    try:
        tps = [TopicPartition(topic, p) for p in wanted]
        if group:
            consumer.subscribe([topic])
        else:
            consumer.assign(tps)
            _seek(consumer, tps, from_beginning, offset, ts_ms)
        ends = consumer.end_offsets(tps) if exit_at_end else {}
        last_record = time.monotonic()
        while True:
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
    except KeyboardInterrupt:
        pass
    finally:
        if group:
            try:
                consumer.commit()
            except Exception as e:  # the records are printed already; say why the commit failed and go on
                err.print(Text(f"warning: final commit failed: {e}"), highlight=False)
        consumer.close()
    if not st.json:
        err.print(Text(f"consumed {count} record{'s' if count != 1 else ''}", style="dim"), highlight=False)


def _seek(consumer: Any, tps: list[TopicPartition], from_beginning: bool, offset: int | None,
          ts_ms: int | None) -> None:
    if from_beginning:
        consumer.seek_to_beginning(*tps)
    elif offset is not None:
        for tp in tps:
            consumer.seek(tp, offset)
    elif ts_ms is not None:
        found = consumer.offsets_for_times({tp: ts_ms for tp in tps})
        ends = consumer.end_offsets(tps)
        for tp in tps:
            hit = found.get(tp)
            consumer.seek(tp, hit[0] if hit is not None else ends[tp])
    else:
        consumer.seek_to_end(*tps)


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
