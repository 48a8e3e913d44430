"""The Lua scripts live in shared/redis/scripts/*.lua, each documented, registered and used once,
and no Python module of the product holds or evals a script of its own."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

from shared.redis import scripts

ROOT = Path(__file__).resolve().parents[4]
FOLDER = ROOT / "shared" / "redis" / "scripts"
PACKAGES = ("gateway", "workers", "shared")

# What only an inline script or a second way of running one looks like in Python.
INLINE = re.compile(r"redis\.p?call\b|\.eval\(|register_script\(|[\"']EVAL[\"']")
# An index a script uses (KEYS[3]) or its header documents, alone or as a range: KEYS[1..n],
# ARGV[2..] (from 2 on), ARGV[2..n+1].
INDEX = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]")
RANGE = re.compile(r"\b(KEYS|ARGV)\[(\d+)\.\.")


def _python_files() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def _header(source: str) -> str:
    """The comment lines a script starts with."""
    lines = []
    for line in source.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def test_no_python_module_holds_or_evals_a_script() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _python_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if INLINE.search(line)
    ]
    assert not found, f"scripts belong in shared/redis/scripts/*.lua, run by EVALSHA: {found}"


def test_every_script_file_has_a_header_naming_its_keys_argv_and_reply() -> None:
    files = sorted(FOLDER.glob("*.lua"))
    assert files
    for path in files:
        header = _header(path.read_text())
        assert header.startswith(f"-- {path.stem}: "), f"{path.name}: starts `-- {path.stem}: `"
        for word in ("KEYS[", "ARGV[", "Returns"):
            assert word in header, f"{path.name}: its header names no {word}"


def test_every_literal_index_a_script_uses_is_in_its_header() -> None:
    for path in sorted(FOLDER.glob("*.lua")):
        source = path.read_text()
        header = _header(source)
        body = source[len(header) :]
        named = {(kind, int(i)) for kind, i in INDEX.findall(header)}
        ranges = RANGE.findall(header)
        for kind, i in {(kind, int(i)) for kind, i in INDEX.findall(body)}:
            in_a_range = any(k == kind and int(first) <= i for k, first in ranges)
            assert (kind, i) in named or in_a_range, (
                f"{path.name} uses {kind}[{i}] and its header does not say what it is"
            )


def test_the_registry_is_the_folder_and_each_sha_is_its_file() -> None:
    assert set(scripts.SCRIPTS) == {path.stem for path in FOLDER.glob("*.lua")}
    for name, script in scripts.SCRIPTS.items():
        source = (FOLDER / f"{name}.lua").read_text()
        assert script.name == name and script.source == source
        assert script.sha == hashlib.sha1(source.encode()).hexdigest()


def test_every_registered_script_is_run_somewhere() -> None:
    constants = {
        attr: value for attr, value in vars(scripts).items() if isinstance(value, scripts.LuaScript)
    }
    assert {s.name for s in constants.values()} == set(scripts.SCRIPTS)
    code = "\n".join(p.read_text() for p in _python_files() if p.parent != FOLDER)
    unused = [attr for attr in constants if not re.search(rf"\bscripts\.{attr}\b", code)]
    assert not unused, f"registered but never run: {unused}"


def test_an_installed_package_carries_the_scripts() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_data = config["tool"]["setuptools"]["package-data"]
    assert "*.lua" in package_data.get("shared.redis.scripts", [])
