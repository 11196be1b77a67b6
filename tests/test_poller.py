"""The stat poller, one pass at a time: real files, no thread, a made-up clock, no sleeping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memd.core.descriptor import DESCRIPTOR_NAME
from memd.poller import DESCRIPTOR_EVERY, SETTLE_S, StatPoller

Event = tuple[str, str | None]


class Fleet:
    """agents/ with a poller on it; ``one_pass()`` returns what the pass reported."""

    def __init__(self, tmp_path: Path, *names: str) -> None:
        self.agents = tmp_path / "agents"
        self.agents.mkdir()
        for name in names:
            (self.agents / name).mkdir()
        self.now = 1000.0
        self.events: list[Event] = []
        self.poller = StatPoller(
            lambda name: self.events.append(("agents", name)),
            lambda agent: self.events.append(("memory", agent)),
            interval_s=3600,
            clock=lambda: self.now,
        )
        self.poller.watch_root(self.agents)
        for name in names:
            self.poller.watch(name, self.agents / name)

    def one_pass(self) -> list[Event]:
        self.events.clear()
        self.poller.poll_once()
        return list(self.events)

    def settle(self) -> None:
        """Let the made-up clock run past the window where agents/ is listed every pass."""
        self.now += SETTLE_S + 1


def test_each_change_is_reported_once_per_pass(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, "alice")
    alice = fleet.agents / "alice"
    one_pass = fleet.one_pass
    assert fleet.poller.watched() == {"alice"} and fleet.poller.root_watched()

    assert one_pass() == []
    memory = alice / "MEMORY.md"
    memory.write_bytes(b"# Agent Memory\n")
    assert one_pass() == [("memory", "alice")]
    assert one_pass() == []
    with memory.open("ab") as f:
        f.write(b"one more line\n")
    assert one_pass() == [("memory", "alice")]
    (alice / ".memd").mkdir()
    (alice / ".memd" / "journal").write_text("{}")
    assert one_pass() == []  # memd's private files are not agent activity

    (fleet.agents / "bob").mkdir()
    assert one_pass() == [("agents", "bob")]
    (fleet.agents / "bob").rename(fleet.agents / "carol")
    assert sorted(one_pass()) == [("agents", "bob"), ("agents", "carol")]

    (alice / DESCRIPTOR_NAME).write_text("{}")
    seen = [event for _ in range(DESCRIPTOR_EVERY) for event in one_pass()]
    assert seen == [("memory", "alice")]

    memory.unlink()
    (alice / DESCRIPTOR_NAME).unlink()
    (alice / ".memd" / "journal").unlink()
    (alice / ".memd").rmdir()
    alice.rmdir()
    assert ("agents", "alice") in one_pass()
    fleet.poller.unwatch("alice")
    assert fleet.poller.watched() == set()


def test_a_replaced_file_of_the_same_size_is_noticed(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, "alice")
    memory = fleet.agents / "alice" / "MEMORY.md"
    memory.write_bytes(b"# Agent Memory\n")
    fleet.one_pass()
    before = memory.stat()
    replacement = memory.with_name("MEMORY.md.tmp")
    replacement.write_bytes(b"# Agent Memory\n")
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))  # same size, same mtime
    os.replace(replacement, memory)
    assert memory.stat().st_ino != before.st_ino
    assert fleet.one_pass() == [("memory", "alice")]


def test_agents_folder_is_listed_only_when_its_stat_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = Fleet(tmp_path, "alice")
    listings: list[object] = []
    real_listdir = os.listdir

    def listdir(path: str) -> list[str]:
        listings.append(path)
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    fleet.one_pass()
    assert len(listings) == 1  # still settling after watch_root
    fleet.settle()
    listings.clear()
    (fleet.agents / "alice" / "MEMORY.md").write_text("x")  # inside a folder: agents/ unmoved
    assert fleet.one_pass() == [("memory", "alice")]
    assert fleet.one_pass() == []
    assert listings == []
    (fleet.agents / "bob").mkdir()
    assert fleet.one_pass() == [("agents", "bob")]
    assert len(listings) == 1


def test_a_folder_made_in_the_same_clock_tick_is_still_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Coarse timestamps: a second mkdir in the tick of the first leaves
    # agents/ with the stat already seen. Listing goes on for SETTLE_S after
    # a move, so the second folder still shows.
    fleet = Fleet(tmp_path, "alice")
    fleet.settle()
    fleet.one_pass()
    root = os.fsencode(fleet.agents)
    real_stat = os.stat
    frozen: dict[bytes, os.stat_result] = {}

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        result = real_stat(path, *args, **kwargs)  # type: ignore[arg-type]
        if path == root:
            return frozen.setdefault(root, result)
        return result

    (fleet.agents / "bob").mkdir()
    monkeypatch.setattr(os, "stat", stat)
    assert fleet.one_pass() == [("agents", "bob")]  # the stat moved (and is frozen now)
    (fleet.agents / "carol").mkdir()  # agents/ shows the same stat
    fleet.now += SETTLE_S / 2
    assert fleet.one_pass() == [("agents", "carol")]


def test_a_file_that_cannot_be_stated_does_not_stop_the_pass(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, "alice", "bob")
    memory = fleet.agents / "alice" / "MEMORY.md"
    memory.write_text("x")
    assert fleet.one_pass() == [("memory", "alice")]
    memory.unlink()
    memory.symlink_to("MEMORY.md")  # ELOOP on every stat
    (fleet.agents / "bob" / "MEMORY.md").write_text("x")
    assert fleet.one_pass() == [("memory", "alice"), ("memory", "bob")]
    assert fleet.one_pass() == []
    memory.unlink()
    memory.write_text("fixed")
    assert fleet.one_pass() == [("memory", "alice")]


def test_a_replaced_agents_folder_is_pinned_again(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, "alice")
    fleet.agents.rename(tmp_path / "agents.old")
    (fleet.agents / "alice").mkdir(parents=True)
    assert ("agents", None) in fleet.one_pass()
    assert fleet.poller.root_watched()
    (fleet.agents / "alice" / "MEMORY.md").write_text("in the new agents/")
    (tmp_path / "agents.old" / "alice" / "MEMORY.md").write_text("in the old one, longer")
    assert fleet.one_pass() == [("memory", "alice")]
    assert (fleet.agents / "alice" / "MEMORY.md").read_text() == "in the new agents/"
    os.remove(fleet.agents / "alice" / "MEMORY.md")
    assert fleet.one_pass() == [("memory", "alice")]  # the new file, not the old one


def test_agents_folder_gone_is_unwatched_for_the_next_sync(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, "alice")
    fleet.agents.rename(tmp_path / "elsewhere")
    events = fleet.one_pass()
    assert ("agents", None) in events
    assert not fleet.poller.root_watched()
    # Agent folders are then stat'ed by their full path.
    (fleet.agents / "alice").mkdir(parents=True)
    (fleet.agents / "alice" / "MEMORY.md").write_text("x")
    assert fleet.one_pass() == [("memory", "alice")]


def test_agent_folder_outside_agents_is_stated_by_its_full_path(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    outside = tmp_path / "outside" / "dave"
    outside.mkdir(parents=True)
    fleet.poller.watch("dave", outside)
    (outside / "MEMORY.md").write_text("x")
    assert fleet.one_pass() == [("memory", "dave")]


def test_a_missing_folder_is_refused(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    with pytest.raises(OSError):
        fleet.poller.watch("ghost", tmp_path / "ghost")


def test_stop_closes_the_pinned_folder(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, "alice")
    before = set(os.listdir("/proc/self/fd"))
    fleet.poller.stop()
    assert len(before - set(os.listdir("/proc/self/fd"))) == 1
    assert not fleet.poller.root_watched() and fleet.poller.watched() == set()
