"""The one deadline an HTTP connection waits on, kept on a timer that is rarely replaced.

A connection moves its deadline several times per request (head, body, idle). Replacing a timer
each time costs a timer handle and a cancellation every move; here the timer only ever fires
early, at most every ``tick_s``, and sets itself again when the deadline has moved on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

Expire = Callable[[float, int | None, str], None]


class Deadline:
    __slots__ = ("_at", "_expire", "_loop", "_tick_s", "_timer", "_timer_at", "_why")

    def __init__(self, loop: asyncio.AbstractEventLoop, tick_s: float, expire: Expire) -> None:
        """``expire(seconds, status, what)`` runs once a deadline armed with them has passed."""
        self._loop = loop
        self._tick_s = tick_s
        self._expire = expire
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._at: float | None = None
        self._why: tuple[float, int | None, str] = (0.0, None, "")

    def arm(self, seconds: float, status: int | None, what: str) -> None:
        now = self._loop.time()
        self._at = at = now + seconds
        self._why = (seconds, status, what)
        if self._timer is None or self._timer_at > at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = now + min(seconds, self._tick_s)
            self._timer = self._loop.call_at(self._timer_at, self._tick)

    def clear(self) -> None:
        """Nothing to wait for; the timer, if any, lapses when it fires."""
        self._at = None

    def cancel(self) -> None:
        """The connection is gone: no timer may keep it alive."""
        self._at = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = None
        at = self._at
        if at is None:
            return
        now = self._loop.time()
        if now < at:
            self._timer_at = min(at, now + self._tick_s)
            self._timer = self._loop.call_at(self._timer_at, self._tick)
            return
        self._at = None
        self._expire(*self._why)
