"""Turns to start: at most so many of a hub's servers starting at once, the rest in order.

Starting a notebook server costs CPU where its pod runs (the container runtime,
the GPU check's container, Jupyter's own start: seconds of CPU each). When many
users start at once on nodes that share few cores, every start gets a thin share
and all of them finish together at the end: each user waits for the last one.
With turns, the first ones in are ready early and the rest follow in order, and
the last one waits no longer than before.

A turn is taken once a start is admitted (after its limits and the GPU queue:
refusals stay instant) and given back when the server answers HTTP, or when the
start fails or is cancelled. A limit of 0 means no gate.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict


class StartGate:
    """The hub's turns to start (one per hub process, in :class:`~gpuspawner.hub.state.HubState`)."""

    def __init__(self) -> None:
        self._starting: set[str] = set()
        self._waiting: OrderedDict[str, asyncio.Future] = OrderedDict()
        self._limit = 0

    @property
    def starting(self) -> int:
        """How many starts hold a turn."""
        return len(self._starting)

    def ahead_of(self, key: str) -> int | None:
        """How many starts wait before ``key`` (None when it is not waiting)."""
        for position, waiting in enumerate(self._waiting):
            if waiting == key:
                return position
        return None

    async def enter(self, key: str, limit: int) -> None:
        """Wait for ``key``'s turn (at once when fewer than ``limit`` start and none wait)."""
        self._limit = limit
        if key in self._starting:
            return
        if limit <= 0 or (len(self._starting) < limit and not self._waiting):
            self._starting.add(key)
            return
        turn = asyncio.get_running_loop().create_future()
        self._waiting[key] = turn
        try:
            await turn
        except BaseException:
            # Cancelled while waiting (the user stopped, the start timed out), or
            # just after being given the turn: either way it is not used.
            self._waiting.pop(key, None)
            if turn.done() and not turn.cancelled():
                self.leave(key)
            raise

    def leave(self, key: str) -> None:
        """Give ``key``'s turn back (harmless when it holds none) and let the next in."""
        self._starting.discard(key)
        waiting = self._waiting.pop(key, None)
        if waiting is not None and not waiting.done():
            waiting.cancel()
        while self._waiting and (self._limit <= 0 or len(self._starting) < self._limit):
            next_key, turn = self._waiting.popitem(last=False)
            if turn.done():
                continue
            self._starting.add(next_key)
            turn.set_result(None)
