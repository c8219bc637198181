"""What one request costs on a cloud target, from the target's price model.

Lambda bills requests and GB-seconds (and, for image functions, the init phase of a cold start);
FC bills compute units and active GPU time: both fit requests + memory-seconds + GPU-seconds;
an endpoint that bills tokens adds a price per generated token and per prompt token.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from gateway_plugin.config import TargetCost

# A prompt's tokens as its bytes count them: about four bytes a token for English text under the
# common BPE tokenizers (a JSON body's framing counts too). The gateway has no model's tokenizer.
BYTES_PER_INPUT_TOKEN = 4


def input_tokens(body_bytes: float | None) -> float | None:
    """The prompt tokens a request body of ``body_bytes`` is counted as (None: its size unknown)."""
    return None if body_bytes is None else float(math.ceil(max(0.0, body_bytes) / BYTES_PER_INPUT_TOKEN))


def request_cost_usd(cost: TargetCost, cold: bool = False, cold_start_ms: float = 0.0) -> float:
    """The price at decision, from what an answer is expected to take."""
    ms = cost.expected_duration_ms + (cold_start_ms if cold and cost.billed_init else 0.0)
    return answer_cost_usd(cost, ms / 1000, cost.expected_output_tokens)


def answer_cost_usd(
    cost: TargetCost, seconds: float, tokens: float = 0.0, prompt_tokens: float | None = None
) -> float:
    """What an answer that took ``seconds`` and generated ``tokens`` is billed, with a prompt of
    ``prompt_tokens`` (None: the expected ones) (a stream, settled when it ends; the platforms round
    billed time up to the millisecond)."""
    per_request, per_second, per_token, _, per_input, expected_input = stream_price(cost)
    billed_s = math.ceil(max(0.0, seconds) * 1000 - 1e-9) / 1000
    prompt = expected_input if prompt_tokens is None else prompt_tokens
    return per_request + billed_s * per_second + tokens * per_token + prompt * per_input


def stream_price(cost: TargetCost) -> tuple[float, float, float, float, float, float]:
    """A stream's bill as the fast path's plugin settles it: USD per request, per second billed,
    per generated token, the generated tokens expected where none were counted, per prompt token,
    and the prompt tokens expected where the body's size is unknown."""
    per_second = cost.memory_gb * cost.usd_per_gb_second + cost.usd_per_gpu_second
    return (
        cost.usd_per_request,
        per_second,
        cost.usd_per_output_token,
        cost.expected_output_tokens,
        cost.usd_per_input_token,
        cost.expected_input_tokens,
    )


def warm_ping_cost_usd(cost: TargetCost, dwell_ms: float) -> float:
    """One warm-up ping: a billed request holding its instance for the dwell (what the plan prices
    and what the warm-up's report counts as spent)."""
    return cost.usd_per_request + (dwell_ms / 1000) * (
        cost.memory_gb * cost.usd_per_gb_second + cost.usd_per_gpu_second
    )


def monthly_warm_cost_usd(cost: TargetCost, instances: int, pings_per_hour: float, dwell_ms: float) -> float:
    """Keeping ``instances`` warm: ``instances`` pings every round, a 30-day month of rounds."""
    return warm_ping_cost_usd(cost, dwell_ms) * instances * pings_per_hour * 24 * 30


MONTH_S = 30 * 24 * 3600


def monthly_provisioned_cost_usd(cost: TargetCost, kind: str, instances: int) -> float | None:
    """Keeping ``instances`` provisioned a 30-day month, billed per second used or not: Lambda's
    provisioned GB-second price, FC's idle-instance price; None when the price is not configured
    (0), so an unknown price is never shown as free. Requests served on them are billed besides."""
    per_second = (
        cost.memory_gb * cost.usd_per_provisioned_gb_second
        if kind == "aws_lambda"
        else cost.usd_per_idle_second
    )
    if kind not in ("aws_lambda", "aliyun_fc") or per_second <= 0:
        return None
    return per_second * instances * MONTH_S


class PeakFleet(NamedTuple):
    gpus: int
    usd: float
    saved_pct: float


def peak_fleet(
    spent_usd: float, hours: float, gpus: int, usd_per_gpu_hour: float, peak_rps: float, local_peak_rps: float
) -> PeakFleet | None:
    """What serving the busiest window at home would have cost: the cluster serves at most what it
    served in its busiest window (it spills only when full), so the peak takes
    ``ceil(gpus x peak / local peak)`` GPUs for the whole period; and how much less was spent
    (``spent_usd``: the cluster and the clouds together). None when a figure is missing."""
    if not (gpus and usd_per_gpu_hour and hours and peak_rps and local_peak_rps):
        return None
    needed = max(gpus, math.ceil(gpus * peak_rps / local_peak_rps - 1e-9))
    fleet = needed * usd_per_gpu_hour * hours
    return PeakFleet(needed, fleet, 100 * (1 - spent_usd / fleet))
