"""The seam between Python and Lua: everything the runner and the Lua plugins (``spillway``,
``spillway-edge``) must spell alike, in one place.

Each value is declared once on the Python side, where the Python code uses it (a header's name in
``functions.contract``, a reason in ``policy.model``, a logger's variable in ``books.outcomes``);
this module gathers them, and ``spillway/contract.lua`` is generated from it (``python -m devtools.generate
fast-path-contract``; the table's schema, ``spillway/table_schema.lua``, from ``table_model``). A
test fails while either file is stale, and when a Lua file spells one of these values itself.
"""

from __future__ import annotations

from typing import Final

from functions.contract import HEADER_COLD, HEADER_DECISION, HEADER_INSTANCE, HEADER_SIGNATURE, HEADER_TARGET
from gateway_plugin.books.ledger import HOUR, STREAM_SUFFIX
from gateway_plugin.books.outcomes import AUTH_LABEL, TENANT_VAR, TOKENS_VAR, UPSTREAM_VAR, WORKER_VAR
from gateway_plugin.config.secrets import MIN_TOKEN_LEN
from gateway_plugin.content.checks import Unscannable
from gateway_plugin.costs import BYTES_PER_INPUT_TOKEN
from gateway_plugin.fast_path.summary import FastOutcomes
from gateway_plugin.policy.admission import CRITICAL, DEADLINE_SYNTAX, SHEDDABLE
from gateway_plugin.policy.model import (
    DECISION_SEP,
    LABEL_SEP,
    LOCAL,
    RULE_PREFIX,
    SATURATED,
    SHED,
    Reason,
    RuleAction,
)
from gateway_plugin.policy.overflow import WAIT_TAIL
from gateway_plugin.policy.snapshot import BreakerState
from gateway_plugin.request import audit
from gateway_plugin.request.header_names import (
    FRAMING,
    HEADER_CONSUMER,
    HEADER_TENANT,
    HEADER_WORKER,
    OWN_PREFIX,
)

# The decision table's format: a plugin refuses a table of any other.
FORMAT: Final = 10
# The reason of a decision made without a usable table (the plugin's fail-safe).
FAIL_SAFE: Final = "table_stale"

# The runner's loopback endpoints the plugin calls (outcome_listener serves them).
ALIVE_PATH: Final = "/spillway/alive"
TABLE_PATH: Final = "/spillway/table"
OUTCOMES_PATH: Final = "/spillway/fast-outcomes"

# The plugins' names (a route's ``plugins`` and config.yaml's ``plugin_attr`` name them).
PLUGIN: Final = "spillway"
EDGE_PLUGIN: Final = "spillway-edge"
# The nginx shared dict the plugin keeps its table and counters in (config.yaml declares it).
SHARED_DICT: Final = PLUGIN

# The shared dict's keys: prefixes (a name follows) and whole keys.
KEY_PREFIXES: Final = {
    "in_flight": "if:",  # a target's requests in flight
    "in_flight_cold": "ifc:",  # of those, the ones sent towards a cold start
    "spent": "sp:",  # a target's cumulative spend
    "given_back": "gb:",  # ... and what streams settled below their price gave back of it
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


# The summary's usage keys: ``<target>\t<tenant>\t<model>`` (a tab is in no name).
USAGE_SEP: Final = "\t"

# The summary's fields (``summary.FastOutcomes``), by the names the plugin builds it with.
SUMMARY_FIELDS: Final = {name: name for name in FastOutcomes.model_fields if name != "invalid"}

# Header names, in the one spelling nginx compares (lower case).
HEADERS: Final = {
    "own_prefix": OWN_PREFIX,  # a client's spelling of any of Spillway's own is removed
    "decision": HEADER_DECISION,
    "signature": HEADER_SIGNATURE,
    "target": HEADER_TARGET,  # the runner's decision, to the edge (ext-plugin route)
    "audit": audit.HEADER_AUDIT.lower(),
    "instance": HEADER_INSTANCE,  # a function's answer: the instance that served it
    "cold": HEADER_COLD,  # ... and whether it started cold for it
    "worker": HEADER_WORKER,
    "tenant": HEADER_TENANT,
    "consumer": HEADER_CONSUMER,
}
# The variables the edge registers with APISIX: traffic-split matches the first, the outcome
# logger reads them all (``books.outcomes.log_format``), the audit logger its own (``AUDIT``).
VARS: Final = {
    "upstream": UPSTREAM_VAR,
    "worker": WORKER_VAR,
    "decision_tenant": TENANT_VAR,
    "tokens": TOKENS_VAR,
}
# Where a decision sends a request besides a cloud target, and why.
TARGETS: Final = {"local": LOCAL, "shed": SHED}
REASONS: Final = {r.name.lower(): r.value for r in Reason}
# What a rule does with the requests it matches (the table's rules carry it).
ACTIONS: Final = {a.name.lower(): a.value for a in RuleAction}
BREAKER: Final = {s.name.lower(): s.value for s in BreakerState}
# A request's priority, and the syntax of its deadline's seconds (``policy.admission``).
ADMISSION: Final = {"critical": CRITICAL, "sheddable": SHEDDABLE, "deadline_syntax": DEADLINE_SYNTAX}
# How a decision is spelled (``X-Spillway-Decision``, the summary's ``decisions`` keys) and how a
# usage entry's key joins target, tenant and model.
SPELLING: Final = {
    "decision_sep": DECISION_SEP,
    "label_sep": LABEL_SEP,
    "saturated": SATURATED,
    "rule_prefix": RULE_PREFIX,
    "usage_sep": USAGE_SEP,
}
# The audit trail's fields, in the order X-Spillway-Audit joins them, and its words.
AUDIT: Final = {
    "fields": list(audit.FIELDS),
    "sep": audit.SEP,
    "var_prefix": audit.VAR_PREFIX,
    "cloud": audit.CLOUD,
    "fast_path": audit.VIA_FAST_PATH,
    "ext_plugin": audit.VIA_EXT_PLUGIN,
}


def constants() -> dict[str, object]:
    """Everything above, as ``spillway/contract.lua`` holds it."""
    return {
        "FORMAT": FORMAT,
        "FAIL_SAFE": FAIL_SAFE,
        "PATH": {"alive": ALIVE_PATH, "table": TABLE_PATH, "outcomes": OUTCOMES_PATH},
        "PLUGIN": PLUGIN,
        "EDGE_PLUGIN": EDGE_PLUGIN,
        "DICT": SHARED_DICT,
        "PREFIX": dict(KEY_PREFIXES),
        "KEY": dict(KEYS),
        "UNSCANNABLE": dict(UNSCANNABLE),
        "TOKEN": dict(TOKEN_RULES),
        "HEADER": dict(HEADERS),
        "FRAMING": list(FRAMING),
        "VAR": dict(VARS),
        "STREAM_SUFFIX": STREAM_SUFFIX,
        "BUDGET_HOUR_S": HOUR,
        "WAIT_TAIL": WAIT_TAIL,
        "BYTES_PER_INPUT_TOKEN": BYTES_PER_INPUT_TOKEN,
        "TARGET": dict(TARGETS),
        "REASON": dict(REASONS),
        "ACTION": dict(ACTIONS),
        "BREAKER": dict(BREAKER),
        "ADMISSION": dict(ADMISSION),
        "SPELLING": dict(SPELLING),
        "AUDIT": dict(AUDIT),
        "SUMMARY": dict(SUMMARY_FIELDS),
    }
