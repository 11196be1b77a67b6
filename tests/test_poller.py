"""The stat poller, one pass at a time: real files, no thread, a made-up clock, no sleeping."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memd.core.descriptor import DESCRIPTOR_NAME
from memd.poller import (
    DESCRIPTOR_S,
    HOT_S,
    SETTLE_S,
    VERIFY_S,
    StatPoller,
    default_fd_budget,
    passes_within,
)

Event = tuple[str, str | None]
# The fleets' poll interval (their passes are run by hand): the daemon's default.
INTERVAL_S = 1.0
# Passes until every agent's path, and every descriptor, had its turn.
VERIFY_EVERY = passes_within(VERIFY_S, INTERVAL_S)
DESCRIPTOR_EVERY = passes_within(DESCRIPTOR_S, INTERVAL_S)


class Fleet:
    """agents/ with a poller on it; ``one_pass()`` returns what the pass reported."""

    def __init__(
        self, tmp_path: Path, *names: str, fd_budget: int = 0, interval_s: float = INTERVAL_S
    ) -> None:
        self.agents = tmp_path / "agents"
        self.agents.mkdir()
        for name in names:
            (self.agents / name).mkdir()
        self.now = 1000.0
        self.events: list[Event] = []
        self.poller = StatPoller(
            lambda name: self.events.append(("agents", name)),
            lambda agent: self.events.append(("memory", agent)),
            interval_s=interval_s,
            clock=lambda: self.now,
            fd_budget=fd_budget,
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


MakeFleet = Callable[..., Fleet]


def make_plain_fleet(tmp_path: Path, *names: str) -> Fleet:
    return Fleet(tmp_path, *names, fd_budget=0)


@pytest.fixture(params=[0, 100], ids=["path-stat", "held-open"])
def make_fleet(request: pytest.FixtureRequest, tmp_path: Path) -> MakeFleet:
    """Fleets whose poller stats every path, or holds MEMORY.md files open."""

    def make(*names: str) -> Fleet:
        return Fleet(tmp_path, *names, fd_budget=request.param)

    return make


def test_each_change_is_reported_once_per_pass(tmp_path: Path, make_fleet: MakeFleet) -> None:
    fleet = make_fleet("alice")
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


def test_a_replaced_file_of_the_same_size_is_noticed(tmp_path: Path, make_fleet: MakeFleet) -> None:
    fleet = make_fleet("alice")
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
    tmp_path: Path, make_fleet: MakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = make_fleet("alice")
    listings: list[object] = []
    real_scandir = os.scandir

    def scandir(path: str) -> Any:
        listings.append(path)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
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
    tmp_path: Path, make_fleet: MakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Coarse timestamps: a second mkdir in the tick of the first leaves
    # agents/ with the stat already seen. Listing goes on for SETTLE_S after
    # a move, so the second folder still shows.
    fleet = make_fleet("alice")
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


def test_a_file_that_cannot_be_stated_does_not_stop_the_pass(
    tmp_path: Path, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet("alice", "bob")
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


def test_a_replaced_agents_folder_is_pinned_again(tmp_path: Path, make_fleet: MakeFleet) -> None:
    fleet = make_fleet("alice")
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


def test_agents_folder_gone_is_unwatched_for_the_next_sync(
    tmp_path: Path, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet("alice")
    fleet.agents.rename(tmp_path / "elsewhere")
    events = fleet.one_pass()
    assert ("agents", None) in events
    assert not fleet.poller.root_watched()
    # Agent folders are then stat'ed by their full path.
    (fleet.agents / "alice").mkdir(parents=True)
    (fleet.agents / "alice" / "MEMORY.md").write_text("x")
    assert fleet.one_pass() == [("memory", "alice")]


def test_agent_folder_outside_agents_is_stated_by_its_full_path(
    tmp_path: Path, make_fleet: MakeFleet
) -> None:
    fleet = make_fleet()
    outside = tmp_path / "outside" / "dave"
    outside.mkdir(parents=True)
    fleet.poller.watch("dave", outside)
    (outside / "MEMORY.md").write_text("x")
    assert fleet.one_pass() == [("memory", "dave")]


def test_a_missing_folder_is_refused(tmp_path: Path, make_fleet: MakeFleet) -> None:
    fleet = make_fleet()
    with pytest.raises(OSError):
        fleet.poller.watch("ghost", tmp_path / "ghost")


def test_stop_closes_the_pinned_folder_and_every_held_file(make_fleet: MakeFleet) -> None:
    fleet = make_fleet("alice", "bob")
    for name in ("alice", "bob"):
        (fleet.agents / name / "MEMORY.md").write_text("x")
    fleet.one_pass()

    def ours() -> set[str]:
        """What this process has open under the fleet's agents/ (itself included)."""
        found = set()
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{fd}")
                if target.startswith(os.path.realpath(fleet.agents)):
                    found.add(target)
        return found

    agents = os.path.realpath(fleet.agents)
    held = {os.path.join(agents, name, "MEMORY.md") for name in ("alice", "bob")}
    assert ours() == {agents} | (held if fleet.poller.held() else set())
    fleet.poller.stop()
    assert ours() == set()
    assert not fleet.poller.root_watched() and fleet.poller.watched() == set()
    assert fleet.poller.held() == 0


