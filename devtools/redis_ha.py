"""Redis that survives a node's loss, on loopback, from Debian's packages: a Sentinel group (a
master, a replica and three ``redis-sentinel`` processes) and a Redis Cluster (three masters, each
with a replica, made by ``redis-cli --cluster create``). For the shared-state tests and
benchmarks: each can kill the master that holds Spillway's keys (SIGKILL, as a crash would), wait
for its replica's promotion, and bring the old master back as the new one's replica.

The failure detectors are set short (``down_after_ms``, ``node_timeout_ms``, 1 s by default) so a
failover takes seconds; production defaults are 30 s (Sentinel) and 15 s (Cluster)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from devtools.redis import RedisServer, answers
from functions.sidecar import free_port

REDIS_SENTINEL = shutil.which("redis-sentinel")
REDIS_CLI = shutil.which("redis-cli")
SENTINEL_HINT = (
    "redis-sentinel is not installed (apt-get install redis-sentinel; scripts/setup.sh does it as root)"
)
MASTER_NAME = "spillway"
# A replica's sync starts at once (Redis 7 waits 5 s for more replicas to share a diskless one).
SYNC_AT_ONCE = ["--repl-diskless-sync-delay", "0"]


def _wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s} s")
        time.sleep(0.02)


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)


def _role(port: int) -> str | None:
    try:
        with _client(port) as client:
            return str(client.info("replication")["role"])
    except redis.RedisError:
        return None


@dataclass
class Promotion:
    """One failover: the master killed, the replica that took over, and when each happened
    (``time.monotonic()``; ``promoted_at`` is when the failure detector's choice was first seen)."""

    old_port: int
    new_port: int
    killed_at: float
    promoted_at: float

    @property
    def seconds(self) -> float:
        return self.promoted_at - self.killed_at


class SentinelGroup:
    """A master, one replica and three sentinels (quorum 2), all on 127.0.0.1."""

    def __init__(self, folder: Path, down_after_ms: int = 1000, failover_timeout_ms: int = 3000) -> None:
        # A sentinel starts another failover of the same master name only 2 x failover_timeout_ms
        # after its last one.
        self.folder, self.down_after_ms, self.failover_timeout_ms = folder, down_after_ms, failover_timeout_ms
        self.servers = [RedisServer(folder / f"redis-{n}", args=SYNC_AT_ONCE) for n in "ab"]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def start(self) -> None:
        if REDIS_SENTINEL is None:
            raise RuntimeError(SENTINEL_HINT)
        master, replica = self.servers
        master.start()
        replica.args = [*SYNC_AT_ONCE, "--replicaof", "127.0.0.1", str(master.port)]
        replica.start()
        _wait(lambda: self._synced(replica.port), 20, "the replica's first sync")
        for index, port in enumerate(self.sentinel_ports):
            self.sentinels.append(self._sentinel(index, port, master.port))
        _wait(self._sentinels_agree, 20, "three sentinels that see the master and its replica")

    def _sentinel(self, index: int, port: int, master_port: int) -> subprocess.Popen[bytes]:
        folder = self.folder / f"sentinel-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "sentinel.conf"  # sentinel rewrites it with what it learns
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {folder}\nlogfile {folder / 'sentinel.log'}\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {MASTER_NAME} 1\n"
        )
        proc = subprocess.Popen([str(REDIS_SENTINEL), str(conf)], stdout=subprocess.DEVNULL)
        _wait(lambda: answers(port), 20, f"redis-sentinel on port {port}")
        return proc

    def _synced(self, port: int) -> bool:
        try:
            with _client(port) as client:
                return str(client.info("replication").get("master_link_status")) == "up"
        except redis.RedisError:
            return False

    def master_port(self, sentinel_port: int | None = None) -> int | None:
        """The master one sentinel names (the first by default)."""
        try:
            with _client(sentinel_port or self.sentinel_ports[0]) as client:
                found = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        except redis.RedisError:
            return None
        return int(found[1]) if found else None

    def _sentinels_agree(self) -> bool:
        master = self.servers[0].port
        try:
            for port in self.sentinel_ports:
                with _client(port) as client:
                    info = client.execute_command("SENTINEL", "MASTER", MASTER_NAME)
                    fields = dict(zip(info[::2], info[1::2], strict=True))
                    if int(fields[b"port"]) != master or int(fields[b"num-other-sentinels"]) < 2:
                        return False
                    if int(fields[b"num-slaves"]) < 1:
                        return False
        except redis.RedisError:
            return False
        return True

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def kill_master(self) -> float:
        """SIGKILL the master; when."""
        port = self.master_port()
        if port is None:
            raise RuntimeError("no sentinel names a master")
        self.server(port).stop()
        return time.monotonic()

    def wait_promotion(self, old_port: int, killed_at: float, timeout_s: float = 60) -> Promotion:
        """Until every sentinel names another master and it says it is one."""

        def promoted() -> bool:
            ports = {self.master_port(port) for port in self.sentinel_ports}
            return len(ports) == 1 and ports != {old_port} and _role(ports.pop() or 0) == "master"

        _wait(promoted, timeout_s, "the replica's promotion by Sentinel")
        new_port = self.master_port()
        assert new_port is not None
        return Promotion(old_port, new_port, killed_at, time.monotonic())

    def fail_over(self) -> Promotion:
        """Kill the master, wait for the promotion, bring the old master back as a replica."""
        old = self.master_port()
        assert old is not None
        promotion = self.wait_promotion(old, self.kill_master())
        self.rejoin(promotion)
        return promotion

    def rejoin(self, promotion: Promotion) -> None:
        """The killed master back (empty), as the new master's replica, synced."""
        server = self.server(promotion.old_port)
        server.args = [*SYNC_AT_ONCE, "--replicaof", "127.0.0.1", str(promotion.new_port)]
        server.start()
        _wait(lambda: self._synced(server.port), 30, "the old master's sync as a replica")

    def stop(self) -> None:
        for proc in self.sentinels:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.sentinels = []
        for server in self.servers:
            server.stop()


