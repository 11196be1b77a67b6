"""Two agents under real uids, as the shipped systemd layout runs them: alice
(31001) and bob (31002), each with its own user private group, both in the
agents' group (31000). Needs root (to act as them).

What they run is run from a 0755 folder under /tmp by the system Python, in
isolated mode: nothing of the checkout needs to be reachable by those uids.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

ALICE = 31001
BOB = 31002
AGENTS_GID = 31000
SYSTEM_PYTHON = "/usr/bin/python3"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")

# One recall request on the socket; the reply line printed.
ASK = r"""
import json, socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
sock.sendall(json.dumps({"v": 1, "agent": sys.argv[2], "query": sys.argv[3], "limit": 5}).encode() + b"\n")
data = b""
while not data.endswith(b"\n"):
    chunk = sock.recv(65536)
    if not chunk:
        break
    data += chunk
print(data.decode().strip())
"""


@contextmanager
def shared_root() -> Iterator[Path]:
    """A 0755 folder under /tmp (pytest's tmp_path is closed to other uids)."""
    root = Path(tempfile.mkdtemp(prefix="memd-two-agents-", dir="/tmp"))
    try:
        root.chmod(0o755)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def ask_script(root: Path) -> Path:
    """:data:`ASK` written where the agents' uids can read it."""
    bin_dir = root / "bin"
    bin_dir.mkdir(mode=0o755, exist_ok=True)
    script = bin_dir / "ask.py"
    script.write_text(ASK)
    script.chmod(0o644)
    return script


def ask_as(uid: int, script: Path, sock: Path, agent: str, query: str) -> dict[str, Any]:
    """One recall request as ``uid`` (its own group, plus the agents' group)."""
    done = subprocess.run(
        [SYSTEM_PYTHON, "-I", "-S", str(script), str(sock), agent, query],
        user=uid,
        group=uid,
        extra_groups=[AGENTS_GID],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    reply: dict[str, Any] = json.loads(done.stdout)
    return reply


def run_as(uid: int, *command: str, umask: int = 0o007) -> subprocess.CompletedProcess[str]:
    """``command`` as ``uid`` (its own group, plus the agents' group); output decoded
    leniently (an SQLite file read back is binary)."""
    return subprocess.run(
        list(command),
        user=uid,
        group=uid,
        extra_groups=[AGENTS_GID],
        umask=umask,
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=30,
        cwd="/",
    )