# ---------------------------------------------------------------- held open


def held_fleet(
    tmp_path: Path, *names: str, fd_budget: int = 100, interval_s: float = INTERVAL_S
) -> Fleet:
    fleet = Fleet(tmp_path, *names, fd_budget=fd_budget, interval_s=interval_s)
    for name in names:
        (fleet.agents / name / "MEMORY.md").write_text("# Agent Memory\n")
    assert sorted(fleet.one_pass()) == [("memory", name) for name in sorted(names)]
    return fleet


def test_a_held_file_follows_the_path_through_replacements(tmp_path: Path) -> None:
    fleet = held_fleet(tmp_path, "alice")
    assert fleet.poller.held() == 1
    memory = fleet.agents / "alice" / "MEMORY.md"
    with memory.open("a") as f:
        f.write("appended\n")
    assert fleet.one_pass() == [("memory", "alice")]
    assert fleet.one_pass() == []

    replacement = memory.with_name("MEMORY.md.tmp")
    replacement.write_bytes(memory.read_bytes())
    os.replace(replacement, memory)  # a new inode, same size
    assert fleet.one_pass() == [("memory", "alice")]
    with memory.open("a") as f:  # written in the new file: the fd now held
        f.write("more\n")
    assert fleet.one_pass() == [("memory", "alice")]

    memory.rename(memory.with_name("old.md"))  # renamed away (keeps its one link)
    memory.write_bytes(memory.with_name("old.md").read_bytes())
    assert fleet.one_pass() == [("memory", "alice")]
    with memory.with_name("old.md").open("a") as f:
        f.write("not MEMORY.md any more\n")
    assert fleet.one_pass() == []
    with memory.open("a") as f:
        f.write("in MEMORY.md\n")
    assert fleet.one_pass() == [("memory", "alice")]
    assert fleet.poller.held() == 1


def test_the_budget_bounds_the_files_held_open(tmp_path: Path) -> None:
    fleet = held_fleet(tmp_path, "alice", "bob", "carol", fd_budget=1)
    assert fleet.poller.held() == 1
    for name in ("alice", "bob", "carol"):
        with (fleet.agents / name / "MEMORY.md").open("a") as f:
            f.write("x\n")
    assert sorted(fleet.one_pass()) == [("memory", "alice"), ("memory", "bob"), ("memory", "carol")]
    assert fleet.poller.held() == 1


def test_linked_files_are_stated_by_path_not_held(tmp_path: Path) -> None:
    # A second hard link would hide a replacement (the held inode keeps a
    # link); a symlink can be pointed elsewhere without touching its target.
    fleet = held_fleet(tmp_path, "alice", "bob")
    os.link(fleet.agents / "alice" / "MEMORY.md", tmp_path / "backup.md")
    bob = fleet.agents / "bob" / "MEMORY.md"
    (fleet.agents / "bob" / "one.md").write_text("same size\n")
    (fleet.agents / "bob" / "two.md").write_text("same size\n")
    bob.unlink()
    bob.symlink_to("one.md")
    assert fleet.one_pass() == [("memory", "bob")]  # alice's content did not change
    assert fleet.poller.held() == 0
    bob.unlink()
    bob.symlink_to("two.md")
    assert fleet.one_pass() == [("memory", "bob")]
    replacement = tmp_path / "new.md"
    replacement.write_bytes((fleet.agents / "alice" / "MEMORY.md").read_bytes())
    os.replace(replacement, fleet.agents / "alice" / "MEMORY.md")
    assert fleet.one_pass() == [("memory", "alice")]


