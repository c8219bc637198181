"""What one routing decision costs: ``policy.decide`` alone, p50/p99 in microseconds.

Cases cover the policy's paths: a calm cluster (local), a busy one spilling to a warm target,
sensitive data kept home, a rule matching, and a tenant over quota. The baseline measured in
the same run is a dict lookup loop of the same length, so the figures can be read as ratios on a
noisy machine.

    python bench/policy_cost.py [--calls 200000] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from gateway_plugin.config import SpillwayConfig
from gateway_plugin.policy.build import build_policy
from gateway_plugin.policy.decide import decide
from gateway_plugin.policy.snapshot import LocalLoad, RequestFeatures, Snapshot, TargetState, TenantState

CONFIG = SpillwayConfig.model_validate(
    {
        "targets": [
            {"name": "aws", "kind": "aws_lambda", "url": "https://a.example", "cold_start_ms": 500},
            {"name": "ali", "kind": "aliyun_fc", "url": "https://b.example", "cold_start_ms": 800},
        ],
        "rules": [
            {"name": "admin", "priority": 20, "match": {"uri": "^/v2/repository"}, "action": "local"},
            {
                "name": "batch",
                "priority": 10,
                "match": {"headers": {"x-priority": "batch"}},
                "action": "target",
                "targets": ["ali"],
            },
        ],
        "tenants": {"quotas": {"small": {"requests_per_minute": 10}}},
    }
)
POLICY = build_policy(CONFIG)
HEADERS = {"x-data-classification": "public", "content-type": "application/json", "x-tenant": "search"}
CALM = LocalLoad(fresh=True, queue_ms=1, compute_ms=10)
BUSY = LocalLoad(fresh=True, queue_ms=400, compute_ms=10, pending=30)
WARM = {"aws": TargetState(warm_instances=4), "ali": TargetState()}

CASES = {
    "calm-local": (RequestFeatures("/v2/models/m/infer", HEADERS, {}, "m"), Snapshot({"m": CALM}, WARM)),
    "busy-spill-warm": (RequestFeatures("/v2/models/m/infer", HEADERS, {}, "m"), Snapshot({"m": BUSY}, WARM)),
    "sensitive-kept": (
        RequestFeatures("/v2/models/m/infer", {**HEADERS, "x-data-classification": "pii"}, {}, "m"),
        Snapshot({"m": BUSY}, WARM),
    ),
    "rule-batch": (
        RequestFeatures("/v2/models/m/infer", {**HEADERS, "x-priority": "batch"}, {}, "m"),
        Snapshot({"m": CALM}, WARM),
    ),
    "tenant-over-quota": (
        RequestFeatures("/v2/models/m/infer", {**HEADERS, "x-tenant": "small"}, {}, "m"),
        Snapshot({"m": CALM}, WARM, {"small": TenantState(requests_last_minute=10)}),
    ),
}


def timings(fn: object, calls: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        start = clock()
        fn()  # type: ignore[operator]
        out.append(clock() - start)
    out.sort()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--json", action="store_true", help="JSON lines (the default when not on a terminal)")
    args = parser.parse_args(argv)
    as_json = args.json or not sys.stdout.isatty()
    table = dict(HEADERS)
    baseline = timings(lambda: table.get("x-data-classification"), args.calls)
    base_p50 = baseline[len(baseline) // 2] / 1000
    for name, (features, snapshot) in CASES.items():
        decision = decide(features, snapshot, POLICY)
        got = timings(lambda f=features, s=snapshot: decide(f, s, POLICY), args.calls)
        row = {
            "case": name,
            "decision": f"{decision.target};{decision.label}",
            "p50_us": round(got[len(got) // 2] / 1000, 2),
            "p99_us": round(got[int(len(got) * 0.99)] / 1000, 2),
            "baseline_p50_us": round(base_p50, 3),
        }
        if as_json:
            print(json.dumps(row), flush=True)
        else:
            print(
                f"{name:<18} {row['decision']:<28} p50 {row['p50_us']:>6} µs  p99 {row['p99_us']:>6} µs  "
                f"(timer + dict lookup {row['baseline_p50_us']} µs)"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
