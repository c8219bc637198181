"""``X-Spillway-Signature`` for requests the gateway sends a target (the key read once per target)."""

from __future__ import annotations

import os

from functions.signature import sign
from gateway_plugin.config import Target


class TargetSigner:
    def __init__(self, target: Target) -> None:
        raw = os.environ.get(target.signing_key_env or "", "") if target.signing_key_env else ""
        self.key = raw.encode() if raw else None
        self.sign_body = target.sign_body

    def header(self, method: str, path: str, body: bytes | None) -> str | None:
        """``None`` when the target has no key (then the function must not require one)."""
        if self.key is None:
            return None
        return sign(self.key, method, path, body if self.sign_body else None)
