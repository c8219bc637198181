"""The runner's eager dispatch (``gateway_plugin.runner.eager.run_eagerly``) against a Task per call.

``run_eagerly`` steps a plugin chain's coroutine inline and makes a Task only when it suspends
(a backport of Python 3.12's eager task execution). The alternative is what the runner would do
without it: ``loop.create_task`` for every call, its answer sent from the Task's done callback.
Both runners are the real one (``gateway_plugin.runner``), each in its own process with the same
plugins as ``bench/runner_throughput.py``; the "task" one has the call site's ``run_eagerly``
replaced by a Task per call, nothing else. A client process plays APISIX over the Unix socket
(one call at a time per connection, ExtraInfo questions answered), with keep-alive connections
opened and warmed before each measurement.

Cases: the no-op plugin; the spillway plugin deciding local (never suspends); the spillway plugin
sending to an upstream-mode target over UNSIGNED-PAYLOAD, which asks APISIX for the request URI
and so suspends (the case where eager execution cannot help). In every round each cell is
measured for both dispatchers, in alternating order; figures are medians over rounds, ratios the
medians of per-round ratios against ``run_eagerly`` (the runner as shipped). "runner cpu" is the
runner process's user+system CPU time over the calls it answered.

``--micro`` adds an in-process measurement without sockets: one ``Runner.request`` per call,
dispatched by either function in bursts of the concurrency, so that the per-call cost of the
dispatch itself shows without the noise of two processes and the kernel.

    python bench/eager_tasks.py [--rounds 7] [--seconds 2] [--concurrency 1 16] [--json-out F]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import pkgutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from harness import ROOT, Output, add_output_options, cpu_seconds, machine_note, median, render_table, say
from runner_throughput import CASES, HEADERS, SPILLWAY_CONFIG, NoopPlugin, shipped_plugins

from gateway_plugin.protocol import encode, messages, schema
from gateway_plugin.protocol.frames import FrameType, frame
from gateway_plugin.runner import eager

Done = Callable[[Any, BaseException | None], None]
Dispatch = Callable[[Coroutine[Any, Any, Any], Done, set[asyncio.Task[Any]]], None]

BASELINE = "eager"
DEFAULT_CASES = ("noop", "spillway-local", "spillway-cloud-unsigned-payload")
URI = b"/v2/models/add_sub/infer"


def wakeups(pid: int | str = "self") -> int:
    """Voluntary context switches: how often the process slept and was woken (mostly in epoll)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def run_as_task(coro: Coroutine[Any, Any, Any], done: Done, tasks: set[asyncio.Task[Any]]) -> None:
    """The plain alternative: a Task for every call, ``done`` from its done callback."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)

    def finished(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if t.cancelled():
            done(None, asyncio.CancelledError())
        else:
            exc = t.exception()
            done(None if exc else t.result(), exc)

    task.add_done_callback(finished)


def run_eagerly_deferred(coro: Coroutine[Any, Any, Any], done: Done, tasks: set[asyncio.Task[Any]]) -> None:
    """``run_eagerly``, its answer sent on the loop's next turn (as 3.12's eager tasks run their done
    callbacks): tells the cost of a Task from the effect of answering after the reads."""
    loop = asyncio.get_running_loop()

    def later(out: Any, exc: BaseException | None) -> None:
        loop.call_soon(done, out, exc)

    eager.run_eagerly(coro, later, tasks)


def variants() -> dict[str, Dispatch]:
    """The dispatchers compared; the first is the runner as shipped, the baseline of every ratio."""
    return {"eager": eager.run_eagerly, "task": run_as_task, "eager-deferred": run_eagerly_deferred}


def install(variant: str, counts: Any) -> list[str]:
    """Point every runner module that calls ``run_eagerly`` at the variant, counting calls and how
    many made a Task (``counts[0]``, ``counts[1]``); the names of the modules patched."""
    original = eager.run_eagerly
    chosen = variants()[variant]

    def dispatch(coro: Coroutine[Any, Any, Any], done: Done, tasks: set[asyncio.Task[Any]]) -> None:
        counts[0] += 1
        before = len(tasks)
        chosen(coro, done, tasks)
        if len(tasks) > before:
            counts[1] += 1

    import gateway_plugin.runner as package

    patched = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if module is not eager and getattr(module, "run_eagerly", None) is original:
            module.run_eagerly = dispatch  # type: ignore[attr-defined]
            patched.append(module.__name__)
    if not patched:
        raise RuntimeError(
            "no module of gateway_plugin.runner calls run_eagerly by that name; adapt the bench"
        )
    return patched


def plugins() -> dict[str, Any]:
    from gateway_plugin.config import SpillwayConfig

    os.environ.setdefault("SPILLWAY_SIGNING_KEY", "bench-signing-key")
    return {**shipped_plugins(SpillwayConfig.model_validate(SPILLWAY_CONFIG)), "noop": NoopPlugin()}


def server_process(sock: str, variant: str, use_uvloop: bool, counts: Any, ready: Any) -> None:
    from gateway_plugin.runner import Runner, serve

    install(variant, counts)
    runner = Runner(plugins())

    async def main() -> None:
        await serve(runner, Path(sock))
        ready.set()
        await asyncio.Event().wait()

    if use_uvloop:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


# ---------------------------------------------------------------------------------------------
# The client: plays APISIX on kept connections, one process, driven over a pipe.


class _Peer:
    """One APISIX connection with its route's conf prepared."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, call: bytes) -> None:
        self.reader, self.writer, self.call = reader, writer, call

    @classmethod
    async def open(cls, sock: str, case: str) -> _Peer:
        name, value, extra = CASES[case]
        reader, writer = await asyncio.open_unix_connection(sock)
        writer.write(frame(FrameType.PREPARE_CONF, encode.prepare_conf("bench", [(name, value)])))
        head = await reader.readexactly(4)
        token = messages.conf_token(await reader.readexactly(int.from_bytes(head[1:], "big")))
        payload = encode.req_call(1, token, 2, URI.decode(), [], HEADERS + extra, bytes([10, 1, 2, 3]))
        return cls(reader, writer, frame(FrameType.HTTP_REQ_CALL, payload))

    async def one(self, answers: dict[int, bytes]) -> None:
        self.writer.write(self.call)
        while True:
            head = await self.reader.readexactly(4)
            length = int.from_bytes(head[1:], "big")
            answer = await self.reader.readexactly(length) if length else b""
            if head[0] != FrameType.EXTRA_INFO:
                break
            self.writer.write(answers[messages.extra_info_request(answer)[0]])
        if head[0] != FrameType.HTTP_REQ_CALL:
            raise RuntimeError(f"the runner answered with frame type {head[0]}")


