"""``python -m devtools function-demo``: the whole function on one machine, one real inference, then stop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from functions.cli import serve_command
from functions.sidecar import free_port


def _say(message: str) -> None:
    if sys.stderr.isatty():
        print(f"• {message}", file=sys.stderr, flush=True)


def run_demo(model_repository: Path, timeout_s: float = 60.0) -> int:
    import tritonclient.http as httpclient

    port = free_port()
    env = {**os.environ, "SPILLWAY_MODELS": "add_sub"}
    log_path = Path(tempfile.gettempdir()) / f"spillway-function-demo-{port}.log"
    _say(f"starting a local function with its Triton sidecar on 127.0.0.1:{port} (log: {log_path})")
    started = time.monotonic()
    with log_path.open("wb") as log:
        server = subprocess.Popen(
            serve_command(port, model_repository),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        while not _ready(client):
            if server.poll() is not None or time.monotonic() - started > timeout_s:
                print(
                    "error: the function did not get ready; run "
                    f"'python -m functions serve --port {port} --model-repository {model_repository}' "
                    "to see its log",
                    file=sys.stderr,
                )
                return 1
            time.sleep(0.05)
        ready_s = time.monotonic() - started
        _say(f"ready after {ready_s:.2f} s; sending one inference to add_sub")
        a = np.array([[1, 2, 3, 4]], dtype=np.float32)
        b = np.array([[10, 20, 30, 40]], dtype=np.float32)
        inputs = [
            httpclient.InferInput("INPUT0", [1, 4], "FP32"),
            httpclient.InferInput("INPUT1", [1, 4], "FP32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b, binary_data=True)
        result = client.infer("add_sub", inputs)
        out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
        response = result.get_response()
        ok = bool(np.allclose(out0, a + b) and np.allclose(out1, a - b))
        summary = {
            "ok": ok,
            "ready_s": round(ready_s, 3),
            "model": response["model_name"],
            "INPUT0": a.tolist(),
            "INPUT1": b.tolist(),
            "OUTPUT0": out0.tolist(),
            "OUTPUT1": out1.tolist(),
        }
        if sys.stdout.isatty():
            print(
                f"add_sub({a.tolist()}, {b.tolist()})\n"
                f"  OUTPUT0 = {out0.tolist()}\n  OUTPUT1 = {out1.tolist()}\n"
                f"{'correct' if ok else 'WRONG'}; function ready in {ready_s:.2f} s"
            )
        else:
            print(json.dumps(summary))
        return 0 if ok else 1
    finally:
        server.terminate()
        server.wait(15)


def _ready(client: object) -> bool:
    try:
        return bool(client.is_server_ready())  # type: ignore[attr-defined]
    except Exception:
        return False
