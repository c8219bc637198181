"""What clients' tenant names cost the fast path's decision table: its bytes and the runner's time
to build and encode it, with 1,000 tenants at their quota named by 7 KB texts against the same
with short names (the baseline, measured in the same run), and the memory their books keep.

Each tenant's request goes through the runner's own ``spillway`` plugin (``request_filter``, as
APISIX's call would: the name keyed there) under a quota of one request a minute, so every one
is at its limit and in the table. Then the table is built as a fetch builds it
(``FastPathBook.exchange``), the two cases interleaved build by build so both see the same noise.

    python bench/decision_table.py [--tenants 1000] [--name-bytes 7000] [--builds 200] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import secrets
import statistics
import sys
import time
import tracemalloc
from typing import Any

from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.fast_path.book import FastPathBook, FastPathReport
from gateway_plugin.plugin import HttpRequest, RequestAction
from gateway_plugin.protocol import encode, messages
from gateway_plugin.request.spillway import RouteOverrides, SpillwayPlugin

# The route token only MACs target values here; none leaves this process.
os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(16))
CONFIG = {
    "targets": [{"name": "aws", "kind": "http", "url": "https://fn.example", "signing_key_env": None}],
    "tenants": {"default": {"requests_per_minute": 1}},
    "metrics": {"listen": None},
    "outcomes": {"listen": None},
}


async def admit(names: list[str]) -> tuple[FastPathBook, int]:
    """A runner's state after one request of each tenant, and the bytes its books keep."""
    config = SpillwayConfig.model_validate(CONFIG)
    state = GatewayState(config, GatewaySecrets.read(config))
    plugin = SpillwayPlugin(state)
    conf = plugin.prepare(RouteOverrides())
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, name in enumerate(names):
        headers = [("x-tenant", name), ("content-type", "application/json")]
        call = messages.HttpReqCall(encode.req_call(i, 1, 2, "/v2/models/m/infer", [], headers, bytes(4)))
        request = HttpRequest(call, None)  # type: ignore[arg-type]  # a local decision asks nothing
        await plugin.request_filter(conf, request, RequestAction(request))
        del call, request
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return FastPathBook(state), kept


def build_us(book: FastPathBook) -> tuple[float, int]:
    report = FastPathReport(node="bench")
    start = time.perf_counter()
    text = book.exchange(report)
    return (time.perf_counter() - start) * 1e6, len(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--name-bytes", type=int, default=7000)
    parser.add_argument("--builds", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="JSON lines (the default when not on a terminal)")
    args = parser.parse_args(argv)
    as_json = args.json or not sys.stdout.isatty()
    long = "n" * (args.name_bytes - 4)
    cases = {
        "short names": [f"tenant-{i:04}" for i in range(args.tenants)],
        f"{args.name_bytes:,}-byte names": [f"{i:04}{long}" for i in range(args.tenants)],
    }
    books: dict[str, FastPathBook] = {}
    kept: dict[str, int] = {}
    for case, names in cases.items():
        books[case], kept[case] = asyncio.run(admit(names))
    times: dict[str, list[float]] = {case: [] for case in cases}
    sizes: dict[str, int] = {}
    for _ in range(args.builds):
        for case, book in books.items():
            us, size = build_us(book)
            times[case].append(us)
            sizes[case] = size
    base = next(iter(cases))
    base_us = statistics.median(times[base])
    for case in cases:
        us = statistics.median(times[case])
        row: dict[str, Any] = {
            "case": case,
            "tenants": args.tenants,
            "rows": len(json.loads(books[case].exchange(FastPathReport(node="bench")))["tenants"]),
            "table_bytes": sizes[case],
            "bytes_of_baseline": round(sizes[case] / sizes[base], 3),
            "build_us_p50": round(us, 1),
            "build_us_p99": round(sorted(times[case])[int(len(times[case]) * 0.99)], 1),
            "build_of_baseline": round(us / base_us, 3),
            "books_bytes": kept[case],
            "books_of_baseline": round(kept[case] / kept[base], 3),
        }
        if as_json:
            print(json.dumps(row), flush=True)
        else:
            print(
                f"{case:<18} rows {row['rows']:>5}  table {row['table_bytes']:>9,} B "
                f"(x{row['bytes_of_baseline']})  build p50 {row['build_us_p50']:>8,} µs "
                f"p99 {row['build_us_p99']:>8,} µs (x{row['build_of_baseline']})  "
                f"books {row['books_bytes']:>10,} B (x{row['books_of_baseline']})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
