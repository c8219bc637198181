"""A readable summary of a valid config: what ``check-config`` prints after "valid"."""

from __future__ import annotations

from gateway_plugin.config import SpillwayConfig, Target
from gateway_plugin.config.thresholds import (
    CPU_UTILIZATION,
    GPU_MEMORY_TOTAL,
    GPU_MEMORY_USED,
    GPU_UTILIZATION,
)
from gateway_plugin.policy.gauges import compiled
from gateway_plugin.targets.urls import masked_url


def _members(config: SpillwayConfig) -> list[str]:
    local, dns = config.local, config.local.discovery.dns
    lines = []
    if dns is not None:
        where = "port from each SRV record" if dns.record == "SRV" else f"metrics port {dns.metrics_port}"
        lines.append(
            f"  and every member {dns.name} names ({dns.record} records, {where}), resolved every "
            f"{dns.period_s:g} s by {dns.resolver or 'the system resolver'}"
        )
    prometheus = local.discovery.prometheus
    if prometheus is not None:
        lines.append(
            f"  members and their load from Prometheus at {masked_url(prometheus.url)}: the series "
            f"{{{prometheus.selector}}}, a member per {prometheus.member_label}, failing when up is 0 or "
            f"its samples are over {prometheus.max_age_s:g} s old (instead of scraping each member)"
        )
    per_member = local.member_parallelism
    if per_member == "model_config":
        capacity = "each member's instances of each model, read from its model configuration"
    elif per_member is not None:
        capacity = f"{per_member:g} per member answering"
    else:
        capacity = f"{local.parallelism} with every member answering, in their share otherwise"
    grace = local.drop_member_after_s
    lines.append(f"  capacity: {capacity}; a member failing {grace:g} s stops counting until it answers")
    return lines


def explain(config: SpillwayConfig) -> str:
    local = config.local
    lines = [
        f"local: {len(local.endpoints)} Triton endpoint(s), latency target {local.latency_target_ms:g} ms, "
        f"scraped every {local.scrape_period_s:g} s (stale after {local.stale_after_s:g} s)",
        *(f"  scrapes {masked_url(e.metrics_url)}" for e in local.endpoints),
        *_members(config),
        *_thresholds(config),
        *_first_tokens(config),
        _health(config),
    ]
    for t in config.targets:
        where = (
            masked_url(t.url or "")
            if t.mode == "upstream"
            else f"{t.function_name} in {t.region or 'default region'}"
        )
        lines.append(
            f"target {t.name}: {t.kind}, {t.mode} mode → {where}; cap {t.concurrency_cap} in flight, "
            f"cold start {t.cold_start_ms:g} ms"
        )
        lines.extend(_unexpected_tokens(t))
    if not config.targets:
        lines.append("no cloud targets: every request stays local")
    for rule in sorted(config.rules, key=lambda r: -r.priority):
        chain = f" → {', '.join(rule.targets)}" if rule.targets else ""
        lines.append(f"rule {rule.name} (priority {rule.priority}): {rule.action}{chain}")
    lines.append("otherwise: overflow over " + (", ".join(t.name for t in config.targets) or "nothing"))
    residency = config.residency
    leaving = ", ".join(residency.cloud_allowed) or "nothing"
    lines.append(
        f"residency: {residency.header} in [{leaving}] may leave; unclassified "
        f"{'may leave' if residency.unclassified_may_leave else 'stays on premises'}"
    )
    lines.append(_content(config))
    shared = config.shared_state
    if shared is not None:
        password = f"from ${shared.password_env}" if shared.password_env else "none"
        lines.append(
            f"shared state: {masked_url(shared.redis_url)} (keys {{{shared.key_prefix}}}:*, password "
            f"{password}), view refreshed every {shared.sync_period_ms} ms; {shared.nodes_expected} "
            f"node(s) expected, each alone keeps 1/{shared.nodes_expected} of every budget and cap"
        )
    return "\n".join(lines)


def _unexpected_tokens(target: Target) -> list[str]:
    """Tokens priced but none expected: a stream is held at less than it will cost until it ends,
    so budgets and caps let more through meanwhile."""
    cost = target.cost
    priced = (
        ("output", "usd_per_output_token", cost.usd_per_output_token, cost.expected_output_tokens),
        ("input", "usd_per_input_token", cost.usd_per_input_token, cost.expected_input_tokens),
    )
    return [
        f"  warning: {name} is priced but cost.expected_{kind}_tokens is 0: a stream is held at less "
        f"than it will cost until it ends; set it to a typical request's"
        for kind, name, price, expected in priced
        if price > 0 and expected == 0
    ]


