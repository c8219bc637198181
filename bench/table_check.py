"""What checking a decision table costs the fast path's plugin, once per table version per worker:
``table.parse`` (decode, ``core.schema.check`` against the schema generated from the table's
models, the PCRE compiles a schema cannot express, compile) against the baseline measured in the
same run, the hand-written checks table.lua had before (decode, check, compile), interleaved parse
by parse in one APISIX worker (CPU time, ``os.clock``).

The table is the runner's own for ``examples/spillway.yaml`` (its rules, targets and content
checks) with ``--tenants`` rows of tenants at their quota, as a fetch would carry them.

    python bench/table_check.py [--tenants 1000] [--rounds 500] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys

from harness import ROOT, free_port

from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import load
from gateway_plugin.config.secrets import GatewaySecrets
from gateway_plugin.fast_path.book import FastPathBook
from gateway_plugin.fast_path.table import encode

sys.path.insert(1, str(ROOT))  # devtools and testing are source-only: importable from the checkout
from devtools import apisix
from testing.http import http

# Keys only name what the table carries here; nothing is signed or sent anywhere.
for var in ("SPILLWAY_ROUTE_TOKEN", "SPILLWAY_SIGNING_KEY"):
    os.environ.setdefault(var, secrets.token_hex(16))


def table_text(tenants: int) -> str:
    config = load(ROOT / "examples" / "spillway.yaml")
    state = GatewayState(config, GatewaySecrets.read(config))
    table = FastPathBook(state).table()
    row = {"requests_last_minute": 60, "spent_hour_usd": 0.5, "spent_day_usd": 3.25}
    table["tenants"] = {f"tenant-{i:05d}": dict(row) for i in range(tenants)}
    return encode(table).decode()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    text = table_text(args.tenants)
    route = {
        "id": "check",
        "uri": "/table-check",
        "plugins": {"spillway-table-check": {}},
        "upstream": {"type": "roundrobin", "nodes": {"127.0.0.1:1": 1}},
    }
    settings = apisix.ApisixSettings(
        port=free_port(),
        routes_yaml=json.dumps({"routes": [route]}),
        plugins=["spillway-table-check"],
        more_lua_paths=[ROOT / "bench" / "lua"],
    )
    body = json.dumps({"table": text, "rounds": args.rounds}).encode()
    with apisix.running(settings) as gateway:
        status, _, answer = http(
            "POST", gateway.url + "/table-check", body, {"content-type": "application/json"}, timeout=600
        )
    if status != 200:
        print(f"error: APISIX answered {status}: {answer[:300]!r}", file=sys.stderr)
        return 1
    times = json.loads(answer)
    base = statistics.median(times["baseline"])
    rows = []
    for case in ("baseline", "schema"):
        us = sorted(times[case])
        p50, p99 = statistics.median(us), us[int(len(us) * 0.99) - 1]
        rows.append(
            {"case": case, "bytes": len(text), "p50_us": p50, "p99_us": p99, "of_baseline": p50 / base}
        )
    for row in rows:
        if args.json or not sys.stdout.isatty():
            print(json.dumps(row))
        else:
            print(
                f"{row['case']:9} {row['bytes']:>8} B  p50 {row['p50_us']:>8.0f} µs  "
                f"p99 {row['p99_us']:>8.0f} µs  x{row['of_baseline']:.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
