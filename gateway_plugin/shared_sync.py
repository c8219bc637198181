"""The background rounds that keep this node's shared view fresh, off the decision path.

Every ``sync_period_ms`` (sooner when a lease or the slots run low, but never more often than ten
times a period) the loop gathers what changed, the store's blocking call runs on its own thread
with a deadline, and the answer is applied back on the loop. A round that fails or runs late
leaves the node deciding alone, with its ``1/N`` shares, until a round succeeds again; at most one
call is out at a time, so a hung store cannot pile up threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from gateway_plugin.books.metrics import RunnerMetrics
from gateway_plugin.books.state import GatewayState

log = logging.getLogger("spillway.shared")


class Store(Protocol):
    """The shared store's edge: one atomic exchange per round (blocking, bounded by timeouts)."""

    def exchange(self, payload: dict[str, Any]) -> list[Any]: ...

    def describe(self, error: BaseException) -> str: ...

    def may_have_run(self, error: BaseException) -> bool: ...

    def close(self) -> None: ...


class SharedSync:
    def __init__(
        self,
        state: GatewayState,
        store: Store,
        period_s: float,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if state.shared is None:
            raise ValueError("shared state rounds need a state with a shared view")
        self.state, self.view, self.store = state, state.shared, store
        self.period_s, self.timeout_s, self.clock = period_s, timeout_s, clock
        self.metrics: RunnerMetrics = state.metrics
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="shared-state")
        self._out: Future[list[Any]] | None = None
        self._wake = asyncio.Event()
        self.view.wake = self._wake.set
        self.rounds = 0
        self._said_lost = False

    async def run(self) -> None:
        self.metrics.shared_connected.set(0)
        while True:
            started = self.clock()
            try:
                await self.round()
            except Exception:  # an answer that cannot be applied must not end the rounds
                log.exception("a shared state round could not be applied")
                self._lost("an answer that could not be applied")
            self._wake.clear()
            try:
                async with asyncio.timeout(self.period_s):
                    await self._wake.wait()
            except TimeoutError:
                continue
            await asyncio.sleep(max(0.0, self.period_s / 10 - (self.clock() - started)))

    async def round(self, release: bool = False) -> bool:
        """One exchange; whether the store answered in time."""
        if self._out is not None and not self._out.done():
            self._lost("the previous call has not returned")
            return False
        sent = self.state.shared_round(release)
        self._out = self._executor.submit(self.store.exchange, sent.payload)
        try:
            # asyncio.timeout, not wait_for: on 3.11, wait_for can swallow a cancellation that
            # arrives as the call returns, and the rounds would outlive the runner's stop.
            async with asyncio.timeout(self.timeout_s):
                reply = await asyncio.wrap_future(self._out)
        except TimeoutError:
            self.view.may_have_run(sent)
            self._lost(f"no answer within {self.timeout_s * 1000:.0f} ms")
            return False
        except Exception as exc:  # the store's client raises many kinds; each means "not now"
            if self.store.may_have_run(exc):
                self.view.may_have_run(sent)
            self._lost(self.store.describe(exc))
            return False
        self.state.shared_answered(sent, reply)
        self.rounds += 1
        self.metrics.shared_rounds.inc()
        if not self.view.connected:
            self.view.connected, self._said_lost = True, False
            self.metrics.shared_connected.set(1)
            log.info("shared state reachable: deciding with this node's leases and the shared view")
        return True

    def _lost(self, why: str) -> None:
        self.metrics.shared_errors.inc()
        if not self._said_lost:
            self._said_lost = True
            log.warning(
                "shared state unreachable (%s): deciding alone with 1/%d of every budget and cap "
                "until it answers",
                why,
                self.view.share,
            )
        self.view.connected = False
        self.metrics.shared_connected.set(0)

    async def drained(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for a call still out; whether none is."""
        out = self._out
        if out is not None and not out.done():
            await asyncio.wait([asyncio.wrap_future(out)], timeout=timeout_s)
        return out is None or out.done()

    async def close(self) -> None:
        """Hand back unused leases and slots (best effort, bounded), then close the store."""
        if self.view.connected:
            await self.round(release=True)
        self._executor.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.store.close)
