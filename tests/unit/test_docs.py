"""The docs site: it builds with ``mkdocs build --strict`` (no broken link or anchor, no page left
out of the nav), its reference pages are what the code makes now, and README stays the way in."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from devtools.generate import reference, stale
from gateway_plugin.config import SpillwayConfig
from testing.paths import ROOT

README_MOST_LINES = 200
# What the site's build reads from the repository: its config, its pages and what they include.
SITE_SOURCES = ("mkdocs.yml", "docs", "ARCHITECTURE.md", "SECURITY.md")


def _build(where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(where / "site")],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(where)},
    )


def _copy_sources(to: Path) -> Path:
    to.mkdir(parents=True, exist_ok=True)
    for name in SITE_SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, to / name)
        else:
            shutil.copy(source, to / name)
    return to


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = _build(_copy_sources(tmp_path))
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
    assert (tmp_path / "site" / "schema" / "spillway.schema.json").is_file()


def test_a_broken_link_or_an_orphan_page_fails_the_build(tmp_path: Path) -> None:
    """The strict build can fail: a link to a page that is not there, an anchor no heading makes, a
    page no nav entry reaches."""
    planted = {
        "a link to nowhere": ("docs/gateway.md", "\nSee [the missing page](missing.md).\n"),
        "an anchor to nowhere": ("docs/gateway.md", "\nSee [a runbook](operating/alerts.md#nosuchalert).\n"),
        "an orphan page": ("docs/orphan.md", "# Orphan\n"),
    }
    for what, (name, text) in planted.items():
        where = _copy_sources(tmp_path / what.replace(" ", "-"))
        with (where / name).open("a") as page:
            page.write(text)
        built = _build(where)
        assert built.returncode != 0, f"{what} did not fail the build"


def test_the_reference_pages_are_what_the_code_makes() -> None:
    old = stale(reference.files())
    assert not old, (
        f"stale: {[str(p.relative_to(ROOT)) for p in old]}; run python -m devtools.generate reference"
    )


def test_the_reference_covers_every_key_command_and_alert() -> None:
    config = (ROOT / "docs" / "reference" / "config.md").read_text()
    for section in SpillwayConfig.model_fields:
        assert f"## `{section}`" in config, section
    commands = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for name in ("run", "check-config", "config-schema", "apisix-route", "simulate", "costs"):
        assert f"### `spillway-gateway {name}`" in commands, name
    alerts = (ROOT / "docs" / "reference" / "alerts.md").read_text()
    rules = yaml.safe_load((ROOT / "ops" / "prometheus" / "spillway-rules.yml").read_text())["groups"]
    for rule in (rule for group in rules for rule in group["rules"] if "alert" in rule):
        assert f"## `{rule['alert']}`" in alerts, rule["alert"]


def test_every_page_is_in_the_nav() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed: set[str] = set()

    def walk(entries: list[object]) -> None:
        for entry in entries:
            for value in entry.values() if isinstance(entry, dict) else [entry]:
                walk(value) if isinstance(value, list) else listed.add(str(value))

    walk(nav)
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == listed


def test_readme_is_the_way_in() -> None:
    """Short, its two commands first, and every file it links to there."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MOST_LINES
    assert "bash scripts/setup.sh && .venv/bin/python -m devtools demo" in readme
    assert "bash scripts/test.sh" in readme
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).exists(), f"README links to {target}, which is not there"


def test_every_metric_the_rules_and_dashboards_read_is_in_the_reference() -> None:
    """What operators query is what the reference lists (histograms by their family's name)."""
    listed = set(
        re.findall(r"^\| `(spillway_\w+)` \|", (ROOT / "docs" / "reference" / "metrics.md").read_text(), re.M)
    )
    queried = (ROOT / "ops" / "prometheus" / "spillway-rules.yml").read_text()
    queried += "".join(p.read_text() for p in (ROOT / "ops" / "grafana" / "dashboards").glob("*.json"))
    names = {re.sub(r"_(bucket|sum|count)$", "", name) for name in re.findall(r"\bspillway_\w+", queried)}
    missing = sorted(names - listed)
    assert not missing, f"queried but not in docs/reference/metrics.md: {missing}"
