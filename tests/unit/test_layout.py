"""The house's proportions (issue 41): the folders say who does what, modules stay small.

shared/ holds only the contract between the gateway and the workers; what only answers a chat
lives under workers/. Measured in lines of Python, as the issue states the bound.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("gateway", "workers", "shared")
MAX_SHARED_SHARE = 0.30
MAX_MODULE_LINES = 600


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_shared_is_only_the_contract() -> None:
    lines = {side: sum(_lines(p) for p in _modules(side)) for side in SIDES}
    share = lines["shared"] / sum(lines.values())
    assert share <= MAX_SHARED_SHARE, (
        f"shared/ is {share:.1%} of gateway + workers + shared ({lines}); code that only one "
        "side imports belongs under that side (docs/architecture.md, the layout)"
    )


def test_no_module_over_the_size_bound() -> None:
    big = [
        f"{p.relative_to(ROOT)}: {_lines(p)} lines"
        for side in SIDES
        for p in _modules(side)
        if _lines(p) > MAX_MODULE_LINES
    ]
    assert not big, f"modules over {MAX_MODULE_LINES} lines; split them by concept: {big}"
