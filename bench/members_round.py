"""What a scrape round costs the runner's event loop with 3, 30 and 300 on-prem members: the whole
round (each page parsed, each member's deltas and state, the tracker's per-model load) against,
in the same run, rounds interleaved, CPU time (``time.process_time``): the members' pages parsed
by the round's own parser alone, and by prometheus_client's parser (what a round used before).
The pages are a real Triton's metrics text for a few models (counters, pending, CPU and memory
gauges), each member's counters moving; the fetch is in memory, so network time is left out
(the round's own work is what is measured).

    python bench/members_round.py [--members 3,30,300] [--rounds 200] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from prometheus_client.parser import text_string_to_metric_families

from gateway_plugin.signals.exposition import samples_of
from gateway_plugin.signals.load import LoadTracker
from gateway_plugin.signals.scraper import Scraper

MODELS = ("add_sub", "resnet50", "bert", "llama")


def page(member: int, round_: int) -> str:
    """One Triton's metrics text, as its metrics port writes it, for four models."""
    lines = []
    for model in MODELS:
        labels = f'{{model="{model}",version="1"}}'
        done = 1000 + round_ * 10 + member
        for name, value in (
            ("nv_inference_request_success", done),
            ("nv_inference_request_failure", 0),
            ("nv_inference_count", done),
            ("nv_inference_exec_count", done),
            ("nv_inference_request_duration_us", done * 12000),
            ("nv_inference_queue_duration_us", done * 2000),
            ("nv_inference_compute_input_duration_us", done * 100),
            ("nv_inference_compute_infer_duration_us", done * 9000),
            ("nv_inference_compute_output_duration_us", done * 100),
        ):
            lines += [f"# HELP {name} x", f"# TYPE {name} counter", f"{name}{labels} {value}"]
        lines += [
            "# TYPE nv_inference_pending_request_count gauge",
            f"nv_inference_pending_request_count{labels} {member % 5}",
        ]
    lines += [
        "# TYPE nv_cpu_utilization gauge",
        "nv_cpu_utilization 0.5",
        "# TYPE nv_cpu_memory_used_bytes gauge",
        "nv_cpu_memory_used_bytes 1e9",
    ]
    return "\n".join(lines) + "\n"


def measure(members: int, rounds: int) -> dict[str, float]:
    urls = [f"http://10.0.{m // 250}.{m % 250}:8002/metrics" for m in range(members)]
    pages = {url: [page(m, r) for r in range(rounds + 1)] for m, url in enumerate(urls)}
    at = {"round": 0}

    async def fetch(url: str) -> str:
        return pages[url][at["round"]]

    tracker = LoadTracker(2.0, member_parallelism=2)
    scraper = Scraper(tracker, fetch, urls, 0.25)
    parse_s, round_s, client_s = [], [], []
    loop = asyncio.new_event_loop()
    try:
        for r in range(rounds):
            at["round"] = r
            started = time.process_time()
            for url in urls:
                samples_of(pages[url][r])
            parse_s.append(time.process_time() - started)
            started = time.process_time()
            for url in urls:
                list(text_string_to_metric_families(pages[url][r]))
            client_s.append(time.process_time() - started)
            started = time.process_time()
            ok = loop.run_until_complete(scraper.scrape_once())
            round_s.append(time.process_time() - started)
            assert ok and tracker.live == members
    finally:
        loop.close()
    parse, whole = statistics.median(parse_s) * 1000, statistics.median(round_s) * 1000
    client = statistics.median(client_s) * 1000
    return {
        "members": members,
        "round_ms": whole,
        "parse_ms": parse,
        "client_parse_ms": client,
        "round_per_parse": whole / parse,
        "round_per_client_parse": whole / client,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--members", default="3,30,300", help="member counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=200, help="rounds per count")
    parser.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    args = parser.parse_args()
    results = [measure(int(n), args.rounds) for n in args.members.split(",")]
    if args.json:
        for row in results:
            print(json.dumps(row))
        return
    head = ("members", "round ms", "parse ms", "p_c parse ms", "round/parse", "round/p_c")
    print(" ".join(f"{h:>13}" for h in head))
    for r in results:
        keys = (
            "members",
            "round_ms",
            "parse_ms",
            "client_parse_ms",
            "round_per_parse",
            "round_per_client_parse",
        )
        print(" ".join(f"{r[k]:>13.3f}" for k in keys))


if __name__ == "__main__":
    main()
