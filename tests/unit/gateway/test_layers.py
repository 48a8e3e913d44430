"""The gateway's modules import one way: the process (state) knows its sessions, a session
sees its process only through the SessionHost protocol."""

from __future__ import annotations

import ast
from pathlib import Path

GATEWAY = Path(__file__).resolve().parents[3] / "gateway"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any level (TYPE_CHECKING blocks and functions too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_session_and_the_modules_it_uses_never_import_the_gateway_state() -> None:
    """No import of gateway.state from session, jobs, admit or relaystate, not even a hidden one."""
    for name in ("wsdoor.py", "jobs.py", "admit.py", "relaystate.py"):
        assert "gateway.state" not in _imports(GATEWAY / name), name


def test_admission_is_pure_it_imports_no_session_socket_or_redis_module() -> None:
    """gateway/admit.py decides from values alone; the session keeps the I/O."""
    imported = _imports(GATEWAY / "admit.py")
    assert not {m for m in imported if m.split(".")[0] in ("redis", "starlette", "asyncio")}
    assert not {"gateway.wsdoor", "gateway.state", "gateway.ratelimit"} & imported
