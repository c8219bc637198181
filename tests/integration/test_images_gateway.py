"""The gateway image (images/gateway/Dockerfile) built on a stand-in for APISIX's Debian image: the
APISIX 3.18 this machine runs (scripts/install-apisix.sh) on Debian bookworm, laid out as the
official image lays it out. Run as a cluster runs it: its own entrypoint, its own non-root user,
a read-only root with conf, logs and /tmp mounted empty, the example config excerpt and routes
and spillway.yaml mounted, secrets only in the environment. Both routes, the ext-plugin one and
the fast path, decide and answer in front of loopback stand-ins for Triton and a function. What
the stand-in does not prove (OpenResty, the real base's size): images/README.md."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.apisix import ApisixSettings, config_yaml
from devtools.generate import examples
from functions.sidecar import free_port
from testing.apisix import FAST_HOST, needs_apisix
from testing.examples import EXAMPLE_ENVS, example_config, loopback_route
from testing.http import http, wait_until
from testing.images import Built, built_image, container, engine, logs, missing_reason, running
from testing.paths import ROOT
from testing.standins import MetricsFeed, Upstream, metrics_feed, upstream

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(missing_reason()), reason=str(missing_reason())),
    needs_apisix(),  # the stand-in base is made from this machine's APISIX
]

HOME = "/usr/local/apisix"
EXCERPT = ROOT / "examples" / "apisix" / "config-fast-path.yaml"
# What the environment holds and nothing may print: the route token must be the examples' (their
# routes carry its MAC); the rest are this run's own.
SECRETS = {
    "SPILLWAY_ROUTE_TOKEN": examples.EXAMPLE_TOKEN,
    "SPILLWAY_SIGNING_KEY": "gateway-image-key-" + os.urandom(12).hex(),
    "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "AKIA" + os.urandom(8).hex().upper(),
    "AWS_SECRET_ACCESS_KEY": "aws-secret-" + os.urandom(12).hex(),
    "ALIBABA_CLOUD_ACCESS_KEY_ID": "LTAI" + os.urandom(8).hex(),
    "ALIBABA_CLOUD_ACCESS_KEY_SECRET": "fc-secret-" + os.urandom(12).hex(),
}
JSON = {"content-type": "application/json"}
ADD_SUB = "/v2/models/add_sub/infer"


@pytest.fixture(scope="module")
def image() -> Iterator[Built]:
    with built_image("gateway", f"localhost/spillway-test-gateway:{os.getpid()}") as built:
        yield built


@dataclass(frozen=True)
class Gateway:
    url: str
    name: str
    local: Upstream
    aws: Upstream
    feed: MetricsFeed
    metrics_url: str


def apisix_config(config: dict[str, Any], port: int) -> str:
    """The example excerpt (its plugins, runner command, Lua path, shared dict, envs and
    plugin_attr) as a standalone data plane on 127.0.0.1:``port``, with what Debian's nginx needs
    that OpenResty has built in (devtools.apisix.config_yaml: its modules, no HTTP/2)."""
    excerpt = yaml.safe_load(EXCERPT.read_text())
    attr = excerpt["plugin_attr"]
    attr["spillway"]["runner"] = config["outcomes"]["listen"]
    attr["prometheus"]["export_addr"]["port"] = free_port()
    settings = ApisixSettings(
        port=port,
        routes_yaml="",
        runner_cmd=excerpt["ext-plugin"]["cmd"],
        plugins=excerpt["plugins"],
        envs=EXAMPLE_ENVS,
        extra_lua_path=Path(excerpt["apisix"]["extra_lua_path"]).parent,
        shared_dicts=excerpt["nginx_config"]["http"]["custom_lua_shared_dict"],
        plugin_attr=attr,
        trusted_ca=excerpt["apisix"]["ssl"]["ssl_trusted_certificate"],
    )
    # Written for a master started as root; here nginx runs as the image's user.
    return config_yaml(settings).replace("  user: root\n", "")


def routes(config: dict[str, Any]) -> str:
    """Both example routes with their hosts moved to the stand-ins; the fast path's on its own host."""
    ext = yaml.safe_load((examples.OUT / "apisix.yaml").read_text())["routes"][0]
    fast = yaml.safe_load((examples.OUT / "apisix-fast-path.yaml").read_text())["routes"][0]
    made = [loopback_route(ext, config), {**loopback_route(fast, config), "hosts": [FAST_HOST]}]
    return yaml.safe_dump({"routes": made}, sort_keys=False) + "#END\n"


