"""A real Apache APISIX (``scripts/install-apisix.sh``) started with Spillway's runner as its
``ext-plugin.cmd``: for the tests, the demo and the benchmarks.

Writes APISIX's ``conf/config.yaml`` (a standalone data plane on 127.0.0.1 with ``conf/apisix.yaml``
holding the routes, or, given an etcd, the traditional deployment: routes from etcd, put there
through the Admin API), runs ``apisix start``, waits until APISIX answers and the runner listens,
and stops it with ``apisix quit``. Several nodes run from copies of the installed APISIX
(``node_prefix``): one APISIX runs per prefix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from gateway_plugin.fast_path.route import VERIFY_UPSTREAM_TLS, lua_path

ROOT = Path(__file__).resolve().parent.parent
TESTBED = ROOT / "third_party" / "apisix-testbed"


def prefix() -> Path:
    return Path(os.environ.get("SPILLWAY_APISIX_PREFIX") or "/opt/spillway-apisix")


def node_prefix(base: Path, index: int) -> Path:
    """Another node's APISIX: the installed one's code copied under ``base`` (at most 70
    characters, as APISIX's Unix sockets need), without its logs or configuration."""
    home = base / f"apisix-{index}"
    if len(str(home)) > 70:
        raise ValueError(f"{home} is over 70 characters: APISIX's Unix sockets under it would not fit")
    if not home.exists():
        shutil.copytree(prefix() / "bin", home / "bin", symlinks=True)
        shutil.copytree(prefix() / "apisix", home / "apisix", symlinks=True, ignore=_node_own)
    return home


def _node_own(folder: str, names: list[str]) -> set[str]:
    """What each node makes for itself: its logs, its configuration, its sockets."""
    if Path(folder) == prefix() / "apisix":
        return {"logs"}
    if Path(folder) == prefix() / "apisix" / "conf":
        return {n for n in names if n in ("config.yaml", "apisix.yaml", "nginx.conf") or n.endswith(".sock")}
    return set()


def missing_reason() -> str | None:
    """Why APISIX cannot run here (None when it can)."""
    if not (prefix() / "bin" / "apisix").exists():
        return (
            f"no APISIX in {prefix()}: run 'bash scripts/install-apisix.sh' (needs root and apt on Debian 12)"
        )
    return None


@dataclass
class ApisixSettings:
    port: int
    routes_yaml: str
    runner_cmd: Sequence[str] | None = None
    plugins: Sequence[str] = (
        "spillway-edge",
        "ext-plugin-pre-req",
        "traffic-split",
        "http-logger",
        "aws-lambda",
        "proxy-rewrite",
    )
    envs: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    workers: int = 1
    # Spillway's Lua plugins (spillway-edge, spillway): every Spillway route needs them.
    extra_lua_path: Path | None = field(default_factory=lua_path)
    # More directories holding apisix/plugins/<name>.lua (searched after extra_lua_path).
    more_lua_paths: Sequence[Path] = ()
    shared_dicts: dict[str, str] = field(default_factory=dict)
    plugin_attr: dict[str, dict[str, object]] = field(default_factory=dict)
    timeout_s: float = 60.0
    # The CAs an upstream's certificate must chain to ("system": the OS bundle), and the location
    # snippet that makes nginx check it (fast_path.route.VERIFY_UPSTREAM_TLS).
    trusted_ca: str = "system"
    verify_upstream_tls: bool = True
    # The APISIX install to run (default: prefix()); another node's comes from node_prefix.
    home: Path | None = None
    # The traditional deployment: routes from this etcd (under etcd_prefix, shared by every node
    # that names it) instead of routes_yaml; admin_port serves the Admin API, whose key APISIX
    # reads from the variable admin_key_env names (never written to a file).
    etcd: str | None = None
    etcd_prefix: str = "/apisix"
    admin_port: int | None = None
    admin_key_env: str = "APISIX_ADMIN_KEY"
    # config.yaml's discovery section (fast_path.route.config_snippet's, with local.discovery).
    discovery: dict[str, object] | None = None


_MODULES = (
    "load_module /usr/lib/nginx/modules/ndk_http_module.so;\n"
    "load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;\n"
    "load_module /usr/lib/nginx/modules/ngx_http_headers_more_filter_module.so;\n"
)


def config_yaml(s: ApisixSettings) -> str:
    """APISIX 3.18 standalone on Debian's nginx (what OpenResty would bring is loaded or shimmed)."""
    lines = [
        "apisix:",
        f"  node_listen: [{{ip: 127.0.0.1, port: {s.port}}}]",
        "  enable_ipv6: false",
        "  enable_http2: false",
        f"  enable_admin: {'true' if s.admin_port else 'false'}",
        "  enable_control: false",
        f"  ssl: {{enable: false, ssl_trusted_certificate: {json.dumps(s.trusted_ca)}}}",
    ]
    lua_paths = [p for p in (s.extra_lua_path, *s.more_lua_paths) if p is not None]
    if lua_paths:
        joined = ";".join(f"{p.resolve()}/?.lua" for p in lua_paths)
        lines.append(f'  extra_lua_path: "{joined}"')
    lines += [
        "nginx_config:",
        "  main_configuration_snippet: |",
        *(f"    {line}" for line in _MODULES.splitlines()),
        "  http_server_location_configuration_snippet: |",
        "    set $apisix_request_id $request_id;",
        *(f"    {line}" for line in (VERIFY_UPSTREAM_TLS.splitlines() if s.verify_upstream_tls else [])),
        f"  worker_processes: {s.workers}",
        "  worker_rlimit_nofile: 16384",
        "  event: {worker_connections: 4096}",
        "  error_log_level: notice",
        "  http:",
        # upstream-healthcheck: APISIX declares it in a block Debian's nginx lacks (the route's checks).
        "    custom_lua_shared_dict: "
        + json.dumps({"prometheus-cache": "10m", "upstream-healthcheck": "10m", **s.shared_dicts}),
    ]
    if os.getuid() == 0:
        lines.append("  user: root")
    if s.envs:
        lines.append(f"  envs: {json.dumps(list(s.envs))}")
    lines += _deployment(s)
    lines += [
        f"plugins: {json.dumps(list(s.plugins))}",
        "stream_plugins: [ip-restriction]",
    ]
    if s.runner_cmd is not None:
        lines.append(f"ext-plugin: {{cmd: {json.dumps(list(s.runner_cmd))}}}")
    if s.plugin_attr:
        lines.append(f"plugin_attr: {json.dumps(s.plugin_attr)}")
    if s.discovery:
        lines.append(f"discovery: {json.dumps(s.discovery)}")
    return "\n".join(lines) + "\n"


def _deployment(s: ApisixSettings) -> list[str]:
    if s.etcd is None:
        return ["deployment:", "  role: data_plane", "  role_data_plane: {config_provider: yaml}"]
    lines = [
        "deployment:",
        "  role: traditional",
        "  role_traditional: {config_provider: etcd}",
        f"  etcd: {{host: [{json.dumps(s.etcd)}], prefix: {json.dumps(s.etcd_prefix)}, timeout: 30}}",
    ]
    if s.admin_port:
        lines += [
            "  admin:",
            "    admin_key_required: true",
            f"    admin_key: [{{name: admin, role: admin, key: '${{{{{s.admin_key_env}}}}}'}}]",
            f"    admin_listen: {{ip: 127.0.0.1, port: {s.admin_port}}}",
            "    allow_admin: [127.0.0.0/24]",
        ]
    return lines


class Apisix:
    def __init__(self, settings: ApisixSettings) -> None:
        self.settings = settings
        self.prefix = settings.home or prefix()
        self.home = self.prefix / "apisix"
        self.url = f"http://127.0.0.1:{settings.port}"
        self.master_pid: int | None = None

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    def error_log(self) -> str:
        return (self.logs / "error.log").read_text(errors="replace")

    def runner_pids(self) -> list[int]:
        """Every runner pid APISIX logged, in order: a respawn adds one."""
        return [int(p) for p in re.findall(r"started ext-plugin runner pid (\d+)", self.error_log())]

    def runner_socket(self) -> Path:
        return self.home / "conf" / f"apisix-{self.master_pid}.sock"

    def worker_pids(self) -> list[int]:
        out = subprocess.run(
            ["ps", "-o", "pid=", "--ppid", str(self.master_pid)], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]

    def start(self) -> None:
        s = self.settings
        (self.home / "conf" / "config.yaml").write_text(config_yaml(s))
        if s.etcd is None:
            routes = s.routes_yaml if "#END" in s.routes_yaml else s.routes_yaml + "\n#END\n"
            (self.home / "conf" / "apisix.yaml").write_text(routes)
        self.logs.mkdir(parents=True, exist_ok=True)
        self._forget_dead_master()
        for name in ("error.log", "access.log"):
            (self.logs / name).write_text("")
        env = {**os.environ, **s.env}
        result = subprocess.run(
            [str(self.prefix / "bin" / "apisix"), "start"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"apisix start failed:\n{result.stdout}{result.stderr}\n{self.error_log()[-3000:]}"
            )
        deadline = time.monotonic() + s.timeout_s
        while time.monotonic() < deadline:
            pid_file = self.logs / "nginx.pid"
            if self.master_pid is None and pid_file.exists() and pid_file.read_text().strip():
                self.master_pid = int(pid_file.read_text())
            if (
                self.master_pid is not None
                and self._answers()
                and (s.runner_cmd is None or self._runner_accepts())
            ):
                return
            time.sleep(0.05)
        log = self.error_log()[-3000:]
        self.stop()
        raise RuntimeError(f"APISIX not up within {s.timeout_s} s:\n{log}")

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(self.url + "/", timeout=1)
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def _runner_accepts(self) -> bool:
        """The runner listens: a socket of its name may be one a runner killed outright left,
        found again once pids wrap."""
        with socket.socket(socket.AF_UNIX) as probe:
            probe.settimeout(1)
            try:
                probe.connect(str(self.runner_socket()))
            except OSError:
                return False
        return True

    def _forget_dead_master(self) -> None:
        """A master killed earlier leaves its pid file and the workers' event socket behind; the
        next start would stop at the socket ("address already in use")."""
        pid_file = self.logs / "nginx.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is None or not alive(pid):
            for stale in (pid_file, self.logs / "worker_events.sock"):
                stale.unlink(missing_ok=True)

    def stop(self) -> list[int]:
        """``apisix quit`` (graceful: the workers stop the runner), then by force whatever outlived
        it: the master, its workers (a killed master's workers go on serving) and the runners they
        started (one left running keeps scraping and holding ports into the next test). Returns
        the runners it had to stop so."""
        master = [] if self.master_pid is None else [self.master_pid]
        workers = self.worker_pids() if master else []
        subprocess.run([str(self.prefix / "bin" / "apisix"), "quit"], capture_output=True, check=False)
        left = [*master, *(p for p in workers if alive(p))] if _outlived(master, 15) else []
        forced: list[int] = []
        if self.settings.runner_cmd is not None:
            runner = list(self.settings.runner_cmd)
            runners = [p for p in self.runner_pids() if alive(p) and _cmdline(p) == runner]
            forced = _outlived(runners, 5)  # time to remove its socket, as on a graceful quit
            left += forced
        for pid in left:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _outlived(left, 5)
        if master and not alive(master[0]):
            self.runner_socket().unlink(missing_ok=True)  # what a runner killed outright leaves
        return forced


def _outlived(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still alive after up to ``seconds`` of waiting for them to go."""
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@contextmanager
def running(settings: ApisixSettings) -> Iterator[Apisix]:
    apisix = Apisix(settings)
    apisix.start()
    try:
        yield apisix
    finally:
        apisix.stop()
