"""What the benchmarks share: process trees that always get stopped, loopback polling, output.

Every process a benchmark starts goes through ``Launched`` so that a failure, a timeout or Ctrl-C
still stops it and everything it spawned (Triton, its Python backend stubs, the Lambda runtime).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_REPOSITORY = ROOT / "examples" / "model_repository"
BENCH_REPOSITORY = Path(__file__).resolve().parent / "model_repository"
LOOPBACK = "127.0.0.1"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_SHM_IN_MAPS = re.compile(r"/dev/shm/triton_python_backend_shm_region_\S+")

ADD_SUB_JSON_REQUEST = json.dumps(
    {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]},
            {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": [10.0, 20.0, 30.0, 40.0]},
        ]
    }
).encode()


def say(message: str) -> None:
    """Progress goes to stderr so that stdout stays a clean table or JSON stream."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port: int = s.getsockname()[1]
        return port


def tools_dir() -> Path:
    """The fetch script is idempotent and prints where perf_analyzer and aws-lambda-rie are."""
    env_dir = os.environ.get("SPILLWAY_TOOLS")
    candidate = Path(env_dir) if env_dir else ROOT / ".cache" / "tools"
    if (candidate / "bin" / "perf_analyzer").exists() and (candidate / "bin" / "aws-lambda-rie").exists():
        return candidate
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "fetch-tools.sh")],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    return Path(out.stdout.strip().splitlines()[-1])


def parent_of(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[1])


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, found through ``/proc`` parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            children.setdefault(parent_of(int(entry)), []).append(int(entry))
    found: list[int] = []
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child in children.get(pid, []):
            found.append(child)
            frontier.append(child)
    return found


def cpu_seconds(pid: int) -> float:
    """User plus system time of one process (its own, not its children's)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _alive(p)]
    return left


@dataclass
class Launched:
    """A started process, its log file, and the launch instant that cold starts are timed from."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    started: float
    before_stop: Callable[[Launched], None] | None = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def stop(self, grace_s: float = 8.0) -> bool:
        """SIGTERM so each process stops its own children, then the stragglers; True if all went cleanly.

        ``before_stop`` runs first, for a tree whose root would otherwise kill its children outright.
        """
        tree = descendants(self.proc.pid)
        if self.before_stop is not None and self.proc.poll() is None:
            self.before_stop(self)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
        left = wait_gone(tree, 1.0)
        clean = not left and self.proc.poll() is not None
        if left:
            signal_all(left, signal.SIGTERM)
            left = wait_gone(left, grace_s)
        if left or self.proc.poll() is None:
            signal_all([*left, self.proc.pid], signal.SIGKILL)
            wait_gone(left, 2.0)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(2.0)
        return clean


def launch(
    args: Sequence[str],
    env: dict[str, str],
    log_path: Path,
    cwd: Path = ROOT,
    before_stop: Callable[[Launched], None] | None = None,
) -> Launched:
    with log_path.open("wb") as log:
        started = time.perf_counter()
        proc = subprocess.Popen(
            list(args), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    return Launched(proc, log_path, started, before_stop)


@contextlib.contextmanager
def running(launched: list[Launched]) -> Iterator[list[Launched]]:
    """Stop whatever was launched into the list, whatever happens inside the block."""
    try:
        yield launched
    finally:
        for item in reversed(launched):
            name = Path(str(item.proc.args[0])).name  # type: ignore[index]
            try:
                clean = item.stop()
            except Exception:
                signal_all([*descendants(item.proc.pid), item.proc.pid], signal.SIGKILL)
                raise
            if not clean:
                say(f"warning: {name} (pid {item.proc.pid}) needed more than one SIGTERM to stop")


def http_call(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> tuple[int, bytes]:
    """One request on a fresh loopback connection; raises ``OSError`` while nothing listens."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request(method, path, body=body or None, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def poll(check: Callable[[], bool], deadline_s: float, interval_s: float, alive: Callable[[], bool]) -> float:
    """Call ``check`` until it holds; the ``perf_counter`` instant it first did, or ``TimeoutError``."""
    deadline = time.perf_counter() + deadline_s
    while time.perf_counter() < deadline:
        if not alive():
            raise RuntimeError("the process under test exited before it answered")
        try:
            if check():
                return time.perf_counter()
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(interval_s)
    raise TimeoutError(f"not ready within {deadline_s:.0f} s")


def shm_regions() -> set[str]:
    """Triton's Python backend leaves these behind when it is killed rather than stopped."""
    with contextlib.suppress(OSError):
        return {n for n in os.listdir("/dev/shm") if n.startswith("triton_python_backend_shm_region_")}
    return set()


def _mapped_regions() -> set[str]:
    """Regions some live process (this run's or anyone else's) still has mapped."""
    mapped: set[str] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                maps = Path(f"/proc/{entry}/maps").read_text()
                mapped.update(m.rsplit("/", 1)[-1] for m in _SHM_IN_MAPS.findall(maps))
    return mapped


def warn_leaked(before: set[str]) -> None:
    """New regions that no live process maps: what a Triton killed without a clean stop leaves.

    Looked at twice, a second apart, so that a Triton of someone else's starting or stopping just
    then is not taken for a leak.
    """
    suspects = shm_regions() - before - _mapped_regions()
    if suspects:
        time.sleep(1.0)
        suspects &= shm_regions() - _mapped_regions()
    leaked = sorted(suspects)
    if leaked:
        say(f"warning: {len(leaked)} new Triton shared-memory region(s) in /dev/shm: {', '.join(leaked)}")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def machine_note() -> dict[str, Any]:
    load1, load5, _ = os.getloadavg()
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "loadavg_1m": round(load1, 2),
        "loadavg_5m": round(load5, 2),
        "python": sys.version.split()[0],
    }


class Output:
    """JSON lines for machines (stdout unless it is a terminal; a file if asked), tables for people."""

    def __init__(self, fmt: str, json_out: Path | None, stream: IO[str] = sys.stdout) -> None:
        self.table = stream.isatty() if fmt == "auto" else fmt == "table"
        self._stream = stream
        self._file = json_out.open("w") if json_out is not None else None

    def record(self, record: dict[str, Any]) -> None:
        rounded = {k: round(v, 3) if isinstance(v, float) else v for k, v in record.items()}
        line = json.dumps(rounded, separators=(",", ":"))
        if not self.table:
            print(line, file=self._stream, flush=True)
        if self._file is not None:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=("auto", "table", "json"),
        default="auto",
        help="auto (default): a table on a terminal, JSON lines otherwise",
    )
    parser.add_argument("--json-out", type=Path, default=None, help="also write the JSON lines to this file")


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers], *[[_cell(v) for v in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:.2f}" if abs(value) < 10 else f"{value:.0f}"
    return str(value)
