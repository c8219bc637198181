"""The shared store at the edge: Redis (standalone, TLS, Sentinel or Cluster) through redis-py.

A round is one ``EVALSHA`` of the script below, atomic on the server: node liveness, lease
claims, holds and grants, slots, breaker transitions and probe tokens, warm instances, and which
nodes told all their claims since a time (the server's clock). Every key carries
the hash tag ``{prefix}``, so on a Cluster all of them live in one slot and the script may touch
them together. With ``replicas_ack``, an answer is used only once that many replicas hold the
round's writes (``WAIT``): replication is asynchronous, and a failover to a replica that lacks a
grant would lease it again. Every call is bounded by ``timeout_ms`` (connect and read); the
password comes from the environment and is never part of a message.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from gateway_plugin.config import SharedState

ROUND_SCRIPT = r"""
if redis.replicate_commands then redis.replicate_commands() end
local req = cjson.decode(ARGV[1])
local p, me = req.p, req.node
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local function int(x) return string.format('%d', x) end
local function live(node)
  return node == me or redis.call('EXISTS', p .. ':node:' .. node) == 1
end
local born = tonumber(redis.call('GET', p .. ':born'))
if not born then
  born = now
  redis.call('SET', p .. ':born', int(born))
end
local lost = req.born ~= 0 and req.born ~= born
local rounds = p .. ':rounds'
if req.bye == 1 then
  redis.call('DEL', p .. ':node:' .. me)
  redis.call('HDEL', rounds, me)
else
  redis.call('SET', p .. ':node:' .. me, '1', 'PX', req.node_ttl_ms)
  if req.complete == 1 then redis.call('HSET', rounds, me, int(now)) end
end
local told = 0
local seen = redis.call('HGETALL', rounds)
for j = 1, #seen, 2 do
  local at = tonumber(seen[j + 1])
  if at < now - req.node_ttl_ms then
    redis.call('HDEL', rounds, seen[j])
  elseif at >= req.since then
    told = told + 1
  end
end
redis.call('PEXPIRE', rounds, req.node_ttl_ms)
local leases = {}
for i, l in ipairs(req.leases) do
  local k, hk = p .. ':lease:' .. l.key, p .. ':held:' .. l.key
  local fields = redis.call('HGETALL', k)
  local total, mine = 0, 0
  for j = 1, #fields, 2 do
    local v = tonumber(fields[j + 1])
    total = total + v
    if fields[j] == me then mine = v end
  end
  local holds = redis.call('HGETALL', hk)
  for j = 1, #holds, 2 do
    if holds[j] ~= me then total = total + tonumber(holds[j + 1]) end
  end
  local before = mine
  if l.claim > mine or l.release == 1 then
    total = total + l.claim - mine
    mine = l.claim
  end
  total = total + l.hold
  local give = math.min(l.want, l.limit - total)
  if give > 0 and not lost then
    total = total + give
    mine = mine + give
  end
  redis.call('HSET', k, me, int(mine))
  redis.call('PEXPIRE', k, l.ttl_ms + 60000)
  if l.hold > 0 then
    redis.call('HSET', hk, me, int(l.hold))
    redis.call('PEXPIRE', hk, l.ttl_ms + 60000)
  else
    redis.call('HDEL', hk, me)
  end
  leases[i] = {mine, total, before}
end
local slots = {}
for i, s in ipairs(req.slots) do
  local hk, bk = p .. ':slots:' .. s.key, p .. ':busy:' .. s.key
  local fields = redis.call('HGETALL', hk)
  local others = 0
  for j = 1, #fields, 2 do
    if fields[j] ~= me then
      if live(fields[j]) then
        others = others + tonumber(fields[j + 1])
      else
        redis.call('HDEL', hk, fields[j])
        redis.call('HDEL', bk, fields[j])
      end
    end
  end
  local held = math.max(0, math.min(s.want, s.cap - others))
  redis.call('HSET', hk, me, int(held))
  redis.call('HSET', bk, me, int(s.busy))
  local busy = 0
  local counts = redis.call('HGETALL', bk)
  for j = 1, #counts, 2 do
    if counts[j] ~= me then busy = busy + tonumber(counts[j + 1]) end
  end
  redis.call('PEXPIRE', hk, 86400000)
  redis.call('PEXPIRE', bk, 86400000)
  slots[i] = {held, busy}
