"""Folders moved, replaced or re-pointed under the watches (review 14b): each agent's
events keep reaching the counter afterwards, with inotify and with ``--poll``."""

from __future__ import annotations

import contextlib
import os
import queue
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.hints import drain_hints, wait_for_hint
from support.memfiles import AgentWorkspace, swarms_header

from memd.daemon.counter import Hint, HintKind, HintSink
from memd.daemon.registry import AgentRegistry
from memd.daemon.watches import WatchService
from memd.settings import build_config
from memd.watcher import Watcher


@dataclass
class Rig:
    ws: AgentWorkspace
    registry: AgentRegistry
    inbox: queue.SimpleQueue[Hint]
    service: WatchService

    def drain(self) -> list[tuple[HintKind, str | None]]:
        """The hints queued so far."""
        return drain_hints(self.inbox)

    def wait_for(self, kind: HintKind, name: str | None, timeout: float = 3.0) -> bool:
        """Wait for one hint (a real inotify event on the watcher's thread)."""
        return wait_for_hint(self.inbox, kind, name, timeout)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    # carol's folder is a symlink inside the workspace (allowed by DESIGN §1).
    store = ws.root / "store"
    for target in ("c1", "c2"):
        (store / target).mkdir(parents=True)
        (store / target / "MEMORY.md").write_text(swarms_header("carol"))
    (ws.root / "agents" / "carol").symlink_to("../store/c1")
    config, _ = build_config({}, {})
    registry = AgentRegistry(ws.root, config, recover=lambda _p, _key: None, context_length_of=None)
    registry.start(contextlib.ExitStack())
    registry.reconcile()
    inbox: queue.SimpleQueue[Hint] = queue.SimpleQueue()
    sink = HintSink(inbox)
    watcher = Watcher(ws.root, sink, kind="inotify")
    service = WatchService(watcher, registry, sink, check_every_s=86_400)
    with contextlib.ExitStack() as stack:
        service.start(stack)
        yield Rig(ws, registry, inbox, service)


def test_inotify_follows_an_agent_folder_symlink_pointed_elsewhere(rig: Rig) -> None:
    agents = rig.ws.root / "agents"
    assert rig.service.watcher.watched() == {"alice", "carol"}
    # `ln -sfn ../store/c2 agents/carol`: a new link renamed over the old one.
    (agents / ".carol.tmp").symlink_to("../store/c2")
    os.replace(agents / ".carol.tmp", agents / "carol")
    assert rig.wait_for(HintKind.AGENTS, "carol")
    # What the daemon does on that hint: a rescan (the same names), then the
    # watch service's tick.
    assert rig.registry.reconcile() == ([], [])
    rig.service.tick()
    rig.drain()
    # The agent appends to its MEMORY.md, now in store/c2.
    with (rig.ws.root / "store" / "c2" / "MEMORY.md").open("a") as f:
        f.write("### Human — 2026-01-01T00:00:00\n\nhello\n\n---\n\n")
    assert rig.wait_for(HintKind.MEMORY, "carol")


def test_inotify_follows_agents_folder_replaced_by_a_rename(rig: Rig) -> None:
    root = rig.ws.root
    # A restore: the old tree moved aside (kept), a copy put in its place.
    fresh = root / "agents.new"
    (fresh / "alice").mkdir(parents=True)
    (fresh / "alice" / "MEMORY.md").write_text(swarms_header("alice"))
    (fresh / "carol").symlink_to("../store/c1")
    (root / "agents").rename(root / "agents.old")
    fresh.rename(root / "agents")
    assert rig.wait_for(HintKind.AGENTS, None)  # the counter's full reconcile follows
    assert rig.registry.reconcile() == ([], [])
    rig.service.tick()
    rig.drain()
    with (root / "agents" / "alice" / "MEMORY.md").open("a") as f:
        f.write("### Human — 2026-01-01T00:00:00\n\nhello\n\n---\n\n")
    assert rig.wait_for(HintKind.MEMORY, "alice")


