"""Tenant names are the clients' choice: the runner keeps every book, quota and table row under a
bounded key (``policy.tenants``), so the decision table stays small whatever names arrive; a
build reads a bounded number of books however many are tracked; and a table trimmed to the room
the plugin's shared dict has leaves out the least recently seen tenants."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from devtools.apisix_peer import ApisixPeer, PeerRequest
from functions.sidecar import free_port
from gateway_plugin.books.ledger import TenantBook
from gateway_plugin.books.outcomes import auth_header
from gateway_plugin.books.state import GatewayState
from gateway_plugin.config import SpillwayConfig
from gateway_plugin.fast_path import table as decision_table
from gateway_plugin.fast_path.book import FastPathBook, FastPathReport
from gateway_plugin.plugin import HttpRequest, RequestAction
from gateway_plugin.policy.snapshot import Snapshot, TenantState
from gateway_plugin.policy.tenants import MAX_TENANT_BYTES, tenant_key
from gateway_plugin.protocol import encode, messages
from gateway_plugin.request.spillway import RouteOverrides, SpillwayPlugin
from testing.gateway import gateway_state
from testing.http import http, wait_until
from tests.unit.test_runner_hostile import SPILL, runner_process

TOKEN = os.environ["SPILLWAY_ROUTE_TOKEN"].encode()


def state(**tenants: object) -> GatewayState:
    return gateway_state(
        SpillwayConfig.model_validate(
            {
                "targets": [{"name": "aws", "kind": "http", "url": "https://fn.example"}],
                "tenants": tenants,
                "metrics": {"listen": None},
            }
        )
    )


def test_a_name_is_its_own_key_only_when_short_and_printable_ascii() -> None:
    assert tenant_key("acme corp") == "acme corp"
    assert tenant_key("t" * MAX_TENANT_BYTES) == "t" * MAX_TENANT_BYTES
    for name in ("t" * 257, "café", "tab\there", "a\udcffb"):
        key = tenant_key(name)
        assert key.startswith("sha256:") and len(key) == 71 and key == tenant_key(name)
    assert tenant_key("\ud800") != tenant_key("\udcff"), "a surrogate no header byte gives is hashed too"


def test_a_quota_named_outside_printable_ascii_holds_its_tenant() -> None:
    policy = state(quotas={"café": {"requests_per_minute": 3}}).policy
    assert policy.quota_of(tenant_key("café")).requests_per_minute == 3
    table = FastPathBook(state(quotas={"café": {"requests_per_minute": 3}})).table()
    assert table["policy"]["quotas"] == {tenant_key("café"): {"requests_per_minute": 3}}  # type: ignore[index]


def test_a_tenant_row_is_at_most_max_tenant_row_bytes() -> None:
    """The longest key, every character of it escaped, and the longest numbers."""
    worst_key = '"' * MAX_TENANT_BYTES
    worst = TenantState(10**23, 0, -1.7976931348623157e308, -2.2250738585072014e-308)
    table = decision_table.build_table(state().policy, Snapshot({}, {}, {worst_key: worst}), {}, 1, 0.0)
    row = decision_table.encode(table["tenants"])  # {row}: its braces for its comma and one more
    assert len(row) - 1 <= decision_table.MAX_TENANT_ROW_BYTES
    assert tenant_key(worst_key) == worst_key, "a name the key keeps, not its hash"


def test_a_long_name_reaching_the_table_is_keyed_there_too() -> None:
    table = decision_table.build_table(
        state().policy, Snapshot({}, {}, {"t" * 7000: TenantState(5)}), {}, 1, 0.0
    )
    assert list(table["tenants"]) == [tenant_key("t" * 7000)]


def test_a_table_over_the_room_the_plugin_reports_leaves_out_the_least_recently_seen_tenants() -> None:
    gateway = state(default={"requests_per_minute": 1})
    wall = gateway.wall()
    for i in range(500):
        gateway.tenants.book(f"tenant-{i:03}").arrivals.append(wall)
    book = FastPathBook(gateway)
    whole = book.exchange(FastPathReport(node="n-1"))
    room = len(whole) - 5_000
    trimmed = book.exchange(FastPathReport(node="n-1", room=room))
    tenants = json.loads(trimmed)["tenants"]
    assert len(trimmed) <= room < len(whole)
    left_out = 500 - len(tenants)
    assert set(tenants) == {f"tenant-{i:03}" for i in range(left_out, 500)}, "the most recent kept"
    assert gateway.metrics.fast_path_table_left_out._value.get() == left_out > 0
    name = f"tenant-{left_out - 1:03}"
    one_more = decision_table.encode({name: json.loads(whole)["tenants"][name]})
    assert len(trimmed) + len(one_more) - 1 > room, "no more rows left out than it takes"
    assert gateway.metrics.fast_path_table_bytes._value.get() == len(trimmed)


def test_long_tenant_names_on_the_ext_plugin_route_keep_the_table_within_its_bound(tmp_path: Path) -> None:
    """A runner process as APISIX starts it decides 1,000 requests, each with its own 7 KB tenant
    name under a quota of one a minute, so every one of them is at its limit: the table the fast
    path fetches carries them as 71-character keys, within MAX_TENANTS rows of at most
    MAX_TENANT_ROW_BYTES, and each tenant still has its quota (a second request is refused)."""
    port = free_port()
    spec = {
        "targets": [{"name": "aws", "kind": "http", "url": "https://fn.example", "signing_key_env": None}],
        "tenants": {"default": {"requests_per_minute": 1}},
        "metrics": {"listen": None},
        "outcomes": {"listen": f"127.0.0.1:{port}"},
    }
    names = [f"{i:04}" + "n" * 7000 for i in range(1000)]

    async def send(sock: Path, batch: list[str]) -> list[int]:
        peer = ApisixPeer(sock, pool_size=16, timeout_s=30)

        async def one(name: str) -> int:
            outcome = await peer.request(
                SPILL, PeerRequest("POST", "/v2/models/m/infer", headers=[("x-tenant", name)])
            )
            return outcome.stop.status if outcome.stop is not None else 200

        try:
            return list(await asyncio.gather(*(one(name) for name in batch)))
        finally:
            await peer.close()

    def fetch() -> tuple[int, bytes]:
        body = json.dumps({"node": "probe"}).encode()
        headers = {"authorization": auth_header(TOKEN), "content-type": "application/json"}
        try:
            status, _, answer = http("POST", f"http://127.0.0.1:{port}/spillway/table", body, headers)
        except OSError as exc:
            return 0, str(exc).encode()
        return status, answer

    def table() -> bytes:
        status, answer = fetch()
        assert status == 200, answer[:300]
        return answer

    with runner_process(tmp_path, spec) as (sock, _):
        wait_until(lambda: fetch()[0] == 200, 10, "the runner's table endpoint")
        base = len(table())
        assert Counter(asyncio.run(send(sock, names))) == {200: 1000}
        assert asyncio.run(send(sock, names[-3:])) == [429] * 3, "each tenant keeps its quota"
        text = table()
    tenants = json.loads(text)["tenants"]
    assert len(tenants) == decision_table.MAX_TENANTS
    assert all(len(name) == 71 for name in tenants) and tenant_key(names[-1]) in tenants
    assert len(text) <= base + decision_table.MAX_TENANTS * decision_table.MAX_TENANT_ROW_BYTES
    print(f"1,000 tenants of 7 KB: table {len(text):,} bytes (without tenants {base:,})")


def evaluations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The books a table build reads, counted as it reads each one's spend."""
    read: list[str] = []
    spent = TenantBook.spent

    def counted(book: TenantBook, now: float) -> tuple[float, float]:
        read.append("")
        return spent(book, now)

    monkeypatch.setattr(TenantBook, "spent", counted)
    return read


