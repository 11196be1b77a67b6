"""Reading agents' memd-agent.json from disk, and a real daemon following it."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.daemon_proc import DaemonProcess
from support.memfiles import AgentWorkspace, append_entry

from memd.core.descriptor import DescriptorError
from memd.descriptor import Descriptors, read_window


def words(text: str) -> int:
    return len(text.split())


def write(folder: Path, **fields: Any) -> Path:
    document = {
        "format": "memd-agent",
        "version": 1,
        "agent": folder.name,
        "model": "gpt-4o-mini",
        "context_length": 4000,
        "reserved": {"unit": "text", "text": "alpha beta"},
    }
    document.update(fields)
    path = folder / "memd-agent.json"
    temporary = folder / ".memd-agent.tmp"
    temporary.write_text(json.dumps(document), encoding="utf-8")
    os.replace(temporary, path)  # as memd_swarms writes it: a new inode each time
    return path


def test_absent_means_no_window(tmp_path: Path) -> None:
    assert read_window(tmp_path, words) == (None, None)


def test_symlinks_and_special_files_are_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write(elsewhere)
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "memd-agent.json").symlink_to(elsewhere / "memd-agent.json")
    with pytest.raises(DescriptorError, match="a symlink; memd does not follow it"):
        read_window(agent, words)
    (agent / "memd-agent.json").unlink()
    os.mkfifo(agent / "memd-agent.json")  # opening must not block on it
    with pytest.raises(DescriptorError, match="not a regular file"):
        read_window(agent, words)


def test_descriptors_reread_only_a_changed_file_and_a_bad_one_costs_only_its_window(
    tmp_path: Path,
) -> None:
    counted: list[str] = []

    def counting(text: str) -> int:
        counted.append(text)
        return words(text)

    descriptors = Descriptors(counting)
    assert not descriptors.changed("ada", tmp_path)
    write(tmp_path)
    assert descriptors.changed("ada", tmp_path)
    window = descriptors.window("ada", tmp_path)
    assert window is not None and (window.context_length, window.reserved_tokens) == (4000, 2)
    assert descriptors.window("ada", tmp_path) is window and len(counted) == 1
    assert not descriptors.changed("ada", tmp_path)
    write(tmp_path, context_length=9000)
    assert descriptors.changed("ada", tmp_path)
    window = descriptors.window("ada", tmp_path)
    assert window is not None and window.context_length == 9000
    (tmp_path / "memd-agent.json").write_text("{broken", encoding="utf-8")
    assert descriptors.window("ada", tmp_path) is None
    assert not descriptors.changed("ada", tmp_path)  # said once, not re-read every event


def test_a_running_daemon_follows_an_agents_descriptor(
    tmp_path: Path, cl100k: Callable[[str], int]
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("ada")
    memory = ws.root / "agents" / "ada" / "MEMORY.md"
    for n in range(30):
        append_entry(memory, "Human" if n % 2 == 0 else "AI", f"ada turn {n}: " + "word " * 20)
    config = tmp_path / "memd.toml"
    config.write_text(
        "[trigger]\ndebounce_ms = 40\nmax_wait_ms = 200\n[compaction]\ndrain_quiet_s = 0.05\n",
        encoding="utf-8",
    )
    with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
        daemon.wait_ready()
        # ~900 tokens against the default 200,000-token window: nothing to do.
        assert daemon.events("compaction started") == []
        # The agent declares a 1,024-token window (clamped up from 500, with a log
        # line) reserving a little: memd sees the new file without any MEMORY.md
        # change, and the agent is now over 0.9 × 1024 − reserved.
        write(memory.parent, context_length=500, reserved={"unit": "text", "text": "x " * 40})
        clamped = daemon.wait_for("agent descriptor clamped")
        assert (
            clamped["agent"] == "ada" and "context_length 500 clamped to 1024" in clamped["detail"]
        )
        read = daemon.wait_for("agent descriptor read")
        assert (read["context_length"], read["reserved_tokens"]) == (1024, cl100k("x " * 40))
        started = daemon.wait_for("compaction started", timeout=30)
        assert started["agent"] == "ada"
        daemon.wait_for("compacted", timeout=60)
        # A descriptor memd cannot use is reported once and the agent keeps running.
        # Written whole (temp + rename, as an agent writes it): an in-place write
        # can be read half-written, which is reported as another error first.
        future = memory.parent / ".memd-agent.tmp"
        future.write_text('{"format": "memd-agent", "version": 7}', encoding="utf-8")
        os.replace(future, memory.parent / "memd-agent.json")
        ignored = daemon.wait_for("agent descriptor ignored")
        assert "version 7 is not one memd reads" in ignored["error"]
        assert daemon.stop() == 0


def test_a_deeply_nested_descriptor_costs_only_its_agent_its_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # json's decoder recurses per nesting level: 200,000 "[" (under MAX_BYTES)
    # raised RecursionError past every caller, and the daemon never started.
    from support.cli import run

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("ada", entries=2)
    ws.create_agent("bob", entries=2)
    (ws.root / "agents" / "bob" / "memd-agent.json").write_bytes(b"[" * 200_000)
    config = tmp_path / "memd.toml"
    config.write_text("[trigger]\ndebounce_ms = 40\nmax_wait_ms = 200\n", encoding="utf-8")
    with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
        daemon.wait_ready()
        ignored = daemon.wait_for("agent descriptor ignored")
        assert (ignored["agent"], ignored["error"]) == (
            "bob",
            "memd-agent.json: JSON nested too deeply",
        )
        code, out, err = run(
            capsys, "status", "--workspace", str(ws.root), "--state-dir", str(tmp_path / "state")
        )
        assert code == 0 and "Traceback" not in err, err
        assert "ada" in out and "bob" in out
        assert daemon.stop() == 0


_REWRITER = """
import json, os, sys
folder = sys.argv[1]
text = " ".join(f"w{n}" for n in range(200_000))[: (1 << 20) - 400]  # near MAX_BYTES
n = 0
while True:
    document = {"format": "memd-agent", "version": 1, "agent": "flood",
                "context_length": 100_000 + n % 1000, "reserved": {"unit": "text", "text": text}}
    with open(folder + "/.memd-agent.tmp", "w") as handle:
        json.dump(document, handle)
    os.replace(folder + "/.memd-agent.tmp", folder + "/memd-agent.json")
    n += 1
