"""What bench/multi_node.py stands two APISIX nodes in front of: each node's spillway.yaml, an
upstream that counts what it has in flight, clients on both nodes and routes, the runners'
metrics."""

from __future__ import annotations

import contextlib
import http.client
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from harness import free_port
from prometheus_client.parser import text_string_to_metric_families

from devtools.nodes import Node, Nodes

COST_USD = 0.01


def node_configs(
    local: str,
    aws: str,
    feed: str,
    store_url: str,
    budget: int,
    cap: int,
    count: int = 2,
    replicas_ack: int = 0,
) -> list[dict[str, Any]]:
    """Each node's spillway.yaml: every public request to aws (a rule) at $0.01, an hourly budget
    of ``budget`` of them and a cap of ``cap`` shared by the nodes; each its own ports."""
    prefix = "bench-" + secrets.token_hex(4)
    return [
        {
            "local": {
                "endpoints": [{"url": local, "metrics_url": feed}],
                "latency_target_ms": 200,
                "scrape_period_s": 0.1,
            },
            "targets": [
                {
                    "name": "aws",
                    "kind": "http",
                    "url": aws,
                    "cold_start_ms": 0,
                    "concurrency_cap": cap,
                    "cost": {"usd_per_request": COST_USD, "usd_per_gb_second": 0, "billed_init": False},
                }
            ],
            "rules": [{"name": "out", "action": "target", "targets": ["aws"]}],
            "budgets": {"per_target_hourly_usd": {"aws": budget * COST_USD}},
            "shared_state": {
                "redis_url": store_url,
                "nodes_expected": count,
                "key_prefix": prefix,
                "replicas_ack": replicas_ack,
            },
            "metrics": {"listen": f"127.0.0.1:{free_port()}"},
            "outcomes": {"listen": f"127.0.0.1:{free_port()}"},
        }
        for _ in range(count)
    ]


@dataclass
class CountingUpstream:
    name: str
    delay_s: float = 0.0
    url: str = ""
    count: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    # How many requests arrived to find each count in flight, themselves included.
    arrivals: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.count = self.max_in_flight = 0
            self.arrivals.clear()


@contextmanager
def counting_upstream(name: str, delay_s: float = 0.0) -> Iterator[CountingUpstream]:
    state = CountingUpstream(name, delay_s)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            with state.lock:
                state.count += 1
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
                state.arrivals[state.in_flight] += 1
            time.sleep(state.delay_s)
            with state.lock:
                state.in_flight -= 1
            body = b'{"upstream": "%s"}' % name.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.send_header("x-spillway-instance", "fn-1")
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Traffic:
    """``per_path[i]`` clients on node ``i`` per path (one on each by default), one request at a
    time each (keep-alive), until stopped."""

    nodes: Nodes
    paths: Iterable[str]
    per_path: tuple[int, ...] = ()
    answers: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for i, node in enumerate(self.nodes.nodes):
            for path in self.paths:
                for _ in range(self.per_path[i] if i < len(self.per_path) else 1):
                    thread = threading.Thread(target=self._client, args=(node, path), daemon=True)
                    thread.start()
                    self.threads.append(thread)

    def _client(self, node: Node, path: str) -> None:
        where = urlsplit(node.url)
        headers = {"content-type": "application/json", "x-data-classification": "public"}
        conn = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
        while not self.stop.is_set():
            try:
                conn.request("POST", path, body=b"{}", headers=headers)
                answer = conn.getresponse()
                answer.read()
                status = answer.status
            except (OSError, http.client.HTTPException):
                conn.close()
                status = 0
            with self.lock:
                self.answers[status] += 1
        conn.close()

    def finish(self) -> Counter[int]:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        return self.answers


def metric(node: Node, name: str, **labels: str) -> float:
    conn = http.client.HTTPConnection(*node.config["metrics"]["listen"].split(":"), timeout=5)
    try:
        conn.request("GET", "/metrics")
        body = conn.getresponse().read().decode()
    except OSError:
        return -1.0
    finally:
        conn.close()
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def poll_back(nodes: Nodes, since: float, timeout_s: float = 30.0) -> list[float | None]:
    """Per node, seconds from ``since`` until its runner says it reached the store again (never
    less than 0: a runner may find the new master before every sentinel names it)."""
    back: list[float | None] = [None] * len(nodes.nodes)
    deadline = time.monotonic() + timeout_s
    while None in back and time.monotonic() < deadline:
        for i, node in enumerate(nodes.nodes):
            if back[i] is None and metric(node, "spillway_shared_state_connected") == 1:
                back[i] = round(max(0.0, time.monotonic() - since), 3)
        time.sleep(0.02)
    return back


class HeldProxy:
    """A TCP proxy on loopback to ``port`` that forwards nothing while ``open`` is clear."""

    def __init__(self, port: int) -> None:
        self.target, self.open = port, threading.Event()
        self.open.set()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

    def __enter__(self) -> HeldProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.open.set()
        self.listener.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target), timeout=10)
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError), source, sink:
            source.settimeout(None)
            while chunk := source.recv(65536):
                self.open.wait()
                sink.sendall(chunk)