def test_a_build_reads_a_bounded_number_of_books_whatever_is_tracked(monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 tracked tenants (tenants.max_tracked), every one at its limit: a build reads the
    1,000 most recently seen and stops; with none at a limit but the oldest, it reads at most
    MAX_SCANNED and leaves that one out, as it leaves out any past the most recent 1,000."""
    gateway = state(default={"requests_per_minute": 1})
    wall = gateway.wall()
    for i in range(10_000):
        gateway.tenants.book(f"t-{i}").arrivals.append(wall)
    read = evaluations(monkeypatch)
    tenants = FastPathBook(gateway).table()["tenants"]
    assert isinstance(tenants, dict) and len(tenants) == decision_table.MAX_TENANTS
    assert "t-9999" in tenants and "t-8999" not in tenants
    assert len(read) == decision_table.MAX_TENANTS
    for i in range(1, 10_000):
        gateway.tenants.get(f"t-{i}").arrivals.clear()  # type: ignore[union-attr]
    read.clear()
    assert FastPathBook(gateway).table()["tenants"] == {}
    assert len(read) == decision_table.MAX_SCANNED


def test_a_tenant_shed_for_its_quota_is_seen_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant the runner keeps shedding stays among the most recently seen, so rotating names
    do not push it out of the table while it is at its limit."""
    gateway = state(default={"requests_per_minute": 1})
    decide_one(gateway, "steady")
    for i in range(decision_table.MAX_SCANNED):
        decide_one(gateway, f"other-{i}")
    for i in range(decision_table.MAX_SCANNED):
        gateway.tenants.get(f"other-{i}").arrivals.clear()  # type: ignore[union-attr]
    assert "steady" not in FastPathBook(gateway).table()["tenants"]  # type: ignore[operator]
    assert decide_one(gateway, "steady") == "shed"
    assert "steady" in FastPathBook(gateway).table()["tenants"]  # type: ignore[operator]


def decide_one(gateway: GatewayState, tenant: str) -> str:
    """One request of ``tenant`` through the runner's own plugin, as APISIX's call would send it."""
    plugin = SpillwayPlugin(gateway)
    headers = [("x-tenant", tenant)]
    call = messages.HttpReqCall(encode.req_call(1, 1, 2, "/v2/models/m/infer", [], headers, bytes(4)))
    request = HttpRequest(call, None)  # type: ignore[arg-type]  # a local decision asks nothing
    action = RequestAction(request)
    asyncio.run(plugin.request_filter(plugin.prepare(RouteOverrides()), request, action))
    return "shed" if action.stopped else "sent"
