"""``python -m gateway_plugin``: the APISIX plugin runner and its operator commands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from gateway_plugin.config import ConfigError, SpillwayConfig, load


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gateway_plugin",
        description="Spillway's APISIX external plugin runner: routes each request to the on-prem "
        "cluster or a cloud function, keeping sensitive data at home.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="serve APISIX's ext-plugin protocol (what ext-plugin.cmd starts)",
        description="Listen on the Unix socket named by APISIX_LISTEN_ADDRESS and answer APISIX's "
        "PrepareConf, HTTPReqCall and HTTPRespCall frames. APISIX starts this itself through "
        "ext-plugin.cmd in its config.yaml.",
    )
    run.add_argument("--config", type=Path, help="spillway.yaml (default: built-in defaults)")
    check = sub.add_parser(
        "check-config",
        help="validate a spillway.yaml and explain it",
        description="Validate a spillway.yaml; a bad field is named by its path. A valid file is "
        "summarised: targets, rules in the order they apply, and what may leave the premises.",
    )
    check.add_argument("file", type=Path)
    split = sub.add_parser(
        "traffic-split",
        help="print the traffic-split rules that send each decision to its upstream",
        description="Print, as JSON, the traffic-split plugin conf for an APISIX route: one rule per "
        "upstream-mode target, matching the X-Spillway-Target value the runner sets (it carries a MAC "
        "under the route token, so clients cannot forge it). Upstream ids are the target names. "
        "Needs the route token in the environment variable the config names (runner.route_token_env).",
    )
    split.add_argument("--config", type=Path, required=True, help="spillway.yaml")
    imp = sub.add_parser(
        "import-targets",
        help="turn Terraform's spillway_targets output into the targets section",
        description="Read `terraform output -json spillway_targets` on standard input and print the "
        "validated `targets:` section of spillway.yaml.",
    )
    imp.add_argument("file", type=Path, nargs="?", help="JSON file (default: standard input)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "import-targets":
            from gateway_plugin.targets_import import import_targets

            raw = args.file.read_text() if args.file else sys.stdin.read()
            print(import_targets(raw), end="")
            return 0
        source = args.file if args.command == "check-config" else args.config
        config = load(source) if source else SpillwayConfig()
        if args.command == "traffic-split":
            return _print_traffic_split(config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        from gateway_plugin.explain import explain

        print(f"{args.file}: valid")
        print(explain(config))
        return 0
    loop = _new_loop(config.runner.uvloop)
    try:
        return loop.run_until_complete(_run(config, args.config))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        loop.close()


def _print_traffic_split(config: SpillwayConfig) -> int:
    import json

    from gateway_plugin.routing.state import GatewayState

    rules = [
        {
            "match": [{"vars": [["http_x_spillway_target", "==", value]]}],
            "weighted_upstreams": [{"upstream_id": name, "weight": 1}],
        }
        for name, value in GatewayState.route_values(config).items()
    ]
    print(json.dumps({"rules": rules}, indent=2))
    return 0


def _new_loop(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


async def until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _run(config: SpillwayConfig, config_path: Path | None) -> int:
    from gateway_plugin.app import RunnerApp
    from gateway_plugin.runner import (
        ConfCache,
        Runner,
        default_ttl,
        serve,
        socket_identity,
        socket_path,
        unlink_if_ours,
    )

    try:
        path = socket_path(os.environ.get("APISIX_LISTEN_ADDRESS") or config.runner.socket)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    app = RunnerApp(config, config_path)
    runner = Runner(app.plugins, ConfCache(ttl_s=config.runner.conf_ttl_s or default_ttl()))
    server = await serve(runner, path, config.runner.socket_group)
    identity = socket_identity(path)
    app.start()
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, app.reload)
    logging.getLogger("spillway.runner").info("listening on %s with plugins %s", path, sorted(runner.plugins))
    try:
        await until_signalled()
    finally:
        app.close()
        server.close()
        for task in list(runner.tasks):
            task.cancel()
        await server.wait_closed()
        unlink_if_ours(path, identity)
    return 0
