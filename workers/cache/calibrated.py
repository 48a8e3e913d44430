"""Calibration tables of the semantic tier, one per embedding model (workers/cache/
calibration.py), read once from calibrated.json beside this module. `firsttoken cache
calibrate --write` generates that file (`--folds --write` adds each table's folds and the
threshold shipped per risk, workers/cache/folds.py); do not edit it by hand. Data, not code:
the tables are thousands of numbers, which a module would hold as lines of source.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workers.cache.calibration import Point

PATH = Path(__file__).with_name("calibrated.json")


def _points(rows: Sequence[Sequence[Any]]) -> tuple[Point, ...]:
    return tuple(Point(float(t), int(w), int(n), int(s), int(p)) for t, w, n, s, p in rows)


def _rows(points: Sequence[Point]) -> list[list[float | int]]:
    return [
        [p.threshold, p.wrong, p.traps, p.served, p.paraphrases]
        for p in sorted(points, key=lambda p: p.threshold)
    ]


def render(
    tables: Mapping[str, Sequence[Point]],
    sets: str,
    folds: Mapping[str, Mapping[str, Sequence[Point]]] | None = None,
    risks: Mapping[str, Sequence[tuple[float, float]]] | None = None,
) -> str:
    """The text of calibrated.json: one line per table, fold and risk list, sorted by name."""
    folds, risks = folds or {}, risks or {}
    lines = ["{", f'  "sets": {json.dumps(sets)},', '  "calibration": {']
    lines.append(
        ",\n".join(
            f"    {json.dumps(name)}: {json.dumps(_rows(tables[name]))}" for name in sorted(tables)
        )
    )
    lines += ["  },", '  "folds": {']
    blocks = []
    for name in sorted(folds):
        inner = ",\n".join(
            f"      {json.dumps(fold)}: {json.dumps(_rows(folds[name][fold]))}"
            for fold in sorted(folds[name])
        )
        blocks.append(f"    {json.dumps(name)}: {{\n{inner}\n    }}")
    lines += [",\n".join(blocks), "  },", '  "risks": {']
    lines.append(
        ",\n".join(
            f"    {json.dumps(name)}: {json.dumps([list(r) for r in risks[name]])}"
            for name in sorted(risks)
        )
    )
    lines += ["  }", "}", ""]
    return "\n".join(line for line in lines if line)


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


_DATA = _load(PATH)
SETS: str = _DATA["sets"]
CALIBRATION: dict[str, tuple[Point, ...]] = {
    name: _points(rows) for name, rows in _DATA["calibration"].items()
}
FOLDS: dict[str, dict[str, tuple[Point, ...]]] = {
    name: {fold: _points(rows) for fold, rows in folds.items()}
    for name, folds in _DATA["folds"].items()
}
RISKS: dict[str, tuple[tuple[float, float], ...]] = {
    name: tuple((float(r), float(t)) for r, t in rows) for name, rows in _DATA["risks"].items()
}
