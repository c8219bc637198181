"""The docs site's reference pages, made from the code so that they cannot drift: every command
(from the argparse parsers the console scripts run), every metric (from the registries the
processes serve) and every alert (from the rules file), beside the config page
(``config_reference``); and the benchmarks' figures as ``bench/RESULTS.md`` holds them."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from pydantic import BaseModel

from devtools.generate import config_reference

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
RULES = ROOT / "ops" / "prometheus" / "spillway-rules.yml"
RESULTS = ROOT / "bench" / "RESULTS.md"
HELP_WIDTH = 100
MADE_BY = "<!-- Made by `python -m devtools.generate reference` from {what}: edit that, not this page. -->"


def _programs() -> list[tuple[str, str, Callable[[], argparse.ArgumentParser]]]:
    """Each program: its console script, what it is for, and its parser."""
    from functions import cli as function_cli
    from gateway_plugin import cli as gateway_cli
    from warmup import cli as warmup_cli

    return [
        ("spillway-gateway", "the gateway runner and its operator commands", gateway_cli._parser),
        ("spillway-function", "the cloud function's server and its checks", function_cli._parser),
        ("spillway-warmup", "the scheduled warm-up", warmup_cli._parser),
    ]


def _fixed_width(parser: argparse.ArgumentParser) -> None:
    """Help text wrapped at one width, whatever the terminal that makes the page."""
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=HELP_WIDTH)
    for sub in _commands(parser).values():
        _fixed_width(sub)


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_page() -> str:
    lines = [
        "# Commands",
        "",
        MADE_BY.format(what="the commands' parsers"),
        "",
        "Each console script is also a module: `spillway-gateway` is `python -m gateway_plugin`, "
        "`spillway-function` is `python -m functions`, `spillway-warmup` is `python -m warmup`. "
        "Every command takes `--help`.",
    ]
    for script, what, make in _programs():
        parser = make()
        _fixed_width(parser)
        lines += [
            "",
            f"## `{script}`",
            "",
            f"{what.capitalize()}.",
            "",
            "```text",
            parser.format_help().rstrip(),
        ]
        lines.append("```")
        for name, sub in _commands(parser).items():
            lines += ["", f"### `{script} {name}`", "", "```text", sub.format_help().rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _registries() -> Iterator[tuple[str, str, CollectorRegistry]]:
    from functions.metrics import FunctionMetrics
    from gateway_plugin.books.metrics import RunnerMetrics
    from gateway_plugin.config import MetricsSettings, WarmupSettings
    from warmup.report import registry as warmup_registry

    listen, report = _key(MetricsSettings, "listen"), _key(WarmupSettings, "report_file")
    yield "The gateway runner", f"its `metrics.{listen}` (`/metrics`)", RunnerMetrics().registry
    yield "The function", "the function's `/metrics`, beside Triton's own", FunctionMetrics().registry
    yield "The warm-up", f"its report file (`warmup.{report}`)", warmup_registry([], {}, None)


def _key(model: type[BaseModel], name: str) -> str:
    """A config key the page names, checked against the model that reads it."""
    if name not in model.model_fields:
        raise KeyError(f"{model.__name__} has no field {name!r}: the page would name a key that is not read")
    return name


def _label_names(registry: CollectorRegistry, family: Metric) -> tuple[str, ...]:
    """A family's label names, sampled or not. prometheus_client has no public way to ask for them:
    its metric objects keep them in ``_labelnames``, and so do the families a custom collector makes."""
    exposed = family.name + ("_total" if family.type == "counter" else "")
    for owner in (registry._names_to_collectors.get(exposed), registry._names_to_collectors.get(family.name)):
        if names := tuple(getattr(owner, "_labelnames", ())):
            return names
    return tuple(getattr(family, "_labelnames", ()))


def metrics_page() -> str:
    lines = ["# Metrics", "", MADE_BY.format(what="the processes' metric registries")]
    for process, where, registry in _registries():
        lines += ["", f"## {process}", "", f"Served on {where}.", ""]
        lines += ["| metric | type | labels | help |", "| --- | --- | --- | --- |"]
        for family in registry.collect():
            exposed = family.name + ("_total" if family.type == "counter" else "")
            labels = _label_names(registry, family)
            shown = ", ".join(f"`{label}`" for label in labels) or "-"
            text = " ".join(family.documentation.split()).replace("|", "\\|")
            lines.append(f"| `{exposed}` | {family.type} | {shown} | {text} |")
    return "\n".join(lines) + "\n"


def _alerts() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def alerts_page() -> str:
    lines = [
        "# Alerts",
        "",
        MADE_BY.format(what="`ops/prometheus/spillway-rules.yml`"),
        "",
        "The alerting rules Prometheus loads from `ops/prometheus/spillway-rules.yml`; what to do "
        "when each fires is in [its runbook](../operating/alerts.md).",
    ]
    for alert in _alerts():
        name = alert["alert"]
        notes = alert["annotations"]
        lines += ["", f"## `{name}`", ""]
        lines += [f"**Severity** {alert['labels']['severity']}; **for** {alert.get('for', '0m')}.", ""]
        lines += [f"{notes['summary']}.", "", notes["description"], ""]
        lines += ["```promql", alert["expr"].rstrip(), "```", ""]
        lines.append(f"Runbook: [{name}](../operating/alerts.md#{name.lower()}).")
    return "\n".join(lines) + "\n"


def benchmarks_page() -> str:
    """``bench/RESULTS.md`` on the site, its pictures found from the page's place."""
    made_by = MADE_BY.format(what="`bench/RESULTS.md`")
    return made_by + "\n\n" + RESULTS.read_text().replace("](../docs/images/", "](images/")


def files() -> dict[Path, str]:
    return {
        ROOT / "docs" / "benchmarks.md": benchmarks_page(),
        **config_reference.files(),
        REFERENCE / "cli.md": cli_page(),
        REFERENCE / "metrics.md": metrics_page(),
        REFERENCE / "alerts.md": alerts_page(),
    }
