"""Run a coroutine eagerly: most plugin calls finish without suspending, and those need no Task.

A backport of the idea behind Python 3.12's ``asyncio.eager_task_factory``: step the coroutine
once inline; only if it suspends is it handed, mid-flight, to a real Task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")

Done = Callable[[Any, BaseException | None], None]


class _Resume:
    """Awaitable that continues an already-started coroutine from what it last yielded."""

    __slots__ = ("_coro", "_pending")

    def __init__(self, coro: Coroutine[Any, Any, Any], pending: Any) -> None:
        self._coro = coro
        self._pending = pending

    def __await__(self) -> Generator[Any, None, Any]:
        pending = self._pending
        while True:
            try:
                yield pending
            except BaseException as exc:  # cancellation and errors go into the coroutine
                try:
                    pending = self._coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                pending = self._coro.send(None)
            except StopIteration as stop:
                return stop.value


async def _finish(resume: _Resume) -> Any:
    return await resume


def run_eagerly(coro: Coroutine[Any, Any, Any], done: Done, tasks: set[asyncio.Task[Any]]) -> None:
    """Call ``done(result, error)`` once, inline if the coroutine never suspends."""
    try:
        pending = coro.send(None)
    except StopIteration as stop:
        done(stop.value, None)
        return
    except Exception as exc:
        done(None, exc)
        return
    task = asyncio.ensure_future(_finish(_Resume(coro, pending)))
    tasks.add(task)

    def finished(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if t.cancelled():
            done(None, asyncio.CancelledError())
        else:
            exc = t.exception()
            done(None if exc else t.result(), exc)

    task.add_done_callback(finished)
