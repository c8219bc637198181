"""The function's settings, read from its environment once at start.

A plain dataclass rather than a pydantic model: it is read before the sidecar starts, and the
sidecar must start before anything heavy is imported.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from functions.sidecar import SidecarOptions

IMAGE_MODEL_REPOSITORY = "/opt/spillway/models"
LAMBDA_MAX_BODY_BYTES = 6 * 1024 * 1024
FC_MAX_BODY_BYTES = 32 * 1024 * 1024


class SettingsError(ValueError):
    """An environment variable has a value the function cannot use."""


@dataclass(frozen=True)
class HttpLimits:
    """What one client may hold of the HTTP server (FC and local): every read is timed, every buffer
    and the number of connections bounded."""

    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 75.0
    body_timeout_s: float = 30.0
    max_connections: int = 1024
    max_pipelined: int = 16

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HttpLimits:
        return cls(
            max_header_bytes=_whole(env, "SPILLWAY_MAX_HEADER_BYTES", cls.max_header_bytes),
            max_headers=_whole(env, "SPILLWAY_MAX_HEADERS", cls.max_headers),
            header_timeout_s=_number(env, "SPILLWAY_HEADER_TIMEOUT_S", cls.header_timeout_s),
            idle_timeout_s=_number(env, "SPILLWAY_IDLE_TIMEOUT_S", cls.idle_timeout_s),
            body_timeout_s=_number(env, "SPILLWAY_BODY_TIMEOUT_S", cls.body_timeout_s),
            max_connections=_whole(env, "SPILLWAY_MAX_CONNECTIONS", cls.max_connections),
        )


@dataclass(frozen=True)
class FunctionSettings:
    model_repository: Path
    models: tuple[str, ...]
    ready_timeout_s: float = 9.0
    max_body_bytes: int = FC_MAX_BODY_BYTES
    request_timeout_s: float = 60.0
    deadline_margin_s: float = 0.2
    signing_key: bytes | None = None
    allow_unsigned_payload: bool = False
    triton_http_port: int = 0
    access_log_headers: tuple[str, ...] | None = None
    expose_statistics: bool = False
    expose_model_config: bool = False
    triton_env: tuple[str, ...] = ()
    replay_cache_entries: int = 500_000
    http: HttpLimits = HttpLimits()
    # Lets a scraper read /spillway/metrics with "Authorization: Bearer <token>" instead of a signature.
    metrics_token: bytes | None = None

    def sidecar_options(self) -> SidecarOptions:
        return SidecarOptions(
            self.model_repository,
            self.models,
            self.ready_timeout_s,
            self.triton_http_port,
            expose_statistics=self.expose_statistics,
            expose_model_config=self.expose_model_config,
            env_names=self.triton_env,
        )

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        model_repository: str | None = None,
        default_max_body: int = FC_MAX_BODY_BYTES,
    ) -> FunctionSettings:
        env = os.environ if env is None else env
        repo = Path(model_repository or env.get("SPILLWAY_MODEL_REPOSITORY") or IMAGE_MODEL_REPOSITORY)
        if not repo.is_dir():
            raise SettingsError(
                f"model repository {repo} is not a directory: set SPILLWAY_MODEL_REPOSITORY "
                "or pass --model-repository"
            )
        models = tuple(m.strip() for m in env.get("SPILLWAY_MODELS", "").split(",") if m.strip())
        return cls(
            model_repository=repo,
            models=models or discover_models(repo),
            ready_timeout_s=_number(env, "SPILLWAY_READY_TIMEOUT_S", 9.0),
            max_body_bytes=int(_number(env, "SPILLWAY_MAX_BODY_BYTES", default_max_body)),
            request_timeout_s=_number(env, "SPILLWAY_REQUEST_TIMEOUT_S", 60.0),
            deadline_margin_s=_number(env, "SPILLWAY_DEADLINE_MARGIN_MS", 200.0) / 1000,
            signing_key=_signing_key(env),
            allow_unsigned_payload=_flag(env, "SPILLWAY_ALLOW_UNSIGNED_PAYLOAD"),
            triton_http_port=int(_number(env, "SPILLWAY_TRITON_HTTP_PORT", 0, allow_zero=True)),
            access_log_headers=_access_log(env),
            expose_statistics=_flag(env, "SPILLWAY_EXPOSE_STATISTICS"),
            expose_model_config=_flag(env, "SPILLWAY_EXPOSE_MODEL_CONFIG"),
            metrics_token=_metrics_token(env),
            triton_env=_triton_env(env),
            replay_cache_entries=_whole(env, "SPILLWAY_REPLAY_CACHE_ENTRIES", 500_000),
            http=HttpLimits.from_env(env),
        )


def discover_models(repo: Path) -> tuple[str, ...]:
    """Every folder of the repository that holds a ``config.pbtxt``: those are loaded and awaited."""
    return tuple(sorted(p.parent.name for p in repo.glob("*/config.pbtxt")))


def _number(env: Mapping[str, str], name: str, default: float, allow_zero: bool = False) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not math.isfinite(value):
        raise SettingsError(f"{name}={raw!r} must be a finite number")
    if value < 0 or (value == 0 and not allow_zero):
        raise SettingsError(f"{name}={raw!r} must be greater than zero")
    return value


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    value = _number(env, name, default)
    if value != int(value):
        raise SettingsError(f"{name}={env[name]!r} must be a whole number")
    return int(value)


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise SettingsError(f"{name}={raw!r} is not a boolean: use 1/0, true/false, yes/no or on/off")


def _signing_key(env: Mapping[str, str]) -> bytes | None:
    """The key from exactly one source: literal, file, or an AWS Secrets Manager secret."""
    sources = [
        n
        for n in (
            "SPILLWAY_SIGNING_KEY",
            "SPILLWAY_SIGNING_KEY_FILE",
            "SPILLWAY_SIGNING_KEY_SECRET_ARN",
            "SPILLWAY_SIGNING_KEY_SECRET_NAME",
        )
        if env.get(n)
    ]
    if len(sources) > 1:
        raise SettingsError(f"set only one of {', '.join(sources)}")
    if not sources:
        return None
    name, value = sources[0], env[sources[0]]
    if name == "SPILLWAY_SIGNING_KEY":
        key = value
    elif name == "SPILLWAY_SIGNING_KEY_FILE":
        try:
            key = Path(value).read_text().strip()
        except OSError as exc:
            raise SettingsError(f"SPILLWAY_SIGNING_KEY_FILE={value}: {exc.strerror}") from None
    elif name == "SPILLWAY_SIGNING_KEY_SECRET_ARN":
        key = _aws_secret(value)
    else:
        raise SettingsError(
            "SPILLWAY_SIGNING_KEY_SECRET_NAME (Alibaba KMS) cannot be read by this version; refusing to "
            "start without the signature check: mount the key as a file and set SPILLWAY_SIGNING_KEY_FILE"
        )
    if not key.strip():
        raise SettingsError(f"{name} gives a blank signing key; set a random key of 32 bytes or more")
    return key.encode()


def _metrics_token(env: Mapping[str, str]) -> bytes | None:
    """Prometheus cannot sign; a bearer token that opens /spillway/metrics alone, at least 16
    characters (a guessable one would publish the function's counters)."""
    token = env.get("SPILLWAY_METRICS_TOKEN", "").strip()
    if not token:
        return None
    if len(token) < 16:
        raise SettingsError("SPILLWAY_METRICS_TOKEN is shorter than 16 characters; set a random token")
    return token.encode()


def _aws_secret(arn: str) -> str:
    """Read once at init, with the function's own role (granted on this secret only)."""
    try:
        import boto3
    except ImportError:
        raise SettingsError(
            "SPILLWAY_SIGNING_KEY_SECRET_ARN needs boto3 in the image: pip install boto3"
        ) from None
    try:
        # A session of its own: boto3's default one keeps the first credentials it resolved.
        client = boto3.session.Session().client("secretsmanager")
        secret = client.get_secret_value(SecretId=arn)
    except Exception as exc:  # botocore's errors are many; the init must fail with the reason
        raise SettingsError(f"cannot read the signing key from {arn}: {exc}") from None
    return str(secret.get("SecretString") or "").strip()


def _access_log(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """``SPILLWAY_ACCESS_LOG=1`` logs every request; ``SPILLWAY_ACCESS_LOG_HEADERS`` adds headers to it."""
    headers = tuple(
        h.strip().lower() for h in env.get("SPILLWAY_ACCESS_LOG_HEADERS", "").split(",") if h.strip()
    )
    return headers if headers or _flag(env, "SPILLWAY_ACCESS_LOG") else None


def _triton_env(env: Mapping[str, str]) -> tuple[str, ...]:
    """Extra variables Triton and the models may see; the signing key is never one of them."""
    names = tuple(n.strip() for n in env.get("SPILLWAY_TRITON_ENV", "").split(",") if n.strip())
    refused = [n for n in names if n.startswith("SPILLWAY_SIGNING_KEY")]
    if refused:
        raise SettingsError(
            f"SPILLWAY_TRITON_ENV names {', '.join(refused)}: the signing key never reaches Triton or "
            "model code; remove it from the list"
        )
    return names
