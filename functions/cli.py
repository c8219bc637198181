"""``python -m functions`` (also ``spillway-function``): serve a function, or try one locally."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from functions.server import PLATFORMS

EXAMPLE_REPOSITORY = Path(__file__).resolve().parent.parent / "examples" / "model_repository"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m functions",
        description="Spillway's cloud function: a Triton sidecar behind a KServe v2 handler.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="serve the function over HTTP (FC custom container, or local development)",
        description="Start Triton as a sidecar and serve the KServe v2 protocol in front of it. "
        "On Alibaba FC this is the container's command; on AWS Lambda use "
        "'python -m awslambdaric functions.aws_lambda.handler' instead.",
    )
    serve.add_argument(
        "--platform",
        choices=PLATFORMS,
        default="local",
        help="aliyun-fc: bind 0.0.0.0 and add /initialize and /invoke; local: bind 127.0.0.1 (default)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("FC_SERVER_PORT") or 9000),
        help="port to listen on (default: $FC_SERVER_PORT, else 9000)",
    )
    serve.add_argument("--host", default=None, help="address to bind (default: by platform)")
    serve.add_argument(
        "--model-repository",
        type=Path,
        default=None,
        help="Triton model repository (default: $SPILLWAY_MODEL_REPOSITORY, else /opt/spillway/models)",
    )
    demo = sub.add_parser(
        "demo",
        help="serve the example model through a local function and answer one inference",
        description="Start a local function with its Triton sidecar on the example add_sub model, "
        "send one inference with tritonclient, print the answer and stop.",
    )
    demo.add_argument(
        "--model-repository",
        type=Path,
        default=EXAMPLE_REPOSITORY,
        help="model repository holding add_sub (default: the bundled example)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from functions.settings import SettingsError

    try:
        if args.command == "serve":
            from functions import server

            host = args.host or ("0.0.0.0" if args.platform == "aliyun-fc" else "127.0.0.1")
            return server.run(args.platform, host, args.port, args.model_repository)
        from functions.demo import run_demo

        return run_demo(args.model_repository)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
