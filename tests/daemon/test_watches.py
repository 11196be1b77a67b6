"""The watch service: the watches follow the agent set the registry publishes,
with real watchdog/inotify events; what it asks of the counter is read off the
counter's hint queue (nothing is called back)."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.hints import drain_hints, wait_for_hint
from support.memfiles import AgentWorkspace

import memd.watcher
from memd.daemon.committed import Replacements
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
    stack: contextlib.ExitStack
    backends: list[Any] = field(default_factory=list)  # every backend the watcher started

    def agent_dir(self, name: str) -> Path:
        return self.ws.root / "agents" / name

    def drain(self) -> list[tuple[HintKind, str | None]]:
        """The hints queued so far."""
        return drain_hints(self.inbox)

    def count_requests(self) -> list[str]:
        return [name for kind, name in self.drain() if kind is HintKind.COUNT_NOW and name]

    def wait_for(self, kind: HintKind, name: str | None, timeout: float = 10.0) -> bool:
        """Wait for one hint (a real inotify event on the watcher's thread)."""
        return wait_for_hint(self.inbox, kind, name, timeout)

    def write(self, name: str, text: str = "x") -> None:
        (self.agent_dir(name) / "MEMORY.md").write_text(text)

    def sees_writes_to(self, name: str) -> bool:
        self.drain()
        self.write(name, f"written at {time.monotonic()}")
        return self.wait_for(HintKind.MEMORY, name)


@pytest.fixture
def rig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    # The backend is reached through its one swappable name (watchfiles' pattern).
    backends: list[Any] = []
    real_make_backend = memd.watcher.make_backend

    def make_backend(*args: Any, **kwargs: Any) -> Any:
        backends.append(real_make_backend(*args, **kwargs))
        return backends[-1]

    monkeypatch.setattr(memd.watcher, "make_backend", make_backend)
    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alice", "bob"):
        ws.create_agent(name)
    config, _ = build_config({}, {})
    registry = AgentRegistry(ws.root, config, recover=lambda _p, _key: None, context_length_of=None)
    registry.start(contextlib.ExitStack())
    registry.reconcile()
    inbox: queue.SimpleQueue[Hint] = queue.SimpleQueue()
    sink = HintSink(inbox)
    watcher = Watcher(ws.root, sink, kind="inotify")
    # A day between checks: in these tests the service acts on a rescan or a tick only.
    service = WatchService(watcher, registry, sink, check_every_s=86_400)
    with contextlib.ExitStack() as stack:
        service.start(stack)
        yield Rig(ws, registry, inbox, service, stack, backends)


def test_start_watches_every_registered_agent_and_asks_for_no_count(rig: Rig) -> None:
    assert rig.service.watcher.watched() == {"alice", "bob"}
    assert rig.service.is_alive()
    assert rig.sees_writes_to("alice") and rig.sees_writes_to("bob")
    rig.service.tick()  # nothing changed: nothing asked
    assert rig.count_requests() == []


def test_a_new_agent_is_watched_then_counted_and_a_gone_one_unwatched(rig: Rig) -> None:
    rig.ws.create_agent("carol")
    shutil.rmtree(rig.agent_dir("bob"))
    assert rig.registry.reconcile() == (["carol"], ["bob"])
    rig.drain()
    rig.service.tick()
    assert rig.service.watcher.watched() == {"alice", "carol"}
    assert rig.count_requests() == ["carol"]  # watched first: nothing written since is missed
    assert rig.sees_writes_to("carol")


def test_a_folder_replaced_under_the_same_name_is_watched_again_and_recounted(
    rig: Rig,
) -> None:
    shutil.rmtree(rig.agent_dir("alice"))
    rig.ws.create_agent("alice")
    # The old folder's watch went with it (inotify says so on the watcher's thread).
    assert rig.wait_for(HintKind.AGENTS, "alice")
    deadline = time.monotonic() + 10
    while "alice" in rig.service.watcher.watched() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rig.registry.reconcile() == ([], [])  # the same agent set
    rig.drain()
    rig.service.tick()
    assert rig.service.watcher.watched() == {"alice", "bob"}
    assert rig.count_requests() == ["alice"]
    assert rig.sees_writes_to("alice")


def test_a_dead_watcher_is_restarted_and_every_agent_recounted(rig: Rig) -> None:
    assert len(rig.backends) == 1
    rig.backends[0].stop()  # its thread dies under us
    assert not rig.service.is_alive()
    rig.drain()
    rig.service.tick()
    assert rig.service.is_alive() and len(rig.backends) == 2  # a new backend
    assert rig.count_requests() == ["alice", "bob"]
    assert rig.sees_writes_to("alice")


def test_a_watch_that_failed_is_retried_at_the_next_tick(rig: Rig) -> None:
    rig.ws.create_agent("dave")
    assert rig.registry.reconcile() == (["dave"], [])
    shutil.rmtree(rig.agent_dir("dave"))  # gone before it could be watched
    rig.service.tick()
    assert "dave" in rig.service.watcher.failed
    assert rig.service.watcher.watched() == {"alice", "bob"}
    rig.ws.create_agent("dave")
    rig.drain()
    rig.service.tick()
    assert rig.service.watcher.failed == {}
    assert rig.service.watcher.watched() == {"alice", "bob", "dave"}
    assert rig.count_requests() == ["dave"]
    assert rig.sees_writes_to("dave")


def test_the_thread_follows_each_published_rescan_and_stops_when_asked(rig: Rig) -> None:
    rig.ws.create_agent("erin")
    rig.drain()
    rig.registry.reconcile()  # published: the service's thread acts, no tick from here
    assert rig.wait_for(HintKind.COUNT_NOW, "erin")
    assert "erin" in rig.service.watcher.watched()
    rig.stack.close()  # shutdown: the service, then the watcher
    assert not rig.service.is_alive() and not rig.service.watcher.is_alive()


def test_a_folder_renamed_and_replaced_keeps_a_watch_under_each_name(rig: Rig) -> None:
    # `mv alice carol && mkdir alice`: inotify hands the moved folder's watch to
    # carol; alice's new folder needs a watch of its own.
    rig.agent_dir("alice").rename(rig.agent_dir("carol"))
    rig.ws.create_agent("alice")
    assert rig.registry.reconcile() == (["carol"], [])
    rig.drain()
    rig.service.tick()
    assert rig.service.watcher.watched() == {"alice", "bob", "carol"}
    # Each is counted: carol as a new agent, alice either as lost by the tick or,
    # when the reader saw the move first and watched alice's new folder itself,
    # through the MEMORY hint it gives for it.
    counted = {name for kind, name in rig.drain() if kind in (HintKind.COUNT_NOW, HintKind.MEMORY)}
    assert counted == {"alice", "carol"}
    assert rig.sees_writes_to("alice") and rig.sees_writes_to("carol")


def test_memds_own_replacement_reaches_the_poller_as_an_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --poll: memd's compaction renames a new file over a MEMORY.md the poller
    # holds (its size never moves); the agent has not written for hours (not hot)
    # and its path's turn never comes here. The commit is put on Replacements as
    # the kernel queues a rename; the service's thread hands it to the watcher and
    # the next pass reports the file.
    monkeypatch.setattr("memd.poller.VERIFY_S", 10.0**6)
    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alice", "bob"):
        ws.create_agent(name)
    long_ago = time.time() - 7200
    memory = ws.root / "agents" / "alice" / "MEMORY.md"
    os.utime(memory, (long_ago, long_ago))
    config, _ = build_config({}, {})
    registry = AgentRegistry(ws.root, config, recover=lambda _p, _key: None, context_length_of=None)
    registry.start(contextlib.ExitStack())
    registry.reconcile()
    inbox: queue.SimpleQueue[Hint] = queue.SimpleQueue()
    sink = HintSink(inbox)
    replacements = Replacements()
    watcher = Watcher(ws.root, sink, kind="polling", poll_interval_s=0.05)
    service = WatchService(watcher, registry, sink, check_every_s=86_400, replacements=replacements)
    with contextlib.ExitStack() as stack:
        service.start(stack)
        backend: Any = watcher.backend
        deadline = time.monotonic() + 10
        while backend.poller.held_fds("alice")[0] < 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert backend.poller.held_fds("alice")[0] >= 0
        new = memory.with_name("MEMORY.md.new")
        new.write_text("# summary\n")
        os.replace(new, memory)
        replacements.put("alice")
        rig = Rig(ws, registry, inbox, service, stack)
        assert rig.wait_for(HintKind.MEMORY, "alice")
        rig.drain()
        with memory.open("a") as f:  # the new file held now: its append shows
            f.write("the next entry\n")
        assert rig.wait_for(HintKind.MEMORY, "alice")
    assert not service.is_alive()
