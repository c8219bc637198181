"""The Triton sidecar's life cycle: start, readiness, restart with backoff, stop.

Standard library only, so that the handler can start Triton before its heavy imports and the two
overlap during a cold start. The supervisor runs on threads, not on the event loop, because on
Lambda the loop only runs while an invocation is in flight.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, cast

from functions.process_tree import children, first_gone
from functions.triton_install import TritonInstall, locate

_PR_SET_PDEATHSIG = 1


class SidecarState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DOWN = "down"
    FAILED = "failed"
    STOPPED = "stopped"


class SidecarFailed(RuntimeError):
    """Triton never became ready; the message carries its last log lines."""


@dataclass(frozen=True)
class SidecarOptions:
    model_repository: Path
    models: tuple[str, ...] = ()
    ready_timeout_s: float = 9.0
    http_port: int = 0
    max_backoff_s: float = 30.0
    extra_args: tuple[str, ...] = ()
    log_prefix: str = "[tritonserver] "
    metrics_port: int | None = None
    log_path: Path | None = None
    expose_statistics: bool = False
    expose_model_config: bool = False
    env_names: tuple[str, ...] = ()
    watch_period_s: float = 1.0
    # Triton's GPU gauges (nv_gpu_utilization, nv_gpu_memory_*) on its metrics port: only where
    # there is a GPU (the FC GPU image); elsewhere Triton would only log that it found none.
    gpu_metrics: bool = False
    # The address Triton's HTTP and metrics ports listen on (gRPC is off): loopback in a function.
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        import ipaddress  # here, not at the top: off the path to Triton's launch

        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise ValueError(
                f"sidecar host {self.host!r} is not an IP address: Triton listens on one"
            ) from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _die_with_parent() -> None:
    """Linux: Triton gets SIGKILL if the handler process dies, so no orphan holds the GPU."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


