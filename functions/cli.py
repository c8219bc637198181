"""``python -m functions`` (also ``spillway-function``): serve a function."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from functions.serve import PLATFORMS


def serve_command(
    port: int, model_repository: Path | None = None, platform: str = "local", host: str = "127.0.0.1"
) -> list[str]:
    """The command that serves one function with this interpreter: the one way pools, tests and
    benchmarks start a function (the images run the same ``serve`` as their command)."""
    cmd = [
        sys.executable,
        "-m",
        "functions",
        "serve",
        "--platform",
        platform,
        "--host",
        host,
        "--port",
        str(port),
    ]
    return cmd + ([] if model_repository is None else ["--model-repository", str(model_repository)])


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
    sub.add_parser(
        "lambda-runtime",
        help="answer AWS Lambda invocations, streaming generations (a Function URL in RESPONSE_STREAM mode)",
        description="Speak Lambda's runtime API ($AWS_LAMBDA_RUNTIME_API) directly: generate_stream's "
        "events reach the caller as the model makes them; every other invocation is answered whole, as "
        "'python -m awslambdaric functions.aws_lambda.handler' answers it. Settings as for that handler.",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from functions.settings import SettingsError

    if args.command == "lambda-runtime":
        from functions import lambda_stream

        return lambda_stream.main()
    try:
        from functions import serve

        host = args.host or ("0.0.0.0" if args.platform == "aliyun-fc" else "127.0.0.1")
        return serve.run(args.platform, host, args.port, args.model_repository)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
