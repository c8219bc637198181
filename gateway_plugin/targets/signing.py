"""``X-Spillway-Signature`` for requests the gateway sends a target, with the key its edge read
(``config.secrets``)."""

from __future__ import annotations

from functions.signature import sign


class TargetSigner:
    def __init__(self, key: bytes | None, sign_body: bool = True) -> None:
        self.key = key
        self.sign_body = sign_body

    def header(self, method: str, path: str, body: bytes | None) -> str | None:
        """``None`` when the target has no key (then the function must not require one)."""
        if self.key is None:
            return None
        return sign(self.key, method, path, body if self.sign_body else None)