def test_a_removed_folder_gives_its_file_back(tmp_path: Path) -> None:
    fleet = held_fleet(tmp_path, "alice")
    (fleet.agents / "alice" / "MEMORY.md").unlink()
    (fleet.agents / "alice").rmdir()
    assert ("agents", "alice") in fleet.one_pass()
    assert fleet.poller.held() == 0
    bob = tmp_path / "second"
    bob.mkdir()
    fleet = held_fleet(bob, "bob")
    assert fleet.poller.held() == 1
    fleet.poller.unwatch("bob")
    assert fleet.one_pass() == []  # the pass thread gives its fds back
    assert fleet.poller.held() == 0


def test_a_held_file_is_checked_against_its_path_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where a rename does not move the held inode's ctime (not every
    # filesystem sets it), the fstat alone would never tell: every agent's
    # path is stat'ed again within VERIFY_EVERY passes.
    fleet = held_fleet(tmp_path, "alice")
    memory = fleet.agents / "alice" / "MEMORY.md"
    held, _ = fleet.poller.held_fds("alice")
    assert held >= 0
    before = os.fstat(held)
    memory.rename(memory.with_name("old.md"))
    memory.write_text("a new file\n")
    real_fstat = os.fstat

    class Unmoved:
        """The held inode's fstat, its ctime as before the rename."""

        def __init__(self, st: os.stat_result) -> None:
            self._st = st

        def __getattr__(self, name: str) -> object:
            return before.st_ctime_ns if name == "st_ctime_ns" else getattr(self._st, name)

    def fstat(fd: int) -> object:
        st = real_fstat(fd)
        return Unmoved(st) if fd == held else st

    monkeypatch.setattr(os, "fstat", fstat)  # as if the rename left the ctime alone
    seen = [event for _ in range(VERIFY_EVERY) for event in fleet.one_pass()]
    assert seen == [("memory", "alice")]


def test_files_are_held_open_only_on_local_filesystems_within_a_share_of_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import resource

    from memd import poller

    limits = {"soft": 20_000}
    monkeypatch.setattr(
        resource, "getrlimit", lambda which: (limits["soft"], resource.RLIM_INFINITY)
    )
    monkeypatch.setattr(poller, "filesystem_of", lambda path: "ext4")
    assert default_fd_budget(tmp_path) == 15_000
    limits["soft"] = 1024  # systemd's default soft limit: nothing to spare
    assert default_fd_budget(tmp_path) == 0
    limits["soft"] = 65_536
    assert default_fd_budget(tmp_path) == 49_152
    for remote in ("nfs4", "cifs", "fuse.grpcfuse", "virtiofs", "overlay", None):
        monkeypatch.setattr(poller, "filesystem_of", lambda path, fs=remote: fs)
        assert default_fd_budget(tmp_path) == 0


def descriptor_passes(fleet: Fleet) -> list[Event]:
    """What the next DESCRIPTOR_EVERY passes reported (one of them checks descriptors)."""
    return [event for _ in range(DESCRIPTOR_EVERY) for event in fleet.one_pass()]


def test_a_held_descriptor_notices_replacements_and_writes(tmp_path: Path) -> None:
    fleet = held_fleet(tmp_path, "alice")
    descriptor = fleet.agents / "alice" / DESCRIPTOR_NAME
    descriptor.write_text('{"version": 1}')
    assert descriptor_passes(fleet) == [("memory", "alice")]
    assert fleet.poller.held() == 2
    replacement = descriptor.with_name("new.json")
    replacement.write_text('{"version": 2}')  # same size
    os.replace(replacement, descriptor)
    assert descriptor_passes(fleet) == [("memory", "alice")]
    with descriptor.open("a") as f:  # the new file is the one held now
        f.write(" ")
    assert descriptor_passes(fleet) == [("memory", "alice")]
    descriptor.unlink()
    assert descriptor_passes(fleet) == [("memory", "alice")]
    assert fleet.poller.held() == 1


