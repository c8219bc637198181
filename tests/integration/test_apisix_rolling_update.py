"""A rolling update of three real tritonservers behind a real Apache APISIX 3.18, both routes, while
public and on-prem-only traffic runs at about twice what the cluster can serve.

Each member runs the ``slow`` model (one instance, 100 ms a request: 10 requests a second, so
three make 30) and is replaced one at a time as a Deployment's rollout does: stopped (its
inference and metrics ports close), then started again on the same ports. The cloud target is a
loopback stand-in. Public traffic must keep spilling through every phase, more while a member is
away (before, the scrape round failed whole and every request stayed home once the signals went
stale); no public request fails; no on-prem-only request leaves. The shares are printed.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import pytest

from devtools import apisix
from testing.apisix import needs_apisix
from testing.http import wait_until
from testing.tritons import FAST, PATH, Load, Member, rolling_cluster

pytestmark = [pytest.mark.integration, needs_apisix()]

# Clients sending one request after another: about twice the 30 a second three members serve.
CLIENTS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[apisix.Apisix, list[Member]]]:
    with rolling_cluster(tmp_path_factory.mktemp("apisix-rolling")) as (gateway, members, _):
        yield gateway, members


@pytest.mark.parametrize("host", [None, FAST], ids=["ext-plugin", "fast-path"])
def test_public_traffic_keeps_spilling_through_a_rolling_update(
    cluster: tuple[apisix.Apisix, list[Member]], host: str | None
) -> None:
    gateway, members = cluster
    load = Load(gateway.url + PATH, host)
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        running = [pool.submit(load.client, i) for i in range(CLIENTS)]
        try:
            wait_until(
                lambda: load.phase(time.monotonic() - 2)["spilled"] > 0.2, 60, "spilling at twice the load"
            )
            phases: list[tuple[str, dict[str, float]]] = []
            start = time.monotonic()
            time.sleep(4)
            phases.append(("3 members", load.phase(start)))
            for index, member in enumerate(members):
                member.stop()
                start = time.monotonic()
                time.sleep(4)
                phases.append((f"member {index} away", load.phase(start)))
                member.start()
                start = time.monotonic()
                time.sleep(3)
                phases.append((f"member {index} back", load.phase(start)))
        finally:
            load.stop.set()
            for future in running:
                future.result()
    for name, figures in phases:
        print(f"{host or 'ext-plugin'}: {name}: {figures}")
    everyone = phases[0][1]["spilled"]
    for name, figures in phases:
        assert figures["public"] > 10, (name, figures)
        assert figures["onprem_out"] == 0, (name, figures)
        assert figures["public_failed"] == 0, (name, figures)
        assert figures["unanswered"] == 0, (name, figures)
        if name.endswith("away"):
            assert figures["spilled"] >= everyone - 0.1, (name, figures, everyone)