class ClusterGroup:
    """Three masters and one replica each (``redis-cli --cluster create --cluster-replicas 1``)."""

    def __init__(self, folder: Path, node_timeout_ms: int = 1000) -> None:
        self.folder = folder
        self.servers = [
            RedisServer(
                folder / f"node-{i}",
                _cluster_port(),
                args=[
                    *SYNC_AT_ONCE,
                    *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                    *("--cluster-node-timeout", str(node_timeout_ms)),
                ],
            )
            for i in range(6)
        ]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers[:3])

    def start(self) -> None:
        if REDIS_CLI is None:
            raise RuntimeError(
                "redis-cli is not installed (it comes with redis-server: apt-get install redis-tools)"
            )
        for server in self.servers:
            server.start()
        created = subprocess.run(
            [
                str(REDIS_CLI),
                *("--cluster", "create", *(f"127.0.0.1:{s.port}" for s in self.servers)),
                *("--cluster-replicas", "1", "--cluster-yes"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}{created.stderr}")
        _wait(self._settled, 90, "a Cluster whose nodes all say cluster_state:ok with three replicas")

    def _settled(self) -> bool:
        try:
            for server in self.servers:
                with _client(server.port) as client:
                    if client.cluster("info").get("cluster_state") != "ok":
                        return False
            roles = {s.port: _role(s.port) for s in self.servers}
            synced = all(self._replica_synced(port) for port, role in roles.items() if role == "slave")
            return synced and all(
                self._knows_its_replica(port) for port, role in roles.items() if role == "master"
            )
        except redis.RedisError:
            return False

    def _knows_its_replica(self, port: int) -> bool:
        """The master's own view of the Cluster lists its replica (gossip spreads it, seconds after
        the replica syncs): what a failover and ``replicas_ack`` go by."""
        with _client(port) as client:
            return bool(
                client.execute_command("CLUSTER", "REPLICAS", client.execute_command("CLUSTER", "MYID"))
            )

    def _replica_synced(self, port: int) -> bool:
        with _client(port) as client:
            return str(client.info("replication").get("master_link_status")) == "up"

    def master_port(self, key: str) -> int | None:
        """The master that serves ``key``'s slot, as the first live node sees it."""
        for server in self.servers:
            try:
                with _client(server.port) as client:
                    slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
                    for start, end, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                        if int(start) <= slot <= int(end):
                            return int(master[1])
            except redis.RedisError:
                continue
        return None

    def server(self, port: int) -> RedisServer:
        return next(s for s in self.servers if s.port == port)

    def kill_master(self, key: str) -> tuple[int, float]:
        """SIGKILL the master of ``key``'s slot; its port and when."""
        port = self.master_port(key)
        if port is None:
            raise RuntimeError("no Cluster node answers")
        self.server(port).stop()
        return port, time.monotonic()

    def wait_promotion(self, key: str, old_port: int, killed_at: float, timeout_s: float = 60) -> Promotion:
        """Until a live node names another master for ``key``'s slot and it says it is one."""

        def promoted() -> bool:
            port = self.master_port(key)
            return port is not None and port != old_port and _role(port) == "master"

        _wait(promoted, timeout_s, "the replica's promotion by the Cluster")
        new_port = self.master_port(key)
        assert new_port is not None
        return Promotion(old_port, new_port, killed_at, time.monotonic())

    def fail_over(self, key: str) -> Promotion:
        old, killed_at = self.kill_master(key)
        promotion = self.wait_promotion(key, old, killed_at)
        self.rejoin(promotion)
        return promotion

    def rejoin(self, promotion: Promotion) -> None:
        """The killed master back, empty with its nodes.conf: it rejoins as the new master's replica."""
        server = self.server(promotion.old_port)
        server.start()

        def rejoined() -> bool:
            try:
                return _role(server.port) == "slave" and self._replica_synced(server.port) and self._settled()
            except redis.RedisError:
                return False

        _wait(rejoined, 60, "the old master back as a synced replica")

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


def _cluster_port() -> int:
    """A free port whose Cluster bus port (10,000 above it) is free too."""
    while True:
        port = free_port()
        if port <= 55535 and _free(port + 10000):
            return port


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextmanager
def sentinel_group(folder: Path, down_after_ms: int = 1000) -> Iterator[SentinelGroup]:
    group = SentinelGroup(folder, down_after_ms)
    try:
        group.start()
        yield group
    finally:
        group.stop()


@contextmanager
def cluster_group(folder: Path, node_timeout_ms: int = 1000) -> Iterator[ClusterGroup]:
    group = ClusterGroup(folder, node_timeout_ms)
    try:
        group.start()
        yield group
    finally:
        group.stop()