# Triton's API groups that administer the server rather than serve inference.
_ADMIN_APIS = ("model-repository", "model-config", "shared-memory", "logging", "trace", "statistics")
_ADMIN_HEADER = "spillway-admin"
# What Triton and model code may see of the handler's environment: never the signing key, cloud
# credentials or anything else the operator did not name.
_TRITON_ENV = frozenset(
    {"PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "HOME", "TMPDIR", "TMP", "TEMP", "LANG", "LANGUAGE", "TZ"}
    | {"PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "OMP_NUM_THREADS"}
    | {"SPILLWAY_SHM_DIR", "SPILLWAY_SHM_DIR_FORCE"}
)
_TRITON_ENV_PREFIXES = ("LC_", "CUDA_", "NVIDIA_", "TRITON_")


def triton_environment(
    env: Mapping[str, str], install_env: Mapping[str, str], extra: Iterable[str] = ()
) -> dict[str, str]:
    """The environment Triton starts with: what it needs and what the operator named, nothing else."""
    allowed = _TRITON_ENV | set(extra)
    kept = {k: v for k, v in env.items() if k in allowed or k.startswith(_TRITON_ENV_PREFIXES)}
    return {**kept, **install_env}


_HARMLESS = ("CudaDriverHelper", "NVML", "DCGM", "pinned memory", "CUDA driver")


def _is_error(line: str) -> bool:
    """Triton's error lines (``E1129 ...`` or ``error: ...``), less those the CPU always prints."""
    is_error = (line[:1] == "E" and line[1:2].isdigit()) or line.startswith("error:")
    return is_error and not any(noise in line for noise in _HARMLESS)


def _reap_group(proc: subprocess.Popen[bytes]) -> None:
    """Triton leads its own process group: a crashed or killed server leaves no backend stubs behind."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class Sidecar:
    """One supervised ``tritonserver`` bound to its options' host (localhost unless told)."""

    def __init__(
        self,
        options: SidecarOptions,
        install: TritonInstall | None = None,
        on_state: Callable[[SidecarState], None] | None = None,
    ) -> None:
        self.options = options
        self._install = install
        self.http_port = options.http_port or free_port()
        self.state = SidecarState.STOPPED
        self.restarts = 0
        self.ready_at: float | None = None
        self.failure: str | None = None
        self._on_state = on_state
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._first_settled = threading.Event()
        self._errors: deque[str] = deque(maxlen=10)
        self._thread: threading.Thread | None = None
        self._linked_repository: Path | None = None
        self._admin_key = secrets.token_hex(16)
        self._broken: str | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        """Launch without waiting; ``wait_ready`` blocks until the first start settles."""
        self._set_state(SidecarState.STARTING)
        try:
            self._launch()
        except SidecarFailed as exc:
            self.failure = str(exc)
            self._set_state(SidecarState.FAILED)
            self._first_settled.set()
            return
        self._thread = threading.Thread(target=self._supervise, name="triton-supervisor", daemon=True)
        self._thread.start()

    def report_broken(self, reason: str) -> None:
        """Triton answers but cannot serve (a backend stub died): take it down now for a restart."""
        proc = self._proc
        if self.state is not SidecarState.READY or proc is None:
            return
        self._broken = reason
        self._set_state(SidecarState.DOWN)
        _reap_group(proc)

    def wait_ready(self, timeout: float | None = None) -> None:
        if not self._first_settled.wait(timeout):
            raise SidecarFailed(f"tritonserver not ready after {timeout:.1f} s")
        if self.state is SidecarState.FAILED:
            raise SidecarFailed(self.failure or "tritonserver failed to start")

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc is not None:
            _reap_group(proc)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self._linked_repository is not None:
            shutil.rmtree(self._linked_repository, ignore_errors=True)
        self._set_state(SidecarState.STOPPED)

    def _set_state(self, state: SidecarState) -> None:
        self.state = state
        if self._on_state is not None:
            self._on_state(state)

    def _command(self) -> tuple[list[str], dict[str, str]]:
        install = self._install or locate()
        self._install = install
        opts = self.options
        args = [
            *install.args(),
            f"--model-repository={self._repository()}",
            "--model-control-mode=none",
            f"--http-restricted-api={','.join(self._restricted())}:{_ADMIN_HEADER}={self._admin_key}",
            f"--http-address={opts.host}",
            f"--http-port={self.http_port}",
            "--allow-grpc=false",
            "--exit-timeout-secs=5",
        ]
        if opts.metrics_port is None:
            args.append("--allow-metrics=false")
        else:
            args += [
                "--allow-metrics=true",
                f"--allow-gpu-metrics={'true' if opts.gpu_metrics else 'false'}",
                f"--metrics-port={opts.metrics_port}",
                f"--metrics-address={opts.host}",
                "--metrics-interval-ms=100",
            ]
        args.extend(opts.extra_args)
        return args, triton_environment(os.environ, install.env, opts.env_names)

    def admin_header(self) -> tuple[bytes, bytes]:
        """The header that opens Triton's locked administration: the handler's own reads only
        (statistics for /spillway/metrics), never passed on to or from a client."""
        return _ADMIN_HEADER.encode(), self._admin_key.encode()

    def _restricted(self) -> tuple[str, ...]:
        """Triton's own lock on its administration, behind the handler's allow-list: the key is
        random per process and nobody is given it."""
        opened = {
            "statistics": self.options.expose_statistics,
            "model-config": self.options.expose_model_config,
        }
        return tuple(a for a in _ADMIN_APIS if not opened.get(a))

    def _repository(self) -> Path:
        """The models to serve, and only those: a private folder of links when a subset is named.

        Triton then runs with ``--model-control-mode=none``, in which no client can load or unload
        a model.
        """
        opts = self.options
        if not opts.models:
            return opts.model_repository
        if self._linked_repository is None:
            missing = [m for m in opts.models if not (opts.model_repository / m / "config.pbtxt").is_file()]
            if missing:
                raise SidecarFailed(
                    f"model {missing[0]!r} is not in the model repository {opts.model_repository} "
                    "(no config.pbtxt); check SPILLWAY_MODELS"
                )
            folder = Path(tempfile.mkdtemp(prefix="spillway-models-"))
            for model in opts.models:
                source = (opts.model_repository / model).resolve()
                (folder / model).symlink_to(source, target_is_directory=True)
            self._linked_repository = folder
        return self._linked_repository

    def _launch(self) -> None:
        args, env = self._command()
        proc = subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
            start_new_session=True,
        )
        self._proc = proc
        stream = cast(IO[bytes], proc.stdout)
        threading.Thread(target=self._forward_log, args=(stream,), name="triton-log", daemon=True).start()

    def _forward_log(self, stream: IO[bytes]) -> None:
        prefix = self.options.log_prefix
        sink = self.options.log_path.open("a") if self.options.log_path else sys.stderr
        try:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip()
                if _is_error(line):
                    self._errors.append(line)
                sink.write(f"{prefix}{line}\n")
                sink.flush()
        finally:
            stream.close()
            if sink is not sys.stderr:
                sink.close()

    def _supervise(self) -> None:
        attempt = 0
        first = True
        while not self._stopping.is_set():
            proc = cast(subprocess.Popen[bytes], self._proc)
            if self._await_ready(proc):
                if first:
                    self.ready_at = time.monotonic()
                    self._first_settled.set()
                    first = False
                self._broken = None
                self._set_state(SidecarState.READY)
                attempt = 0
                reason = self._watch(proc)
                if self._stopping.is_set():
                    return
                sys.stderr.write(f"{self.options.log_prefix}{reason}; restarting\n")
            elif first:
                self._fail(proc)
                return
            self._set_state(SidecarState.DOWN)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            _reap_group(proc)
            delay = min(self.options.max_backoff_s, 0.25 * 2**attempt)
            attempt += 1
            if self._stopping.wait(delay):
                return
            self.restarts += 1
            self._set_state(SidecarState.STARTING)
            self._launch()

    def _watch(self, proc: subprocess.Popen[bytes]) -> str:
        """Wait until Triton exits or breaks; why it must be restarted.

        A backend stub that dies leaves Triton up and its models "ready" while every inference of
        theirs fails, so the processes Triton started are watched too.
        """
        stubs = children(proc.pid)
        while True:
            try:
                proc.wait(self.options.watch_period_s)
            except subprocess.TimeoutExpired:
                gone = first_gone(stubs, proc.pid)
                if gone is not None:
                    self._broken = f"backend process {gone} of tritonserver is gone"
                    _reap_group(proc)
                    proc.wait()
                    return self._broken
                continue
            return self._broken or f"exited with {proc.returncode}"

    def _fail(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.kill()
            reason = f"not ready within {self.options.ready_timeout_s:.1f} s"
        else:
            reason = f"exited with code {proc.returncode}"
        proc.wait()
        time.sleep(0.05)
        tail = "\n".join(self._errors)
        self.failure = f"tritonserver {reason}" + (f":\n{tail}" if tail else "")
        self._set_state(SidecarState.FAILED)
        self._first_settled.set()

    def _await_ready(self, proc: subprocess.Popen[bytes]) -> bool:
        deadline = time.monotonic() + self.options.ready_timeout_s
        paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in self.options.models)]
        while time.monotonic() < deadline:
            if proc.poll() is not None or self._stopping.is_set():
                return False
            if all(self._get_ok(p) for p in paths):
                return True
            time.sleep(0.005)
        return False

    def _get_ok(self, path: str) -> bool:
        import http.client  # here, not at the top: off the path to Triton's launch

        conn = http.client.HTTPConnection(self.options.host, self.http_port, timeout=1.0)
        try:
            conn.request("GET", path)
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()
