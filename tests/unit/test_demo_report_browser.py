"""The demo's report as a person sees it: rendered from a small fixed results file, opened in
headless Chromium, its DOM read back and a screenshot checked for charts that are really there.

Chromium comes from Debian's ``chromium`` package (``scripts/setup.sh`` installs it where apt is
available); without it the browser tests skip and say so.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from devtools.demo_report import charts, png_data_uri, report_html, summarize
from devtools.loadgen import Sample

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh installs it)"
)
WINDOW = (1280, 2400)
CHART_IDS = ("latency", "split", "cold", "cost")
PHASES = [("steady", 0.0, 4.0, 10.0), ("burst", 4.0, 10.0, 30.0), ("after", 10.0, 14.0, 10.0)]


def fixed_results(instance_logs: Path) -> dict[str, Any]:
    """A short run's results, the same every time: local answers slow down in the burst, half of
    its public requests spill, the first request on each cloud target meets a cold instance."""
    rng = random.Random(20240607)
    samples, seen = [], set()
    for name, start, end, rate in PHASES:
        at = start + rng.expovariate(rate)
        while at < end:
            sensitive = rng.random() < 0.2
            target = "local"
            if name == "burst" and not sensitive and rng.random() < 0.5:
                target = rng.choice(("aws", "aliyun"))
            cold = target != "local" and target not in seen
            seen.add(target)
            base = 0.05 + (0.2 * (at - start) / (end - start) if name == "burst" and target == "local" else 0)
            latency = base + rng.uniform(0.0, 0.03) + (1.5 if cold else 0.0)
            reason = "local_ok" if target == "local" else "overflow_cold" if cold else "overflow_warm"
            sample = Sample(
                at, name, sensitive, latency, latency * 1000 - 2, 200, target, reason, "i-1", cold
            )
            samples.append(dataclasses.asdict(sample))
            at += rng.expovariate(rate)
    logs = {}
    for target in ("aws", "aliyun"):
        folder = instance_logs / f"instances-{target}"
        folder.mkdir(parents=True, exist_ok=True)
        logs[target] = str(folder)
    return {
        "settings": {"latency_target_ms": 500.0, "pool_max": 2, "warm_instances": 1, "sensitive_share": 0.2},
        "phases": [{"name": n, "start_s": s, "end_s": e, "rate_per_s": r} for n, s, e, r in PHASES],
        "samples": samples,
        "sent": len(samples),
        "answered": len(samples),
        "runner_metrics": {"spend_usd": {"aws": 0.000123, "aliyun": 0.000045}},
        "pools": {},
        "warmup_rounds": [],
        "instance_logs": logs,
    }


@pytest.fixture
def report(tmp_path: Path) -> Path:
    """``results.json`` from the fixed results, and the report made from it as the demo makes it."""
    results = tmp_path / "results.json"
    results.write_text(json.dumps(fixed_results(tmp_path)))
    result = json.loads(results.read_text())
    path = tmp_path / "report.html"
    path.write_text(report_html(result, summarize(result)))
    return path


def _chromium(page: Path, *extra: str) -> str:
    assert CHROMIUM is not None
    profile = page.parent / f"chromium-profile-{len(list(page.parent.glob('chromium-profile-*')))}"
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            *extra,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _busy(image: Image.Image) -> tuple[int, float]:
    """Distinct colours, and the share of pixels that are not near-white."""
    rgb = image.convert("RGB")
    colours = rgb.getcolors(maxcolors=1 << 20) or []
    inked = sum(count for count, (r, g, b) in colours if min(r, g, b) < 235)
    return len(colours), inked / max(1, rgb.width * rgb.height)


def problems(page: Path) -> list[str]:
    """What is wrong with the page as Chromium shows it; empty when every chart is there and drawn."""
    found = []
    dom = _chromium(page, "--dump-dom")
    images = {m.group(1): m.group(0) for m in re.finditer(r'<img[^>]*id="chart-([a-z]+)"[^>]*>', dom)}
    boxes = {}
    for chart in CHART_IDS:
        tag = images.get(chart)
        if tag is None:
            found.append(f"chart {chart}: not in the page")
            continue
        loaded = re.search(r'data-loaded="(\d)"', tag)
        natural = re.search(r'data-natural="(\d+)x(\d+)"', tag)
        box = re.search(r'data-box="(\d+),(\d+),(\d+),(\d+)"', tag)
        if not (loaded and loaded.group(1) == "1" and natural and min(map(int, natural.groups())) > 0):
            found.append(f"chart {chart}: the image did not load ({tag[-120:]})")
        elif box is None or min(int(v) for v in box.groups()[2:]) < 100:
            found.append(f"chart {chart}: no size on the page")
        else:
            left, top, width, height = (int(v) for v in box.groups())
            if top + height > WINDOW[1] or left + width > WINDOW[0]:
                found.append(f"chart {chart}: outside the {WINDOW[0]}x{WINDOW[1]} window")
            else:
                boxes[chart] = (left, top, left + width, top + height)
    shot = page.with_suffix(".png")
    _chromium(page, f"--screenshot={shot}")
    with Image.open(shot) as image:
        colours, inked = _busy(image)
        if colours < 50 or inked < 0.03:
            found.append(f"the page looks blank ({colours} colours, {inked:.1%} inked)")
        for chart, box in boxes.items():
            colours, inked = _busy(image.crop(box))
            if colours < 20 or inked < 0.02:
                found.append(f"chart {chart}: nothing drawn ({colours} colours, {inked:.1%} inked)")
    return found


@needs_chromium
def test_report_shows_every_chart_in_headless_chromium(report: Path) -> None:
    assert problems(report) == []
    dom = _chromium(report, "--dump-dom")
    assert "<h2>Per phase</h2>" in dom and re.search(r"<td>burst</td><td>30</td><td>\d+</td>", dom)
    assert report.with_suffix(".png").stat().st_size > 50_000


@needs_chromium
def test_the_check_sees_a_blank_page_and_a_missing_or_empty_chart(report: Path) -> None:
    """The browser check must fail where a person would see nothing."""
    blank = report.with_name("blank.html")
    blank.write_text("<!doctype html><html><body></body></html>")
    found = problems(blank)
    assert any("looks blank" in p for p in found) and any("not in the page" in p for p in found)

    text = report.read_text()
    broken = report.with_name("broken.html")
    broken.write_text(re.sub(r'(id="chart-split"[^>]*src=")[^"]*', r"\1data:image/png;base64,AAAA", text))
    assert any(p.startswith("chart split: the image did not load") for p in problems(broken))

    white = io.BytesIO()
    Image.new("RGB", (1000, 300), "white").save(white, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(white.getvalue()).decode()
    empty = report.with_name("empty.html")
    empty.write_text(re.sub(r'(id="chart-cost"[^>]*src=")[^"]*', lambda m: m.group(1) + uri, text))
    assert any(p.startswith("chart cost: nothing drawn") for p in problems(empty))


def test_charts_have_labelled_axes_ticks_legends_and_the_phases(tmp_path: Path) -> None:
    result = fixed_results(tmp_path)
    summary = summarize(result)
    made = charts(result, summary)
    assert [key for key, *_ in made] == list(CHART_IDS)
    for key, title, caption, fig in made:
        (ax,) = fig.axes
        assert title and caption
        assert ax.get_xlabel() and ax.get_ylabel(), key
        assert len(ax.get_xticks()) >= 3 and len(ax.get_yticks()) >= 3, key
        assert all(t.get_text() for t in ax.get_yticklabels()), key
        legend = ax.get_legend()
        assert legend is not None and len(legend.get_texts()) >= 2, key
        if key != "cold":
            texts = {t.get_text() for t in ax.texts}
            assert {"steady (10/s)", "burst (30/s)", "after (10/s)"} <= texts, key
        assert png_data_uri(fig).startswith("data:image/png;base64,iVBORw0KGgo"), key
    assert summary["phases"]["steady"]["local_share"] == 1.0
    assert summary["phases"]["burst"]["cloud_share"] > 0.2
    assert summary["cold_hits"] == 2
