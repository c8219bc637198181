"""SPILLWAY_GPU_METRICS (set in the FC GPU image): the function's Triton runs its metrics port on
loopback with its GPU gauges on, and /spillway/metrics shows them per GPU; off, Triton runs with
no metrics port at all (the Lambda image: no GPU)."""

from __future__ import annotations

from pathlib import Path

from functions.metrics import FunctionMetrics
from functions.settings import FunctionSettings
from functions.sidecar import Sidecar
from testing.function import function_server, model_repository
from testing.http import http, wait_until
from testing.paths import EXAMPLE_MODELS

TOKEN = "gpu-metrics-token-0123456789"
# A page in Triton's format with one GPU: the stand-in for a GPU's gauges (this machine has none,
# so no real tritonserver here exports them).
GPU_PAGE = """\
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-5e1f0c2a"} 0.75
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-5e1f0c2a"} 25769803776
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-5e1f0c2a"} 6442450944
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.5
"""


def _args(env: dict[str, str]) -> list[str]:
    settings = FunctionSettings.from_env({"SPILLWAY_MODEL_REPOSITORY": str(EXAMPLE_MODELS), **env})
    return Sidecar(settings.sidecar_options())._command()[0]


def test_gpu_metrics_turn_on_triton_gpu_gauges_on_a_loopback_port_and_are_off_by_default() -> None:
    off = _args({})
    assert "--allow-metrics=false" in off and not any(a.startswith("--metrics-port") for a in off)
    on = _args({"SPILLWAY_GPU_METRICS": "1"})
    assert "--allow-metrics=true" in on and "--allow-gpu-metrics=true" in on
    assert "--metrics-address=127.0.0.1" in on and any(a.startswith("--metrics-port=") for a in on)


def test_the_gpu_gauges_show_per_gpu_on_the_functions_metrics() -> None:
    metrics = FunctionMetrics()
    metrics.gpu.read(GPU_PAGE)
    page = metrics.render().decode()
    assert 'spillway_function_gpu_utilization{gpu="GPU-5e1f0c2a"} 0.75' in page
    assert 'spillway_function_gpu_memory_used_bytes{gpu="GPU-5e1f0c2a"} 6.442450944e+09' in page
    assert 'spillway_function_gpu_memory_total_bytes{gpu="GPU-5e1f0c2a"} 2.5769803776e+10' in page
    metrics.gpu.read("not { prometheus")
    assert 'gpu="GPU-5e1f0c2a"' in metrics.render().decode(), "a page that does not parse keeps the last"
    many = "".join(f'nv_gpu_utilization{{gpu_uuid="GPU-{i}"}} 0.1\n' for i in range(100))
    metrics.gpu.read(many)
    assert metrics.render().decode().count("spillway_function_gpu_utilization{") == 16, "bounded"


def test_a_real_function_reads_its_tritons_metrics_port_when_gpu_metrics_are_on(tmp_path: Path) -> None:
    """On this machine's CPU the real Triton has no GPU gauges to give: the families are there and
    empty, and the function's Triton runs as the GPU image runs it."""
    repo = model_repository(tmp_path, "add_sub")
    env = {"SPILLWAY_GPU_METRICS": "1", "SPILLWAY_METRICS_TOKEN": TOKEN}
    with function_server(repo, tmp_path, **env) as running:
        cmdline = Path(f"/proc/{running.triton_pid()}/cmdline").read_bytes().split(b"\0")
        assert b"--allow-gpu-metrics=true" in cmdline and b"--metrics-address=127.0.0.1" in cmdline

        def page() -> str:
            status, _, body = http(
                "GET", running.url + "/spillway/metrics", headers={"authorization": f"Bearer {TOKEN}"}
            )
            return body.decode() if status == 200 else ""

        wait_until(lambda: "# TYPE spillway_function_gpu_utilization gauge" in page(), 30, "GPU families")
        assert "spillway_function_gpu_utilization{" not in page(), "no GPU here: no samples"
