"""What the function's HTTP layer costs compared with talking to its Triton sidecar directly.

One function server (local platform) runs with its sidecar on a known port; perf_analyzer then
loads the same model through both doors, direct and function runs interleaved and their order
alternated, because the machine is small and shared: only runs made side by side compare.
Figures are medians over rounds; ratio and added latency are medians of per-round pairs.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness import (
    BENCH_REPOSITORY,
    EXAMPLE_REPOSITORY,
    Launched,
    Output,
    add_output_options,
    cpu_seconds,
    descendants,
    free_port,
    http_call,
    launch,
    machine_note,
    median,
    poll,
    render_table,
    running,
    say,
    shm_regions,
    tools_dir,
    warn_leaked,
)

from functions.cli import serve_command

TARGET_RATIO_AT_C4 = 0.80
TARGET_ADDED_P50_AT_C1_US = 500.0


@dataclass(frozen=True)
class Case:
    model: str
    source: Path
    description: str
    pa_args: tuple[str, ...]


CASES = {
    "add_sub": Case(
        "add_sub",
        EXAMPLE_REPOSITORY / "add_sub",
        "add_sub, 2x4 FP32 as JSON tensors",
        ("--input-tensor-format=json", "--output-tensor-format=json"),
    ),
    "sum_1mb": Case(
        "sum_1mb",
        BENCH_REPOSITORY / "sum_1mb",
        "sum_1mb, 1 MiB FP32 binary tensor in, 4 bytes out",
        ("--input-tensor-format=binary", "--output-tensor-format=binary"),
    ),
}


@dataclass(frozen=True)
class Measurement:
    """One perf_analyzer run against one door, with the CPU each party spent during it."""

    model: str
    target: str
    concurrency: int
    round: int
    infer_per_s: float
    p50_us: float
    p99_us: float
    requests: int
    proxy_cpu_s: float
    triton_cpu_s: float
    client_cpu_s: float
    wall_s: float


class Bench:
    def __init__(self, args: argparse.Namespace, tools: Path, work: Path) -> None:
        self.args = args
        self.perf_analyzer = tools / "bin" / "perf_analyzer"
        self.pa_env = {
            **os.environ,
            "LD_LIBRARY_PATH": os.pathsep.join(
                p for p in (str(tools / "lib"), os.environ.get("LD_LIBRARY_PATH", "")) if p
            ),
        }
        self.work = work
        self.triton_port = args.triton_port or free_port()
        self.function_port = free_port()
        self.function: Launched | None = None

    def start_function(self, launched: list[Launched], repository: Path, models: Sequence[str]) -> None:
        env = {
            **os.environ,
            **dict(item.split("=", 1) for item in self.args.env),
            "SPILLWAY_TRITON_HTTP_PORT": str(self.triton_port),
            "SPILLWAY_MODELS": ",".join(models),
            # Requests are counted from Triton's statistics, which the sidecar locks by default, and
            # perf_analyzer reads each model's configuration first: both opened by their settings.
            "SPILLWAY_EXPOSE_STATISTICS": "1",
            "SPILLWAY_EXPOSE_MODEL_CONFIG": "1",
        }
        cmd = serve_command(self.function_port, repository)
        say(f"starting the function on {self.function_port}, its Triton sidecar on {self.triton_port}")
        self.function = launch(cmd, env, self.work / "function.log")
        launched.append(self.function)
        function = self.function

        def all_ready(port: int) -> bool:
            return all(http_call(port, "GET", f"/v2/models/{m}/ready")[0] == 200 for m in models)

        poll(lambda: all_ready(self.function_port), 60, 0.1, lambda: not function.exited())
        poll(lambda: all_ready(self.triton_port), 5, 0.1, lambda: not function.exited())

    def _cpu(self) -> tuple[float, float]:
        assert self.function is not None
        pid = self.function.proc.pid
        return cpu_seconds(pid), sum(cpu_seconds(p) for p in descendants(pid))

    def _served(self, model: str) -> int:
        status, body = http_call(self.triton_port, "GET", f"/v2/models/{model}/stats")
        if status != 200:
            raise RuntimeError(f"Triton statistics for {model}: HTTP {status}")
        count: int = json.loads(body)["model_stats"][0]["inference_stats"]["success"]["count"]
        return count

    def measure(
        self, case: Case, target: str, concurrency: int, rnd: int, interval_ms: int | None = None
    ) -> Measurement | None:
        port = self.triton_port if target == "direct" else self.function_port
        report = self.work / f"pa-{case.model}-{target}-{concurrency}-{rnd}.csv"
        cmd = [
            str(self.perf_analyzer),
            "-m",
            case.model,
            "-u",
            f"127.0.0.1:{port}",
            "-i",
            "http",
            "--concurrency-range",
            f"{concurrency}:{concurrency}",
            "-p",
            str(interval_ms or self.args.interval_ms),
            "-s",
            str(self.args.stability),
            "-r",
            str(self.args.max_trials),
            "-f",
            str(report),
            *case.pa_args,
        ]
        for attempt in (1, 2):
            proxy0, triton0 = self._cpu()
            served0 = self._served(case.model)
            child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            began = time.perf_counter()
            done = subprocess.run(cmd, env=self.pa_env, capture_output=True, text=True, timeout=120)
            wall = time.perf_counter() - began
            child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            served1 = self._served(case.model)
            proxy1, triton1 = self._cpu()
            if done.returncode == 0 and report.exists():
                break
            say(
                f"perf_analyzer failed ({case.model} {target} c={concurrency}, try {attempt}): "
                f"{(done.stdout + done.stderr).strip().splitlines()[-1:]}"
            )
        else:
            return None
        with report.open() as f:
            row = next(csv.DictReader(f))
        return Measurement(
            model=case.model,
            target=target,
            concurrency=concurrency,
            round=rnd,
            infer_per_s=float(row["Inferences/Second"]),
            p50_us=float(row["p50 latency"]),
            p99_us=float(row["p99 latency"]),
            requests=served1 - served0,
            proxy_cpu_s=proxy1 - proxy0 if target == "function" else 0.0,
            triton_cpu_s=triton1 - triton0,
            client_cpu_s=(child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime),
            wall_s=wall,
        )


def summarise(case: Case, concurrency: int, runs: list[Measurement]) -> dict[str, Any]:
    direct = {m.round: m for m in runs if m.target == "direct"}
    function = {m.round: m for m in runs if m.target == "function"}
    paired = sorted(direct.keys() & function.keys())

    def per_req_us(ms: Sequence[Measurement], field: str) -> float:
        return median([getattr(m, field) / m.requests * 1e6 for m in ms if m.requests])

    fn = [function[r] for r in paired]
    dr = [direct[r] for r in paired]
    return {
        "kind": "summary",
        "model": case.model,
        "concurrency": concurrency,
        "pairs": len(paired),
        "direct_infer_per_s": median([m.infer_per_s for m in dr]),
        "function_infer_per_s": median([m.infer_per_s for m in fn]),
        "ratio": median([f.infer_per_s / d.infer_per_s for f, d in zip(fn, dr, strict=True)]),
        "direct_p50_us": median([m.p50_us for m in dr]),
        "function_p50_us": median([m.p50_us for m in fn]),
        "added_p50_us": median([f.p50_us - d.p50_us for f, d in zip(fn, dr, strict=True)]),
        "direct_p99_us": median([m.p99_us for m in dr]),
        "function_p99_us": median([m.p99_us for m in fn]),
        "added_p99_us": median([f.p99_us - d.p99_us for f, d in zip(fn, dr, strict=True)]),
        "proxy_cpu_us_per_req": per_req_us(fn, "proxy_cpu_s"),
        "triton_cpu_us_per_req_direct": per_req_us(dr, "triton_cpu_s"),
        "triton_cpu_us_per_req_function": per_req_us(fn, "triton_cpu_s"),
        "client_cpu_us_per_req_direct": per_req_us(dr, "client_cpu_s"),
        "client_cpu_us_per_req_function": per_req_us(fn, "client_cpu_s"),
    }


def targets(summaries: list[dict[str, Any]], max_concurrency: int) -> list[dict[str, Any]]:
    out = []
    for s in summaries:
        if s["concurrency"] == 4 and max_concurrency >= 4:
            out.append(
                {
                    "kind": "target",
                    "model": s["model"],
                    "what": "throughput ratio at concurrency 4",
                    "target": f">= {TARGET_RATIO_AT_C4:.2f}",
                    "value": round(s["ratio"], 3),
                    "met": bool(s["ratio"] >= TARGET_RATIO_AT_C4),
                }
            )
        if s["concurrency"] == 1:
            out.append(
                {
                    "kind": "target",
                    "model": s["model"],
                    "what": "added p50 latency at concurrency 1",
                    "target": f"<= {TARGET_ADDED_P50_AT_C1_US:.0f} us",
                    "value": round(s["added_p50_us"], 1),
                    "met": bool(s["added_p50_us"] <= TARGET_ADDED_P50_AT_C1_US),
                }
            )
    return out


def print_table(meta: dict[str, Any], summaries: list[dict[str, Any]], goals: list[dict[str, Any]]) -> None:
    print(
        f"function overhead, {meta['date']}, {meta['cpus']} CPUs (client, proxy and Triton share them), "
        f"{meta['rounds']} rounds x {meta['interval_ms']} ms windows, load avg {meta['loadavg_1m']}"
    )
    for model in dict.fromkeys(s["model"] for s in summaries):
        print(f"\n{CASES[model].description}")
        rows = [
            [
                s["concurrency"],
                s["direct_infer_per_s"],
                s["function_infer_per_s"],
                s["ratio"],
                s["direct_p50_us"],
                s["function_p50_us"],
                s["added_p50_us"],
                s["direct_p99_us"],
                s["function_p99_us"],
                s["added_p99_us"],
                s["proxy_cpu_us_per_req"],
            ]
            for s in summaries
            if s["model"] == model
        ]
        print(
            render_table(
                [
                    "conc",
                    "direct/s",
                    "fn/s",
                    "ratio",
                    "d p50us",
                    "fn p50us",
                    "+p50us",
                    "d p99us",
                    "fn p99us",
                    "+p99us",
                    "proxy cpu us/req",
                ],
                rows,
            )
        )
    print()
    for g in goals:
        print(
            f"{g['model']}: {g['what']} = {g['value']} (target {g['target']}): "
            f"{'met' if g['met'] else 'NOT met'}"
        )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Throughput and latency of the function (local platform) against its own Triton "
        "sidecar, measured with perf_analyzer in one run. Prints a table on a terminal, "
        "JSON lines otherwise."
    )
    parser.add_argument(
        "--models", default=",".join(CASES), help=f"comma list of cases (default: all of {', '.join(CASES)})"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating direct/function rounds (default 3)"
    )
    parser.add_argument("--max-concurrency", type=int, default=4, help="concurrency 1..N (default 4)")
    parser.add_argument(
        "--interval-ms", type=int, default=1000, help="perf_analyzer measurement window, -p (default 1000)"
    )
    parser.add_argument(
        "--stability",
        type=int,
        default=50,
        help="perf_analyzer -s: windows agreeing within this %% are stable (default 50; "
        "the medians over rounds do the smoothing)",
    )
    parser.add_argument("--max-trials", type=int, default=10, help="perf_analyzer -r (default 10)")
    parser.add_argument(
        "--triton-port",
        type=int,
        default=0,
        help="SPILLWAY_TRITON_HTTP_PORT for the sidecar (default: a free port)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra environment for the function server and its sidecar (repeatable)",
    )
    add_output_options(parser)
    parser.add_argument(
        "--keep-logs",
        type=Path,
        default=None,
        help="copy the function's log and perf_analyzer's reports to this folder",
    )
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.env):
        parser.error("--env takes NAME=VALUE")
    unknown = [m for m in args.models.split(",") if m not in CASES]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cases = [CASES[m] for m in args.models.split(",")]
    out = Output(args.format, args.json_out)
    tools = tools_dir()
    work = Path(tempfile.mkdtemp(prefix="spillway-bench-"))
    repository = work / "models"
    repository.mkdir()
    for case in cases:
        (repository / case.model).symlink_to(case.source, target_is_directory=True)
    bench = Bench(args, tools, work)
    meta = {
        "kind": "meta",
        "bench": "function_overhead",
        **machine_note(),
        "rounds": args.rounds,
        "interval_ms": args.interval_ms,
        "stability_pct": args.stability,
        "models": [c.model for c in cases],
        "triton_port": bench.triton_port,
        "function_port": bench.function_port,
    }
    measurements: list[Measurement] = []
    shm_before = shm_regions()
    failed = False
    try:
        with running([]) as launched:
            bench.start_function(launched, repository, [c.model for c in cases])
            out.record(meta)
            for case in cases:
                for target in ("direct", "function"):
                    say(f"warming {case.model} through {target}")
                    bench.measure(case, target, args.max_concurrency, 0, interval_ms=500)
            for rnd in range(1, args.rounds + 1):
                for case in cases:
                    for c in range(1, args.max_concurrency + 1):
                        order = ("direct", "function") if (rnd + c) % 2 else ("function", "direct")
                        for target in order:
                            m = bench.measure(case, target, c, rnd)
                            if m is None:
                                continue
                            say(
                                f"round {rnd} {case.model} c={c} {target}: {m.infer_per_s:.0f}/s "
                                f"p50 {m.p50_us:.0f} us p99 {m.p99_us:.0f} us"
                            )
                            measurements.append(m)
                            out.record({"kind": "run", **asdict(m)})
    except BaseException:
        failed = True
        if bench.function is not None:
            tail = bench.function.log_text().splitlines()[-30:]
            say("function log tail:\n" + "\n".join(tail))
        raise
    finally:
        if args.keep_logs is not None:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for item in work.iterdir():
                if item.is_file():
                    shutil.copy2(item, args.keep_logs / item.name)
        shutil.rmtree(work, ignore_errors=True)
        warn_leaked(shm_before)
        if failed:
            say("stopped every process this run started")
    summaries = [
        summarise(case, c, [m for m in measurements if m.model == case.model and m.concurrency == c])
        for case in cases
        for c in range(1, args.max_concurrency + 1)
    ]
    goals = targets(summaries, args.max_concurrency)
    meta["loadavg_1m_end"] = machine_note()["loadavg_1m"]
    for record in (*summaries, *goals):
        out.record(record)
    out.record({"kind": "end", "loadavg_1m_end": meta["loadavg_1m_end"]})
    out.close()
    if out.table:
        print_table(meta, summaries, goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
