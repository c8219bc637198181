"""``python -m gateway_plugin``: the APISIX plugin runner and its operator commands."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from gateway_plugin import bill
from gateway_plugin.config import ConfigError, SpillwayConfig, load
from gateway_plugin.simulation import command as simulation

if TYPE_CHECKING:
    from gateway_plugin.worker_group import WorkerLink


# What a command's parser is added to.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gateway_plugin",
        description="Spillway's APISIX external plugin runner: routes each request to the on-prem "
        "cluster or a cloud function, keeping sensitive data at home.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Each command adds its own parser, in the order --help lists them.
    commands = (
        _add_run,
        _add_check_config,
        _add_config_schema,
        _add_apisix_route,
        _add_apisix_lua_path,
        _add_import_targets,
    )
    for add in (*commands, simulation.add_parser, bill.add_parser):
        add(sub)
    return parser


def _add_run(sub: Commands) -> None:
    run = sub.add_parser(
        "run",
        help="serve APISIX's ext-plugin protocol (what ext-plugin.cmd starts)",
        description="Listen on the Unix socket named by APISIX_LISTEN_ADDRESS and answer APISIX's "
        "PrepareConf, HTTPReqCall and HTTPRespCall frames. APISIX starts this itself through "
        "ext-plugin.cmd in its config.yaml. With runner.workers > 1 (and a shared_state section), this "
        "process binds the socket and keeps that many worker processes accepting on it.",
    )
    run.add_argument("--config", type=Path, help="spillway.yaml (default: built-in defaults)")


def _add_check_config(sub: Commands) -> None:
    check = sub.add_parser(
        "check-config",
        help="validate a spillway.yaml and explain it",
        description="Validate a spillway.yaml; a bad field is named by its path. A valid file is "
        "summarised: targets, rules in the order they apply, and what may leave the premises.",
    )
    check.add_argument("file", type=Path)


def _add_config_schema(sub: Commands) -> None:
    sub.add_parser(
        "config-schema",
        help="print the JSON Schema of spillway.yaml (for editors and CI validators)",
        description="Print the JSON Schema (draft 2020-12) of spillway.yaml, made from the models the "
        "runner loads it with. Editors read it through a first line such as '# yaml-language-server: "
        "$schema=spillway.schema.json'; any JSON-Schema validator checks a file against it. Checks a "
        "schema cannot express (regular expressions that compile, rules naming declared targets) are "
        "still made by check-config.",
    )


def _add_apisix_route(sub: Commands) -> None:
    route = sub.add_parser(
        "apisix-route",
        help="print the APISIX route that puts Spillway in front of the cluster",
        description="Print the route, made from spillway.yaml: spillway-edge reads each request once "
        "(see apisix-lua-path); ext-plugin-pre-req runs the runner; traffic-split sends each decision to "
        "its upstream, matching the spillway_upstream variable the edge sets from the runner's decision "
        "(no client can write it); http-logger reports each outcome to the runner. JSON is the Admin "
        "API's route object (PUT /apisix/admin/routes/<id>); yaml is standalone mode's conf/apisix.yaml. "
        "Needs the route token in the environment variable the "
        "config names (runner.route_token_env).",
    )
    route.add_argument("--config", type=Path, required=True, help="spillway.yaml")
    route.add_argument("--format", choices=("json", "yaml"), default="json", help="default: json")
    route.add_argument("--id", default="spillway", help="the route's id (default: spillway)")
    route.add_argument("--uri", default="/v2/*", help="the route's uri (default: /v2/*)")
    _add_route_plugins(route)
    _add_route_push(route)


def _add_route_plugins(route: argparse.ArgumentParser) -> None:
    """What the route holds beyond the runner: the fast path, an IAM function URL, authentication,
    APISIX's exporter, content checks, and which node it matches."""
    route.add_argument(
        "--fast-path",
        action="store_true",
        help="the fast path's route: the spillway Lua plugin decides inside APISIX from the runner's "
        "decision table (upstream-mode targets only); see apisix-lua-path",
    )
    route.add_argument(
        "--lambda-iam",
        metavar="TARGET",
        default=None,
        help="serve this aws_lambda target through APISIX's aws-lambda plugin (SigV4 to an AWS_IAM "
        "function URL) instead of traffic-split",
    )
    route.add_argument(
        "--auth",
        metavar="PLUGIN",
        default=None,
        help="the APISIX plugin that authenticates consumers on this route (key-auth, jwt-auth, ...); "
        "Spillway decides after it and, with tenants.source: consumer, takes the tenant from it",
    )
    route.add_argument(
        "--prometheus",
        action="store_true",
        help="add APISIX's own prometheus plugin to the route (its exporter: plugin_attr.prometheus, "
        "127.0.0.1:9091, clear of the runner's metrics.listen)",
    )
    route.add_argument(
        "--content-checks",
        action="store_true",
        help="read the text inputs of each request that would leave (spillway.yaml's content: detectors; "
        "a match keeps it on premises): the route's conf gets content_checks",
    )
    route.add_argument(
        "--node-port",
        type=int,
        metavar="PORT",
        default=None,
        help="match only requests to the APISIX node listening on PORT: several nodes on one host, "
        "each runner with its own outcome port, need a route each (on hosts of their own, one serves all)",
    )