def mounted(folder: Path, name: str, text: str) -> Path:
    """A file the image's user (not this process's) can read, as a mounted ConfigMap is."""
    path = folder / name
    path.write_text(text)
    path.chmod(0o644)
    return path


def options(files: Path, config: dict[str, Any], port: int) -> list[str]:
    """Host network (everything listens on 127.0.0.1 only), a read-only root with empty folders
    mounted on conf and logs as emptyDir mounts them (podman's own tmpfs on /tmp), the files
    mounted read-only on top, the secrets in an environment file (never on a command line)."""
    env_file = files / "secrets.env"
    env_file.write_text("".join(f"{name}={value}\n" for name, value in SECRETS.items()))
    env_file.chmod(0o600)
    conf = f"{HOME}/conf"
    made = {
        f"{conf}/config.yaml": mounted(files, "config.yaml", apisix_config(config, port)),
        f"{conf}/apisix.yaml": mounted(files, "apisix.yaml", routes(config)),
        "/etc/spillway/spillway.yaml": mounted(files, "spillway.yaml", yaml.safe_dump(config)),
    }
    empty = {f"{HOME}/{name}": files / f"empty-{name}" for name in ("conf", "logs")}
    for folder in empty.values():
        folder.mkdir()
        folder.chmod(0o777)
    return [
        "--network=host",
        "--read-only",
        *(f"--volume={source}:{target}:rw" for target, source in empty.items()),
        *(f"--volume={source}:{target}:ro" for target, source in made.items()),
        f"--env-file={env_file}",
    ]