def _content(config: SpillwayConfig) -> str:
    checks = config.content
    asking = [r.name for r in config.rules if r.content_checks]
    detectors = [*checks.detectors, *checks.patterns] or ["none"]
    where = f"rules {', '.join(asking)} and " if asking else ""
    unreadable = "stay on premises" if checks.unscannable == "stay_home" else "are decided by their label"
    return (
        f"content checks (on {where}routes with content_checks): {', '.join(detectors)} over the text "
        f"inputs of bodies up to {checks.max_scan_bytes} bytes; a match is decided as "
        f"{checks.classify_as!r} and stays on premises; bodies that cannot be read {unreadable}"
    )


_READS = {
    "gpu_utilization": f"{GPU_UTILIZATION} (the busiest GPU's share of time busy)",
    "gpu_memory": f"{GPU_MEMORY_USED} / {GPU_MEMORY_TOTAL} (the fullest GPU's share of its memory)",
    CPU_UTILIZATION: f"{CPU_UTILIZATION} (the CPU use Triton reads from /proc/stat: its host, all cores)",
}
_GPU_OFF = (
    "  Triton exports nv_gpu_* only with a GPU and --allow-gpu-metrics (on by default); where none is "
    "reported the threshold neither starts nor holds overflow"
)


def _thresholds(config: SpillwayConfig) -> list[str]:
    """The thresholds, what each reads, and what the seed design's ``load_aware`` keys became."""
    aliases = config.load_aware
    lines = []
    if aliases is not None and aliases.threshold_gpu_mem is not None:
        lines.append(
            f"  load_aware.threshold_gpu_mem {aliases.threshold_gpu_mem:g} is local.thresholds.gpu_memory "
            f"(limit {aliases.threshold_gpu_mem:g}): {GPU_MEMORY_USED} / {GPU_MEMORY_TOTAL} per GPU"
        )
    if aliases is not None and aliases.threshold_cpu is not None:
        lines.append(
            f"  load_aware.threshold_cpu {aliases.threshold_cpu:g} is local.thresholds.gauges "
            f"[{{metric: {CPU_UTILIZATION}, limit: {aliases.threshold_cpu:g}}}]: the CPU use of each "
            "Triton's host as Triton reads it (all cores, every --metrics-interval-ms), "
            "not the gateway's own CPU"
        )
    specs, limits = compiled(config.thresholds(), config.overflow.enter_ratio, config.overflow.exit_ratio)
    if not specs:
        return ["  overflow: on the latency estimate alone (no local.thresholds)", *lines]
    for spec, limit in zip(specs, limits, strict=True):
        reads = _READS.get(spec.name, f"{spec.metric}, the largest sample per endpoint")
        lines.append(
            f"  overflow also above {spec.name} {limit.enter:g} (until below {limit.exit:g}): {reads}, "
            f"{spec.across} over the endpoints"
        )
    if any(spec.metric.startswith("nv_gpu_") for spec in specs):
        lines.append(_GPU_OFF)
    return lines


def _first_tokens(config: SpillwayConfig) -> list[str]:
    enter, leave = config.overflow.enter_ratio, config.overflow.exit_ratio
    return [
        f"  first token of {model}: target {ms:g} ms, overflow while the cluster's first bytes average "
        f"above {ms * enter:g} ms (until below {ms * leave:g} ms)"
        for model, ms in sorted(config.local.model_ttft_targets_ms.items())
    ]


def _health(config: SpillwayConfig) -> str:
    h = config.local.health
    return (
        f"local health: {h.failures_to_open} failed local answers in a row (5xx, timeout, refused; one "
        f"while the metrics endpoint refuses) or {h.failure_rate:.0%} of the last {h.window} mark a model "
        f"failing: requests that may leave go out warm or cold, the rest get 503 + Retry-After; a probe "
        f"after {h.open_s:g} s (doubling to {h.max_open_s:g} s), home after {h.successes_to_close} "
        f"answered in a row; missing metrics alone keep everything local"
    )