def test_memory_files_come_before_descriptors_in_the_budget(tmp_path: Path) -> None:
    fleet = held_fleet(tmp_path, "alice", fd_budget=2)
    (fleet.agents / "alice" / DESCRIPTOR_NAME).write_text("{}")
    descriptor_passes(fleet)
    alice_memory, alice_descriptor = fleet.poller.held_fds("alice")
    assert alice_memory >= 0 and alice_descriptor >= 0  # room for both
    (fleet.agents / "bob").mkdir()
    (fleet.agents / "bob" / "MEMORY.md").write_text("x")
    fleet.poller.watch("bob", fleet.agents / "bob")
    descriptor_passes(fleet)
    descriptor_passes(fleet)
    alice_memory, alice_descriptor = fleet.poller.held_fds("alice")
    bob_memory, _ = fleet.poller.held_fds("bob")
    assert fleet.poller.held() == 2
    assert alice_memory >= 0 and bob_memory >= 0 and alice_descriptor < 0


def test_a_pass_never_blocks_the_watches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pass on NFS is one round trip per agent: watch(), watched() and
    # unwatch() from the daemon's threads must not wait for it.
    import threading

    fleet = make_plain_fleet(tmp_path, "alice", "bob")
    (fleet.agents / "bob" / "MEMORY.md").write_text("x")
    gate = threading.Event()
    in_pass = threading.Event()
    real_stat = os.stat

    def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if isinstance(path, bytes) and path.endswith(b"bob/MEMORY.md"):
            in_pass.set()
            gate.wait()  # a slow server
        return real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", stat)
    passing = threading.Thread(target=fleet.poller.poll_once)
    passing.start()
    fallback = threading.Timer(30, gate.set)  # never hang the suite
    fallback.start()
    try:
        assert in_pass.wait(30)
        (fleet.agents / "carol").mkdir()
        fleet.poller.watch("carol", fleet.agents / "carol")
        fleet.poller.unwatch("alice")
        assert fleet.poller.watched() == {"bob", "carol"}
        assert not gate.is_set()  # all of it while the pass was still waiting
    finally:
        gate.set()
        fallback.cancel()
        passing.join()
    assert fleet.events == [("memory", "bob")]


# ------------------------------------------- held files: what each pass checks


def cold_fleet(tmp_path: Path, *names: str, interval_s: float = INTERVAL_S) -> Fleet:
    """A held fleet past SETTLE_S and HOT_S: nothing hot, agents/ not listed."""
    fleet = held_fleet(tmp_path, *names, interval_s=interval_s)
    fleet.now += HOT_S + SETTLE_S + 1
    for _ in range(fleet.poller.verify_every):  # every file's turn: each seen as it is now
        assert fleet.one_pass() == []
    return fleet


def passes_until_seen(fleet: Fleet, limit: int) -> tuple[int, list[Event]]:
    """How many passes (at most ``limit``) until one reported something, and what."""
    for n in range(1, limit + 1):
        events = fleet.one_pass()
        if events:
            return n, events
    return limit + 1, []


