"""Two real APISIX nodes on a real etcd, each with its runner, sharing state through Redis: a
single redis-server, a Sentinel group (master, replica, three sentinels) or a Redis Cluster (three
masters, a replica each), traffic split over both nodes. Five parts:

``throughput``  per store and route (the ext-plugin route, the fast path): ``wrk`` against both
    nodes at once (``--connections`` each, ``--seconds``), every public request sent to aws by a
    rule under budgets and a cap too large to bind, answered by a Debian nginx (bench/
    apisix_gateway.py's upstreams). Requests/s of both nodes together and each node's p50/p99,
    the runners' rounds per second (each one ``EVALSHA``) and the commands the store's master ran
    per second, against the single redis-server measured in the same round.
``decision``    per store: ``snapshot -> decide -> commit`` with a view whose leases and slots that
    store granted (bench/shared_state.py's decision cost; the decision path does no I/O), and a
    round's time through ``RedisStore`` (p50/p99 of ``--rounds`` rounds; for Sentinel and Cluster
    also with ``replicas_ack: 1``, the ``WAIT`` for a replica after the script).
Sentinel and Cluster run with ``replicas_ack: 1`` in the other parts.
``budget``      per store: one hourly budget of ``--budget`` requests and a cap of 4 in flight
    shared by both nodes, four clients (each node, each route), aws answering after 20 ms
    (a Python upstream counting what it has in flight): requests aws got against the budget, the
    most it had in flight against the cap, and what the runners counted as spent.
``failover``    per Sentinel and Cluster, ``--failover-trials`` trials: the same with a budget of
    100, the master holding the runners' keys killed once aws has had 20 requests; every answer's
    status, the seconds from the promotion to each runner's ``spillway_shared_state_connected``
    back at 1 (polled every 20 ms), and aws's requests against the stated bound (the budget, or the
    sum of the runners' ``spillway_shared_state_alone_usd`` once both went alone).
``stall``       the second node's way to a single redis-server held up (a proxy that stops
    forwarding) for ``--stall-ms`` every 2 s, ``--stalls`` times, as a congested link or a loaded
    machine may, while clients (three a route on the first node, one on the second) send every
    public request to aws under a cap of 4 and a budget too large to bind: the second node's round
    comes late and it decides alone, while the first still holds most of the cap; the most aws had
    in flight against the cap and how many requests arrived beyond it, the runners' failed or late
    rounds, and every answer's status.

    python bench/multi_node.py [--parts throughput,decision,budget,failover,stall] [--json]

Needs APISIX (scripts/install-apisix.sh, $SPILLWAY_APISIX_PREFIX), etcd, redis-server,
redis-sentinel, wrk and nginx; everything on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis
from apisix_gateway import metrics_feed, run_wrk, upstream_nginx, wrk_command, wrk_script
from harness import ROOT
from multi_node_stack import (
    CountingUpstream,
    HeldProxy,
    Traffic,
    counting_upstream,
    metric,
    node_configs,
    poll_back,
)
from shared_state import decision_cost

from gateway_plugin.shared_store import RedisStore

sys.path.insert(1, str(ROOT))  # devtools is source-only: importable from the checkout, not installed
from devtools.nodes import Nodes, nodes_running
from devtools.redis import RedisServer
from devtools.redis_ha import ClusterGroup, Promotion, SentinelGroup

os.environ.setdefault("SPILLWAY_ROUTE_TOKEN", secrets.token_hex(32))
MODES = ("single", "sentinel", "cluster")
PATHS = {"ext-plugin": "/v2/models/add_sub/infer", "fast": "/fast/v2/models/add_sub/infer"}
Store = RedisServer | SentinelGroup | ClusterGroup


@contextlib.contextmanager
def store(mode: str, folder: Path) -> Iterator[Store]:
    made: Store
    if mode == "single":
        made = RedisServer(folder)
    else:
        made = SentinelGroup(folder) if mode == "sentinel" else ClusterGroup(folder)
    made.start()
    try:
        yield made
    finally:
        made.stop()


def master_port(made: Store, prefix: str) -> int:
    if isinstance(made, RedisServer):
        return made.port
    port = made.master_port() if isinstance(made, SentinelGroup) else made.master_port(f"{{{prefix}}}:round")
    assert port is not None
    return port


def commands(port: int) -> int:
    with redis.Redis(port=port, socket_timeout=5) as client:
        stats = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


@contextlib.contextmanager
def two_nodes(folder: Path, configs: list[dict[str, Any]]) -> Iterator[Nodes]:
    with nodes_running(folder, configs, secrets.token_hex(24)) as nodes:
        nodes.push_routes()
        yield nodes


def throughput(folder: Path, seconds: int, connections: int) -> list[dict[str, Any]]:
    rows = []
    script = wrk_script(folder)
    with upstream_nginx(folder) as ups, metrics_feed() as feed:
        for mode in MODES:
            with store(mode, folder / f"tp-{mode}") as made:
                local, aws = (f"http://127.0.0.1:{port}" for port in (ups.local_port, ups.aws_port))
                ack = 0 if mode == "single" else 1
                configs = node_configs(
                    local, aws, feed.url, made.url, budget=10**6, cap=10**4, replicas_ack=ack
                )
                with two_nodes(folder / f"tp-{mode}-nodes", configs) as nodes:
                    for route, path in PATHS.items():
                        rows.append(_measure(mode, route, path, nodes, made, seconds, connections, script))
                        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    for row in rows:
        base = next(r for r in rows if r["mode"] == "single" and r["route"] == row["route"])
        row["of_single"] = round(row["requests_s"] / base["requests_s"], 2)
    return rows


def _measure(
    mode: str, route: str, path: str, nodes: Nodes, made: Store, seconds: int, connections: int, script: Path
) -> dict[str, Any]:
    prefix = nodes.nodes[0].config["shared_state"]["key_prefix"]
    warm = [wrk_command(n.url + path, connections, 1, script) for n in nodes.nodes]
    _wrk_all(warm, 1)
    rounds = [metric(n, "spillway_shared_state_rounds_total") for n in nodes.nodes]
    port = master_port(made, prefix)
    before = commands(port)
    started = time.monotonic()
    got = _wrk_all([wrk_command(n.url + path, connections, seconds, script) for n in nodes.nodes], seconds)
    took = time.monotonic() - started
    after = commands(port)
    per_node_rounds = [
        (metric(n, "spillway_shared_state_rounds_total") - r) / took
        for n, r in zip(nodes.nodes, rounds, strict=True)
    ]
    return {
        "mode": mode,
        "route": route,
        "requests_s": round(sum(g["requests"] for g in got) / seconds),
        "p50_ms": [round(g["p50_us"] / 1000, 2) for g in got],
        "p99_ms": [round(g["p99_us"] / 1000, 2) for g in got],
        "errors": sum(int(g["socket_errors"] + g["non2xx"] + g["timeouts"]) for g in got),
        "redis_calls_s_per_node": [round(r, 1) for r in per_node_rounds],
        "master_commands_s": round((after - before) / took),
    }


def _wrk_all(cmds: list[list[str]], seconds: int) -> list[dict[str, float]]:
    out: list[dict[str, float]] = [{} for _ in cmds]

    def one(i: int) -> None:
        out[i] = run_wrk(cmds[i], seconds)[0]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cmds))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out


def decision(folder: Path, calls: int, rounds: int) -> list[dict[str, Any]]:
    rows = []
    for mode in MODES:
        with store(mode, folder / f"dc-{mode}") as made:
            for row in decision_cost(made.url, calls):
                rows.append({"mode": mode, **row})
            rows[-1]["round_ms"] = _round_times(made.url, rounds, 0)
            if mode != "single":
                rows[-1]["round_ms_replicas_ack_1"] = _round_times(made.url, rounds, 1)
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _round_times(url: str, rounds: int, replicas_ack: int) -> dict[str, float]:
    from shared_state import config, one_round, state_for

    cfg = config(url)
    assert cfg.shared_state is not None
    shared = cfg.shared_state.model_copy(update={"replicas_ack": replicas_ack})
    cfg = cfg.model_copy(update={"shared_state": shared})
    state = state_for(cfg)
    assert cfg.shared_state is not None
    store_ = RedisStore(cfg.shared_state)
    one_round(state, store_)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        one_round(state, store_)
        times.append(time.perf_counter() - start)
    store_.close()
    times.sort()
    return {
        "p50": round(times[len(times) // 2] * 1000, 3),
        "p99": round(times[int(len(times) * 0.99)] * 1000, 3),
    }


BUDGET_WAIT_S = 120.0  # how long the budget part lets both nodes spend before it reports what they did


def budget(folder: Path, budget_requests: int) -> list[dict[str, Any]]:
    rows = []
    with (
        counting_upstream("local") as local,
        counting_upstream("aws", delay_s=0.02) as aws,
        metrics_feed() as feed,
    ):
        for mode in MODES:
            with store(mode, folder / f"b-{mode}") as made:
                rows.append(
                    _budget_run(mode, folder / f"b-{mode}-nodes", made, local, aws, feed.url, budget_requests)
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _budget_run(
    mode: str,
    folder: Path,
    made: Store,
    local: CountingUpstream,
    aws: CountingUpstream,
    feed: str,
    requests: int,
) -> dict[str, Any]:
    ack = 0 if mode == "single" else 1
    configs = node_configs(local.url, aws.url, feed, made.url, budget=requests, cap=4, replicas_ack=ack)
    aws.reset()
    with two_nodes(folder, configs) as nodes:
        traffic = Traffic(nodes, PATHS.values())
        traffic.start()
        started, deadline = time.monotonic(), time.monotonic() + BUDGET_WAIT_S
        while (
            sum(metric(n, "spillway_cloud_spend_usd_total", target="aws") for n in nodes.nodes)
            < (requests - 6) * 0.01
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        took_s = time.monotonic() - started
        time.sleep(1.0)
        answers = traffic.finish()
        time.sleep(0.5)
        spent = sum(metric(n, "spillway_cloud_spend_usd_total", target="aws") for n in nodes.nodes) / 0.01
    return {
        "mode": mode,
        "budget": requests,
        "aws": aws.count,
        "over": aws.count - requests,
        "spent_counted": round(spent),
        "max_in_flight": aws.max_in_flight,
        "cap": 4,
        "answers": sum(answers.values()),
        "not_200": sum(n for status, n in answers.items() if status != 200),
        "spending_s": round(took_s, 1),  # BUDGET_WAIT_S: the budget was not spent within it
    }


def failover(folder: Path, trials: int) -> list[dict[str, Any]]:
    rows = []
    with (
        counting_upstream("local") as local,
        counting_upstream("aws", delay_s=0.02) as aws,
        metrics_feed() as feed,
    ):
        for mode in ("sentinel", "cluster"):
            with store(mode, folder / f"f-{mode}") as made:
                assert not isinstance(made, RedisServer)
                for number in range(trials):
                    if number and isinstance(made, SentinelGroup):
                        time.sleep(
                            6.5
                        )  # a sentinel fails a master name over again 2 x failover-timeout later
                    row = _failover_trial(mode, folder / f"f-{mode}-{number}", made, local, aws, feed.url)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def _failover_trial(
    mode: str,
    folder: Path,
    made: SentinelGroup | ClusterGroup,
    local: CountingUpstream,
    aws: CountingUpstream,
    feed: str,
) -> dict[str, Any]:
    configs = node_configs(local.url, aws.url, feed, made.url, budget=100, cap=4, replicas_ack=1)
    prefix = configs[0]["shared_state"]["key_prefix"]
    aws.reset()
    with two_nodes(folder, configs) as nodes:
        traffic = Traffic(nodes, PATHS.values())
        traffic.start()
        while aws.count < 20:
            time.sleep(0.01)
        alone, promotion = _kill_and_wait(made, prefix, nodes)
        follow = poll_back(nodes, promotion.promoted_at)
        time.sleep(1.5)
        answers = traffic.finish()
        time.sleep(0.5)
        spent = sum(metric(n, "spillway_cloud_spend_usd_total", target="aws") for n in nodes.nodes) / 0.01
    made.rejoin(promotion)
    bound = max(100, int(alone / 0.01 + 1e-6))
    return {
        "mode": mode,
        "failover_s": round(promotion.seconds, 3),
        "follow_s": follow,
        "aws": aws.count,
        "bound": bound,
        "over": aws.count - 100,
        "within_bound": aws.count <= bound,
        "spent_counted": round(spent),
        "max_in_flight": aws.max_in_flight,
        "answers": sum(answers.values()),
        "not_200": sum(n for status, n in answers.items() if status != 200),
    }


def _kill_and_wait(made: SentinelGroup | ClusterGroup, prefix: str, nodes: Nodes) -> tuple[float, Promotion]:
    """Kill the master; once both runners went alone, what they may spend alone; the promotion."""
    if isinstance(made, SentinelGroup):
        old = made.master_port()
        assert old is not None
        killed_at = made.kill_master()
        wait = lambda: made.wait_promotion(old, killed_at)  # noqa: E731
    else:
        key = f"{{{prefix}}}:round"
        old, killed_at = made.kill_master(key)
        wait = lambda: made.wait_promotion(key, old, killed_at)  # noqa: E731
    done: list[Promotion] = []
    watch = threading.Thread(target=lambda: done.append(wait()))
    watch.start()
    while any(metric(n, "spillway_shared_state_connected") != 0 for n in nodes.nodes):
        time.sleep(0.01)
    alone = sum(
        metric(n, "spillway_shared_state_alone_usd", target="aws", window="hour") for n in nodes.nodes
    )
    watch.join()
    return alone, done[0]


STALL_EVERY_S = 2.0
CLIENTS = (3, 1)  # per path, on the first node and the second: one node holds most of the cap


def stall(folder: Path, stalls: int, stall_ms: int) -> dict[str, Any]:
    with (
        contextlib.ExitStack() as stack,
        counting_upstream("local") as local,
        counting_upstream("aws", delay_s=0.02) as aws,
        metrics_feed() as feed,
        store("single", folder / "s-single") as made,
    ):
        assert isinstance(made, RedisServer)
        proxy = stack.enter_context(HeldProxy(made.port))
        configs = node_configs(local.url, aws.url, feed.url, made.url, budget=1_000_000, cap=4)
        configs[1]["shared_state"]["redis_url"] = f"redis://127.0.0.1:{proxy.port}/0"
        with two_nodes(folder / "s-nodes", configs) as nodes:
            aws.reset()
            traffic = Traffic(nodes, PATHS.values(), per_path=CLIENTS)
            traffic.start()
            for _ in range(stalls):
                time.sleep(STALL_EVERY_S - stall_ms / 1000)
                proxy.open.clear()
                time.sleep(stall_ms / 1000)
                proxy.open.set()
            time.sleep(1.0)
            answers = traffic.finish()
            late = [metric(n, "spillway_shared_state_errors_total") for n in nodes.nodes]
    return {
        "stalls": stalls,
        "stall_ms": stall_ms,
        "rounds_failed_or_late": late,
        "aws": aws.count,
        "max_in_flight": aws.max_in_flight,
        "cap": 4,
        "over_cap": sum(n for level, n in aws.arrivals.items() if level > 4),
        "answers": sum(answers.values()),
        "not_200": sum(n for status, n in answers.items() if status != 200),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="throughput,decision,budget,failover")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--budget", type=int, default=300)
    parser.add_argument("--failover-trials", type=int, default=10)
    parser.add_argument("--stalls", type=int, default=20)
    parser.add_argument("--stall-ms", type=int, default=500)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="spillway-nodes-") as tmp:
        folder = Path(tmp)
        if "throughput" in parts:
            out["throughput"] = throughput(folder, args.seconds, args.connections)
        if "decision" in parts:
            out["decision"] = decision(folder, args.calls, args.rounds)
        if "budget" in parts:
            out["budget"] = budget(folder, args.budget)
        if "failover" in parts:
            out["failover"] = failover(folder, args.failover_trials)
        if "stall" in parts:
            out["stall"] = stall(folder, args.stalls, args.stall_ms)
    if "failover" in out:
        follow = sorted(s for row in out["failover"] for s in row["follow_s"])
        out["failover_summary"] = {
            "trials": len(out["failover"]),
            "follow_s_max": follow[-1] if follow else None,
            "follow_s_mean": round(statistics.fmean(follow), 3) if follow else None,
        }
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