def _add_route_push(route: argparse.ArgumentParser) -> None:
    """Where the route goes instead of standard output: APISIX's Admin API."""
    route.add_argument(
        "--push",
        metavar="ADMIN_URL",
        default=None,
        help="put the route through APISIX's Admin API at this origin (http://127.0.0.1:9180) instead "
        "of printing it: every node on the same etcd serves it. The key comes from the environment",
    )
    route.add_argument(
        "--admin-key-env",
        default="APISIX_ADMIN_KEY",
        help="the variable holding the Admin API key (default: APISIX_ADMIN_KEY; never APISIX's default key)",
    )


def _add_apisix_lua_path(sub: Commands) -> None:
    lua = sub.add_parser(
        "apisix-lua-path",
        help="print the directory to name in APISIX's extra_lua_path (Spillway's Lua plugins)",
        description="Print the directory holding Spillway's Lua plugins shipped with this package: "
        "apisix/plugins/spillway.lua (the fast path) and spillway-edge.lua (the ext-plugin route's "
        'edge; both routes need it). In APISIX\'s config.yaml: apisix.extra_lua_path: "<dir>/?.lua", '
        "'spillway' and 'spillway-edge' in plugins, nginx_config.http.custom_lua_shared_dict: "
        "{spillway: 10m}, the route "
        "token's variable in nginx_config.envs, and plugin_attr.spillway.runner set to the runner's "
        "outcomes.listen. --config prints that whole config.yaml excerpt instead.",
    )
    lua.add_argument("--config", type=Path, help="spillway.yaml: print the config.yaml excerpt for it")


def _add_import_targets(sub: Commands) -> None:
    imp = sub.add_parser(
        "import-targets",
        help="turn Terraform's spillway_targets output into the targets section",
        description="Read `terraform output -json spillway_targets` on standard input and print the "
        "validated `targets:` section of spillway.yaml.",
    )
    imp.add_argument("file", type=Path, nargs="?", help="JSON file (default: standard input)")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "simulate":
        return simulation.run(args)
    if args.command == "costs":
        return bill.run(args)
    if args.command == "config-schema":
        from gateway_plugin.config.schema import schema_text

        print(schema_text(), end="")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "import-targets":
            from gateway_plugin.targets_import import import_targets

            raw = args.file.read_text() if args.file else sys.stdin.read()
            print(import_targets(raw), end="")
            return 0
        if args.command == "apisix-lua-path" and args.config is None:
            from gateway_plugin.fast_path.route import lua_path

            print(lua_path())
            return 0
        source = args.file if args.command == "check-config" else args.config
        config = load(source) if source else SpillwayConfig()
        if args.command == "apisix-lua-path":
            return _print_lua_config(config)
        if args.command == "apisix-route":
            return _print_route(config, args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "check-config":
        from gateway_plugin.explain import explain

        print(f"{args.file}: valid")
        print(explain(config))
        return 0
    from gateway_plugin.worker_group import WorkerLink

    link = WorkerLink.from_env()
    if link is None and config.runner.workers > 1:
        return _supervise(config, args.config)
    if link is not None:
        signal.pthread_sigmask(
            signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD}
        )
    loop = _new_loop(config.runner.uvloop)
    try:
        return loop.run_until_complete(_run(config, args.config, link))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        loop.close()


