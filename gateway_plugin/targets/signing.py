"""``X-Spillway-Signature`` for requests the gateway sends a target (the key read once per target)."""

from __future__ import annotations

import os

from functions.signature import sign
from gateway_plugin.config import ConfigError, Target


class TargetSigner:
    def __init__(self, target: Target) -> None:
        name = target.signing_key_env
        raw = os.environ.get(name, "") if name else ""
        if raw and not raw.strip():
            raise ConfigError(
                f"target {target.name!r}: {name} holds a blank signing key; set a random key of 32 bytes "
                "or more, or unset it if the function requires no signature"
            )
        self.key = raw.encode() if raw else None
        self.sign_body = target.sign_body

    def header(self, method: str, path: str, body: bytes | None) -> str | None:
        """``None`` when the target has no key (then the function must not require one)."""
        if self.key is None:
            return None
        return sign(self.key, method, path, body if self.sign_body else None)
