"""The registry owns the agent set: a rescan adds and removes agents and is
published (the watch service waits for it; the registry calls no one)."""

from __future__ import annotations

import contextlib
import shutil
import threading
from pathlib import Path

import pytest
from support.memfiles import AgentWorkspace

from memd.daemon.registry import AgentRegistry, Rescans
from memd.settings import build_config


def make_registry(ws: AgentWorkspace) -> AgentRegistry:
    config, _ = build_config({}, {})
    registry = AgentRegistry(ws.root, config, recover=lambda _p, _key: None, context_length_of=None)
    registry.start(contextlib.ExitStack())
    return registry


def test_each_rescan_adds_removes_and_is_published(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    ws.create_agent("bob")
    (ws.root / "agents" / "a..b").mkdir()  # refused: never an agent
    registry = make_registry(ws)
    assert registry.rescans.number == 0
    assert registry.reconcile() == (["alice", "bob"], [])
    assert registry.rescans.number == 1
    assert registry.dirs() == {name: str(ws.root / "agents" / name) for name in ("alice", "bob")}
    shutil.rmtree(ws.root / "agents" / "alice")
    ws.create_agent("carol")
    assert registry.reconcile() == (["carol"], ["alice"])
    assert registry.reconcile() == ([], [])  # nothing changed: published all the same
    assert registry.rescans.number == 3
    assert registry.names() == {"bob", "carol"}


def test_a_waiter_sees_the_next_rescan_or_its_stop() -> None:
    rescans = Rescans()
    stop = threading.Event()
    assert rescans.wait(0, 0, stop) == 0  # nothing new: back after the timeout
    rescans.publish()
    assert rescans.wait(0, 3600, stop) == 1  # already past what was seen: no wait
    seen: list[int] = []
    waiter = threading.Thread(target=lambda: seen.append(rescans.wait(1, 3600, stop)))
    waiter.start()
    rescans.publish()
    waiter.join()
    assert seen == [2]
    waiter = threading.Thread(target=lambda: seen.append(rescans.wait(2, 3600, stop)))
    waiter.start()
    stop.set()
    rescans.wake()
    waiter.join()
    assert seen == [2, 2]  # woken by its stop, no rescan


def test_recovery_is_handed_the_current_configs_key_file(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    (ws.root / "agents" / "alice" / ".memd").mkdir()  # compacted before: may need recovery
    handed: list[Path | None] = []

    def recover(_paths: object, key_file: Path | None) -> None:
        handed.append(key_file)

    plain, _ = build_config({}, {})
    registry = AgentRegistry(ws.root, plain, recover=recover, context_length_of=None)
    registry.start(contextlib.ExitStack())

    def add_alice() -> None:
        entry = registry.make_entry("alice")
        assert entry is not None and entry.may_need_recovery
        registry.recover(entry)

    add_alice()
    assert handed == [None]  # archives not encrypted: no key
    key = tmp_path / "master.key"
    sealed, _ = build_config({"privacy": {"encrypt_archives": True, "key_file": str(key)}}, {})
    registry.reconfigure(sealed)  # a reload: the registry holds the new config's value
    add_alice()
    assert handed == [None, key]


def test_a_badly_named_folder_is_said_once_and_hidden_ones_never(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    (ws.root / "agents" / "a..b").mkdir()
    (ws.root / "agents" / ".git").mkdir()
    registry = make_registry(ws)
    capsys.readouterr()
    assert registry.scan() == {"alice": False}
    assert registry.scan() == {"alice": False}  # the workspace returns it; the registry says it
    said = [line for line in capsys.readouterr().out.splitlines() if "agent skipped" in line]
    assert len(said) == 1 and "a..b" in said[0]
