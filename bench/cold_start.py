"""How much the function's handler adds to Triton's own cold start.

Three launches, repeated with their order rotated, each timed from process start on the client's
clock: (a) the sidecar's tritonserver alone, to /v2/health/ready and then to a first inference;
(b) ``python -m functions serve --platform aliyun-fc`` to its first successful inference;
(c) aws-lambda-rie running the awslambdaric handler to its first successful Function URL event.
b - a and c - a are what the handler costs on top of Triton; the logs say where it went.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness import (
    ADD_SUB_JSON_REQUEST,
    EXAMPLE_REPOSITORY,
    LOOPBACK,
    Launched,
    Output,
    add_output_options,
    descendants,
    free_port,
    http_call,
    launch,
    machine_note,
    median,
    parent_of,
    poll,
    render_table,
    running,
    say,
    shm_regions,
    signal_all,
    tools_dir,
    wait_gone,
    warn_leaked,
)

from functions.cli import serve_command
from functions.contract import WARMUP_KEY
from functions.triton_install import locate

TARGET_ADDED_MS = 150.0
MODEL = "add_sub"
INFER_PATH = f"/v2/models/{MODEL}/infer"
INVOKE_PATH = "/2015-03-31/functions/function/invocations"
POLL_S = 0.005
DEADLINE_S = 60.0
_READY_LOG = re.compile(r"sidecar ready after (\d+) ms")
_RIE_INIT = re.compile(r"INIT REPORT\(durationMs: ([\d.]+)\)")
_RIE_INVOKE = re.compile(r"INVOKE RTDONE\(status: success.*?duration: ([\d.]+)ms\)")


def _infer_ok(port: int) -> bool:
    status, body = http_call(
        port,
        "POST",
        INFER_PATH,
        ADD_SUB_JSON_REQUEST,
        {"content-type": "application/json"},
        timeout=DEADLINE_S,
    )
    return status == 200 and b"OUTPUT0" in body


def function_url_event() -> bytes:
    """The payload-2.0 event a Function URL would send for one JSON inference."""
    return json.dumps(
        {
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": INFER_PATH,
            "rawQueryString": "",
            "headers": {"content-type": "application/json", "host": "bench.lambda-url.localhost"},
            "requestContext": {
                "accountId": "anonymous",
                "apiId": "bench",
                "domainName": "bench.lambda-url.localhost",
                "http": {
                    "method": "POST",
                    "path": INFER_PATH,
                    "protocol": "HTTP/1.1",
                    "sourceIp": LOOPBACK,
                    "userAgent": "spillway-bench",
                },
                "requestId": "bench",
                "routeKey": "$default",
                "stage": "$default",
                "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime()),
                "timeEpoch": int(time.time() * 1000),
            },
            "body": base64.b64encode(ADD_SUB_JSON_REQUEST).decode(),
            "isBase64Encoded": True,
        }
    ).encode()


class ColdStarts:
    def __init__(self, repository: Path, work: Path, tools: Path) -> None:
        self.repository = repository
        self.work = work
        self.rie = tools / "bin" / "aws-lambda-rie"
        self.install = locate()
        self.event = function_url_event()

    def _once(
        self,
        name: str,
        launch_it: Callable[[list[Launched]], Launched],
        measure: Callable[[Launched], dict[str, float]],
    ) -> dict[str, float]:
        with running([]) as launched:
            proc = launch_it(launched)
            try:
                return measure(proc)
            except BaseException:
                say(f"{name} failed; log tail:\n" + "\n".join(proc.log_text().splitlines()[-20:]))
                raise

    def triton(self, rep: int) -> dict[str, float]:
        """The sidecar's own command line, flags as the sidecar passes them."""
        port = free_port()
        args = [
            *self.install.args(),
            f"--model-repository={self.repository}",
            f"--http-address={LOOPBACK}",
            f"--http-port={port}",
            "--allow-grpc=false",
            "--allow-metrics=false",
            "--exit-timeout-secs=5",
            "--model-control-mode=explicit",
            f"--load-model={MODEL}",
        ]
        env = {**os.environ, **self.install.env}

        def start(launched: list[Launched]) -> Launched:
            launched.append(launch(args, env, self.work / f"triton-{rep}.log"))
            return launched[-1]

        def measure(proc: Launched) -> dict[str, float]:
            def alive() -> bool:
                return not proc.exited()

            ready = poll(
                lambda: http_call(port, "GET", "/v2/health/ready")[0] == 200, DEADLINE_S, POLL_S, alive
            )
            inferred = poll(lambda: _infer_ok(port), DEADLINE_S, POLL_S, alive)
            return {
                "ready_ms": (ready - proc.started) * 1000,
                "first_infer_ms": (inferred - proc.started) * 1000,
            }

        return self._once("tritonserver", start, measure)

    def fc_server(self, rep: int) -> dict[str, float]:
        port = free_port()
        cmd = serve_command(port, self.repository, "aliyun-fc", LOOPBACK)
        env = {**os.environ, "SPILLWAY_MODELS": MODEL}

        def start(launched: list[Launched]) -> Launched:
            launched.append(launch(cmd, env, self.work / f"fc-{rep}.log"))
            return launched[-1]

        def measure(proc: Launched) -> dict[str, float]:
            def alive() -> bool:
                return not proc.exited()

            listening = poll(
                lambda: http_call(port, "GET", "/v2/health/live")[0] > 0, DEADLINE_S, POLL_S, alive
            )
            inferred = poll(lambda: _infer_ok(port), DEADLINE_S, POLL_S, alive)
            out = {
                "listening_ms": (listening - proc.started) * 1000,
                "first_infer_ms": (inferred - proc.started) * 1000,
            }
            found = _READY_LOG.search(proc.log_text())
            if found:
                out["sidecar_ready_log_ms"] = float(found.group(1))
            return out

        return self._once("FC server", start, measure)

    def _stop_runtime(self, rie: Launched, port: int) -> None:
        """Let the handler stop its sidecar before aws-lambda-rie kills everything.

        awslambdaric waits for its next event inside C code, so the handler's SIGTERM handler runs
        only once an event arrives: send SIGTERM, then one warm-up event to wake it.
        """
        runtimes = [p for p in descendants(rie.proc.pid) if parent_of(p) == rie.proc.pid]
        signal_all(runtimes, signal.SIGTERM)
        with contextlib.suppress(OSError, http.client.HTTPException):
            http_call(port, "POST", INVOKE_PATH, json.dumps({WARMUP_KEY: {}}).encode(), timeout=15)
        wait_gone(runtimes, 10)

    def lambda_rie(self, rep: int) -> dict[str, float]:
        port, runtime_port = free_port(), free_port()
        cmd = [
            str(self.rie),
            "--runtime-interface-emulator-address",
            f"{LOOPBACK}:{port}",
            "--runtime-api-address",
            f"{LOOPBACK}:{runtime_port}",
            sys.executable,
            "-m",
            "awslambdaric",
            "functions.aws_lambda.handler",
        ]
        env = {
            **os.environ,
            "SPILLWAY_MODEL_REPOSITORY": str(self.repository),
            "SPILLWAY_MODELS": MODEL,
            "AWS_LAMBDA_FUNCTION_TIMEOUT": "60",
        }

        def start(launched: list[Launched]) -> Launched:
            launched.append(
                launch(
                    cmd,
                    env,
                    self.work / f"rie-{rep}.log",
                    before_stop=lambda rie: self._stop_runtime(rie, port),
                )
            )
            return launched[-1]

        def invoke_ok() -> bool:
            status, body = http_call(
                port,
                "POST",
                INVOKE_PATH,
                self.event,
                {"content-type": "application/json"},
                timeout=DEADLINE_S,
            )
            if status != 200:
                return False
            result: dict[str, Any] = json.loads(body)
            if result.get("statusCode") != 200:
                return False
            payload = result.get("body", "")
            decoded = base64.b64decode(payload) if result.get("isBase64Encoded") else payload.encode()
            return b"OUTPUT0" in decoded

        def measure(proc: Launched) -> dict[str, float]:
            inferred = poll(invoke_ok, DEADLINE_S, POLL_S, lambda: not proc.exited())
            out = {"first_infer_ms": (inferred - proc.started) * 1000}
            time.sleep(0.05)
            log = proc.log_text()
            for key, pattern in (("rie_init_ms", _RIE_INIT), ("rie_first_invoke_ms", _RIE_INVOKE)):
                found = pattern.search(log)
                if found:
                    out[key] = float(found.group(1))
            return out

        return self._once("aws-lambda-rie", start, measure)


