"""What the audit trail costs per request, through a real Apache APISIX 3.18.

Four cases, each one APISIX built the way ``bench/apisix_gateway.py`` builds its own (same nginx
upstreams, metrics feed, wrk load and CPU accounting, from that module), calm feed so every request
is decided ``local;local_ok``:

    ext              the ext-plugin route ``apisix_route.route`` makes, no audit section
    ext-audit        the same with ``audit: {logger: file-logger}``: the runner adds X-Spillway-Audit,
                     the edge takes it into the context, file-logger writes one JSON line a request
    fast             the fast path's route, no audit section
    fast-audit       the same with the file-logger (the plugin's decision read at log time)

Each round runs every case once, in an order rotated between rounds; the ratios are medians of
per-round ratios of each audited case against its unaudited twin measured in the same round (req/s,
p50, p99, APISIX and runner CPU per request), plus the audit file's bytes per request.

    python bench/audit_cost.py [--rounds 3] [--seconds 6] [--connections 16] [--json-out F]

Needs APISIX in a prefix of its own, as bench/apisix_gateway.py does (--prefix, else
$SPILLWAY_APISIX_PREFIX, else /opt/spillway-apisix-bench), and wrk and nginx (the installer's).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import secrets
import shlex
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

import apisix_gateway as gw
import yaml
from harness import machine_note, say

from devtools import apisix
from gateway_plugin.apisix_fast_route import config_snippet, fast_route
from gateway_plugin.apisix_route import route, standalone_yaml
from gateway_plugin.config import SpillwayConfig

CASES = ("ext", "ext-audit", "fast", "fast-audit")


def case(name: str, setup: gw.Setup) -> gw.Case:
    metrics_port = gw.free_port()
    config = gw.spillway_config(setup, metrics_port, gw.free_port())
    if name.endswith("-audit"):
        log = setup.work / f"{name}.log"
        log.unlink(missing_ok=True)
        config["audit"] = {"logger": "file-logger", "conf": {"path": str(log)}}
    validated = SpillwayConfig.model_validate(config)
    path = setup.work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    fast = name.startswith("fast")
    made = fast_route(validated, setup.token.encode()) if fast else route(validated, setup.token.encode())
    return gw.Case(
        # apisix_gateway gives a case named fast-* the fast path's plugin list.
        f"fast-local{name.removeprefix('fast')}" if fast else f"spillway-local{name.removeprefix('ext')}",
        [sys.executable, "-m", "gateway_plugin", "run", "--config", str(path)],
        standalone_yaml(made),
        "local",
        "local;local_ok",
        "calm",
        f"http://{gw.LOOPBACK}:{metrics_port}/metrics",
        "http-logger" in made["plugins"],
        lua=config_snippet(validated),
    )


def with_file_logger(settings: apisix.ApisixSettings) -> apisix.ApisixSettings:
    return dataclasses.replace(settings, plugins=[*settings.plugins, "file-logger"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=6)
    parser.add_argument("--warmup-seconds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--prefix", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    args.keep_logs = None
    args.prefix = args.prefix or Path(os.environ.get("SPILLWAY_APISIX_PREFIX") or gw.DEFAULT_PREFIX)
    os.environ["SPILLWAY_APISIX_PREFIX"] = str(args.prefix.resolve())
    gw.check_prefix()
    original = gw.apisix_settings
    gw.apisix_settings = lambda *a, **k: with_file_logger(original(*a, **k))  # type: ignore[assignment]
    command = shlex.join(["python", "bench/audit_cost.py", *(argv if argv is not None else sys.argv[1:])])
    say(f"APISIX in {apisix.prefix()}; {command}")
    samples: dict[str, list[tuple[gw.Sample, int]]] = {name: [] for name in CASES}
    with (
        tempfile.TemporaryDirectory(prefix="spillway-audit-bench-") as tmp,
        gw.upstream_nginx(Path(tmp)) as ups,
        gw.metrics_feed() as feed,
    ):
        work = Path(tmp)
        setup = gw.Setup(work, secrets.token_hex(32), secrets.token_hex(32), ups, feed, gw.GO_RUNNER, 50)
        script = gw.wrk_script(work)
        for rnd in range(args.rounds):
            for position, name in enumerate(gw.rotated(list(CASES), rnd)):
                sample = gw.measure(case(name, setup), setup, args, script, rnd, position)
                log = work / f"{name}.log"
                size = log.stat().st_size if log.exists() else 0
                samples[name].append((sample, size))
                say(
                    f"round {rnd + 1} {name}: {sample.req_per_s:,.0f}/s p50 {sample.p50_us:,.0f} µs "
                    f"p99 {sample.p99_us:,.0f} µs APISIX {sample.apisix_cpu_us_per_req:.0f} µs/req "
                    f"runner {sample.runner_cpu_us_per_req:.0f} µs/req; audit file {size:,} bytes; "
                    f"errors {sample.socket_errors + sample.non2xx + sample.timeouts}"
                )
    rows = summarise(samples)
    report = {"machine": machine_note(), "command": command, "rows": rows}
    if args.json_out is not None:
        args.json_out.write_text(gw.json.dumps(gw.jsonable(report), indent=2))
    print(markdown(rows, command))
    return 0


def summarise(samples: dict[str, list[tuple[gw.Sample, int]]]) -> list[dict[str, Any]]:
    rows = []
    for name in CASES:
        mine = samples[name]
        twin = {s.round: s for s, _ in samples[name.removesuffix("-audit")]}

        def ratio(
            value: str, mine: list[tuple[gw.Sample, int]] = mine, twin: dict[int, gw.Sample] = twin
        ) -> float:
            return median(
                getattr(s, value) / getattr(twin[s.round], value)
                for s, _ in mine
                if getattr(twin[s.round], value)
            )

        rows.append(
            {
                "case": name,
                "req_per_s": median(s.req_per_s for s, _ in mine),
                "p50_us": median(s.p50_us for s, _ in mine),
                "p99_us": median(s.p99_us for s, _ in mine),
                "apisix_cpu_us_per_req": median(s.apisix_cpu_us_per_req for s, _ in mine),
                "runner_cpu_us_per_req": median(s.runner_cpu_us_per_req for s, _ in mine),
                "of_unaudited": ratio("req_per_s"),
                "p50_of_unaudited": ratio("p50_us"),
                "p99_of_unaudited": ratio("p99_us"),
                "apisix_cpu_of_unaudited": ratio("apisix_cpu_us_per_req"),
                "runner_cpu_of_unaudited": ratio("runner_cpu_us_per_req"),
                # Over every request the case served, warm-up and probe included.
                "audit_bytes_per_request": median(size / max(1, s.requests) for s, size in mine)
                if name.endswith("-audit")
                else 0.0,
                "errors": sum(s.socket_errors + s.non2xx + s.timeouts for s, _ in mine),
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        f"`{command}`",
        "",
        "| case | req/s | x unaudited | p50 µs | p99 µs | p99 x unaudited | APISIX CPU µs/req | x unaudited "
        "| runner CPU µs/req | x unaudited | audit bytes/req | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['req_per_s']:,.0f} | {r['of_unaudited']:.2f} | {r['p50_us']:,.0f} | "
            f"{r['p99_us']:,.0f} | {r['p99_of_unaudited']:.2f} | {r['apisix_cpu_us_per_req']:.0f} | "
            f"{r['apisix_cpu_of_unaudited']:.2f} | {r['runner_cpu_us_per_req']:.0f} | "
            f"{r['runner_cpu_of_unaudited']:.2f} | {r['audit_bytes_per_request']:.0f} | {r['errors']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
