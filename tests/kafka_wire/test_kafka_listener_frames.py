"""How a Kafka listener holds and parses frames, on a real KafkaListener in this process (real sockets;
the broker behind it is never reached: only ApiVersions is asked, which needs none).

Found by an audit: clients that never log in reserved their announced frames (up to 8 MiB each) in the
pool logged-in clients' requests share, and held them for kafka.request.timeout.ms (30 s), long past
kafka.authentication.timeout.ms: 32 connections froze a listener's every client. And the bounds walk
of a frame ran on the event loop: an 8 MiB frame of empty entries stalled the broker for seconds."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import threading
import types
from collections.abc import AsyncIterator

import pytest
from waiting import await_for
from wire_bytes import uvarint

from broker.kafka_wire import apis, codec
from broker.kafka_wire import server as kafka_server
from broker.kafka_wire.server import KafkaListener, KafkaListenerSpec

POOL = 100 * 1024  # queued.max.request.bytes: two of the attackers' frames below would fill it
LOGIN_MS = 2000


async def _listener(protocol: str, **defaults: str) -> KafkaListener:
    broker = types.SimpleNamespace(metadata_cache=types.SimpleNamespace(  # what ApiVersions and the frame pool read
        version=0, metadata_level=1, counts=lambda: (0, 0)))
    lst = KafkaListener(broker, KafkaListenerSpec(f"KAFKA_{protocol}", "127.0.0.1", 0, protocol),
                        {"queued.max.request.bytes": str(POOL), "kafka.authentication.timeout.ms": str(LOGIN_MS),
                         "kafka.request.timeout.ms": "60000", **defaults})
    await lst.start()
    return lst


@pytest.fixture()
async def sasl_listener() -> AsyncIterator[KafkaListener]:
    lst = await _listener("SASL_PLAINTEXT")
    try:
        yield lst
    finally:
        await lst.stop()


def _api_versions_frame(software: str = "frames-test") -> bytes:
    body = struct.pack(">hhih", apis.API_VERSIONS, 3, 7, 0) + b"\x00"  # header v2: no client id, no tags
    name = software.encode()
    body += uvarint(len(name) + 1)
    body += name + b"\x021\x00"
    return struct.pack(">i", len(body)) + body


async def _answered(port: int, frame: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(frame)
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        return await reader.readexactly(size)
    finally:
        writer.close()


async def _closed(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read(1) == b""
    except ConnectionError:
        return True


async def test_before_login_a_frame_over_sasl_server_max_receive_size_closes_the_connection(
        sasl_listener: KafkaListener) -> None:
    assert sasl_listener.pre_auth_max_bytes == 64 * 1024
    reader, writer = await asyncio.open_connection("127.0.0.1", sasl_listener.port)
    writer.write(struct.pack(">i", 64 * 1024 + 1))
    await writer.drain()
    assert await asyncio.wait_for(_closed(reader), 10)
    writer.close()
    assert sasl_listener.frame_budget.used_bytes == 0 and sasl_listener.pre_auth_budget.used_bytes == 0


async def test_frames_before_login_hold_a_pool_of_their_own_and_only_for_the_login_time(
        sasl_listener: KafkaListener) -> None:
    attackers = []
    for _ in range(2):  # each announces 60 KiB and sends nothing more
        reader, writer = await asyncio.open_connection("127.0.0.1", sasl_listener.port)
        writer.write(struct.pack(">i", 60 * 1024) + b"\x00\x12")
        await writer.drain()
        attackers.append((reader, writer))
    try:
        await await_for(lambda: sasl_listener.pre_auth_budget.used_bytes >= 120 * 1024, 10,
                        lambda: f"both frames reserved ({sasl_listener.pre_auth_budget.used_bytes} bytes)")
        assert sasl_listener.frame_budget.used_bytes == 0, "frames before login took the shared pool"
        # Another client (logging in: ApiVersions first) is answered meanwhile, not after the attackers' time.
        answer = await asyncio.wait_for(_answered(sasl_listener.port, _api_versions_frame()), 10)
        assert struct.unpack(">ih", answer[:6]) == (7, 0), answer[:6]
        # The attackers' frames never came: they are closed at the login timeout (2 s), not the request
        # timeout (60 s), and their bytes go back.
        for reader, _ in attackers:
            assert await asyncio.wait_for(_closed(reader), 10)
        assert sasl_listener.pre_auth_budget.used_bytes == 0
    finally:
        for _, writer in attackers:
            writer.close()


@pytest.mark.parametrize("sent, setting, why", [
    (b"", "connections.max.idle.ms", "a connection that sends nothing"),
    (struct.pack(">i", 1000) + b"\x00\x12", "kafka.request.timeout.ms", "a frame begun and not finished"),
])
async def test_a_stalled_connection_is_closed_at_its_timeout_and_gives_its_bytes_back(
        sent: bytes, setting: str, why: str) -> None:
    """After an answered request, a connection's wait for its next frame is bounded by
    connections.max.idle.ms, and the rest of a frame begun by the request timeout: closed when it passes,
    not before, and the frame's reserved bytes go back to the pool."""
    timeouts = {"connections.max.idle.ms": "60000", "kafka.request.timeout.ms": "60000", setting: "1500"}
    lst = await _listener("PLAINTEXT", **timeouts)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", lst.port)
        try:
            writer.write(_api_versions_frame())  # a request answered first: the deadlines are set anew after it
            size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), 10))[0]
            await asyncio.wait_for(reader.readexactly(size), 10)
            writer.write(sent)
            await writer.drain()
            loop = asyncio.get_running_loop()
            start = loop.time()
            assert await asyncio.wait_for(_closed(reader), 30), f"{why}: not closed"
            waited = loop.time() - start
            assert waited >= 1.5 - 0.2, f"{why}: closed after {waited:.2f} s, before its 1.5 s"
            await await_for(lambda: lst.frame_budget.used_bytes == 0, 10,
                            lambda: f"{why}: {lst.frame_budget.used_bytes} bytes still reserved")
        finally:
            writer.close()
    finally:
        await lst.stop()