@pytest.fixture(scope="module")
def gateway(image: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    files = tmp_path_factory.mktemp("gateway-files")
    files.chmod(0o755)
    with ExitStack() as stack:
        local = stack.enter_context(upstream("local"))
        aws = stack.enter_context(upstream("aws", instance="fn-1"))
        feed = stack.enter_context(metrics_feed())
        config = example_config(local.url, aws.url, feed.url, f"127.0.0.1:{free_port()}")
        port = free_port()
        name = stack.enter_context(
            container(image.tag, f"spillway-test-gateway-{os.getpid()}", options(files, config, port))
        )
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            if not running(name):
                raise RuntimeError(f"the gateway stopped:\n{logs(name)[-4000:]}")
            try:
                return "x-spillway-decision" in http("POST", url + ADD_SUB, b"{}", JSON, timeout=2)[1]
            except OSError:
                return False

        wait_until(ready, 90, "the gateway deciding on its ext-plugin route")
        metrics = f"http://{config['metrics']['listen']}/metrics"
        yield Gateway(url, name, local, aws, feed, metrics)


def send(gateway: Gateway, classification: str, fast: bool) -> tuple[int, str, dict[str, Any]]:
    """Status, decision header and the stand-in's answer for one inference on either route."""
    headers = {**JSON, "x-data-classification": classification, **({"host": FAST_HOST} if fast else {})}
    status, answer, body = http("POST", gateway.url + ADD_SUB, b"{}", headers)
    return status, answer.get("x-spillway-decision", ""), json.loads(body) if body.startswith(b"{") else {}


def settled(gateway: Gateway, fast: bool, decided: str) -> bool:
    """Five public requests in a row decided so: a new feed reaches the decisions through a scrape
    and the tables after it, and the fast path's first requests may still see the last state."""
    return all(send(gateway, "public", fast)[1].startswith(decided) for _ in range(5))


def test_image_runs_as_its_own_user_with_nothing_secret_in_it(image: Built) -> None:
    config = image.config()
    assert config["User"] == "636:636" and "9080/tcp" in config["ExposedPorts"]
    assert config["Entrypoint"] == ["/opt/spillway/entrypoint.sh"] and config["Cmd"] == ["docker-start"]
    baked = " ".join(config["Env"])
    assert not [name for name in SECRETS if name in baked], baked
    assert re.search(r"spillway-test-gateway:\d+: [\d,]+ bytes \([\d.]+ GB\) uncompressed", image.output)


def test_the_image_runs_the_warmup_as_the_cronjob_runs_it(image: Built, tmp_path: Path) -> None:
    """deploy/kubernetes's warm-up CronJob runs this image with the warm-up's own command, as its
    user, on a read-only root with /tmp and the config mounted: the warm-up reads the deployed
    spillway.yaml and plans its rounds there (``plan``: its ``run`` would ping the cluster's
    functions)."""
    base = ROOT / "deploy" / "kubernetes" / "base"
    cronjob = next(yaml.safe_load_all((base / "warmup-cronjob.yaml").read_text()))
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    container_spec, user = pod["containers"][0], pod["securityContext"]
    command = container_spec["command"]
    python, module = command[0], command[1:3]
    assert module == ["-m", "warmup"] and command[3:5] == ["run", "--once"]
    config = command[command.index("--config") + 1]
    files = tmp_path / "config"
    files.mkdir()
    files.chmod(0o755)
    mounted(files, "spillway.yaml", (base / "config" / "spillway.yaml").read_text())
    planned = engine(
        "podman", "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
        "--user", f"{user['runAsUser']}:{user['runAsGroup']}", "--env", "HOME=/tmp",
        "--volume", f"{files}:{Path(config).parent}:ro", "--entrypoint", python,
        image.tag, *module, "plan", "--config", config,
    )  # fmt: skip
    plans = [json.loads(line) for line in planned.stdout.splitlines()]
    assert [(p["event"], p["target"]) for p in plans] == [("plan", "aws")], planned.stdout + planned.stderr


@pytest.mark.parametrize("fast", [False, True], ids=["ext-plugin", "fast-path"])
def test_each_route_decides_and_answers(gateway: Gateway, fast: bool) -> None:
    """Kept on premises when quiet or confidential, spilled to the function when Triton queues:
    each answered by the stand-in Spillway chose, 200."""
    gateway.feed.queue_ms = 0
    wait_until(lambda: settled(gateway, fast, "local;"), 30, "a quiet cluster kept")
    status, decision, body = send(gateway, "public", fast)
    assert (status, body["upstream"]) == (200, "local"), decision
    gateway.feed.queue_ms = 500
    wait_until(lambda: settled(gateway, fast, "aws;"), 30, "a busy cluster spilling")
    status, decision, body = send(gateway, "public", fast)
    assert (status, body["upstream"]) == (200, "aws"), decision
    assert body["headers"].get("x-spillway-signature"), "signed with the key from the environment"
    status, decision, body = send(gateway, "confidential", fast)
    assert (status, body["upstream"]) == (200, "local") and decision.startswith("local;"), decision


def test_the_runner_counts_its_decisions(gateway: Gateway) -> None:
    text = http("GET", gateway.metrics_url)[2].decode()
    assert re.search(r'spillway_decisions_total\{[^}]*target="aws"[^}]*\} [1-9]', text), text[-2000:]


def test_every_process_runs_as_the_image_user_on_a_read_only_root(gateway: Gateway) -> None:
    users = engine("podman", "top", gateway.name, "user", "args").stdout.splitlines()[1:]
    assert any("gateway_plugin run" in line for line in users), users
    assert {line.split()[0] for line in users} <= {"apisix", "636"}, users
    inspected = engine("podman", "inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", gateway.name)
    assert inspected.stdout.strip() == "true"
    denied = engine("podman", "exec", gateway.name, "touch", f"{HOME}/apisix/x", check=False)
    assert denied.returncode != 0 and "Read-only file system" in denied.stderr


def test_no_secret_reaches_the_logs(gateway: Gateway) -> None:
    """Checked last, after every request above: the logs hold them (access log and error log go to
    the container's output) and none of the environment's secrets."""
    text = logs(gateway.name)
    assert ADD_SUB in text, text[-2000:]
    leaked = [name for name, value in SECRETS.items() if len(value) > 9 and value in text]
    assert not leaked, leaked