end
local breakers = {}
for i, b in ipairs(req.breakers) do
  local k = p .. ':breaker:' .. b.target
  local h = redis.call('HMGET', k, 'gen', 'until', 'cooldown')
  local gen, untl, cool = tonumber(h[1]) or 0, tonumber(h[2]) or 0, tonumber(h[3]) or 0
  if b.op == 'open' and b.gen == gen and (untl == 0 or b.now >= untl) then
    if cool == 0 then cool = b.base else cool = math.min(cool * 2, b.max) end
    gen, untl = gen + 1, b.now + cool
    redis.call('HSET', k, 'gen', int(gen), 'until', int(untl), 'cooldown', int(cool))
  elseif b.op == 'close' and b.gen == gen and untl > 0 then
    untl, cool = 0, 0
    redis.call('HSET', k, 'gen', int(gen), 'until', '0', 'cooldown', '0')
  end
  redis.call('PEXPIRE', k, 86400000)
  local granted = 0
  if b.probes > 0 and untl > 0 and b.now >= untl then
    local pk = k .. ':probes:' .. int(gen)
    local used = tonumber(redis.call('GET', pk)) or 0
    granted = math.max(0, math.min(b.probes, b.max_probes - used))
    if granted > 0 then
      redis.call('INCRBY', pk, granted)
      if used == 0 then redis.call('PEXPIRE', pk, b.probe_ttl_ms) end
    end
  end
  breakers[i] = {gen, untl, cool, granted}
end
local warm = {}
for i, w in ipairs(req.warm) do
  local k = p .. ':warm:' .. w.target
  for _, e in ipairs(w.seen) do redis.call('ZADD', k, int(e[2]), e[1]) end
  redis.call('ZREMRANGEBYSCORE', k, '-inf', '(' .. int(w.now - w.ttl_ms))
  local n = redis.call('ZCARD', k)
  if n > w.max then
    redis.call('ZREMRANGEBYRANK', k, 0, n - w.max - 1)
    n = w.max
  end
  redis.call('PEXPIRE', k, w.ttl_ms)
  warm[i] = n
end
return {leases, slots, breakers, warm, {now, told, born}}
"""


def _hosts(spec: str) -> list[tuple[str, int]]:
    hosts = []
    for item in spec.split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{item!r} is not host:port")
        hosts.append((host.strip("[]"), int(port)))
    return hosts


def make_client(settings: SharedState, environ: Mapping[str, str] = os.environ) -> Any:
    """A redis-py client for the URL's kind, with every call bounded; connects lazily."""
    import redis

    timeout = settings.timeout_ms / 1000
    options: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "password": environ.get(settings.password_env) if settings.password_env else None,
        "username": environ.get(settings.username_env) if settings.username_env else None,
    }
    scheme, _, rest = settings.redis_url.partition("://")
    tls = scheme.startswith("rediss")
    if scheme in ("redis", "rediss"):
        return redis.Redis.from_url(settings.redis_url, **options)
    location, _, path = rest.partition("/")
    if scheme.endswith("+cluster"):
        from redis.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode(host, port) for host, port in _hosts(location)]  # type: ignore[no-untyped-call]
        return RedisCluster(startup_nodes=nodes, ssl=tls, **options)
    from redis.sentinel import Sentinel

    master, _, db = path.partition("/")
    if not master:
        raise ValueError("a Sentinel URL names its master: redis+sentinel://host:26379/MASTER/0")
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        _hosts(location),
        sentinel_kwargs={"socket_timeout": timeout, "socket_connect_timeout": timeout, "ssl": tls},
        ssl=tls,
        **options,
    )
    return sentinel.master_for(master, db=int(db or 0))  # type: ignore[no-untyped-call]


def check_url(url: str) -> None:
    """What the config's pattern cannot see: every host:port well formed, a Sentinel's master named."""
    scheme, _, rest = url.partition("://")
    location, _, path = rest.partition("/")
    if scheme.endswith(("+cluster", "+sentinel")):
        _hosts(location)
    if scheme.endswith("+sentinel") and not path.partition("/")[0]:
        raise ValueError("a Sentinel URL names its master: redis+sentinel://host:26379/MASTER/0")


