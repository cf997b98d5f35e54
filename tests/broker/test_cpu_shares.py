"""Each client address's share of the broker's interpreter (broker/cpu_shares.py), on a clock the test moves.

A ListGroups flood from one address (20 at a time, ~12 ms of work each) took the broker's interpreter: another
address's ApiVersions went from 2 ms to 15-20 ms at the median and its commits from 10 ms to 130 ms. These
tests hold the rules that stop it, without timing anything: who is held, for how long, and in what order.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from broker.cpu_shares import MAX_DELAY_S, WINDOW_S, CpuShares

ATTACKER, VICTIM = "10.0.0.2", "10.0.0.1"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shares(percent: float = 50) -> tuple[CpuShares, Clock]:
    clock = Clock()
    return CpuShares(percent, clock=clock), clock


def test_a_lone_client_is_never_held_however_much_it_takes() -> None:
    cpu, _ = shares()
    cpu.charge(ATTACKER, 5.0)  # five cores' worth in one window
    assert cpu.delay_s(ATTACKER) == 0.0, "a client alone on the broker was held"


def test_an_address_over_its_share_waits_kafkas_throttle_time_while_another_address_is_active() -> None:
    cpu, clock = shares(50)
    assert cpu.delay_s(VICTIM) == 0.0  # the victim sends a request: it is active
    cpu.charge(ATTACKER, 0.3)
    assert cpu.delay_s(ATTACKER) == 0.0, "held under its share (0.3 s of 0.5 s a second)"
    cpu.charge(ATTACKER, 0.4)
    # 0.7 s used of a 0.5 s share: (0.7 - 0.5) / 0.5 = 0.4 s until it is back under, sending nothing more.
    assert cpu.delay_s(ATTACKER) == pytest.approx(0.4)
    assert cpu.delay_s(VICTIM) == 0.0, "the address within its share was held"
    cpu.charge(ATTACKER, 10.0)
    assert cpu.delay_s(ATTACKER) == MAX_DELAY_S, "one wait is bounded"
    # Once the other address has sent nothing for a window, the attacker is alone again.
    clock.now += WINDOW_S + 0.01
    cpu.charge(ATTACKER, 0.9)
    assert cpu.delay_s(ATTACKER) == 0.0, "held with no other address active"


def test_work_older_than_the_window_no_longer_counts() -> None:
    cpu, clock = shares(50)
    cpu.charge(ATTACKER, 0.9)
    clock.now += 0.55
    assert cpu.used_s(ATTACKER) == pytest.approx(0.9)
    cpu.charge(ATTACKER, 0.2)
    clock.now += 0.5  # the first charge is now more than a window old
    assert cpu.used_s(ATTACKER) == pytest.approx(0.2)
    clock.now += WINDOW_S
    assert cpu.used_s(ATTACKER) == 0.0


def test_zero_percent_means_no_bound() -> None:
    cpu, _ = shares(0)
    cpu.delay_s(VICTIM)
    cpu.charge(ATTACKER, 9.0)
    assert cpu.delay_s(ATTACKER) == 0.0 and cpu.used_s(ATTACKER) == 0.0
    with pytest.raises(ValueError):
        CpuShares(-1)


def test_tracked_addresses_are_bounded() -> None:
    cpu = CpuShares(50, max_clients=100)
    for i in range(1000):
        cpu.charge(f"10.1.{i // 256}.{i % 256}", 0.001)
    assert len(cpu._usage) == 100


def test_an_address_over_its_share_has_its_requests_go_one_at_a_time_each_after_its_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    """Without the one-at-a-time rule, every held request started the moment the sum came back under."""
    caplog.set_level(logging.WARNING, logger="broker.cpu_shares")
    cpu = CpuShares(50)
    ran: list[str] = []
    running = 0
    most = 0

    async def request(name: str, client: str) -> None:
        nonlocal running, most
        async with cpu.turn(client, time.monotonic() + 30):
            running += 1
            most = max(most, running) if client == ATTACKER else most
            ran.append(name)
            await asyncio.sleep(0.01)
            running -= 1

    async def scenario() -> None:
        cpu.delay_s(VICTIM)
        cpu.charge(ATTACKER, 0.55)  # 0.05 s over: a wait of 0.1 s for the first held request
        attackers = [asyncio.ensure_future(request(f"a{i}", ATTACKER)) for i in range(5)]
        await asyncio.sleep(0)
        assert cpu.held_addresses() == 1
        await asyncio.wait_for(request("v", VICTIM), 5)
        assert ran == ["v"], f"the victim waited behind the held address: {ran}"
        await asyncio.wait_for(asyncio.gather(*attackers), 30)
    asyncio.run(scenario())
    assert ran[1:] == [f"a{i}" for i in range(5)], "the held address's requests lost their order"
    assert most == 1, f"{most} of the held address's requests ran at once"
    assert cpu.held_addresses() == 0, "an address stayed held with nothing waiting"
    assert cpu.throttled_total >= 1 and cpu.throttle_seconds_total > 0
    held = [r.getMessage() for r in caplog.records if r.name == "broker.cpu_shares"]
    assert len(held) == 1 and ATTACKER in held[0] and "request.cpu.max.percent.per.ip=50" in held[0], held


def test_a_held_request_starts_anyway_at_its_deadline() -> None:
    cpu = CpuShares(50)

    async def scenario() -> None:
        cpu.delay_s(VICTIM)
        cpu.charge(ATTACKER, 50.0)  # held for good, were it not for the deadline
        async with cpu.turn(ATTACKER, time.monotonic() + 0.05):
            pass
    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_metered_charges_a_coroutines_own_steps_and_not_its_waits() -> None:
    cpu = CpuShares(50, clock=Clock())  # a clock that stands still: every charge stays in the window

    async def work() -> str:
        for _ in range(3):
            end = time.thread_time() + 0.03
            while time.thread_time() < end:  # 30 ms of this thread's CPU, three times
                pass
            await asyncio.sleep(0.2)  # waiting costs nothing
        return "done"

    async def scenario() -> str:
        return await cpu.metered(work(), ATTACKER)
    assert asyncio.run(scenario()) == "done"
    assert 0.09 <= cpu.used_s(ATTACKER) < 0.3, f"charged {cpu.used_s(ATTACKER):.3f} s for 0.09 s of work"
