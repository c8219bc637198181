"""``shared_state:`` in spillway.yaml: where several gateways (and runner workers) share their state."""

from __future__ import annotations

from pydantic import Field, field_validator

from gateway_plugin.config.model import Model

SHARED_STATE_SCHEMES = (
    "redis",
    "rediss",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
)


class SharedState(Model):
    """Several gateways (and runner workers) sharing budgets, breakers, warm pools and caps in Redis."""

    redis_url: str = Field(
        description="redis://host:6379/0, rediss:// (TLS), redis+sentinel://h1:26379,h2:26379/master/0 "
        "or redis+cluster://host:7000; no password here: it comes from password_env"
    )
    key_prefix: str = Field(
        default="spillway",
        pattern=r"^[A-Za-z0-9_.:-]{1,64}$",
        description="every key is {key_prefix}:... (one Redis Cluster slot); the gateways that share "
        "state use the same one",
    )
    sync_period_ms: int = Field(default=100, ge=10, le=10_000, description="how old the local view may get")
    nodes_expected: int = Field(
        default=1, ge=1, le=1000, description="gateways sharing the state; each gets 1/N while Redis is away"
    )
    timeout_ms: int = Field(default=200, ge=10, le=10_000, description="bound on every Redis call")
    lease_share: float = Field(
        default=0.02,
        gt=0,
        le=1,
        description="share of a budget or quota leased to a node at once (at most one block per node "
        "stays unused)",
    )
    replicas_ack: int = Field(
        default=0,
        ge=0,
        le=16,
        description="replicas (of those a failover could promote) that must hold a round's writes before "
        "the node uses its answer (Redis WAIT): 1 with Sentinel or Cluster, so a failover cannot lose a "
        "lease a node already spends",
    )
    username_env: str | None = Field(default=None, description="environment variable holding the ACL user")
    password_env: str | None = Field(
        default="SPILLWAY_REDIS_PASSWORD", description="environment variable holding Redis's password"
    )

    @property
    def node_ttl_ms(self) -> int:
        """How long the store counts a node, and what it holds, after its last round."""
        return max(3000, 30 * self.sync_period_ms)

    @field_validator("redis_url")
    @classmethod
    def _url(cls, value: str) -> str:
        scheme, sep, rest = value.partition("://")
        if not sep or scheme not in SHARED_STATE_SCHEMES:
            raise ValueError(f"the scheme must be one of {', '.join(SHARED_STATE_SCHEMES)}")
        if "@" in rest.split("/", 1)[0]:
            raise ValueError(
                "credentials do not belong in the URL (it is logged and shown): put the password in "
                "the environment variable named by password_env"
            )
        if not rest.split("/", 1)[0]:
            raise ValueError("the URL names no host")
        return value