async def test_a_closed_connection_leaves_no_timer_behind() -> None:
    """A connection's read deadline keeps one timer, armed up to connections.max.idle.ms ahead: once the
    connection ends it must go, or each of a flood of short connections would be held (its reader and
    buffers) for that long."""
    import gc

    from broker.admission import ConnectionDeadline

    def deadlines() -> list[ConnectionDeadline]:
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, ConnectionDeadline)]
    lst = await _listener("PLAINTEXT")
    try:
        # Those of earlier tests in this process may go meanwhile (they were counted, and failed this test): the
        # ones that are not among these are this test's. Held here, so none of these goes and frees its identity.
        before = deadlines()
        for _ in range(20):
            answer = await asyncio.wait_for(_answered(lst.port, _api_versions_frame()), 10)
            assert struct.unpack(">ih", answer[:6]) == (7, 0), answer[:6]
        await await_for(lambda: lst.stats.connections == 0, 10, lambda: f"{lst.stats.connections} connections open")
        left = [o for o in deadlines() if not any(o is b for b in before)]
        assert not left, f"{len(left)} closed connections' deadlines are still referenced (their timers armed)"
    finally:
        await lst.stop()


async def test_a_login_that_keeps_sending_frames_is_closed_when_its_time_is_spent(
        sasl_listener: KafkaListener) -> None:
    """kafka.authentication.timeout.ms bounds the whole login however busy it is: a client that sends
    ApiVersions (answered before login) as fast as the listener reads them, and never authenticates, is closed
    once the login time is spent, although its next frame is always already there to be read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", sasl_listener.port)
    loop = asyncio.get_running_loop()
    start = loop.time()
    burst = _api_versions_frame() * 64

    async def send() -> None:
        with contextlib.suppress(ConnectionError):
            while loop.time() - start < 20:
                writer.write(burst)
                await writer.drain()

    async def closed_after() -> float:
        with contextlib.suppress(ConnectionError):
            while await reader.read(1 << 16):  # the answers, read as they come
                pass
        return loop.time() - start
    sender = asyncio.create_task(send())
    try:
        waited = await asyncio.wait_for(closed_after(), 40)
    finally:
        sender.cancel()
        writer.close()
    assert waited < LOGIN_MS / 1000 + 5, f"a login sending frames all along was closed only after {waited:.1f} s"


async def test_the_elements_a_frame_may_hold_follow_the_cluster_size() -> None:
    from broker.kafka_wire import bounds

    lst = KafkaListener(types.SimpleNamespace(), KafkaListenerSpec("K", "127.0.0.1", 0, "PLAINTEXT"), {})
    assert lst.max_elements() == bounds.MIN_ELEMENTS  # no metadata yet
    for counts, expected in (((10, 100), bounds.MIN_ELEMENTS), ((1_000, 20_000), 84_000),
                             ((10_000, 100_000), bounds.MAX_ELEMENTS)):
        lst.broker = types.SimpleNamespace(metadata_cache=types.SimpleNamespace(counts=lambda c=counts: c))
        assert lst.max_elements() == expected, counts
    lst.parse_pool.shutdown()


async def test_a_large_frame_is_parsed_off_the_event_loop_and_a_small_one_on_it() -> None:
    lst = await _listener("PLAINTEXT")
    threads: list[str] = []
    real = codec.parse_request

    def recording(*args: object) -> codec.Request:
        threads.append(threading.current_thread().name)
        return real(*args)  # type: ignore[arg-type]
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(codec, "parse_request", recording)
            small = _api_versions_frame()
            large = _api_versions_frame("x" * (kafka_server.PARSE_ON_LOOP_MAX_BYTES + 1))
            assert len(small) < kafka_server.PARSE_ON_LOOP_MAX_BYTES < len(large)
            await asyncio.wait_for(_answered(lst.port, small), 10)
            await asyncio.wait_for(_answered(lst.port, large), 10)
        assert threads[0] == threading.current_thread().name, threads
        assert threads[1].startswith("kafka-KAFKA_PLAINTEXT-parse"), threads
    finally:
        await lst.stop()


async def test_one_address_has_one_large_frame_at_the_parse_pool_at_a_time() -> None:
    """Many connections from one address each sending large frames filled the parse pool's queue, and
    everyone else's large frames waited behind all of them; now an address has one there at a time."""
    lst = await _listener("PLAINTEXT")
    started: list[bytes] = []
    release = threading.Event()
    real = codec.parse_request

    def blocking(frame: bytes, *args: object) -> codec.Request:
        started.append(frame)
        release.wait(30)
        return real(frame, *args)  # type: ignore[arg-type]

    attacker_frame = _api_versions_frame("a" * (kafka_server.PARSE_ON_LOOP_MAX_BYTES + 1))
    victim_frame = _api_versions_frame("v" * (kafka_server.PARSE_ON_LOOP_MAX_BYTES + 1))
    writers = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(codec, "parse_request", blocking)
            for _ in range(kafka_server.PARSE_WORKERS + 2):
                _, writer = await asyncio.open_connection("127.0.0.1", lst.port, local_addr=("127.0.0.2", 0))
                writer.write(attacker_frame)
                writers.append(writer)
            await await_for(lambda: started, 10, "an attacker's frame at the parse pool")
            victim = asyncio.ensure_future(_answered(lst.port, victim_frame))
            await await_for(lambda: len(started) >= kafka_server.PARSE_WORKERS, 10,
                            lambda: f"{len(started)} parses started")
            # The pool's two workers: one of the attacker's frames, and the victim's (the size prefix is read off).
            assert started.count(victim_frame[4:]) == 1 and started.count(attacker_frame[4:]) == 1, \
                [f[-8:] for f in started]
            release.set()
            await asyncio.wait_for(victim, 10)
    finally:
        release.set()
        for writer in writers:
            writer.close()
        await lst.stop()


