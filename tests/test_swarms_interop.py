"""Interop with the real ``swarms`` package as the writer and the reader of MEMORY.md.

swarms pins an older litellm than memd needs, so it may live in its own
virtualenv: set ``MEMD_SWARMS_PYTHON`` to that interpreter (``.ci/run`` does).
Without swarms anywhere, these tests are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from support.memfiles import entry_contents_everywhere
from support.swarms import swarms_python

from memd.core.memfile import parse
from memd.workspace import agent_paths

pytestmark = pytest.mark.swarms


SWARMS_PYTHON = swarms_python()
needs_swarms = pytest.mark.skipif(SWARMS_PYTHON is None, reason="swarms is not installed")

WRITE = """
import json, sys
from swarms.structs.conversation import Conversation
path, name, turns = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
conversation = Conversation(name=name, memory_md_path=path)
for role, content in turns:
    conversation.add(role, content)
"""

READ = """
import json, sys
from swarms.structs.conversation import Conversation
conversation = Conversation(name=sys.argv[2], memory_md_path=sys.argv[1])
print(json.dumps(conversation.conversation_history))
"""

WRITE_LOOP = """
import sys, time
from swarms.structs.conversation import Conversation
path, count = sys.argv[1], int(sys.argv[2])
conversation = Conversation(name="loop", memory_md_path=path)
for i in range(count):
    conversation.add("Human", f"swarms-loop-{i} " + "talk " * (i % 9))
    time.sleep(0.012)
"""


def run_swarms(script: str, *args: str) -> str:
    assert SWARMS_PYTHON is not None
    result = subprocess.run(
        [SWARMS_PYTHON, "-c", script, *args],
        # swarms writes its own agent_workspace/ (logs) under the cwd.
        cwd=Path(args[0]).parents[3],  # the test's tmp dir, above the workspace
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def memd(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memd", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=cwd,
        env={
            **os.environ,
            "MEMD_COMPACTION_DRAIN_QUIET_S": "0.1",
            # Forty short turns are far below the turns kept verbatim by default
            # (a tenth of the 180,000-token default threshold): keep none here;
            # the kept tail has its own test below.
            "MEMD_SUMMARIZER_KEEP_RECENT_TOKENS": "0",
            **(env or {}),
        },
    )


TURNS = [
    ["Human", "My name is Ada and I prefer concise answers."],
    ["AI", "Noted, Ada. ### Not a header\n---\nStill the same turn."],
    ["Human", "Decision: we deploy memd as a systemd service on Friday."],
    ["AI", "Understood. Open task: write the runbook. Ünïcödé ✓"],
    ["Human", "Error seen yesterday: ENOSPC on /var during archive."],
] * 8


@needs_swarms
def test_memd_compacts_a_swarms_file_and_swarms_preloads_the_summary(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    memory = workspace / "agents" / "ada" / "MEMORY.md"
    run_swarms(WRITE, str(memory), "ada-chat", json.dumps(TURNS))
    before = memory.read_bytes()
    written = parse(before)
    assert len(written.entries) == len(TURNS)
    assert written.header is not None and written.header.conversation == "ada-chat"

    result = memd("compact-now", "ada", "--workspace", str(workspace))
    assert result.returncode == 0, result.stderr

    paths = agent_paths(workspace, "ada")
    archives = list(paths.archive_dir.glob("history_*.md"))
    assert [a.read_bytes() for a in archives] == [before]
    doc = parse(memory.read_bytes())
    assert doc.header is not None and doc.header.conversation == "ada-chat"
    assert len(doc.entries) == 1 and doc.entries[0].is_summary
    summary = doc.entries[0].summary_text
    assert summary.strip()

    # A fresh Swarms Conversation preloads memd's summary as its memory.
    history = json.loads(run_swarms(READ, str(memory), "ada-chat"))
    preload = history[0]["content"]
    assert preload.startswith("[Persistent Memory")
    assert "[Compressed Memory Summary]" in preload
    assert summary.strip().splitlines()[0] in preload

    # And keeps appending after it, in a format memd still parses.
    run_swarms(WRITE, str(memory), "ada-chat", json.dumps([["Human", "back again"]]))
    doc = parse(memory.read_bytes())
    assert [e.text for e in doc.raw_entries_since_summary()] == ["back again"]
    assert doc.boundary == doc.size


@needs_swarms
def test_swarms_preloads_the_summary_and_the_turns_kept_verbatim(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    memory = workspace / "agents" / "ada" / "MEMORY.md"
    run_swarms(WRITE, str(memory), "ada-chat", json.dumps(TURNS))
    before = parse(memory.read_bytes())
    # A 4,000-token window: threshold 3,600, a tenth of it kept verbatim.
    env = {"MEMD_TRIGGER_CONTEXT_LENGTH": "4000", "MEMD_SUMMARIZER_KEEP_RECENT_TOKENS": "-1"}
    result = memd("compact-now", "ada", "--workspace", str(workspace), env=env)
    assert result.returncode == 0, result.stderr
    doc = parse(memory.read_bytes())
    kept = doc.raw_entries_since_summary()
    assert doc.is_summary_entry(doc.entries[0]) and 0 < len(kept) < len(before.entries)
    assert [e.raw for e in kept] == [e.raw for e in before.entries[-len(kept) :]]

    # Swarms preloads the whole file: the summary, then the kept turns verbatim.
    preload = json.loads(run_swarms(READ, str(memory), "ada-chat"))[0]["content"]
    at = preload.index("[Compressed Memory Summary]")
    for entry in kept:
        assert preload.index(entry.raw.decode(), at) > at


@needs_swarms
def test_swarms_writer_appending_during_compactions_loses_nothing(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    memory = workspace / "agents" / "loop" / "MEMORY.md"
    count = 300
    assert SWARMS_PYTHON is not None
    writer = subprocess.Popen(
        [SWARMS_PYTHON, "-c", WRITE_LOOP, str(memory), str(count)],
        cwd=tmp_path,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    deadline = time.monotonic() + 60
    while not memory.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    runs = 0
    while writer.poll() is None:
        result = memd(
            "compact-now", "loop", "--workspace", str(workspace), "--summary", "loop summary"
        )
        assert result.returncode == 0, result.stderr
        runs += 1
    assert writer.wait() == 0
    assert runs >= 2
    seen = entry_contents_everywhere(agent_paths(workspace, "loop"))
    tags = Counter({text.split()[0]: n for text, n in seen.items()})
    assert set(tags) == {f"swarms-loop-{i}" for i in range(count)}
    assert set(tags.values()) == {1}
