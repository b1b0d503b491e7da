"""Turns to start: the limit, the order, and turns given back on every path."""

from __future__ import annotations

import asyncio

import pytest

from gpuspawner.hub.startturns import StartGate


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_no_limit_means_no_waiting():
    gate = StartGate()
    for key in "abcdef":
        await asyncio.wait_for(gate.enter(key, 0), 1)
    assert gate.starting == 6


async def test_at_most_limit_start_and_the_rest_go_in_order():
    gate = StartGate()
    await gate.enter("a", 2)
    await gate.enter("b", 2)
    entered: list[str] = []

    async def start(key: str) -> None:
        await gate.enter(key, 2)
        entered.append(key)

    tasks = [asyncio.ensure_future(start(k)) for k in "cde"]
    await _settle()
    assert entered == [] and gate.starting == 2
    assert [gate.ahead_of(k) for k in "cde"] == [0, 1, 2]
    assert gate.ahead_of("a") is None
    gate.leave("b")
    await _settle()
    assert entered == ["c"] and gate.ahead_of("d") == 0
    gate.leave("a")
    gate.leave("c")
    await _settle()
    assert entered == ["c", "d", "e"]
    await asyncio.gather(*tasks)
    assert gate.starting == 2  # d and e; a, b and c gave theirs back


async def test_a_start_cancelled_while_waiting_leaves_the_queue():
    gate = StartGate()
    await gate.enter("a", 1)
    waiting = asyncio.ensure_future(gate.enter("b", 1))
    later = asyncio.ensure_future(gate.enter("c", 1))
    await _settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert gate.ahead_of("b") is None and gate.ahead_of("c") == 0
    gate.leave("a")
    await asyncio.wait_for(later, 1)
    assert gate.starting == 1


async def test_a_turn_given_to_a_start_cancelled_at_that_moment_passes_on():
    gate = StartGate()
    await gate.enter("a", 1)
    given = asyncio.ensure_future(gate.enter("b", 1))
    later = asyncio.ensure_future(gate.enter("c", 1))
    await _settle()
    gate.leave("a")  # b's turn is set, but b has not run yet...
    given.cancel()  # ...and is cancelled before it does
    with pytest.raises(asyncio.CancelledError):
        await given
    await asyncio.wait_for(later, 1)
    assert gate.starting == 1


async def test_leaving_twice_or_without_a_turn_is_harmless():
    gate = StartGate()
    await gate.enter("a", 1)
    gate.leave("a")
    gate.leave("a")
    gate.leave("never")
    assert gate.starting == 0
    await asyncio.wait_for(gate.enter("b", 1), 1)
    # Entering again with a turn held does not take a second one.
    await asyncio.wait_for(gate.enter("b", 1), 1)
    assert gate.starting == 1