async def test_a_wait_for_the_frame_pool_ends_when_the_connections_answers_can_no_longer_be_written(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection whose next frame waits for room in queued.max.request.bytes, and whose answer then fails
    to be written (the client is gone), is closed at once and its slot let go: not left waiting for the pool,
    which another connection may hold for the whole request timeout."""
    written = asyncio.Event()
    fail_write = asyncio.Event()

    async def send_that_fails_when_told(_conn: object, _parts: object) -> None:
        # The answer's write, failing as it does when the client reset the connection.
        written.set()
        await fail_write.wait()
        raise ConnectionResetError("the client reset the connection")

    monkeypatch.setattr(kafka_server._Connection, "_send", send_that_fails_when_told)
    lst = await _listener("PLAINTEXT")
    holders = []
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", lst.port)
        holders.append(writer)
        writer.write(_api_versions_frame())  # answered: its write goes on until told to fail
        await writer.drain()
        await asyncio.wait_for(written.wait(), 10)
        # Another connection announces a frame as large as the pool and sends nothing more: it holds the pool
        # for kafka.request.timeout.ms (60 s here).
        _, hog = await asyncio.open_connection("127.0.0.1", lst.port)
        holders.append(hog)
        hog.write(struct.pack(">i", POOL) + b"\x00\x12")
        await hog.drain()
        await await_for(lambda: lst.frame_budget.used_bytes >= POOL, 10, "the pool to be taken")
        writer.write(struct.pack(">i", 1000))  # the first connection's next frame: it waits for the pool
        await writer.drain()
        await await_for(lambda: len(lst.frame_budget._waiters) == 1, 10,  # noqa: SLF001 - the wait under test
                        "the connection to wait for the pool")
        fail_write.set()
        assert await asyncio.wait_for(_closed(reader), 10), "still open"
        await await_for(lambda: lst.stats.connections == 1, 10,
                        lambda: f"{lst.stats.connections} connections open: the failed one holds its slot")
        assert not lst.frame_budget._waiters, "its wait for the pool is still there"  # noqa: SLF001
    finally:
        for w in holders:
            w.close()
        await lst.stop()


async def _announcing(port: int, host: str, size: int, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``n`` connections from ``host`` (a loopback address) that each announce a frame of ``size`` bytes and send
    nothing more."""
    out = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(host, 0))
        writer.write(struct.pack(">i", size) + b"\x00\x12")
        await writer.drain()
        out.append((reader, writer))
    return out


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SASL_PLAINTEXT"])
async def test_one_address_announcing_frames_takes_only_its_share_of_the_frame_pool(
        protocol: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by an audit: on a PLAINTEXT listener (every client counts as logged in), 33 connections that each
    sent a size prefix of socket.request.max.bytes and nothing more took the whole queued.max.request.bytes
    pool for kafka.request.timeout.ms (30 s): every other client's requests waited, and each further 32
    connections queued another 30 s. The same before a SASL login, in the pool of the frames sent before it
    (PRE_AUTH_POOL_BYTES, here 256 KiB): one address filled it, and other clients' logins waited until their
    time ran out. One address's frames now take at most an eighth of a pool (and at least one frame)."""
    monkeypatch.setattr(kafka_server, "PRE_AUTH_POOL_BYTES", 256 * 1024)
    lst = await _listener(protocol, **{"socket.request.max.bytes": str(10 * 1024),
                                       "kafka.authentication.timeout.ms": "60000"})
    pool, shares = ((lst.frame_budget, lst.frame_shares) if protocol == "PLAINTEXT" else
                    (lst.pre_auth_budget, lst.pre_auth_shares))
    frame = 10 * 1024
    assert shares.per_client == max(frame, pool.total_bytes // kafka_server.FRAME_POOL_SHARE)
    count = pool.total_bytes // frame + 2  # more than the pool, announced from 127.0.0.2
    held = shares.per_client // frame
    attackers = await _announcing(lst.port, "127.0.0.2", frame, count)
    try:
        def waiting() -> int:
            budget = shares._budgets.get("127.0.0.2")  # noqa: SLF001 - the wait under test
            return 0 if budget is None else sum(not fut.done() for _, fut in budget._waiters)  # noqa: SLF001
        await await_for(lambda: waiting() == count - held, 10,
                        lambda: f"{held} frame(s) held, {count - held} waiting for the address's share ({waiting()})")
        assert pool.used_bytes <= shares.per_client, (
            f"one address holds {pool.used_bytes} bytes of the pool, over its share of {shares.per_client}")
        answer = await asyncio.wait_for(_answered(lst.port, _api_versions_frame()), 10)
        assert struct.unpack(">ih", answer[:6]) == (7, 0), answer[:6]
    finally:
        for _, writer in attackers:
            writer.close()
        await lst.stop()


async def test_what_a_client_can_make_on_every_connection_is_logged_once_a_period(
        caplog: pytest.LogCaptureFixture) -> None:
    """An oversized size prefix closes the connection with a WARNING: once a period, the rest counted, however
    many connections a client opens to do it (each was a line; audit)."""
    lst = await _listener("PLAINTEXT", **{"socket.request.max.bytes": str(10 * 1024)})
    try:
        with caplog.at_level(logging.INFO, logger=kafka_server.log.name):
            for _ in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", lst.port)
                writer.write(struct.pack(">i", 10 * 1024 + 1))
                await writer.drain()
                assert await asyncio.wait_for(_closed(reader), 10)
                writer.close()
        lines = [r for r in caplog.records if "a request of" in r.getMessage()]
        assert len(lines) == 1, [r.getMessage() for r in lines]
        assert lst.stats.malformed_requests_total == 20
    finally:
        await lst.stop()
