"""``apisix-route --push``: what it refuses before APISIX is asked (a real Admin API takes the route
in test_apisix_nodes.py), and that the key it sends is never shown."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gateway_plugin.apisix_admin import DEFAULT_KEYS, AdminError, admin_key, put_route, route_url
from gateway_plugin.cli import main
from testing.http import QuietHandler, http_server_thread

KEY = "a-random-admin-key-0123456789"


@pytest.mark.parametrize(
    ("environ", "says"),
    [({}, "APISIX_ADMIN_KEY is not set"), ({"APISIX_ADMIN_KEY": "  "}, "is not set")]
    + [({"APISIX_ADMIN_KEY": key}, "documented default") for key in sorted(DEFAULT_KEYS)],
)
def test_no_key_or_a_default_key_is_refused(environ: dict[str, str], says: str) -> None:
    with pytest.raises(AdminError, match=says):
        admin_key(environ, "APISIX_ADMIN_KEY")


@pytest.mark.parametrize("admin", ["127.0.0.1:9180", "ftp://h:1", "http://h:9180/apisix/admin", "http://"])
def test_the_admin_api_is_named_by_its_origin_alone(admin: str) -> None:
    with pytest.raises(AdminError, match="origin alone"):
        route_url(admin, "spillway")


def test_a_route_id_is_one_path_segment() -> None:
    assert route_url("http://127.0.0.1:9180", "a/b") == "http://127.0.0.1:9180/apisix/admin/routes/a%2Fb"


@pytest.fixture
def admin() -> Iterator[tuple[str, list[dict[str, object]]]]:
    """An Admin API stand-in that takes KEY and answers as APISIX does, echoing what it got."""
    seen: list[dict[str, object]] = []

    class Handler(QuietHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            seen.append({"path": self.path, "key": self.headers["x-api-key"], "body": json.loads(body)})
            ok = self.headers["x-api-key"] == KEY
            reply = (
                {"key": "/apisix/routes/r1"}
                if ok
                else {"error_msg": f"wrong key {self.headers['x-api-key']}"}
            )
            text = json.dumps(reply).encode()
            self.send_response(200 if ok else 401)
            self.send_header("content-length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

    with http_server_thread(Handler) as url:
        yield url, seen


def test_the_route_is_put_with_the_key_from_the_environment(
    admin: tuple[str, list[dict[str, object]]],
) -> None:
    url, seen = admin
    said = put_route(url, {"id": "r1", "uri": "/v2/*"}, {"APISIX_ADMIN_KEY": KEY}, "APISIX_ADMIN_KEY")
    assert said == "route r1 put through the Admin API (200): /apisix/routes/r1"
    assert seen == [{"path": "/apisix/admin/routes/r1", "key": KEY, "body": {"uri": "/v2/*"}}]


def test_a_refused_key_is_named_never_shown(admin: tuple[str, list[dict[str, object]]]) -> None:
    url, _ = admin
    with pytest.raises(AdminError, match="answered 401") as refused:
        put_route(url, {"id": "r1"}, {"K": "another-key-of-some-length"}, "K")
    assert "another-key-of-some-length" not in str(refused.value)


def test_push_prints_no_route_and_fails_without_a_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("APISIX_ADMIN_KEY", raising=False)
    argv = ["apisix-route", "--config", "examples/spillway.yaml", "--push", "http://127.0.0.1:1"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and "APISIX_ADMIN_KEY is not set" in err


def test_a_route_for_one_node_of_several_on_a_host_matches_its_port(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["apisix-route", "--config", "examples/spillway.yaml", "--node-port", "9081"]) == 0
    assert json.loads(capsys.readouterr().out)["vars"] == [["server_port", "==", "9081"]]
