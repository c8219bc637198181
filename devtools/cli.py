"""``python -m devtools``: the development tools (a source checkout with the ``dev`` extra).

``demo`` runs the whole hybrid on one machine; ``devgateway`` serves a stand-in for APISIX in front
of a real runner; ``function-demo`` serves one function and answers one inference;
``python -m devtools.generate`` writes the files code makes (dashboards, the fast path's Lua
contract, the APISIX examples). None of this ships in the packages or the images.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from devtools.devgateway import DevGatewaySettings, OutcomeLogger
from gateway_plugin.config import SpillwayConfig

EXAMPLE_REPOSITORY = Path(__file__).resolve().parent.parent / "examples" / "model_repository"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devtools", description=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="run the whole hybrid locally: on-prem Triton, runner, warm function pools, a burst",
        description="Start, on loopback: an on-prem Triton with a small capacity, the runner behind a "
        "gateway (a real Apache APISIX when installed, else the development gateway), two cloud targets "
        "(local pools of function instances with their own Triton sidecars), the warm-up pinger, and a "
        "load generator (steady, a burst, steady; a share labelled confidential). Shows live progress, "
        "then writes results.json and report.html to --out.",
    )
    demo.add_argument(
        "--out", type=Path, default=None, help="folder for the report (default: ./spillway-demo-<time>)"
    )
    demo.add_argument("--short", action="store_true", help="a shorter run (the end-to-end test's)")
    demo.add_argument("--burst-rps", type=float, default=None, help="burst arrival rate (default 30/s)")
    demo.add_argument(
        "--gateway",
        choices=("apisix", "dev", "auto"),
        default="auto",
        help="apisix: a real Apache APISIX (scripts/install-apisix.sh; $SPILLWAY_APISIX_PREFIX); dev: the "
        "development gateway; auto (default): APISIX when installed, else dev",
    )
    dev = sub.add_parser(
        "devgateway",
        help="a local HTTP stand-in for APISIX in front of a real runner",
        description="Start the runner as APISIX would (APISIX_LISTEN_ADDRESS set, ext-plugin.cmd style), "
        "then serve HTTP: each request goes through the runner and on to the upstream that "
        "X-Spillway-Target selects, as traffic-split would. Not a production gateway.",
    )
    dev.add_argument(
        "--config",
        type=Path,
        required=True,
        help="spillway.yaml plus a `devgateway` section (listen, upstreams, plugins)",
    )
    fn = sub.add_parser(
        "function-demo",
        help="serve the example model through a local function and answer one inference",
        description="Start a local function with its Triton sidecar on the example add_sub model, "
        "send one inference with tritonclient, print the answer and stop.",
    )
    fn.add_argument(
        "--model-repository",
        type=Path,
        default=EXAMPLE_REPOSITORY,
        help="model repository holding add_sub (default: the bundled example)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from devtools.demo_cli import run_demo

        return run_demo(args.out, args.short, args.burst_rps, args.gateway)
    if args.command == "function-demo":
        from devtools.function_demo import run_demo as run_function_demo

        return run_function_demo(args.model_repository)
    return _devgateway_command(args.config)


def _devgateway_command(path: Path) -> int:
    from pydantic import ValidationError

    from gateway_plugin.config import ConfigError, parse

    raw: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    section = raw.pop("devgateway", {})
    try:
        config = parse(raw, str(path))
        settings = DevGatewaySettings.model_validate(section)
    except (ConfigError, ValidationError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="spillway-devgateway-"))
    runner_config = work / "spillway.yaml"
    runner_config.write_text(yaml.safe_dump(raw))
    sock = work / "runner.sock"
    runner = subprocess.Popen(
        [sys.executable, "-m", "gateway_plugin", "run", "--config", str(runner_config)],
        env={**os.environ, "APISIX_LISTEN_ADDRESS": f"unix:{sock}"},
    )
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_devgateway(config, settings, sock, runner))
    finally:
        runner.terminate()
        runner.wait(10)
        loop.close()


def _outcomes(config: SpillwayConfig) -> OutcomeLogger | None:
    """The runner's outcome endpoint, as the route's http-logger would post to it."""
    from gateway_plugin.books.outcomes import auth_header
    from gateway_plugin.config.secrets import GatewaySecrets
    from gateway_plugin.outcome_listener import PATH

    token = GatewaySecrets.read(config).route_token
    if not config.outcomes.listen or token is None:
        return None
    url = f"http://{config.outcomes.listen}{PATH}"
    return OutcomeLogger(url, auth_header(token), config.tenants.header)


async def _devgateway(
    config: SpillwayConfig, settings: DevGatewaySettings, sock: Path, runner: subprocess.Popen[bytes]
) -> int:
    from devtools.apisix_peer import ApisixPeer
    from devtools.devgateway import DevGateway
    from functions import http_server
    from gateway_plugin.books.state import GatewayState
    from gateway_plugin.cli import until_signalled
    from gateway_plugin.config.secrets import GatewaySecrets

    log = logging.getLogger("spillway.devgateway")
    for _ in range(200):
        if sock.exists() or runner.poll() is not None:
            break
        await asyncio.sleep(0.05)
    if not sock.exists():
        print("error: the runner did not start; see its log above", file=sys.stderr)
        return 1
    values = GatewayState.route_values(config, GatewaySecrets.read(config))
    gateway = DevGateway(settings, ApisixPeer(sock), values, _outcomes(config))
    host, _, port = settings.listen.rpartition(":")
    server = await http_server.serve(gateway.handle, host or "127.0.0.1", int(port), settings.max_body_bytes)
    log.info(
        "development gateway (a stand-in for APISIX) on http://%s; upstreams %s",
        settings.listen,
        settings.upstreams,
    )
    await until_signalled()
    server.close()
    await gateway.close()
    return 0
