"""A static render of a Grafana dashboard: every panel's queries run against a real Prometheus'
HTTP API over a time range and drawn with matplotlib, in the dashboard's layout, with each panel's
unit, thresholds and legends. For the docs' pictures and the demo's report (Grafana itself is
not packaged here).

    python -m devtools.dashboard_render --prometheus http://127.0.0.1:9090 \\
        --dashboard ops/grafana/dashboards/spillway-gateway.json --minutes 5 --out gateway.png
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from devtools.prometheus import Prometheus

_SCALE = {"percentunit": (100.0, "%"), "s": (1.0, "s"), "reqps": (1.0, "req/s"), "currencyUSD": (1.0, "USD")}


def _label(metric: dict[str, str], legend: str) -> str:
    text = legend
    for key, value in metric.items():
        text = text.replace("{{" + key + "}}", value)
    return text.replace("{{", "").replace("}}", "")


def render(prometheus: Prometheus, dashboard: Path, start: float, end: float, out: Path) -> list[str]:
    """Draw ``dashboard`` from ``start`` to ``end``; the titles of the panels that had no data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    board = json.loads(dashboard.read_text())
    panels = board["panels"]
    rows = max(p["gridPos"]["y"] // 8 for p in panels) + 1
    figure = plt.figure(figsize=(16, 3.2 * rows), dpi=80)
    grid = figure.add_gridspec(rows, 24, hspace=0.6, wspace=2.0)
    step = max(1.0, (end - start) / 200)
    # The grid ends at ``end``: a counter that got its second sample in the last step has a rate
    # there, and nowhere earlier.
    start = end - step * math.floor((end - start) / step)
    minutes = end - start > 300
    empty = []
    for panel in panels:
        pos = panel["gridPos"]
        axes = figure.add_subplot(grid[pos["y"] // 8, pos["x"] : pos["x"] + pos["w"]])
        unit = panel["fieldConfig"]["defaults"]["unit"]
        scale, suffix = _SCALE.get(unit, (1.0, ""))
        had = False
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "1m")
            for series in prometheus.query_range(expr, start, end, step):
                points = [(float(t) - end, float(v) * scale) for t, v in series["values"] if v != "NaN"]
                if points:
                    had = True
                    xs, ys = zip(*points, strict=True)
                    shown_xs = [x / 60 for x in xs] if minutes else list(xs)
                    axes.plot(shown_xs, ys, label=_label(series["metric"], target["legendFormat"]))
        for step_ in panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1:]:
            axes.axhline(step_["value"] * scale, color=step_["color"], linestyle="--", linewidth=1)
        axes.set_title(panel["title"], fontsize=9)
        axes.set_ylabel(suffix or unit, fontsize=8)
        axes.set_xlabel("minutes before the end" if minutes else "seconds before the end", fontsize=7)
        axes.tick_params(labelsize=7)
        if had:
            axes.legend(fontsize=6, loc="upper left")
        else:
            empty.append(panel["title"])
            axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
    figure.suptitle(board["title"], fontsize=12)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, bbox_inches="tight")
    plt.close(figure)
    return empty


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prometheus", required=True)
    parser.add_argument("--dashboard", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    prometheus = Prometheus(0, [], Path("."), url=args.prometheus.rstrip("/"))
    end = time.time()
    empty = render(prometheus, args.dashboard, end - args.minutes * 60, end, args.out)
    print(f"{args.out}: drawn; panels without data: {', '.join(empty) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