def _promotable(sentinels: Any, master: str) -> int:
    """The replicas the first sentinel that answers would promote: not down, not cut off from it
    (a master lost for good is listed as one, disconnected), read by it (a server just back is
    listed before its INFO says whose replica it is), not of priority 0; 0 if none answers."""
    import redis

    for sentinel in sentinels.sentinels:
        try:
            replicas = sentinel.sentinel_slaves(master)
        except redis.RedisError:
            continue
        return sum(
            1
            for r in replicas
            if not (r["is_sdown"] or r["is_odown"] or r["is_disconnected"])
            and r.get("master-port")
            and r.get("slave-priority") != 0
        )
    return 0


class NotReplicated(RuntimeError):
    """The store answered, but fewer replicas than ``replicas_ack`` hold what it wrote."""


class RedisStore:
    """``shared_sync.Store`` on Redis: one script call per round."""

    def __init__(self, settings: SharedState, environ: Mapping[str, str] = os.environ) -> None:
        self._secrets = [
            value
            for name in (settings.password_env, settings.username_env)
            if name and (value := environ.get(name))
        ]
        self._settings, self._environ = settings, environ
        check_url(settings.redis_url)
        self.client: Any = None
        self._script: Any = None
        self._wait_ms = max(1, settings.timeout_ms // 2)  # within the call's own bound

    def exchange(self, payload: dict[str, Any]) -> list[Any]:
        """One round. The client is made on first use, here on the rounds' thread: a Cluster client
        reaches its nodes as it is made, and a store away at start is a failed round, not a
        runner that cannot start."""
        if self._script is None:
            self.client = make_client(self._settings, self._environ)
            self._script = self.client.register_script(ROUND_SCRIPT)
        key = payload["p"] + ":round"
        reply = self._script(keys=[key], args=[json.dumps(payload)])
        if self._settings.replicas_ack:
            self._replicated(key)
        return reply  # type: ignore[no-any-return]

    def _replicated(self, key: str) -> None:
        """Raise unless ``replicas_ack`` of the master's replicas hold the round's writes (``WAIT``,
        on the connection that ran the script: one rounds thread, so the pool hands the same one
        back; on a Cluster, the master of the key's slot). A master with no replica has none to
        fail over to: nothing to wait for."""
        node = self.client.get_node_from_key(key) if hasattr(self.client, "get_node_from_key") else None
        on = {"target_nodes": node} if node is not None else {}
        wanted = min(self._settings.replicas_ack, self._replicas(on))
        if wanted and int(self.client.execute_command("WAIT", wanted, self._wait_ms, **on)) < wanted:
            raise NotReplicated(
                f"the round's writes reached fewer than {wanted} replica(s) within {self._wait_ms} ms: "
                "a failover now could lose them, so this answer is not used"
            )

    def _replicas(self, on: dict[str, Any]) -> int:
        """The replicas a failover could promote: those connected now (``ROLE``) and those the
        sentinels or the Cluster know and do not hold down. A replica reconnecting (after a blip,
        or just restarted) is not in ``ROLE``, yet a failover may promote it without the writes."""
        role = self.client.execute_command("ROLE", **on)
        connected = len(role[2]) if len(role) > 2 else 0
        pool: Any = getattr(self.client, "connection_pool", None)
        manager = getattr(pool, "sentinel_manager", None)
        if manager is not None:
            return max(connected, _promotable(manager, pool.service_name))
        if on:
            me = self.client.execute_command("CLUSTER", "MYID", **on)
            lines = self.client.execute_command("CLUSTER", "REPLICAS", me, **on)
            flags = [line.split()[2].split(b",") for line in lines]  # "<id> <addr> <flags> ..."
            return max(connected, sum(1 for f in flags if b"fail" not in f))
        return connected

    def describe(self, error: BaseException) -> str:
        """The error as a log line may carry it: its kind and text, never a credential."""
        text = f"{type(error).__name__}: {error}"
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text[:300]

    def may_have_run(self, error: BaseException) -> bool:
        """Whether the round may have run on the store though it failed here: it timed out on the
        way back, or ran and was not replicated (a refused connection ran nothing)."""
        import redis

        return isinstance(error, (NotReplicated, redis.exceptions.TimeoutError))

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
