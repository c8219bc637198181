"""``bench/fast_path_steps.py`` instruments the fast path's plugin by the statements that end each
step of its access phase: when the plugin changes, these say which step the bench lost, rather
than the bench measuring nothing for it. Nothing here measures time."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from testing.paths import ROOT


def _load() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))  # its own imports: apisix_gateway, harness
    try:
        spec = importlib.util.spec_from_file_location(
            "spillway_bench_steps", ROOT / "bench" / "fast_path_steps.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


steps = _load()


@pytest.mark.parametrize("measure_bytes", [False, True])
def test_every_step_is_found_in_order_inside_the_access_phase(measure_bytes: bool, tmp_path: Path) -> None:
    source = (steps.LUA_DIR / steps.PLUGIN).read_text()
    text = steps.instrument(source, measure_bytes)
    access = text[text.index("function _M.access(conf, ctx)") :]
    access = access[: access.index("\nend\n")]
    assert re.findall(r'__step\("([^"]+)"\)', access) == [name for _, name in steps.STEPS]
    assert text.count("__step(") == len(steps.STEPS) + 1  # and its definition
    if shutil.which("luajit"):
        (tmp_path / "spillway.lua").write_text(text)
        subprocess.run(["luajit", "-bl", str(tmp_path / "spillway.lua")], check=True, capture_output=True)


def test_a_plugin_without_a_step_is_refused() -> None:
    source = (steps.LUA_DIR / steps.PLUGIN).read_text().replace("edge.pin_path(ctx)", "edge.pin(ctx)")
    with pytest.raises(SystemExit, match=re.escape("edge.pin_path(ctx)")):
        steps.instrument(source, False)


def test_the_logs_are_read_per_request_without_each_workers_first_sums(tmp_path: Path) -> None:
    line = (
        "2026/12/06 19:55:00 [warn] {pid}#{pid}: *9 [lua] spillway.lua:1: "
        "SPILLWAY-BENCH-STEPS time {rest}, context: ngx.timer"
    )
    (tmp_path / "round1-fast-local@time-error.log").write_text(
        "\n".join(
            [
                line.format(pid=7, rest="n=10 access=999999 one_reading=5"),  # warm-up: left out
                line.format(pid=7, rest="n=100 access=200000 one_reading=50000"),
                line.format(pid=8, rest="n=1 access=1"),  # the other worker's first
                line.format(pid=8, rest="n=300 access=600000 after_the_steps_(cloud:_signing)=3000"),
            ]
        )
    )
    read = steps.read_logs(tmp_path)["fast-local@time"]
    assert read["requests"] == 400
    assert read["access"] == 2000
    assert read["one reading"] == 125
    assert read[steps.AFTER] == 7.5
