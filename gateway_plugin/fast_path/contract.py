"""What the runner and the ``spillway`` Lua plugin must agree on, declared once.

The Lua half reads these from ``spillway/contract.lua``, which ``python -m devtools
fast-path-contract`` writes from this module (and the table's schema, ``spillway/table_schema.lua``,
from ``table_model``); a test fails when either file is stale. Change a value here, regenerate,
and both halves move together.
"""

from __future__ import annotations

from typing import Final

from gateway_plugin.books.outcomes import AUTH_LABEL
from gateway_plugin.config.secrets import MIN_TOKEN_LEN
from gateway_plugin.content.checks import Unscannable

# The decision table's format: a plugin refuses a table of any other.
FORMAT: Final = 7
# The reason of a decision made without a usable table (the plugin's fail-safe).
FAIL_SAFE: Final = "table_stale"

# The runner's loopback endpoints the plugin calls (outcome_listener serves them).
ALIVE_PATH: Final = "/spillway/alive"
TABLE_PATH: Final = "/spillway/table"
OUTCOMES_PATH: Final = "/spillway/fast-outcomes"

# The nginx shared dict the plugin keeps its table and counters in (config.yaml declares it).
SHARED_DICT: Final = "spillway"

# The shared dict's keys: prefixes (a name follows) and whole keys.
KEY_PREFIXES: Final = {
    "in_flight": "if:",  # a target's requests in flight
    "in_flight_cold": "ifc:",  # of those, the ones sent towards a cold start
    "spent": "sp:",  # a target's cumulative spend
    "probe": "pr:",  # a half-open target's probe taken
    "tenant_in_flight": "tif:",  # a tenant's requests in flight
    "local_in_flight": "lif:",  # a model's requests at the cluster
    "local_probe": "lpr:",  # a failing cluster's probe taken
    "hot": "hot:",  # a model's overflow flag, as last decided
    "content_match": "cm:",  # requests a detector kept home
    "content_unscannable": "cu:",  # requests found unreadable, per reason
    "table": "table:",  # the table's text, per size class
    "alive": "alive:",  # what the runner last said of itself
}
KEYS: Final = {
    "table_class": "table_class",  # the size class the table is stored under
    "version": "version",  # tables fetched (a worker compiles a new one when it grows)
    "fail_safe": "failsafe",  # decisions made without a usable table
    "dropped": "dropped",  # outcomes not reported
    "store_failed": "store_failed",  # tables the dict had no room for
    "malformed": "malformed",  # tables refused
    "node": "node",  # this node's id
}

# Why a body could not be read: the plugin reports its counts under these names only.
UNSCANNABLE: Final = {r.name.lower(): r.value for r in Unscannable}

# The route token: the plugin refuses a shorter one, as the runner does (config.secrets), and
# both sign the outcome endpoint's Authorization with it over AUTH_LABEL (books.outcomes).
TOKEN_RULES: Final = {"min_len": MIN_TOKEN_LEN, "auth_label": AUTH_LABEL}


def constants() -> dict[str, object]:
    """Everything above, as ``spillway/contract.lua`` holds it."""
    return {
        "FORMAT": FORMAT,
        "FAIL_SAFE": FAIL_SAFE,
        "PATH": {"alive": ALIVE_PATH, "table": TABLE_PATH, "outcomes": OUTCOMES_PATH},
        "DICT": SHARED_DICT,
        "PREFIX": dict(KEY_PREFIXES),
        "KEY": dict(KEYS),
        "UNSCANNABLE": dict(UNSCANNABLE),
        "TOKEN": dict(TOKEN_RULES),
    }
