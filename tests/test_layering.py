"""The import-linter contracts in pyproject.toml cover every top-level module of memd.

A module added to memd without being named in the contracts would escape them:
``memd.core`` could import it, or it could import the daemon, and
``lint-imports`` would still pass.
"""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import memd

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
CORE_CONTRACT = "memd.core is pure: it imports nothing from the shell (only memd.errors)"
DAEMON_CONTRACT = "The daemon is not imported by the modules it drives"


def top_level_modules() -> set[str]:
    return {f"memd.{module.name}" for module in pkgutil.iter_modules(memd.__path__)}


def contract(name: str) -> dict[str, Any]:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (found,) = [c for c in contracts if c["name"] == name]
    return found  # type: ignore[no-any-return]


def test_top_level_modules_are_found() -> None:
    assert {"memd.core", "memd.errors", "memd.daemon", "memd.compaction"} <= top_level_modules()


def test_core_may_import_no_top_level_module_but_errors() -> None:
    forbidden = set(contract(CORE_CONTRACT)["forbidden_modules"])
    missing = top_level_modules() - {"memd.core", "memd.errors"} - forbidden
    assert not missing, f"add to the core contract's forbidden_modules: {sorted(missing)}"
    assert forbidden <= top_level_modules()  # no stale names


def test_every_module_the_daemon_drives_is_kept_from_importing_it() -> None:
    rule = contract(DAEMON_CONTRACT)
    assert set(rule["forbidden_modules"]) == {"memd.daemon", "memd.cli"}
    sources = set(rule["source_modules"])
    # Only the CLI (memd run) and the entry point above it may import the daemon.
    missing = top_level_modules() - {"memd.daemon", "memd.cli", "memd.__main__"} - sources
    assert not missing, f"add to the daemon contract's source_modules: {sorted(missing)}"
    assert sources <= top_level_modules()