@pytest.fixture
def poll_rig(tmp_path: Path) -> Iterator[Rig]:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alice")
    config, _ = build_config({}, {})
    registry = AgentRegistry(ws.root, config, recover=lambda _p, _key: None, context_length_of=None)
    registry.start(contextlib.ExitStack())
    registry.reconcile()
    inbox: queue.SimpleQueue[Hint] = queue.SimpleQueue()
    sink = HintSink(inbox)
    # Passes are run by hand (poll_once): the thread's interval is an hour.
    watcher = Watcher(ws.root, sink, kind="polling", poll_interval_s=3600)
    service = WatchService(watcher, registry, sink, check_every_s=86_400)
    with contextlib.ExitStack() as stack:
        service.start(stack)
        yield Rig(ws, registry, inbox, service)


def test_poller_watches_agents_folder_again_after_it_was_briefly_gone(poll_rig: Rig) -> None:
    rig = poll_rig
    backend = rig.service.watcher.backend
    assert backend is not None
    poller = backend.poller  # type: ignore[attr-defined]
    root = rig.ws.root
    assert poller.root_watched()
    # `mv agents agents.old && mv agents.new agents` (two renames), a pass between.
    (root / "agents").rename(root / "agents.old")
    poller.poll_once()
    (root / "agents.old").rename(root / "agents")
    assert ("agents", None) in [(k.value, n) for k, n in rig.drain()]
    # The daemon's response: the full reconcile (same agents), the watch service's tick.
    assert rig.registry.reconcile() == ([], [])
    rig.service.tick()
    rig.drain()
    # A new agent folder: the next pass should list agents/ and say so.
    rig.ws.create_agent("bob")
    poller.poll_once()
    assert (HintKind.AGENTS, "bob") in rig.drain()


def test_poller_sees_a_folder_made_again_when_the_workspace_path_is_a_symlink(
    tmp_path: Path,
) -> None:
    from memd.poller import HOT_S, SETTLE_S, StatPoller

    # `--workspace /srv/memd` where /srv/memd -> /data/memd: the Watcher pins
    # <workspace>/agents as given, the registry's agent folders are resolved.
    real = tmp_path / "data"
    (real / "agents").mkdir(parents=True)
    link = tmp_path / "srv"
    link.symlink_to(real)
    for name in ("alice", "bob"):
        (real / "agents" / name).mkdir()
        (real / "agents" / name / "MEMORY.md").write_text("# Agent Memory\n")
    now = [1000.0]
    events: list[tuple[str, str | None]] = []
    poller = StatPoller(
        lambda name: events.append(("agents", name)),
        lambda agent: events.append(("memory", agent)),
        interval_s=1.0,
        clock=lambda: now[0],
        fd_budget=100,
    )
    poller.watch_root(link / "agents")  # Watcher.agents_dir: workspace / "agents"
    for name in ("alice", "bob"):
        poller.watch(name, (link / "agents").resolve() / name)  # registry.dirs()
    poller.poll_once()  # the files written just now are hot from here...
    now[0] += HOT_S + SETTLE_S + 1  # ...until now: nothing hot, agents/ settled
    for _ in range(poller.verify_every):
        poller.poll_once()
    assert poller.held_fds("alice")[0] >= 0
    events.clear()
    alice = real / "agents" / "alice"
    (alice / "MEMORY.md").unlink()
    alice.rmdir()
    alice.mkdir()
    (alice / "MEMORY.md").write_text("# Agent Memory\n\na fresh start, longer than before\n")
    poller.poll_once()
    # As with a plain workspace path (test_poller's review 13a D3 test).
    assert events == [("agents", "alice"), ("memory", "alice")]


def test_inotify_follows_an_agent_folder_moved_away_and_replaced(rig: Rig) -> None:
    root = rig.ws.root
    agents = root / "agents"
    assert "alice" in rig.service.watcher.watched()
    # A restore: the live folder moved aside (out of agents/), a copy put in its place.
    fresh = root / "staging" / "alice"
    fresh.mkdir(parents=True)
    (fresh / "MEMORY.md").write_text(swarms_header("alice"))
    (root / "trash").mkdir()
    (agents / "alice").rename(root / "trash" / "alice")
    fresh.rename(agents / "alice")
    assert rig.wait_for(HintKind.AGENTS, "alice")
    assert rig.registry.reconcile() == ([], [])
    rig.service.tick()
    rig.drain()
    with (agents / "alice" / "MEMORY.md").open("a") as f:
        f.write("### Human — 2026-01-01T00:00:00\n\nhello\n\n---\n\n")
    assert rig.wait_for(HintKind.MEMORY, "alice")