def summarise(results: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for case, reps in results.items():
        keys = dict.fromkeys(k for r in reps for k in r)
        out[case] = {k: median([r[k] for r in reps if k in r]) for k in keys}
    return out


COLUMNS = {
    "ready_ms": "ready",
    "listening_ms": "port open",
    "sidecar_ready_log_ms": "sidecar ready (own log)",
    "rie_init_ms": "RIE init",
    "rie_first_invoke_ms": "RIE 1st invoke",
    "first_infer_ms": "first inference",
}


def print_table(
    meta: dict[str, Any],
    end_load: float,
    med: dict[str, dict[str, float]],
    added: dict[str, float],
    goals: list[dict[str, Any]],
) -> None:
    print(
        f"cold start, {meta['date']}, {meta['cpus']} CPUs, {meta['reps']} reps, medians in ms from "
        f"process start, load avg {meta['loadavg_1m']} -> {end_load}"
    )
    rows = [[name, *(figures.get(k, float("nan")) for k in COLUMNS)] for name, figures in med.items()]
    print(render_table(["case", *COLUMNS.values()], rows))
    print(
        f"\nb - a = {added['b_minus_a_ms']:.0f} ms, c - a = {added['c_minus_a_ms']:.0f} ms; "
        f"against Triton's own first inference: b = +{added['b_minus_a_first_infer_ms']:.0f} ms, "
        f"c = +{added['c_minus_a_first_infer_ms']:.0f} ms"
    )
    for g in goals:
        print(f"{g['what']} = {g['value']} ms (target {g['target']}): {'met' if g['met'] else 'NOT met'}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Cold start of Triton alone, of the FC custom-container server and of the Lambda "
        "handler under aws-lambda-rie, each to its first successful add_sub inference. "
        "Prints a table on a terminal, JSON lines otherwise."
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each launch (default 5)")
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=EXAMPLE_REPOSITORY,
        help="repository holding add_sub (default: the example one)",
    )
    add_output_options(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Output(args.format, args.json_out)
    tools = tools_dir()
    work = Path(tempfile.mkdtemp(prefix="spillway-cold-"))
    runs = ColdStarts(args.model_repository.resolve(), work, tools)
    cases: dict[str, Callable[[int], dict[str, float]]] = {
        "a_triton": runs.triton,
        "b_fc_server": runs.fc_server,
        "c_lambda_rie": runs.lambda_rie,
    }
    meta = {
        "kind": "meta",
        "bench": "cold_start",
        **machine_note(),
        "reps": args.reps,
        "model": MODEL,
        "tritonserver": str(runs.install.binary),
    }
    out.record(meta)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    shm_before = shm_regions()
    order = list(cases)
    try:
        for rep in range(1, args.reps + 1):
            for name in order[rep % 3 :] + order[: rep % 3]:
                figures = cases[name](rep)
                results[name].append(figures)
                say(f"rep {rep} {name}: " + ", ".join(f"{k} {v:.0f}" for k, v in figures.items()))
                out.record({"kind": "run", "case": name, "rep": rep, **figures})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    warn_leaked(shm_before)
    med = summarise(results)
    a_ready, a_infer = med["a_triton"]["ready_ms"], med["a_triton"]["first_infer_ms"]
    added = {
        "b_minus_a_ms": med["b_fc_server"]["first_infer_ms"] - a_ready,
        "c_minus_a_ms": med["c_lambda_rie"]["first_infer_ms"] - a_ready,
        "b_minus_a_first_infer_ms": med["b_fc_server"]["first_infer_ms"] - a_infer,
        "c_minus_a_first_infer_ms": med["c_lambda_rie"]["first_infer_ms"] - a_infer,
    }
    labels = {"b_minus_a_ms": "FC server (b - a)", "c_minus_a_ms": "Lambda handler under RIE (c - a)"}
    goals = [
        {
            "kind": "target",
            "what": f"{label} adds to Triton's start",
            "target": f"<= {TARGET_ADDED_MS:.0f} ms",
            "value": round(added[key], 1),
            "met": bool(added[key] <= TARGET_ADDED_MS),
        }
        for key, label in labels.items()
    ]
    end_load = machine_note()["loadavg_1m"]
    for name, figures in med.items():
        out.record({"kind": "summary", "case": name, **figures})
    out.record({"kind": "added", **added})
    for g in goals:
        out.record(g)
    out.record({"kind": "end", "loadavg_1m_end": end_load})
    out.close()
    if out.table:
        print_table(meta, end_load, med, added, goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