async def _closed_loop(peers: Sequence[_Peer], seconds: float) -> tuple[list[float], float]:
    answers: dict[int, bytes] = {
        schema.Info.VAR: frame(FrameType.EXTRA_INFO, encode.extra_info_answer(URI)),
        schema.Info.REQ_BODY: frame(FrameType.EXTRA_INFO, encode.extra_info_answer(b"{}")),
    }
    latencies: list[float] = []
    end = time.perf_counter() + seconds

    async def worker(peer: _Peer) -> None:
        clock = time.perf_counter
        while (start := clock()) < end:
            await peer.one(answers)
            latencies.append(clock() - start)

    began = time.perf_counter()
    await asyncio.gather(*(worker(p) for p in peers))
    return latencies, time.perf_counter() - began


def _measured(loop: asyncio.AbstractEventLoop, peers: Sequence[_Peer], seconds: float) -> dict[str, float]:
    cpu0, woken0 = time.process_time(), wakeups()
    lat, wall = loop.run_until_complete(_closed_loop(peers, seconds))
    cpu, woken = time.process_time() - cpu0, wakeups() - woken0
    lat.sort()
    n = max(1, len(lat))
    return {
        "calls": len(lat),
        "calls_per_s": len(lat) / wall,
        "p50_us": lat[len(lat) // 2] * 1e6,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6,
        "client_cpu_us_per_call": cpu / n * 1e6,
        "client_wakeups_per_call": woken / n,
    }


def client_process(conn: Connection) -> None:
    """Answers ``(sock, case, concurrency, seconds, warmup_s)`` until ``None``."""
    import uvloop

    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    peers: dict[tuple[str, str], list[_Peer]] = {}
    while (command := conn.recv()) is not None:
        sock, case, concurrency, seconds, warmup_s = command
        try:
            mine = peers.setdefault((sock, case), [])
            while len(mine) < concurrency:
                mine.append(loop.run_until_complete(_Peer.open(sock, case)))
            loop.run_until_complete(_closed_loop(mine[:concurrency], warmup_s))
            conn.send(_measured(loop, mine[:concurrency], seconds))
        except Exception as exc:
            conn.send({"error": repr(exc)})
    for group in peers.values():
        for peer in group:
            peer.writer.close()
    loop.close()


# ---------------------------------------------------------------------------------------------
# The in-process measurement.


class _Info:
    """Answers ExtraInfo questions on the loop's next turn: the call suspends once, as over a socket."""

    def ask(self, payload: bytes) -> asyncio.Future[bytes | None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes | None] = loop.create_future()
        loop.call_soon(fut.set_result, URI)
        return fut


async def _micro_once(dispatch: Dispatch, runner: Any, conf: Any, call: Any, burst: int, calls: int) -> float:
    tasks: set[asyncio.Task[Any]] = set()
    info = _Info()
    loop = asyncio.get_running_loop()
    left = 0
    waiter: asyncio.Future[None] | None = None

    def done(out: Any, exc: BaseException | None) -> None:
        nonlocal left
        if exc is not None:
            raise exc
        left -= 1
        if left == 0 and waiter is not None:
            waiter.set_result(None)

    began = time.perf_counter()
    for _ in range(calls // burst):
        left = burst
        waiter = None
        for _ in range(burst):
            dispatch(runner.request(conf, call, info), done, tasks)
        if left:
            waiter = loop.create_future()
            await waiter
    return (time.perf_counter() - began) / (calls // burst * burst) * 1e6


def micro(
    cases: Sequence[str], bursts: Sequence[int], rounds: int, calls: int, use_uvloop: bool
) -> list[dict[str, Any]]:
    from gateway_plugin.runner import Runner

    runner = Runner(plugins())
    found: list[dict[str, Any]] = []

    async def main() -> None:
        for rnd in range(rounds):
            for case in cases:
                name, value, extra = CASES[case]
                answer = runner.prepare(encode.prepare_conf("bench", [(name, value)]))
                conf = runner.confs.get(messages.conf_token(answer))
                payload = encode.req_call(1, 1, 2, URI.decode(), [], HEADERS + extra, bytes([10, 1, 2, 3]))
                call = messages.HttpReqCall(payload)
                for burst in bursts:
                    for variant in rotated(list(variants()), rnd + burst):
                        dispatch = variants()[variant]
                        us = await _micro_once(dispatch, runner, conf, call, burst, calls)
                        found.append(
                            {"round": rnd, "case": case, "burst": burst, "dispatch": variant, "us": us}
                        )

    if use_uvloop:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
    rows = []
    for case in cases:
        for burst in bursts:
            cell = [f for f in found if f["case"] == case and f["burst"] == burst]
            base = {f["round"]: f["us"] for f in cell if f["dispatch"] == BASELINE}
            for variant in variants():
                mine = [f for f in cell if f["dispatch"] == variant]
                rows.append(
                    {
                        "kind": "micro",
                        "case": case,
                        "burst": burst,
                        "dispatch": variant,
                        "us_per_call": median([f["us"] for f in mine]),
                        "added_us": median([f["us"] - base[f["round"]] for f in mine]),
                        "of_eager": median([f["us"] / base[f["round"]] for f in mine]),
                    }
                )
    return rows


# ---------------------------------------------------------------------------------------------
# The run.


@dataclass(frozen=True)
class Sample:
    kind: str
    round: int
    uvloop: bool
    case: str
    concurrency: int
    dispatch: str
    calls: int
    calls_per_s: float
    p50_us: float
    p99_us: float
    runner_cpu_us_per_call: float
    runner_wakeups_per_call: float
    client_cpu_us_per_call: float
    client_wakeups_per_call: float
    task_share: float


def summarise(samples: list[Sample]) -> list[dict[str, Any]]:
    rows = []
    keys = list(dict.fromkeys((s.uvloop, s.case, s.concurrency) for s in samples))
    for uvloop_on, case, conc in keys:
        cell = [s for s in samples if (s.uvloop, s.case, s.concurrency) == (uvloop_on, case, conc)]
        base = {s.round: s for s in cell if s.dispatch == BASELINE}
        for variant in variants():
            mine = [s for s in cell if s.dispatch == variant]
            paired = [(s, base[s.round]) for s in mine if s.round in base]
            rows.append(
                {
                    "kind": "summary",
                    "uvloop": uvloop_on,
                    "case": case,
                    "concurrency": conc,
                    "dispatch": variant,
                    "rounds": len(mine),
                    "calls_per_s": median([s.calls_per_s for s in mine]),
                    "of_eager": median([s.calls_per_s / b.calls_per_s for s, b in paired]),
                    "p50_us": median([s.p50_us for s in mine]),
                    "p99_us": median([s.p99_us for s in mine]),
                    "p99_of_eager": median([s.p99_us / b.p99_us for s, b in paired]),
                    "runner_cpu_us_per_call": median([s.runner_cpu_us_per_call for s in mine]),
                    "cpu_added_us": median(
                        [s.runner_cpu_us_per_call - b.runner_cpu_us_per_call for s, b in paired]
                    ),
                    "runner_wakeups_per_call": median([s.runner_wakeups_per_call for s in mine]),
                    "client_cpu_us_per_call": median([s.client_cpu_us_per_call for s in mine]),
                    "client_wakeups_per_call": median([s.client_wakeups_per_call for s in mine]),
                    "task_share": median([s.task_share for s in mine]),
                }
            )
    return rows


def run(args: argparse.Namespace, out: Output) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ctx = get_context("spawn")
    samples: list[Sample] = []
    loops = {"on": [True], "off": [False], "both": [True, False]}[args.uvloop]
    work = Path(tempfile.mkdtemp(prefix="spillway-eager-"))
    client_end, ours = ctx.Pipe()
    client = ctx.Process(target=client_process, args=(client_end,), daemon=True)
    client.start()
    servers: list[Any] = []
    try:
        total = len(loops) * args.rounds * len(args.cases) * len(args.concurrency) * len(variants())
        done = 0
        for use_uvloop in loops:
            started: dict[str, tuple[str, Any, Any]] = {}
            for variant in variants():
                sock = str(work / f"{variant}-{int(use_uvloop)}.sock")
                counts, ready = ctx.Array("q", 2, lock=False), ctx.Event()
                proc = ctx.Process(
                    target=server_process, args=(sock, variant, use_uvloop, counts, ready), daemon=True
                )
                proc.start()
                servers.append(proc)
                deadline = time.monotonic() + 60
                while not ready.wait(0.2):
                    if not proc.is_alive() or time.monotonic() > deadline:
                        raise RuntimeError(f"the {variant} runner did not start")
                started[variant] = (sock, proc, counts)
            say(f"uvloop {'on' if use_uvloop else 'off'}: warming up both runners")
            for sock, _, _ in started.values():
                for case in args.cases:
                    ours.send((sock, case, max(args.concurrency), 0.5, 0.0))
                    if "error" in (got := ours.recv()):
                        raise RuntimeError(got["error"])
            for rnd in range(args.rounds):
                for case in args.cases:
                    for conc in args.concurrency:
                        for variant in rotated(list(started), rnd + conc):
                            sock, proc, counts = started[variant]
                            cpu0, calls0, tasks0 = cpu_seconds(proc.pid), counts[0], counts[1]
                            woken0 = wakeups(proc.pid)
                            ours.send((sock, case, conc, args.seconds, args.warmup_s))
                            got = ours.recv()
                            if "error" in got:
                                raise RuntimeError(got["error"])
                            served = counts[0] - calls0
                            s = Sample(
                                "sample",
                                rnd,
                                use_uvloop,
                                case,
                                conc,
                                variant,
                                got["calls"],
                                got["calls_per_s"],
                                got["p50_us"],
                                got["p99_us"],
                                (cpu_seconds(proc.pid) - cpu0) / max(1, served) * 1e6,
                                (wakeups(proc.pid) - woken0) / max(1, served),
                                got["client_cpu_us_per_call"],
                                got["client_wakeups_per_call"],
                                (counts[1] - tasks0) / max(1, served),
                            )
                            samples.append(s)
                            out.record(asdict(s))
                            done += 1
                            say(
                                f"[{done}/{total}] uvloop {'on' if use_uvloop else 'off'} round {rnd + 1} "
                                f"{case} c={conc} {variant}: {s.calls_per_s:,.0f}/s p50 {s.p50_us:.0f} µs "
                                f"p99 {s.p99_us:.0f} µs runner cpu {s.runner_cpu_us_per_call:.1f} µs/call "
                                f"({s.runner_wakeups_per_call:.2f} wake-ups) client cpu "
                                f"{s.client_cpu_us_per_call:.1f} µs/call tasks {s.task_share:.0%}"
                            )
            for _, proc, _ in started.values():
                proc.terminate()
                proc.join()
    finally:
        ours.send(None)
        client.join(10)
        for proc in [client, *servers]:
            if proc.is_alive():
                proc.terminate()
                proc.join()
    rows = summarise(samples)
    micro_rows: list[dict[str, Any]] = []
    if args.micro:
        say("in-process dispatch measurement")
        cases = [c for c in args.cases if c in ("noop", "spillway-local", "spillway-cloud-unsigned-payload")]
        for use_uvloop in loops:
            for row in micro(cases, args.concurrency, args.rounds, args.micro_calls, use_uvloop):
                micro_rows.append({**row, "uvloop": use_uvloop})
    return rows, micro_rows


def rotated(items: list[str], by: int) -> list[str]:
    by %= len(items)
    return [*items[by:], *items[:by]]


def source_note() -> dict[str, Any]:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout

    status = git("status", "--porcelain").splitlines()
    changed = [line[3:] for line in status if line and not line.startswith("??")]
    return {"commit": git("rev-parse", "--short", "HEAD").strip(), "uncommitted": changed}


def _runner_files(note: dict[str, Any]) -> list[str]:
    """The uncommitted files that can change these figures: the runner, plugins, protocol, routing."""
    return [f for f in note["uncommitted"] if f.startswith("gateway_plugin/")]


def markdown(
    rows: list[dict[str, Any]], micro_rows: list[dict[str, Any]], notes: list[dict[str, Any]]
) -> str:
    start, end = notes[0], notes[-1]
    lines = [
        f"Run on {start['date']} ({end['wall_s']:.0f} s; Python {start['python']}, {start['cpus']} CPUs; "
        f"load average {start['loadavg_1m']} at the start, {end['loadavg_1m']} at the end; "
        f"commit {start['commit']}"
        + (f", uncommitted changes in {', '.join(runner)}" if (runner := _runner_files(start)) else "")
        + ").",
        "",
        "| uvloop | case | conc | dispatch | calls/s | of eager | p50 µs | p99 µs | p99 of eager "
        "| runner cpu µs/call | added cpu µs | runner wake-ups/call | client cpu µs/call "
        "| client wake-ups/call | calls that made a Task |",
        "| --- | --- | ---: | --- |" + " ---: |" * 11,
    ]
    for r in rows:
        lines.append(
            f"| {'on' if r['uvloop'] else 'off'} | {r['case']} | {r['concurrency']} | {r['dispatch']} | "
            f"{r['calls_per_s']:,.0f} | {r['of_eager']:.2f} | {r['p50_us']:,.0f} | {r['p99_us']:,.0f} | "
            f"{r['p99_of_eager']:.2f} | {r['runner_cpu_us_per_call']:.1f} | {r['cpu_added_us']:+.1f} | "
            f"{r['runner_wakeups_per_call']:.2f} | {r['client_cpu_us_per_call']:.1f} | "
            f"{r['client_wakeups_per_call']:.2f} | {r['task_share']:.0%} |"
        )
    if micro_rows:
        lines += [
            "",
            "In process (no sockets), one `Runner.request` per call, dispatched in bursts:",
            "",
            "| uvloop | case | burst | dispatch | µs/call | added µs | of eager |",
            "| --- | --- | ---: | --- | ---: | ---: | ---: |",
        ]
        for r in micro_rows:
            lines.append(
                f"| {'on' if r['uvloop'] else 'off'} | {r['case']} | {r['burst']} | {r['dispatch']} | "
                f"{r['us_per_call']:.2f} | {r['added_us']:+.2f} | {r['of_eager']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="rounds over every cell (default 7)")
    parser.add_argument("--seconds", type=float, default=2.0, help="measured seconds per cell (default 2)")
    parser.add_argument(
        "--warmup-s", type=float, default=0.3, help="unmeasured load before each measurement (default 0.3)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="default: 1 16")
    parser.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES), choices=list(CASES))
    parser.add_argument(
        "--uvloop", choices=["on", "off", "both"], default="on", help="default on, as shipped"
    )
    parser.add_argument("--micro", action="store_true", help="also measure the dispatch in process")
    parser.add_argument("--micro-calls", type=int, default=20_000, help="calls per in-process measurement")
    parser.add_argument("--markdown-out", type=Path, default=None, help="also write the summary as markdown")
    add_output_options(parser)
    args = parser.parse_args(argv)

    out = Output(args.format, args.json_out)
    notes = [{**machine_note(), **source_note()}]
    out.record({"kind": "machine", "phase": "start", **notes[0]})
    say(f"load average {notes[0]['loadavg_1m']} at the start")
    began = time.monotonic()
    try:
        rows, micro_rows = run(args, out)
        for row in [*rows, *micro_rows]:
            out.record(row)
        notes.append({**machine_note(), "wall_s": time.monotonic() - began})
        out.record({"kind": "machine", "phase": "end", **notes[-1]})
        say(f"done in {time.monotonic() - began:.0f} s; load average {notes[-1]['loadavg_1m']} at the end")
        if out.table:
            keys = [
                "uvloop",
                "case",
                "concurrency",
                "dispatch",
                "calls_per_s",
                "of_eager",
                "p50_us",
                "p99_us",
            ]
            keys += ["p99_of_eager", "runner_cpu_us_per_call", "cpu_added_us", "runner_wakeups_per_call"]
            keys += ["client_cpu_us_per_call", "client_wakeups_per_call", "task_share"]
            print(render_table(keys, [[r[k] for k in keys] for r in rows]))
            if micro_rows:
                keys = ["uvloop", "case", "burst", "dispatch", "us_per_call", "added_us", "of_eager"]
                print()
                print(render_table(keys, [[r[k] for k in keys] for r in micro_rows]))
        if args.markdown_out is not None:
            args.markdown_out.write_text(markdown(rows, micro_rows, notes))
    finally:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
