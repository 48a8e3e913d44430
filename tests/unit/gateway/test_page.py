"""The chat page's files and routes, without a stack (tests/browser drives the page itself)."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch

from starlette.testclient import TestClient

from gateway.app import PAGE_DIR, create_app
from tests.support import ROOT


def _client() -> TestClient:
    # Not entered as a context manager: the lifespan (Redis, the database) never runs, and the
    # page's routes need none of it.
    return TestClient(create_app())


def test_the_page_is_served_at_the_root_with_a_same_origin_policy() -> None:
    resp = _client().get("/")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/html")
    assert "<title>firsttoken chat</title>" in resp.text
    csp = resp.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp


def test_every_file_the_page_links_is_served_by_the_gateway() -> None:
    client = _client()
    html = client.get("/").text
    links = re.findall(r'(?:src|href)="([^"]+)"', html)
    local = [link for link in links if not link.startswith("data:")]
    assert sorted(local) == ["/page/app.js", "/page/style.css"]
    for link in local:
        resp = client.get(link)
        assert resp.status_code == 200, link
        assert resp.text == (PAGE_DIR / link.removeprefix("/page/")).read_text()


def test_the_page_loads_nothing_from_elsewhere() -> None:
    """No CDN, no font service: the page works offline."""
    for path in PAGE_DIR.iterdir():
        text = path.read_text()
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), path.name
        assert "@import" not in text and "import(" not in text, path.name


def test_the_package_data_ships_every_page_file() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["gateway"]
    for path in PAGE_DIR.iterdir():
        relative = f"page/{path.name}"
        assert any(fnmatch(relative, p) for p in patterns), relative


def test_the_page_speaks_the_protocol_it_needs() -> None:
    """The frames the page sends are the protocol's (README): chat, cancel and resume."""
    js = (PAGE_DIR / "app.js").read_text()
    for frame in ('type: "chat"', 'type: "cancel"', 'type: "resume"'):
        assert frame in js
    assert "after_seq: chat.lastSeq" in js
    assert "sessionStorage" in js and "localStorage" not in js
