"""Erase by pattern: how long ``memd forget AGENT --match`` takes over an agent's archives.

    python bench/bench_erase.py [--mb 100] [--archive-mb 1] [--planted 50]

Builds one agent with ``--mb`` of archives (``--archive-mb`` each, Swarms-format
entries) and a live MEMORY.md, plants a string in ``--planted`` entries spread
over them, then runs the real erase (memd.erasure.erase_by_pattern) twice: on
plain archives, and on the same history encrypted at rest (every ``.md.enc`` is
decrypted, filtered and re-sealed under a new data key). Prints wall time,
MB/s, what was removed, and checks that the planted string is gone from every
file (decrypted, for the encrypted run).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.memfiles import swarms_block, swarms_header

from memd.agentdir import AgentDir
from memd.archive_crypto import (
    agent_data_key,
    generate_master_key,
    read_archive,
    read_master_key,
    seal_archive,
)
from memd.erasure import EraseOptions, erase_by_pattern
from memd.workspace import agent_paths

PLANTED = "PLANTED-bench-7f3a"
FILLER = "the worker reports all nominal; queue depth 12, latency 48 ms, nothing to do. " * 6


def build(root: Path, mb: float, archive_mb: float, planted: int) -> int:
    """The agent's files; returns the bytes of archives written."""
    folder = root / "agents" / "alpha"
    (folder / "archive").mkdir(parents=True)
    (folder / ".memd").mkdir(mode=0o700)
    count = max(1, int(mb / archive_mb))
    every = max(1, count // max(1, planted))
    total = 0
    placed = 0
    for index in range(count):
        parts = [swarms_header("alpha")]
        size = 0
        turn = 0
        while size < archive_mb * 1_000_000:
            text = f"turn {index}-{turn}: {FILLER}"
            if turn == 3 and index % every == 0 and placed < planted:
                text = f"turn {index}-{turn}: the card is {PLANTED}; {FILLER}"
                placed += 1
            block = swarms_block("Human" if turn % 2 == 0 else "AI", text)
            parts.append(block)
            size += len(block)
            turn += 1
        data = "".join(parts).encode()
        stamp = f"2026-01-{1 + index // 1440 % 28:02d}_{index // 60 % 24:02d}-{index % 60:02d}-00"
        (folder / "archive" / f"history_{stamp}.md").write_bytes(data)
        total += len(data)
    memory = (
        swarms_header("alpha")
        + swarms_block("Human", f"live {PLANTED}")
        + swarms_block("AI", "live and kept")
    )
    (folder / "MEMORY.md").write_text(memory)
    return total


def encrypt_all(root: Path, key_file: Path) -> None:
    paths = agent_paths(root, "alpha")
    master = read_master_key(key_file)
    with AgentDir.open(paths) as pinned:
        data_key = agent_data_key(pinned, master, create=True)
        assert data_key is not None
        for plain in sorted(paths.archive_dir.glob("history_*.md")):
            name = plain.name + ".enc"
            (plain.parent / name).write_bytes(seal_archive(data_key, name, plain.read_bytes()))
            plain.unlink()


def run(root: Path, key_file: Path | None, label: str, total: int) -> None:
    paths = agent_paths(root, "alpha")
    options = EraseOptions(drain_quiet_s=0.05, key_file=key_file)
    started = time.perf_counter()
    outcome = erase_by_pattern(paths, re.compile(re.escape(PLANTED)), options)
    elapsed = time.perf_counter() - started
    master = read_master_key(key_file) if key_file else None
    for item in paths.archive_dir.iterdir():
        text = read_archive(paths, item.name, master)
        assert PLANTED.encode() not in text, item.name
    assert PLANTED not in paths.memory.read_text()
    print(
        f"{label}: {total / 1e6:,.0f} MB in {len(list(paths.archive_dir.iterdir()))} archives: "
        f"{elapsed:.2f} s ({total / 1e6 / elapsed:,.1f} MB/s); removed {outcome.entries} "
        f"entries from {outcome.files} files ({outcome.resealed} re-sealed)"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--archive-mb", type=float, default=1)
    parser.add_argument("--planted", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        plain = base / "plain"
        total = build(plain, args.mb, args.archive_mb, args.planted)
        run(plain, None, "plain", total)
        sealed = base / "sealed"
        build(sealed, args.mb, args.archive_mb, args.planted)
        key_file = base / "master.key"
        generate_master_key(key_file)
        encrypt_all(sealed, key_file)
        run(sealed, key_file, "encrypted", total)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
