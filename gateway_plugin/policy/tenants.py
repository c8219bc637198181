"""Tenant names as the gateway keeps them: clients choose them, so every book, lease, summary and
table row carries a bounded key instead of the name itself.

A name of at most ``MAX_TENANT_BYTES`` bytes of printable ASCII is its own key; any other name
(longer, or with a byte outside 0x20-0x7e) is keyed ``sha256:<hex>`` of its bytes. The fast path's
Lua plugin keys names the same way (``spillway/counters.lua`` ``tenant_key``), so a tenant's
books are one whichever route it came through. Printable ASCII only, because a name goes into
JSON both ways between the runner and the plugin: invalid UTF-8 bytes would make a whole summary
or outcome batch unreadable for the runner, and the runner's escape of them (a lone surrogate) a
whole decision table unreadable for the plugin.
"""

from __future__ import annotations

import hashlib
import re

MAX_TENANT_BYTES = 256
_PLAIN = re.compile(r"[\x20-\x7e]*")


def tenant_key(name: str) -> str:
    """The key a tenant's books are kept under. ``name`` as the runner decodes header bytes
    (UTF-8, undecodable bytes as surrogate escapes), so the digest is of the bytes sent."""
    if len(name) <= MAX_TENANT_BYTES and _PLAIN.fullmatch(name):
        return name
    try:
        sent = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no header byte decodes to (a JSON escape): any bytes do
        sent = name.encode("utf-8", "surrogatepass")
    return "sha256:" + hashlib.sha256(sent).hexdigest()
