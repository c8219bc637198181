"""The runner's metric families as a fresh ``RunnerMetrics`` registers them: the attribute the
code reaches each by, its name, type, help, labels and buckets, in registration order (the order
``/metrics`` lists them). Dashboards, alerts, recording rules and the bill read these names and
labels; this holds them to ``runner_metrics.jsonl``, line for line. A family changed on purpose
changes that file with it (``python -m tests.unit.test_runner_metrics`` writes it anew)."""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path
from typing import Any

from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from gateway_plugin.books.families import FAMILIES_AFTER_COST, FAMILIES_BEFORE_COST
from gateway_plugin.books.metrics import RunnerMetrics

EXPECTED = Path(__file__).with_name("runner_metrics.jsonl")


def _bound(value: float) -> float | str:
    return "+Inf" if math.isinf(value) else value


def _described(collector: Collector) -> list[dict[str, Any]]:
    """What a collector exposes, read before anything is observed (so from the wrapper's own fields:
    a labelled family has no samples to read its labels from yet)."""
    if isinstance(collector, MetricWrapperBase):
        bounds = getattr(collector, "_upper_bounds", None)
        return [
            {
                "name": collector._name,
                "type": collector._type,
                "help": collector._documentation,
                "labels": list(collector._labelnames),
                "buckets": None if bounds is None else [_bound(b) for b in bounds],
            }
        ]
    return [
        {
            "name": family.name,
            "type": family.type,
            "help": family.documentation,
            # A collector that declares its label names has no samples to read them from yet.
            "labels": list(getattr(collector, "labelnames", ()))
            or sorted({k for s in family.samples for k in s.labels if k != "le"}),
            "buckets": [s.labels["le"] for s in family.samples if "le" in s.labels] or None,
        }
        for family in collector.collect()
    ]


def families() -> list[dict[str, Any]]:
    metrics = RunnerMetrics()
    owners = {id(v): k for k, v in vars(metrics).items()}
    owners |= {id(v): f"cost.{k}" for k, v in vars(metrics.cost).items()}
    collectors = list(metrics.registry._collector_to_names)
    return [{"attr": owners.get(id(c))} | f for c in collectors for f in _described(c)]


def test_the_families_are_as_dashboards_and_alerts_read_them() -> None:
    expected = [json.loads(line) for line in EXPECTED.read_text().splitlines()]
    assert families() == expected


def test_every_family_is_reached_by_an_attribute() -> None:
    assert all(f["attr"] is not None for f in families())


def test_each_attribute_is_of_the_type_the_class_declares() -> None:
    """The tables build the attributes; the class's annotations are what the type checker reads:
    the two name the same attributes, of the same kinds."""
    declared = typing.get_type_hints(RunnerMetrics)
    metrics = RunnerMetrics()
    built = {f.attr for f in (*FAMILIES_BEFORE_COST, *FAMILIES_AFTER_COST)} | {"cost"}
    assert set(declared) == built
    wrong = {
        a: type(getattr(metrics, a))
        for a, kind in declared.items()
        if not isinstance(getattr(metrics, a), kind)
    }
    assert not wrong, wrong


if __name__ == "__main__":
    EXPECTED.write_text("".join(json.dumps(f) + "\n" for f in families()))
