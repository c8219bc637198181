"""``local.thresholds:`` (and the seed design's ``load_aware:`` keys): gauges Triton exports that make
the cluster count as overflowing once one crosses its limit, besides the latency estimate.

A GPU whose memory is nearly full, or whose compute is saturated by other tenants of the machine,
is overloaded before its queue shows it. Each threshold is read from every endpoint's scrape: within
an endpoint, the largest of its samples (its busiest GPU: the one its next request may land on);
across endpoints, the largest by default (APISIX's round robin sends every endpoint its share
whatever the others' load, so one endpoint past its limit is enough), or the mean where the
operator balances by load.

An LLM engine is saturated before its GPU says so: requests wait for KV-cache blocks. ``engine``
reads the waiting queue and the KV-cache use that the engine's Triton backend exports, with the
Gateway API Inference Extension's saturation defaults (5 waiting, 80 % of the KV cache).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, GetJsonSchemaHandler, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from gateway_plugin.config.model import Model

GPU_UTILIZATION = "nv_gpu_utilization"
GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
CPU_UTILIZATION = "nv_cpu_utilization"

Across = Literal["max", "mean"]
Backend = Literal["vllm", "tensorrt_llm"]

# What each engine's Triton backend exports (metric, labels a sample must carry): vLLM's backend
# re-exports vLLM's scheduler gauges; TensorRT-LLM's backend (25.03 and later for "fraction") its own.
WAITING: dict[str, tuple[str, dict[str, str]]] = {
    "vllm": ("vllm:num_requests_waiting", {}),
    "tensorrt_llm": ("nv_trt_llm_request_metrics", {"request_type": "waiting"}),
}
KV_CACHE: dict[str, tuple[str, dict[str, str]]] = {
    "vllm": ("vllm:gpu_cache_usage_perc", {}),
    "tensorrt_llm": ("nv_trt_llm_kv_cache_block_metrics", {"kv_cache_block_type": "fraction"}),
}


class Limit(Model):
    """Spill above ``limit``; stop below ``exit`` (default: ``limit`` x overflow.exit_ratio /
    overflow.enter_ratio, the latency estimate's own gap), else keep: the latency's hysteresis."""

    limit: float = Field(ge=0, description="the cluster overflows above this")
    exit: float | None = Field(default=None, ge=0, description="and stops below this")
    across: Across = Field(default="max", description="over the endpoints: max (default) or mean")
    # What a bare number may be, in the published schema (None: the model takes none).
    BARE: ClassVar[dict[str, Any] | None] = {"type": "number", "minimum": 0}

    @model_validator(mode="before")
    @classmethod
    def _bare(cls, data: object) -> object:
        """A bare number is the limit (``gpu_memory: 0.9``)."""
        return {"limit": data} if isinstance(data, int | float) and not isinstance(data, bool) else data

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """Editors and validators take the bare number the model takes."""
        written = handler(schema)
        if cls.BARE is None:
            return written
        model = handler.resolve_ref_schema(written)
        described = {"description": model["description"]} if "description" in model else {}
        return {**described, "anyOf": [cls.BARE, model]}

    @model_validator(mode="after")
    def _hysteresis(self) -> Limit:
        if self.exit is not None and self.exit > self.limit:
            raise ValueError(f"exit {self.exit:g} must not exceed limit {self.limit:g}, or overflow flaps")
        return self


class Share(Limit):
    limit: float = Field(ge=0, le=1, description="a share, 0 to 1: the cluster overflows above this")
    BARE: ClassVar[dict[str, Any] | None] = {"type": "number", "minimum": 0, "maximum": 1}


class GaugeLimit(Limit):
    """Any gauge the endpoints' scrape carries, by name (its samples matching ``labels``)."""

    metric: str = Field(
        min_length=1,
        max_length=200,
        pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
        description="the gauge's Prometheus metric name, as the endpoints' scrape carries it",
    )
    labels: dict[str, str] = Field(default_factory=dict, description="label → value the sample must have")
    BARE: ClassVar[dict[str, Any] | None] = None


class Engine(Model):
    """An LLM engine's own load, read from its backend's gauges on the endpoints' scrape."""

    backend: Backend = Field(description="vllm or tensorrt_llm: whose gauge names to read")
    waiting: Limit | None = Field(
        default_factory=lambda: Limit(limit=5),
        description="requests waiting in the engine's queue, its busiest model's (null: not read)",
    )
    kv_cache: Share | None = Field(
        default_factory=lambda: Share(limit=0.8), description="the KV cache's share in use (null: not read)"
    )
    model: str | None = Field(
        default=None, max_length=200, description="read only this model's samples (label model)"
    )

    def gauges(self) -> list[GaugeLimit]:
        """The engine's limits as the gauges they read."""
        wanted = {"model": self.model} if self.model else {}
        made = []
        for limit, (metric, labels) in (
            (self.waiting, WAITING[self.backend]),
            (self.kv_cache, KV_CACHE[self.backend]),
        ):
            if limit is not None:
                made.append(GaugeLimit(metric=metric, labels=labels | wanted, **limit.model_dump()))
        return made


class Thresholds(Model):
    gpu_utilization: Share | None = Field(
        default=None, description=f"{GPU_UTILIZATION}: the busiest GPU's share of time busy"
    )
    gpu_memory: Share | None = Field(
        default=None, description=f"{GPU_MEMORY_USED} / {GPU_MEMORY_TOTAL}: the fullest GPU's share"
    )
    gauges: list[GaugeLimit] = Field(default_factory=list, max_length=32, description="any other gauge")
    engine: Engine | None = Field(
        default=None, description="an LLM engine's waiting queue and KV-cache use (vllm, tensorrt_llm)"
    )

    @property
    def any(self) -> bool:
        return bool(self.gpu_utilization or self.gpu_memory or self.gauges or self.engine)

    @model_validator(mode="after")
    def _read_once(self) -> Thresholds:
        self.all_gauges()
        return self

    def all_gauges(self) -> list[GaugeLimit]:
        """``gauges`` and the engine's, each metric and labels once."""
        extra = self.engine.gauges() if self.engine is not None else []
        named = {(g.metric, tuple(sorted(g.labels.items()))) for g in self.gauges}
        for gauge in extra:
            if (gauge.metric, tuple(sorted(gauge.labels.items()))) in named:
                raise ValueError(
                    f"local.thresholds.engine and a gauges entry both read {gauge.metric}: keep one"
                )
        return [*self.gauges, *extra]


class LoadAware(Model):
    """The seed design's keys, kept so its configs port: each is one of ``local.thresholds``."""

    threshold_cpu: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description=f"the Triton host's CPU utilisation ({CPU_UTILIZATION}, all cores, from /proc/stat): "
        f"local.thresholds.gauges [{{metric: {CPU_UTILIZATION}, limit: ...}}]",
    )
    threshold_gpu_mem: float | None = Field(
        default=None, ge=0, le=1, description="local.thresholds.gpu_memory.limit"
    )


def merged(thresholds: Thresholds, aliases: LoadAware | None) -> Thresholds:
    """``local.thresholds`` with the aliases added; one named both ways is refused (which wins?)."""
    if aliases is None:
        return thresholds
    memory, gauges = thresholds.gpu_memory, list(thresholds.gauges)
    if aliases.threshold_gpu_mem is not None:
        if memory is not None:
            raise ValueError(
                "load_aware.threshold_gpu_mem and local.thresholds.gpu_memory both set the GPU memory "
                "limit: keep one (local.thresholds.gpu_memory also takes exit and across)"
            )
        memory = Share(limit=aliases.threshold_gpu_mem)
    if aliases.threshold_cpu is not None:
        if any(g.metric == CPU_UTILIZATION for g in gauges):
            raise ValueError(
                f"load_aware.threshold_cpu and a local.thresholds.gauges entry for {CPU_UTILIZATION} "
                "both set the CPU limit: keep one"
            )
        gauges.append(GaugeLimit(metric=CPU_UTILIZATION, limit=aliases.threshold_cpu))
    return Thresholds(
        gpu_utilization=thresholds.gpu_utilization, gpu_memory=memory, gauges=gauges, engine=thresholds.engine
    )