"""


def test_an_agent_rewriting_its_descriptor_in_a_loop_keeps_no_other_agent_waiting(
    tmp_path: Path,
) -> None:
    # Each rewrite (1 MiB of reserved text to count) was read as its hint was taken:
    # the count thread never got to another agent's appends while the loop ran.
    import subprocess
    import sys

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("good", entries=1)
    ws.create_agent("flood", entries=1)
    config = tmp_path / "memd.toml"
    config.write_text(
        "[trigger]\ncontext_length = 1000\nthreshold = 0.5\ndebounce_ms = 40\n"
        "max_wait_ms = 200\n[compaction]\ndrain_quiet_s = 0.05\n",
        encoding="utf-8",
    )
    with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
        daemon.wait_ready()
        writer = subprocess.Popen(
            [sys.executable, "-c", _REWRITER, str(ws.root / "agents" / "flood")]
        )
        try:
            daemon.wait_for("agent descriptor read", lambda line: line["agent"] == "flood")
            memory = ws.root / "agents" / "good" / "MEMORY.md"
            for n in range(20):
                append_entry(memory, "Human", f"good turn {n}: " + "word " * 20)
            daemon.wait_for("compacted", lambda line: line["agent"] == "good", timeout=60)
        finally:
            writer.kill()
            writer.wait()
        assert daemon.stop() == 0


def test_compact_now_plans_with_the_agents_declared_window(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.cli import run

    # 30 short turns fit the default kept tail: keep none, so there is a plan.
    monkeypatch.setenv("MEMD_SUMMARIZER_KEEP_RECENT_TOKENS", "0")
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha", entries=30, size=60)

    def budgets() -> str:
        code, out, err = run(capsys, "compact-now", "alpha", "--dry-run", "-w", str(ws.root))
        assert code == 0, err
        (line,) = [line for line in out.splitlines() if "budgets:" in line]
        return line

    default = budgets()
    write(paths.dir, context_length=3000, reserved={"unit": "text", "text": "x " * 200})
    declared = budgets()
    # The summary budget scales with the threshold: 0.9 × 200,000 by default,
    # 0.9 × 3,000 − what the agent reserves with its descriptor (as the daemon sees it).
    assert "summary 36,000 tokens" in default

    def summary_budget(line: str) -> int:
        return int(line.split("summary ")[1].split(" tokens")[0].replace(",", ""))

    assert summary_budget(declared) < summary_budget(default) * (2700 - 201) / 180_000 + 1


def test_the_start_up_scan_reads_a_descriptor_it_lists_and_lstats_none_it_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memd.descriptor as descriptor_module
    from memd.core.config import MemdConfig
    from memd.daemon.registry import AgentRegistry

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("declared")
    ws.create_agent("plain")
    write(ws.root / "agents" / "declared", context_length=8000)
    registry = AgentRegistry(ws.root, MemdConfig(), lambda _paths, _key: None, None)
    registry.start(contextlib.ExitStack())
    registry.descriptors = Descriptors(words)
    looked: list[Path] = []
    real_key = descriptor_module.file_key
    monkeypatch.setattr(
        descriptor_module, "file_key", lambda folder: looked.append(folder) or real_key(folder)
    )
    entries = {name: registry.make_entry(name, link) for name, link in registry.scan().items()}
    declared, plain = entries["declared"], entries["plain"]
    assert declared is not None and plain is not None
    assert declared.policy.window_source == "memd-agent.json"
    assert declared.policy.context_length == 8000
    assert plain.policy.window_source == "default"
    assert looked == [declared.paths.dir]  # the plain agent's listing said: none


def test_a_reload_hands_the_registry_the_new_tokenizers_count_for_reserved_text(
    tmp_path: Path,
) -> None:
    from memd.core.config import MemdConfig
    from memd.daemon.registry import AgentRegistry

    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("declared")
    write(ws.root / "agents" / "declared")  # reserved text: "alpha beta"
    registry = AgentRegistry(ws.root, MemdConfig(), lambda _paths, _key: None, None)
    registry.start(contextlib.ExitStack())
    registry.descriptors = Descriptors(words)
    registry.register([entry for entry in [registry.make_entry("declared")] if entry], set())

    def reserved() -> int:
        return registry.agents()["declared"].policy.reserved_tokens

    assert reserved() == 2  # counted in words
    registry.reconfigure(MemdConfig())  # a reload that kept the tokenizer
    assert reserved() == 2
    registry.reconfigure(MemdConfig(), lambda text: len(text))  # a new tokenizer's count
    assert reserved() == len("alpha beta")
