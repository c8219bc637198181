"""The runner process assembled: live state, targets, plugins, background work, reload."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway_plugin.books import outcomes
from gateway_plugin.books.state import GatewayState
from gateway_plugin.books.warm_instances import read_warm_counts, read_warm_report
from gateway_plugin.config import ConfigError, SharedState, SpillwayConfig, load
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.fast_path.book import FastPathBook, apply_outcomes
from gateway_plugin.outcome_listener import OutcomeListener, open_outcome_listener
from gateway_plugin.plugin import Plugin
from gateway_plugin.plugins import runner_plugins
from gateway_plugin.plugins.headers import HeadersPlugin
from gateway_plugin.request.spillway import SpillwayPlugin
from gateway_plugin.runner.workers import HEARTBEAT, HEARTBEAT_S
from gateway_plugin.shared.view import SharedView
from gateway_plugin.shared_sync import SharedSync, Store
from gateway_plugin.signals.discovery import dns_members, follow
from gateway_plugin.signals.prometheus_load import PrometheusScraper
from gateway_plugin.signals.scraper import Fetch, Scraper
from gateway_plugin.targets.base import Invoker
from gateway_plugin.targets.invoke import InvokePool, make_invoker
from gateway_plugin.targets.urls import masked_url

log = logging.getLogger("spillway.app")


# Triton's page for a few hundred models and GPUs is a few hundred KiB; past this, something else
# answers on the metrics port, and reading on would hold the scrape's thread and memory.
MAX_METRICS_BYTES = 8 * 1024 * 1024


def http_fetcher(timeout_s: float = 1.0, max_bytes: int = MAX_METRICS_BYTES) -> Fetch:
    """GET a metrics page with ``requests`` (keep-alive), off the event loop: at most ``max_bytes``
    of it, all of it within ``timeout_s`` (a page that drips a byte a second would otherwise pass
    every read's own timeout and hold the scrape for ever)."""
    import requests

    session = requests.Session()

    def get(url: str) -> str:
        deadline = time.monotonic() + timeout_s
        with session.get(url, timeout=timeout_s, stream=True) as response:
            if response.status_code != 200:
                raise ValueError(f"metrics endpoint answered {response.status_code}")
            body = bytearray()
            # read1: what has arrived, not a full chunk's worth (which a drip never completes).
            while chunk := response.raw.read1(65536, decode_content=True):
                body += chunk
                if len(body) > max_bytes:
                    raise ValueError(
                        f"metrics page over {max_bytes} bytes: is {masked_url(url)} Triton's metrics port?"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError(f"metrics page not read whole within {timeout_s:g} s")
            return body.decode("utf-8", "replace")  # the exposition format is UTF-8

    async def fetch(url: str) -> str:
        return await asyncio.to_thread(get, url)

    return fetch


class RunnerApp:
    def __init__(
        self,
        config: SpillwayConfig,
        config_path: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
        worker: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config_path = config_path
        self.environ = os.environ if environ is None else environ
        self.worker = worker
        share = config.shared_state.nodes_expected * config.runner.workers if config.shared_state else None
        self.secrets = GatewaySecrets.read(config, self.environ)
        self.state = GatewayState(config, self.secrets, clock=clock, shared=self._shared_view(config, share))
        self.state.worker = None if worker is None else str(worker)
        self.state.metrics.cost.share = 1 / share if share else 1.0
        self.pool = InvokePool(max(4, sum(t.concurrency_cap for t in config.targets if t.mode == "invoke")))
        self.spillway = SpillwayPlugin(self.state, self._invokers(config), self.pool)
        self.plugins: dict[str, Plugin[Any]] = runner_plugins(
            [self.spillway, HeadersPlugin()], config.runner.plugins
        )
        self.fast_path = FastPathBook(self.state)
        # The route's outcomes, from its logger or the parent of several workers.
        self.outcomes = outcomes.SlicedApply(
            functools.partial(outcomes.read_and_apply, self.state, outcomes.OutcomeWarnings())
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._scraper: Scraper | None = None
        self.outcome_listener: OutcomeListener | None = None
        self.shared_sync: SharedSync | None = None

    @staticmethod
    def _shared_view(config: SpillwayConfig, share: int | None) -> SharedView | None:
        """This node's view of the shared state; ``share``: how many nodes split each budget and cap
        while the store is away (default ``nodes_expected``)."""
        if config.shared_state is None:
            return None
        from gateway_plugin.policy.build import build_policy

        node = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        return SharedView(config.shared_state, config, build_policy(config), node, share)

    @staticmethod
    def _invokers(config: SpillwayConfig) -> dict[str, Invoker]:
        invokers = {}
        for target in config.targets:
            if target.mode != "invoke":
                continue
            try:
                invokers[target.name] = make_invoker(target)
            except ValueError as exc:
                raise ConfigError(
                    f"target {target.name!r} cannot invoke ({str(exc).rstrip('.')}). Invoke mode needs "
                    "the cloud's credentials in the runner's environment (AWS_* for Lambda; "
                    "ALIBABA_CLOUD_ACCESS_KEY_ID/_SECRET for FC); pass them through nginx_config.envs"
                ) from None
        return invokers

    def start(self) -> None:
        """Background work on the running loop: metrics scraping, gauges, the /metrics endpoint."""
        config = self.state.config
        if config.metrics.listen:
            self.state.metrics.serve(self._metrics_listen(config.metrics.listen))
        urls = [e.metrics_url for e in config.local.endpoints]
        dns, prometheus = config.local.discovery.dns, config.local.discovery.prometheus
        state = self.state
        if prometheus is not None:
            self._scraper = PrometheusScraper(
                state.load,
                http_fetcher(prometheus.timeout_s),
                prometheus,
                config.local.scrape_period_s,
                time.time,
                state.scrape_failed,
                lambda: state.gauge_specs,
            )
            self._tasks.append(asyncio.ensure_future(self._scraper.run()))
        elif urls or dns is not None:
            scraper = self._scraper = Scraper(
                state.load,
                http_fetcher(),
                urls,
                config.local.scrape_period_s,
                state.scrape_failed,
                lambda: state.gauge_specs,
            )
            self._tasks.append(asyncio.ensure_future(scraper.run()))
            if dns is not None:
                found = functools.partial(setattr, scraper, "urls")
                following = follow(dns_members(dns), urls, found, dns.period_s, dns.name)
                self._tasks.append(asyncio.ensure_future(following))
        self._tasks.append(asyncio.ensure_future(self._gauges()))
        if not self.worker:
            self._warn_of_empty_signing_keys(config)
        if self.worker is None:
            self._start_outcomes(config)
        if config.shared_state is not None:
            self.start_shared(self._store(config.shared_state))
        if config.warmup.report_file:
            self._tasks.append(asyncio.ensure_future(self._warm_reports(Path(config.warmup.report_file))))

    def _warn_of_empty_signing_keys(self, config: SpillwayConfig) -> None:
        """A target whose key variable is empty gets unsigned requests, which its function refuses;
        said once at start (the variable's name only, never a value)."""
        for target in config.targets:
            env = target.signing_key_env
            if env and target.name not in self.secrets.signing_keys:
                log.warning(
                    "target %s: %s (its signing_key_env) is empty or unset, so its requests go unsigned "
                    "and a function that checks X-Spillway-Signature refuses them; set it in the "
                    "runner's and APISIX's environment (nginx_config.envs)",
                    target.name,
                    env,
                )

    def _metrics_listen(self, listen: str) -> str:
        """Worker ``i`` of several serves its own ``/metrics`` on the configured port plus ``i``."""
        if self.worker is None:
            return listen
        host, _, port = listen.rpartition(":")
        return f"{host}:{int(port) + self.worker}"

    def take_outcomes(self, channel: socket.socket) -> None:
        """A worker's outcomes come from its parent, one batch a message, on ``channel``; and on it
        the worker beats every ``HEARTBEAT_S`` from its event loop, so the parent can tell a worker
        whose loop stopped turning (it kills it and starts it anew)."""
        loop = asyncio.get_running_loop()
        channel.setblocking(False)

        def beat() -> None:
            with contextlib.suppress(OSError):
                channel.send(HEARTBEAT)
            loop.call_later(HEARTBEAT_S, beat)

        beat()

        def read() -> None:
            try:
                data = channel.recv(outcomes.MAX_MESSAGE_BYTES)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(channel.fileno())
                log.warning("the parent of the workers is gone: stopping")
                os.kill(os.getpid(), signal.SIGTERM)
                return
            try:
                self.outcomes(outcomes.entries_of(data))
            except ValueError as exc:
                log.warning("outcomes from the parent unreadable: %s", str(exc)[:200])

        loop.add_reader(channel.fileno(), read)

    @staticmethod
    def _store(settings: SharedState) -> Store:
        from gateway_plugin.shared_store import RedisStore

        try:
            return RedisStore(settings)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"shared_state: {exc}") from None

    def start_shared(self, store: Store) -> None:
        """Rounds with the shared store, every ``sync_period_ms``, in the background."""
        settings = self.state.config.shared_state
        if settings is None:
            raise ConfigError("no shared_state section")
        self.shared_sync = SharedSync(
            self.state, store, settings.sync_period_ms / 1000, settings.timeout_ms / 1000
        )
        self._tasks.append(asyncio.ensure_future(self.shared_sync.run()))

    def _start_outcomes(self, config: SpillwayConfig) -> None:
        """The endpoint the route's http-logger posts to; it needs the route token (its auth)."""
        self.outcome_listener = open_outcome_listener(
            config,
            self.secrets,
            asyncio.get_running_loop(),
            self.outcomes,
            self.fast_path.exchange,
            functools.partial(apply_outcomes, self.state),
        )

    async def _gauges(self) -> None:
        while True:
            self.state.refresh_gauges()
            await asyncio.sleep(1.0)

    async def _warm_reports(self, path: Path, period_s: float = 2.0) -> None:
        """Instances the warm-up pinger reached count as warm: read its report when it changes."""
        seen = 0.0
        while True:
            try:
                mtime = path.stat().st_mtime
                if mtime != seen:
                    seen = mtime
                    text = path.read_text()
                    for target, instances in read_warm_report(text).items():
                        self.state.warm_report(target, instances)
                    self.state.warm_counts(*read_warm_counts(text))
            except (OSError, ValueError) as exc:
                log.debug("warm-up report %s unreadable: %s", path, exc)
            await asyncio.sleep(period_s)

    def reload(self) -> bool:
        """Re-read the config file; an invalid one is refused and the old config keeps serving."""
        if self.config_path is None:
            return False
        try:
            config = load(self.config_path)
            kept = GatewaySecrets.read(config, self.environ)
            invokers = self._invokers(config)
            if config.shared_state != self.state.config.shared_state:
                raise ConfigError("shared_state changes need a restart of the runner")
            if config.runner.plugins != self.state.config.runner.plugins:
                raise ConfigError("runner.plugins changes need a restart of the runner")
        except (ConfigError, ValueError) as exc:
            log.error("config reload refused, still serving the previous config: %s", exc)
            return False
        self.secrets = kept
        self.spillway.reload(config, kept, invokers)
        log.info("config reloaded from %s", self.config_path)
        return True

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.outcome_listener is not None:
            self.outcome_listener.close()
        self.pool.close()

    async def aclose(self) -> None:
        """``close``, then wait for the background tasks to finish cancelling, so a scrape cut short
        leaves no half-gathered futures behind."""
        self.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.shared_sync is not None:
            await self.shared_sync.close()
