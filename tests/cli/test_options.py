"""The shared Typer options: an unreadable path is memd's one-line error (or
doctor's `fail workspace`), never Click's usage box (review16e F1)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.other_uid import NOBODY, can_switch_uid, reachable_tmp

REPO = Path(__file__).resolve().parents[2]

# Run the CLI as uid 65534 from a tree that uid may not be able to traverse: the
# interpreter and every module the parse needs are loaded while still root, then
# the process drops its uid and calls memd's own main().
_AS_NOBODY = r"""
import os, sys
uid = int(sys.argv[1]); argv = sys.argv[2:]
import memd.cli.app as app
app.build_app(argv[0])          # imports the command's module (and Typer, Click, rich)
import rich.console, rich.panel, rich.progress, rich.table, click.exceptions, typer.rich_utils  # noqa: F401
import asyncio, mmap, sqlite3, multiprocessing, concurrent.futures, importlib, pkgutil, memd  # noqa: F401
for info in pkgutil.walk_packages(memd.__path__, "memd."):  # what a command imports lazily (not the CLI)
    if info.name.startswith("memd.cli") or info.name == "memd.__main__":
        continue
    try:
        importlib.import_module(info.name)
    except Exception:
        pass
os.setgroups([]); os.setgid(uid); os.setuid(uid)
os.chdir("/")
app.main(argv)
"""


def memd_as_nobody(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    env.update(PYTHONPATH=str(REPO), HOME=str(home), COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-c", _AS_NOBODY, str(NOBODY), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        cwd="/",
        check=False,
    )


@pytest.mark.skipif(not can_switch_uid(), reason="needs root to run as a second uid")
@pytest.mark.parametrize(
    "argv",
    [
        ("doctor", "--offline", "--workspace", "{ws}"),
        ("history", "a", "--workspace", "{ws}"),
        ("compact-now", "a", "--workspace", "{ws}"),
        ("health", "--workspace", "{ws}"),
        ("config", "check", "{cfg}"),
        ("doctor", "--offline", "--workspace", "{open_ws}", "--config", "{cfg}"),
    ],
    ids=[
        "doctor-ws",
        "history-ws",
        "compact-now-ws",
        "health-ws",
        "config-check-file",
        "doctor-config",
    ],
)
def test_an_unreadable_workspace_or_config_is_one_line_naming_it(argv: tuple[str, ...]) -> None:
    with reachable_tmp("memd-options-") as base:
        ws = base / "ws"
        (ws / "agents" / "a").mkdir(parents=True)
        (ws / "agents" / "a" / "MEMORY.md").write_text("### Human — 2026-01-01 00:00:00\nhi\n\n")
        ws.chmod(0o700)  # root's, closed to uid 65534 (as a workspace for another user is)
        open_ws = base / "open"
        (open_ws / "agents").mkdir(parents=True)
        cfg = base / "memd.toml"
        cfg.write_text("[trigger]\nthreshold = 0.5\n")
        cfg.chmod(0o600)  # like /etc/memd/memd.toml read by the wrong user
        args = [a.format(ws=ws, cfg=cfg, open_ws=open_ws) for a in argv]
        home = base / "home"
        home.mkdir()
        os.chown(home, NOBODY, NOBODY)
        proc = memd_as_nobody(home, *args)
    assert "Usage:" not in proc.stderr, proc.stderr
    assert "Try 'memd" not in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    if argv[0] == "doctor" and "{cfg}" not in argv:
        # doctor's whole point: its own `fail workspace` line with the fix, on stdout,
        # and no second stderr line about the pointer it could not read in there
        assert f"fail workspace: {ws} is not readable by uid {NOBODY}" in proc.stdout, proc
        assert "     fix: run memd as the agents' user" in proc.stdout, proc
        assert proc.stderr == "memd: error: doctor: 1 check(s) failed: workspace\n", proc.stderr
        assert proc.returncode == 1
        return
    named = str(cfg) if "{cfg}" in argv else str(ws)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("memd: error: ")]
    assert len(errors) == 1, proc.stderr
    assert named in errors[0], proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
