"""The arguments `firsttoken cache` subcommands share (firsttoken/cachecli.py, cacheonline.py):
cache settings given on the command line, the evaluation sets, a threshold grid."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.cache.evaluate import PairSet

CACHE_ENV = "FIRSTTOKEN_CACHE_"


def setting_env(assignment: str, fields: set[str]) -> tuple[str, str]:
    """`KEY=VALUE` -> (`FIRSTTOKEN_CACHE_KEY`, VALUE), KEY given bare (`threshold`) or in full
    (`FIRSTTOKEN_CACHE_THRESHOLD`). Only cache settings that exist are accepted: the settings
    ignore unknown variables, so a typo would otherwise measure the defaults unnoticed."""
    key, sep, value = assignment.partition("=")
    key = key.strip().upper().removeprefix(CACHE_ENV).removeprefix("CACHE_")
    if not sep or not key:
        raise ValueError(f"--setting {assignment!r}: expected KEY=VALUE, e.g. threshold=0.9")
    if f"cache_{key.lower()}" not in fields:
        known = ", ".join(
            sorted(f.removeprefix("cache_") for f in fields if f.startswith("cache_"))
        )
        raise ValueError(
            f"--setting {assignment!r}: no cache setting {key.lower()!r}; known: {known}"
        )
    return CACHE_ENV + key, value.strip()


def apply_settings(args: argparse.Namespace) -> None:
    """Put --setting and --threshold into the environment and reload the settings, so that
    the worker's own policy_from sees every cache setting the worker reads, present and
    future."""
    from shared.settings import Settings, get_settings

    assignments = list(args.setting or [])
    if getattr(args, "threshold", None) is not None:
        assignments.append(f"threshold={args.threshold}")
    for assignment in assignments:
        name, value = setting_env(assignment, set(Settings.model_fields))
        os.environ[name] = value
    get_settings.cache_clear()


NO_CHECKOUT = (
    "the evaluation sets are the repository's tests/data, and this installation of firsttoken "
    "has no tests/ beside it (installed from a wheel?): run it from a checkout "
    "(pip install -e .), pass --data-dir PATH/TO/tests/data, or give one PAIRS.jsonl file"
)


def load_sets(sets: str | None, data_dir_arg: str | None) -> list[PairSet]:
    """The sets named by --sets (default dev,validation), read before any model is loaded so
    that a wrong name or a missing checkout fails at once."""
    from workers.cache.evaluate import DEFAULT_SETS, SET_NAMES, data_dir, load_set

    names = [s.strip() for s in sets.split(",") if s.strip()] if sets else list(DEFAULT_SETS)
    if not names or any(n not in SET_NAMES for n in names):
        raise ValueError(f"--sets {sets!r}: choose among {','.join(SET_NAMES)}")
    data = Path(data_dir_arg) if data_dir_arg else data_dir()
    if data is None:
        raise ValueError(NO_CHECKOUT)
    return [load_set(data, name) for name in names]


def grid(spec: str) -> list[float]:
    """`LOW:HIGH:STEP` -> the thresholds from LOW to HIGH, both included."""
    try:
        low, high, step = (float(x) for x in spec.split(":"))
    except ValueError:
        low = high = step = -1.0
    if not 0 < low <= high <= 1 or step <= 0:
        raise ValueError(
            f"--grid {spec!r}: expected LOW:HIGH:STEP within (0, 1], e.g. 0.8:0.97:0.01"
        )
    return [round(low + i * step, 4) for i in range(round((high - low) / step) + 1)]
