"""Run an attacker as a real second uid (65534) from a folder that uid can reach.

The checkout, its venv and even the interpreter may sit where that uid cannot
traverse (a 0700 home such as /root, a ``mktemp -d``): the attacker is a small
stdlib-only script copied into a world-traversable tmp dir, started in
isolated mode, which drops to uid 65534 itself once its imports are done, so it
never needs to read anything from the checkout as that uid.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

NOBODY = 65534

ATTACKER = r"""
import json, os, sys
held = {}
for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    try:
        if op == "open_append":
            held[cmd["key"]] = os.open(cmd["path"], os.O_WRONLY | os.O_APPEND)
        elif op == "write":
            os.write(held[cmd["key"]], cmd["data"].encode())
        elif op == "rename":
            os.rename(cmd["src"], cmd["dst"])
        elif op == "symlink":
            os.symlink(cmd["target"], cmd["path"])
        elif op == "unlink":
            os.unlink(cmd["path"])
        reply = "ok"
    except OSError as exc:
        reply = "err " + str(exc)
    print(reply, flush=True)
"""


def can_switch_uid() -> bool:
    return os.geteuid() == 0


@contextmanager
def reachable_tmp(prefix: str) -> Iterator[Path]:
    """A 0755 tmp dir under /tmp (pytest's tmp_path is 0700, closed to other uids)."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


class Attacker:
    """A long-lived process of uid 65534 that obeys one JSON command per line."""

    def __init__(self, home: Path) -> None:
        script = home / "attacker.py"
        script.write_text(ATTACKER)
        script.chmod(0o644)
        self._proc = subprocess.Popen(
            [os.path.realpath(sys.executable), "-I", "-S", str(script), str(NOBODY)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=home,
        )

    def do(self, op: str, **args: Any) -> str:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self._proc.stdin.flush()
        return self._proc.stdout.readline().strip()

    def must(self, op: str, **args: Any) -> None:
        reply = self.do(op, **args)
        assert reply == "ok", f"attacker {op} {args}: {reply}"

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=10)


_REACH_PROBE = r"""
import importlib.util, os, sys
uid = int(sys.argv[1])
# Where the daemon's code lives, found while still root.
# (Third-party and memd only: the standard library is imported before the drop.)
places = []
for name in (
    "memd", "typer", "click", "structlog", "watchdog", "tiktoken", "pydantic", "detect_secrets"
):
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
        places.extend(spec.submodule_search_locations)
os.setgroups([])
os.setgid(uid)
os.setuid(uid)
for place in places:
    try:
        os.listdir(place)
    except OSError as exc:
        print(f"{place}: {exc.strerror}")
        sys.exit(1)
"""


def unreachable_reason(uid: int = NOBODY) -> str | None:
    """Why a process of ``uid`` could not import memd's code from this checkout (None: it can).

    A daemon started as root and dropped to ``uid`` still imports modules
    lazily afterwards, so the checkout and its venv must be readable by ``uid``.
    """
    probe = subprocess.run(
        [sys.executable, "-c", _REACH_PROBE, str(uid)], capture_output=True, text=True, check=False
    )
    if probe.returncode == 0:
        return None
    return probe.stdout.strip() or probe.stderr.strip().splitlines()[-1]