def _print_lua_config(config: SpillwayConfig) -> int:
    import yaml

    from gateway_plugin.apisix_route import RouteError
    from gateway_plugin.fast_path.route import config_snippet

    try:
        print(yaml.safe_dump(config_snippet(config), sort_keys=False), end="")
    except RouteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _print_route(config: SpillwayConfig, args: argparse.Namespace) -> int:
    from gateway_plugin.apisix_route import RouteError, admin_json, route, standalone_yaml
    from gateway_plugin.config.secrets import GatewaySecrets, RouteTokenError
    from gateway_plugin.fast_path.route import fast_route, invoke_targets

    fmt, route_id, uri, auth, lambda_iam = args.format, args.id, args.uri, args.auth, args.lambda_iam
    fast_path: bool = args.fast_path
    overrides = {"content_checks": True} if args.content_checks else None
    try:
        token = GatewaySecrets.read(config).require_route_token()
        if fast_path:
            if lambda_iam is not None:
                raise RouteError(
                    "--lambda-iam and --fast-path do not combine: aws-lambda needs the ext-plugin route"
                )
            fast_id = route_id if route_id != "spillway" else "spillway-fast"
            made = fast_route(config, token, fast_id, uri, overrides, auth=auth, prometheus=args.prometheus)
            if invoke_targets(config):
                print(
                    f"note: targets {invoke_targets(config)} are in invoke mode, which the fast path does "
                    "not serve; this route's chain leaves them out (the ext-plugin route reaches them)",
                    file=sys.stderr,
                )
        else:
            made = route(config, token, route_id, uri, lambda_iam, auth, overrides, args.prometheus)
    except (RouteError, RouteTokenError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.node_port is not None:
        made["vars"] = [["server_port", "==", str(args.node_port)]]
    if args.push is not None:
        return _push(args.push, made, args.admin_key_env)
    print(admin_json(made) if fmt == "json" else standalone_yaml(made), end="")
    return 0


def _push(admin: str, made: dict[str, object], key_env: str) -> int:
    from gateway_plugin.apisix_admin import AdminError, put_route

    try:
        print(put_route(admin, made, os.environ, key_env))
    except AdminError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
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


def _supervise(config: SpillwayConfig, config_path: Path | None) -> int:
    from gateway_plugin.config.secrets import GatewaySecrets
    from gateway_plugin.runner import socket_path
    from gateway_plugin.worker_group import supervise

    try:
        path = socket_path(os.environ.get("APISIX_LISTEN_ADDRESS") or config.runner.socket)
        secrets = GatewaySecrets.read(config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return supervise(config, config_path, path, secrets)


async def _run(config: SpillwayConfig, config_path: Path | None, link: WorkerLink | None = None) -> int:
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
    app = RunnerApp(config, config_path, worker=None if link is None else link.worker)
    runner = Runner(app.plugins, ConfCache(ttl_s=config.runner.conf_ttl_s or default_ttl()))
    if link is None:
        server = await serve(runner, path, config.runner.socket_group)
        identity: tuple[int, int] | None = socket_identity(path)
    else:
        listening, channel = link.sockets()
        server, identity = await serve(runner, path, sock=listening), None
        app.take_outcomes(channel)
    app.start()
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, app.reload)
    logging.getLogger("spillway.runner").info("listening on %s with plugins %s", path, sorted(runner.plugins))
    try:
        await until_signalled()
    finally:
        server.close()
        calls = list(runner.tasks)
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await app.aclose()
        await server.wait_closed()
        if identity is not None:
            unlink_if_ours(path, identity)
    return 0
