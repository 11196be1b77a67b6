"""``memd run --demo``: a small workspace that shows a compaction within seconds.

Two agents get Swarms-format MEMORY.md files, and the demo settings shrink the
context window to 4,000 tokens so both are over their threshold at start:
the daemon compacts them with the built-in (offline) summarizer, and any
further appends are counted and compacted live.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from memd.core.config import MemdConfig
from memd.core.memfile import render_entry, render_header
from memd.settings import apply_settings

DEMO_DIR = Path("memd-demo")
DEMO_CONTEXT_LENGTH = 4_000

_TURNS = {
    "researcher": [
        (
            "Human",
            "We need a memory daemon for our agent fleet. Goal: keep MEMORY.md under "
            "the context window without losing a single turn.",
        ),
        (
            "AI",
            "Understood. I will compare logrotate-style create mode against copytruncate; "
            "copytruncate loses lines written between the copy and the truncate.",
        ),
        ("Human", "Decision: we use create mode with a journal. Deadline is Friday."),
        ("AI", "Noted the decision. Open task: measure compaction overhead on a 1 MB file."),
        ("Human", "I prefer short answers with numbers, please."),
        ("AI", "Measured: 29 ms median for 1 MB, excluding the LLM call."),
        (
            "Human",
            "Error report: the old in-process compaction deleted MEMORY.md when the "
            "archive write failed with ENOSPC.",
        ),
        ("AI", "That is why memd never removes anything before the archive is durable."),
    ],
    "writer": [
        ("Human", "Draft the README quickstart: two commands, no API key needed."),
        ("AI", "Draft: one command runs memd on a demo workspace, one runs the tests."),
        ("Human", "Use the name 'memd' everywhere, lower case."),
        ("AI", "Done. Open question: do we document NFS? Locks may not work there."),
        ("Human", "Yes, warn about NFS without lockd and Docker Desktop shares."),
        ("AI", "Added a troubleshooting section with those warnings."),
    ],
}


# What the demo sets over the user's config; saved in the workspace's pointer
# (memd.pointer), so later commands on the demo workspace show the same thresholds.
DEMO_SETTINGS: dict[str, dict[str, Any]] = {
    "trigger": {"context_length": DEMO_CONTEXT_LENGTH, "max_tokens": 0, "debounce_ms": 300}
}


def demo_config(config: MemdConfig) -> MemdConfig:
    """The user's config with a tiny context window so the demo compacts at once."""
    return apply_settings(config, DEMO_SETTINGS, "memd run --demo")


def seed_demo_workspace(root: Path, rounds: int = 14) -> list[str]:
    """Create the demo agents under ``root`` unless they already exist."""
    created = []
    # Fixed and naive (Swarms writes naive local time), so demo files are reproducible.
    start = datetime(2026, 1, 5, 9, 0, 0)  # noqa: DTZ001
    for agent, turns in _TURNS.items():
        folder = root / "agents" / agent
        memory = folder / "MEMORY.md"
        if memory.exists():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        parts = [render_header(f"{agent}-demo", start.isoformat())]
        stamp = start
        # The writer's turns are shorter: more rounds put it over threshold too.
        # Repeated turns, as real sessions repeat themselves.
        for _ in range(rounds if agent == "researcher" else rounds * 3 // 2):
            for role, content in turns:
                stamp += timedelta(seconds=37)
                parts.append(render_entry(role, stamp.isoformat(), content))
        memory.write_bytes(b"".join(parts))
        created.append(agent)
    return created