class Calls:
    """Counts the stat family's calls on one file name (monkeypatched into os)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fds: set[int], name: bytes) -> None:
        self.counts = {"fstat": 0, "stat": 0, "lseek": 0}
        real = {name: getattr(os, name) for name in self.counts}

        def fstat(fd: int) -> os.stat_result:
            self.counts["fstat"] += fd in fds
            return real["fstat"](fd)  # type: ignore[no-any-return]

        def stat(path: object, *args: object, **kwargs: object) -> os.stat_result:
            self.counts["stat"] += isinstance(path, bytes) and path.endswith(name)
            return real["stat"](path, *args, **kwargs)  # type: ignore[no-any-return]

        def lseek(fd: int, pos: int, how: int) -> int:
            self.counts["lseek"] += fd in fds
            return real["lseek"](fd, pos, how)  # type: ignore[no-any-return]

        for name_, fake in (("fstat", fstat), ("stat", stat), ("lseek", lseek)):
            monkeypatch.setattr(os, name_, fake)

    def take(self) -> dict[str, int]:
        counts, self.counts = self.counts, dict.fromkeys(self.counts, 0)
        return counts


def test_a_cold_held_file_is_sized_each_pass_and_stated_only_in_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CPU of a pass: an unchanged file that is not hot costs one lseek,
    # and one path stat every VERIFY_EVERY passes; no fstat.
    fleet = cold_fleet(tmp_path, "alice")
    held, _ = fleet.poller.held_fds("alice")
    calls = Calls(monkeypatch, {held}, b"alice/MEMORY.md")
    for _ in range(VERIFY_EVERY):
        assert fleet.one_pass() == []
    assert calls.take() == {"lseek": VERIFY_EVERY, "fstat": 0, "stat": 1}

    # An append keeps the inode, which its size shows: checked in full in the
    # pass that saw it move, then sized again, not fstat'ed every pass (a fleet
    # that all wrote in the last minutes would cost an fstat per agent per pass).
    with (fleet.agents / "alice" / "MEMORY.md").open("a") as f:
        f.write("appended\n")
    assert fleet.one_pass() == [("memory", "alice")]
    calls.take()
    for _ in range(VERIFY_EVERY):
        assert fleet.one_pass() == []
    assert calls.take() == {"lseek": VERIFY_EVERY, "fstat": 0, "stat": 1}


def test_a_file_its_writer_replaced_is_hot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A writer that saves by rename (an editor, a framework; another process's
    # compaction): its first replacement shows in the file's turn, the held fd
    # being the old file. From then on the file is hot: fstat'ed every pass, so
    # the next rename over it, and the append after that, show on the next
    # pass each, until HOT_S passes with no replacement.
    fleet = cold_fleet(tmp_path, "alice", "bob")
    memory = fleet.agents / "alice" / "MEMORY.md"
    new = memory.with_name("MEMORY.md.new")
    new.write_text("# saved whole\n")
    os.replace(new, memory)
    passes, events = passes_until_seen(fleet, VERIFY_EVERY)
    assert events == [("memory", "alice")] and passes <= VERIFY_EVERY
    for text in ("# saved whole again, longer\n", "# and again\n"):
        fleet.now += HOT_S / 2  # each replacement keeps it hot
        new.write_text(text)
        os.replace(new, memory)
        assert fleet.one_pass() == [("memory", "alice")]
    with memory.open("a") as f:
        f.write("appended to the new file\n")
    assert fleet.one_pass() == [("memory", "alice")]
    held, _ = fleet.poller.held_fds("alice")
    calls = Calls(monkeypatch, {held}, b"alice/MEMORY.md")
    assert fleet.one_pass() == [] and calls.take()["fstat"] == 1
    fleet.now += HOT_S
    for _ in range(VERIFY_EVERY):
        assert fleet.one_pass() == []
    assert calls.take() == {"lseek": VERIFY_EVERY, "fstat": 0, "stat": 1}


@pytest.mark.parametrize("how", ["unlinked", "renamed away"])
def test_a_file_gone_and_made_again_in_its_folder_is_hot(tmp_path: Path, how: str) -> None:
    # The agent deletes (or moves away) its MEMORY.md and starts a new one in the
    # same folder: seen in the file's turn; then hot, as a replaced file.
    fleet = cold_fleet(tmp_path, "alice")
    memory = fleet.agents / "alice" / "MEMORY.md"
    if how == "unlinked":
        memory.unlink()
    else:
        memory.rename(memory.with_name("MEMORY.old.md"))
    memory.write_text("# Agent Memory\n\na fresh start\n")
    passes, events = passes_until_seen(fleet, VERIFY_EVERY)
    assert events == [("memory", "alice")] and passes <= VERIFY_EVERY
    assert fleet.poller.held_fds("alice")[0] >= 0
    new = memory.with_name("MEMORY.md.new")
    new.write_text("# Agent Memory\n")
    os.replace(new, memory)
    assert fleet.one_pass() == [("memory", "alice")]


def test_appends_and_truncations_of_a_cold_file_show_in_one_pass(tmp_path: Path) -> None:
    fleet = cold_fleet(tmp_path, "alice", "bob")
    memory = fleet.agents / "alice" / "MEMORY.md"
    with memory.open("a") as f:
        f.write("appended\n")
    assert fleet.one_pass() == [("memory", "alice")]
    fleet.now += HOT_S
    os.truncate(fleet.agents / "bob" / "MEMORY.md", 3)
    assert fleet.one_pass() == [("memory", "bob")]
    fleet.now += HOT_S
    os.truncate(memory, 0)
    assert fleet.one_pass() == [("memory", "alice")]


def test_another_process_compaction_after_appends_shows_in_its_turn(
    tmp_path: Path,
) -> None:
    # The agent appended (reported; not hot: an append keeps the inode), then
    # another process (compact-now) renames a new file over MEMORY.md, which
    # the held (old) fd's size never shows: the file's turn stats its path, and
    # the agent's appends to the new file show with it, then each on the next
    # pass. (memd's own compactions are handed on: the next pass.)
    fleet = cold_fleet(tmp_path, "alice", "bob")
    memory = fleet.agents / "alice" / "MEMORY.md"
    with memory.open("a") as f:
        f.write("an entry that takes it over the threshold\n")
    assert fleet.one_pass() == [("memory", "alice")]
    new = memory.with_name("MEMORY.md.new")
    new.write_text("# summary\n")
    os.replace(new, memory)
    with memory.open("a") as f:
        f.write("the next entry\n")
    passes, events = passes_until_seen(fleet, VERIFY_EVERY)
    assert events == [("memory", "alice")] and passes <= VERIFY_EVERY
    assert fleet.poller.held() == 2
    with memory.open("a") as f:
        f.write("the entry after\n")
    assert fleet.one_pass() == [("memory", "alice")]


@pytest.mark.parametrize(
    "change", ["rewrite", "replace", "replace-then-append", "rename", "unlink"]
)
def test_other_changes_to_a_cold_file_show_within_verify_every_passes(
    tmp_path: Path, change: str
) -> None:
    fleet = cold_fleet(tmp_path, "alice")
    memory = fleet.agents / "alice" / "MEMORY.md"
    size = memory.stat().st_size
    if change == "rewrite":  # in place, same size
        with memory.open("r+b") as f:
            f.write(b"#" * size)
        os.utime(memory, ns=(1, 1))  # an mtime the pass has not seen, whatever the clock tick
    elif change.startswith("replace"):  # compact-now in another process, an editor's save
        new = memory.with_name("new.md")
        new.write_text("a different text\n")
        os.replace(new, memory)
        if change == "replace-then-append":
            with memory.open("a") as f:
                f.write("appended to the new file\n")
    elif change == "rename":
        memory.rename(memory.with_name("old.md"))
    else:
        memory.unlink()
    passes, events = passes_until_seen(fleet, VERIFY_EVERY)
    assert events == [("memory", "alice")] and passes <= VERIFY_EVERY
    # Hot now: the next change to the new file shows on the next pass.
    if memory.exists():
        with memory.open("a") as f:
            f.write("more\n")
        assert fleet.one_pass() == [("memory", "alice")]


def test_a_cold_agent_folder_removed_or_added_shows_in_one_pass(tmp_path: Path) -> None:
    fleet = cold_fleet(tmp_path, "alice")
    (fleet.agents / "alice" / "MEMORY.md").unlink()
    (fleet.agents / "alice").rmdir()
    (fleet.agents / "bob").mkdir()
    assert sorted(fleet.one_pass()) == [("agents", "alice"), ("agents", "bob")]


def test_a_replaced_agents_folder_rechecks_every_held_file(tmp_path: Path) -> None:
    # agents/ replaced (a restore from backup, `mv agents.new agents`): the held
    # fds are the old tree's files, still linked there (one link, size and ctime
    # as they were): neither lseek nor fstat shows the new ones. The pass that
    # pins agents/ again checks every held file's path. (Found by review 13a, D2.)
    fleet = cold_fleet(tmp_path, "alice", "bob", "carol")
    new_root = tmp_path / "agents.new"
    for name in ("alice", "bob", "carol"):
        (new_root / name).mkdir(parents=True)
        (new_root / name / "MEMORY.md").write_text("# Agent Memory\n")
    (new_root / "alice" / "MEMORY.md").write_text("# Agent Memory\n\nrestored, much longer\n")
    (new_root / "bob" / DESCRIPTOR_NAME).write_text("{}")
    fleet.agents.rename(tmp_path / "agents.old")
    new_root.rename(fleet.agents)
    seen = fleet.one_pass()  # the new files are new inodes: each one is reported
    assert ("agents", None) in seen
    assert {event for event in seen if event[0] == "memory"} == {
        ("memory", name) for name in ("alice", "bob", "carol")
    }
    assert fleet.one_pass() == []
    # Each now held on the new tree: an append to it shows on the next pass.
    with (fleet.agents / "carol" / "MEMORY.md").open("a") as f:
        f.write("appended\n")
    assert fleet.one_pass() == [("memory", "carol")]


def test_the_verify_turn_reaches_every_agent_while_others_come_and_go(tmp_path: Path) -> None:
    # One earlier agent unwatched each pass (a fleet whose agents finish): a turn
    # taken as an index into the current list fell by one as the pass number rose
    # by one, and alice's path was never stat'ed again. Each agent's turn is its
    # own, fixed when watched. (Found by review 13a, D4.)
    names = [f"a{n:03d}" for n in range(3 * VERIFY_EVERY)] + ["alice"]
    fleet = cold_fleet(tmp_path, *names)
    memory = fleet.agents / "alice" / "MEMORY.md"
    new = memory.with_name("MEMORY.md.new")
    new.write_text("a different text\n")
    os.replace(new, memory)
    for n in range(VERIFY_EVERY):
        fleet.poller.unwatch(names[n])  # its folder stays: only unwatched
        if ("memory", "alice") in fleet.one_pass():
            break
    else:
        raise AssertionError("alice's replaced MEMORY.md not seen in VERIFY_EVERY passes")


def test_the_descriptor_turn_reaches_every_agent_while_others_come_and_go(
    tmp_path: Path,
) -> None:
    names = [f"a{n:03d}" for n in range(3 * DESCRIPTOR_EVERY)] + ["alice"]
    fleet = cold_fleet(tmp_path, *names)
    (fleet.agents / "alice" / DESCRIPTOR_NAME).write_text('{"format": "memd-agent"}')
    for n in range(DESCRIPTOR_EVERY):
        fleet.poller.unwatch(names[n])
        if ("memory", "alice") in fleet.one_pass():
            break
    else:
        raise AssertionError("alice's new memd-agent.json not probed in DESCRIPTOR_EVERY passes")


def test_a_folder_removed_and_made_again_within_a_pass_is_seen(tmp_path: Path) -> None:
    # An agent folder deleted and made again between two passes (an operator's
    # reset, a harness re-creating an agent): agents/ lists the same names and
    # the held fd is the removed file, unchanged. The listing's inodes tell: the
    # folder is reported, its files checked against their paths, and the new
    # MEMORY.md held from then on. (Found by review 13a, D3.)
    fleet = cold_fleet(tmp_path, "alice", "bob")
    alice = fleet.agents / "alice"
    (alice / "MEMORY.md").unlink()
    alice.rmdir()
    alice.mkdir()
    (alice / "MEMORY.md").write_text("# Agent Memory\n\na fresh start, longer than before\n")
    assert fleet.one_pass() == [("agents", "alice"), ("memory", "alice")]
    with (alice / "MEMORY.md").open("a") as f:
        f.write("appended\n")
    fleet.settle()
    assert fleet.one_pass() == [("memory", "alice")]


def test_a_file_memd_replaced_is_checked_on_the_next_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # memd's own compaction long after the agent's last write (a spending hold,
    # backoff, a restart or reload): the held fd is the old file. Told of it
    # (the watch stage hands memd's replacements on), the next pass checks the
    # path and holds the new file. (Found by review 13a, D1.) It is not hot:
    # memd tells each of its replacements, and a fleet memd compacts would
    # otherwise cost an fstat per agent per pass.
    fleet = cold_fleet(tmp_path, "alice", "bob")
    memory = fleet.agents / "alice" / "MEMORY.md"
    for summary in ("# summary\n", "# the next summary, longer\n"):
        new = memory.with_name("MEMORY.md.new")
        new.write_text(summary)
        os.replace(new, memory)
        fleet.poller.replaced(["alice", "carol"])  # carol: not watched, nothing to do
        with memory.open("a") as f:
            f.write("the next entry\n")
        assert fleet.one_pass() == [("memory", "alice")]
        with memory.open("a") as f:
            f.write("and the one after\n")
        assert fleet.one_pass() == [("memory", "alice")]
    held, _ = fleet.poller.held_fds("alice")
    calls = Calls(monkeypatch, {held}, b"alice/MEMORY.md")
    for _ in range(VERIFY_EVERY):
        assert fleet.one_pass() == []
    assert calls.take() == {"lseek": VERIFY_EVERY, "fstat": 0, "stat": 1}


@pytest.mark.parametrize("written_s_ago", [0, HOT_S + 60])
def test_a_file_written_recently_is_not_hot_from_its_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written_s_ago: float
) -> None:
    # After a restart, a fleet that wrote in the last minutes costs what an
    # idle one does: one lseek per file per pass, whatever its mtime (memd's
    # own compactions of it are handed on). A replacement by another process
    # shows in the file's turn, with the append after it.
    fleet = Fleet(tmp_path, "alice", "bob", fd_budget=100)
    memory = fleet.agents / "alice" / "MEMORY.md"
    memory.write_text("# Agent Memory\n\n" + "an entry over the threshold\n" * 50)
    (fleet.agents / "bob" / "MEMORY.md").write_text("# Agent Memory\n")
    written = time.time() - written_s_ago
    os.utime(memory, (written, written))
    for name in ("alice", "bob"):  # watched as after a restart
        fleet.poller.unwatch(name)
        fleet.poller.watch(name, fleet.agents / name)
    fleet.settle()
    assert fleet.one_pass() == [] and fleet.poller.held() == 2
    held, _ = fleet.poller.held_fds("alice")
    calls = Calls(monkeypatch, {held}, b"alice/MEMORY.md")
    assert fleet.one_pass() == [] and calls.take()["fstat"] == 0
    new = memory.with_name("MEMORY.md.new")
    new.write_text("# Agent Memory\n\n### System - summary\n")
    os.replace(new, memory)
    with memory.open("a") as f:
        f.write("### Human - the next turn\n")
    passes, events = passes_until_seen(fleet, VERIFY_EVERY)
    assert events == [("memory", "alice")] and passes <= VERIFY_EVERY


def test_a_file_that_cannot_be_sized_is_checked_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = cold_fleet(tmp_path, "alice", "bob")
    alice, _ = fleet.poller.held_fds("alice")
    real_lseek = os.lseek

    def lseek(fd: int, pos: int, how: int) -> int:
        if fd == alice:
            raise OSError(5, "I/O error")
        return real_lseek(fd, pos, how)

    monkeypatch.setattr(os, "lseek", lseek)
    for name in ("alice", "bob"):
        with (fleet.agents / name / "MEMORY.md").open("a") as f:
            f.write("appended\n")
    assert sorted(fleet.one_pass()) == [("memory", "alice"), ("memory", "bob")]
    assert fleet.one_pass() == []


def test_the_turns_take_verify_s_whatever_the_interval(tmp_path: Path) -> None:
    assert passes_within(VERIFY_S, 1.0) == 30 and passes_within(VERIFY_S, 0.1) == 300
    # A long interval (a large fleet on a share): every path on every pass.
    fleet = cold_fleet(tmp_path, "alice", interval_s=VERIFY_S * 2)
    assert fleet.poller.verify_every == 1 and fleet.poller.descriptor_every == 1
    memory = fleet.agents / "alice" / "MEMORY.md"
    new = memory.with_name("new.md")
    new.write_text("a different text\n")
    os.replace(new, memory)
    assert fleet.one_pass() == [("memory", "alice")]
    (fleet.agents / "alice" / DESCRIPTOR_NAME).write_text("{}")
    assert fleet.one_pass() == [("memory", "alice")]
