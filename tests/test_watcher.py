from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memd.watcher import BackendKind, Watcher, default_backend_kind

KINDS: list[BackendKind] = ["inotify", "polling", "observer"]


class Sink:
    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []
        self.cond = threading.Condition()
        self.explode = False

    def agents_changed(self, name: str | None) -> None:
        self._add(("agents", name))

    def memory_changed(self, agent: str) -> None:
        self._add(("memory", agent))

    def descriptor_changed(self, agent: str) -> None:
        self._add(("descriptor", agent))

    def _add(self, event: tuple[str, str | None]) -> None:
        with self.cond:
            self.events.append(event)
            self.cond.notify_all()
        if self.explode:
            raise RuntimeError("handler bug")

    def wait_for(self, event: tuple[str, str | None], timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while event not in self.events:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def clear(self) -> None:
        with self.cond:
            self.events.clear()


@pytest.fixture(params=KINDS)
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Watcher, Sink, Path]]:
    agents = tmp_path / "agents"
    (agents / "alice").mkdir(parents=True)
    sink = Sink()
    watcher = Watcher(tmp_path, sink, kind=request.param, poll_interval_s=0.05)
    watcher.start()
    watcher.sync({"alice": agents / "alice"})
    time.sleep(0.1)  # let a polling emitter take its first snapshot
    yield watcher, sink, agents
    watcher.stop()


def test_memory_writes_and_replacement_are_reported(setup: tuple[Watcher, Sink, Path]) -> None:
    _watcher, sink, agents = setup
    memory = agents / "alice" / "MEMORY.md"
    memory.write_bytes(b"# Agent Memory\n")
    assert sink.wait_for(("memory", "alice"))
    sink.clear()
    time.sleep(0.06)
    with memory.open("ab") as f:
        f.write(b"more bytes\n")
    assert sink.wait_for(("memory", "alice"))
    sink.clear()
    tmp = agents / "alice" / "MEMORY.md.tmp"
    tmp.write_bytes(b"replaced")
    os.replace(tmp, memory)
    assert sink.wait_for(("memory", "alice"))


def test_agent_folders_created_renamed_deleted(setup: tuple[Watcher, Sink, Path]) -> None:
    watcher, sink, agents = setup
    (agents / "bob").mkdir()
    assert sink.wait_for(("agents", "bob"))
    (agents / "bob").rename(agents / "carol")
    assert sink.wait_for(("agents", "carol"))
    (agents / "carol").rmdir()
    sink.clear()
    time.sleep(0.1)
    watcher.sync({"alice": agents / "alice", "dave": agents / "dave"})  # dave is missing
    assert "dave" in watcher.failed
    assert watcher.watched() == {"alice"}
    watcher.sync({})
    assert watcher.watched() == set()


def test_private_and_archive_files_are_not_watched(setup: tuple[Watcher, Sink, Path]) -> None:
    _watcher, sink, agents = setup
    private = agents / "alice" / ".memd"
    private.mkdir()
    time.sleep(0.2)
    sink.clear()
    for n in range(5):
        (private / f"journal{n}.json").write_text("{}")
    (agents / "alice" / "MEMORY.md").write_text("x")
    assert sink.wait_for(("memory", "alice"))
    # (The poller cannot tell MEMORY.md from memd-agent.json: it reports both.)
    assert set(sink.events) <= {("memory", "alice"), ("descriptor", "alice")}


def test_handler_exception_is_logged_and_watching_continues(
    setup: tuple[Watcher, Sink, Path],
) -> None:
    watcher, sink, agents = setup
    sink.explode = True
    memory = agents / "alice" / "MEMORY.md"
    memory.write_text("a")
    assert sink.wait_for(("memory", "alice"))
    sink.clear()
    time.sleep(0.06)
    memory.write_text("ab")
    assert sink.wait_for(("memory", "alice"))
    assert watcher.is_alive()


def test_dead_watcher_is_detected_and_restarted(setup: tuple[Watcher, Sink, Path]) -> None:
    watcher, sink, agents = setup
    backend = watcher.backend
    assert backend is not None and watcher.is_alive()
    backend.stop()  # the thread dies under us
    assert not watcher.is_alive()
    watcher.restart()
    watcher.sync({"alice": agents / "alice"})
    time.sleep(0.1)
    sink.clear()
    (agents / "alice" / "MEMORY.md").write_text("after restart")
    assert sink.wait_for(("memory", "alice"))


@pytest.mark.parametrize("kind", ["inotify", "polling"])
def test_backend_uses_one_thread_for_many_folders(tmp_path: Path, kind: BackendKind) -> None:
    before = threading.active_count()
    agents = tmp_path / "agents"
    dirs = {f"a{n}": agents / f"a{n}" for n in range(300)}
    for path in dirs.values():
        path.mkdir(parents=True)
    sink = Sink()
    watcher = Watcher(tmp_path, sink, kind=kind, poll_interval_s=0.05)
    watcher.start()
    try:
        watcher.sync(dirs)
        assert len(watcher.watched()) == 300
        assert threading.active_count() - before <= 1
        (agents / "a299" / "MEMORY.md").write_text("x")
        assert sink.wait_for(("memory", "a299"))
    finally:
        watcher.stop()


def test_default_backend() -> None:
    assert default_backend_kind(True) == "polling"
    assert default_backend_kind(False) == "inotify"


def test_poll_backend_maps_the_root_key_to_agents_folder(tmp_path: Path) -> None:
    # The passes themselves are tested in test_poller.py; here the backend's
    # ROOT_KEY is agents/ (listed, pinned) and other keys are agent folders.
    from memd.watcher import ROOT_KEY, StatPollBackend

    agents = tmp_path / "agents"
    (agents / "alice").mkdir(parents=True)
    sink = Sink()
    backend = StatPollBackend(sink, poll_interval_s=3600)
    backend.watch(ROOT_KEY, agents)
    backend.watch("alice", agents / "alice")
    assert backend.watched() == {ROOT_KEY, "alice"}
    (agents / "bob").mkdir()
    (agents / "alice" / "MEMORY.md").write_text("x")
    backend.poll_once()
    # The poller reports a change of MEMORY.md or memd-agent.json: both, to the sink.
    assert sink.events == [("agents", "bob"), ("descriptor", "alice"), ("memory", "alice")]
    backend.unwatch(ROOT_KEY)
    assert backend.watched() == {"alice"}
    backend.unwatch("alice")
    assert backend.watched() == set()
    with pytest.raises(OSError):
        backend.watch("ghost", tmp_path / "ghost")


def test_watching_a_renamed_folder_again_does_not_warn(tmp_path: Path) -> None:
    import warnings

    from memd.watcher import InotifyBackend

    backend = InotifyBackend(Sink())
    backend.start()
    try:
        (tmp_path / "bob").mkdir()
        backend.watch("bob", tmp_path / "bob")
        (tmp_path / "bob").rename(tmp_path / "carol")
        with warnings.catch_warnings(record=True) as caught:
            # Same inode, same watch descriptor: watchdog warns "Overwritten".
            backend.watch("carol", tmp_path / "carol")
        assert caught == []
        assert backend.watched() == {"carol"}
    finally:
        backend.stop()


def _event(wd: int, mask: int, name: bytes = b"") -> bytes:
    from memd.inotify import EVENT

    padded = name + b"\0" * (16 - len(name) % 16) if name else b""  # NUL-padded, as the kernel does
    return EVENT.pack(wd, mask, 0, len(padded)) + padded


def test_inotify_batch_is_reported_once_per_agent(tmp_path: Path) -> None:
    # One read's events, scripted in the kernel's layout: every MEMORY.md write
    # of an agent collapses to one report, agents/ names to one each, and an
    # overflow or a watch the kernel dropped to a rescan or that agent's name.
    from memd import inotify as C
    from memd.watcher import ROOT_KEY, InotifyBackend

    agents = tmp_path / "agents"
    for name in ("alice", "bob", "erin"):
        (agents / name).mkdir(parents=True)
    sink = Sink()
    backend = InotifyBackend(sink, read_delay_s=0)
    backend.start()
    try:
        backend.watch(ROOT_KEY, agents)
        backend.watch("alice", agents / "alice")
        backend.watch("bob", agents / "bob")
        backend.watch("erin", agents / "erin")
        wd: dict[str, int] = {}
        for key in (ROOT_KEY, "alice", "bob", "erin"):
            descriptor = backend.descriptor_of(key)
            assert descriptor is not None
            wd[key] = descriptor
        data = b"".join(
            [
                *[_event(wd["alice"], C.IN_MODIFY, b"MEMORY.md") for _ in range(50)],
                _event(wd["bob"], C.IN_CREATE, b"memd-agent.json"),
                _event(wd["bob"], C.IN_MODIFY, b".memd"),  # memd's own files: nothing
                _event(wd["alice"], C.IN_MODIFY, b"MEMORY.md"),
                _event(wd[ROOT_KEY], C.IN_CREATE | 0x40000000, b"carol"),
                _event(wd[ROOT_KEY], C.IN_MODIFY, b"alice"),  # a folder's mtime: nothing
                _event(wd[ROOT_KEY], C.IN_CREATE | 0x40000000, b"carol"),
                _event(wd["erin"], C.IN_DELETE_SELF),
                _event(wd["erin"], C.IN_IGNORED),
                _event(12345, C.IN_MODIFY, b"MEMORY.md"),  # not ours (any more)
            ]
        )
        backend.dispatch(data)
        assert sink.events == [
            ("agents", "carol"),
            ("agents", "erin"),
            ("descriptor", "bob"),  # memd-agent.json: told apart from MEMORY.md
            ("memory", "alice"),
        ]
        assert backend.watched() == {ROOT_KEY, "alice", "bob"}  # erin's watch is gone
        sink.clear()
        backend.dispatch(_event(-1, C.IN_Q_OVERFLOW) + _event(wd["bob"], C.IN_MODIFY, b"MEMORY.md"))
        assert sink.events == [("agents", None), ("memory", "bob")]
    finally:
        backend.stop()
    assert not backend.is_alive()


def test_inotify_burst_of_appends_wakes_the_sink_once(tmp_path: Path) -> None:
    # Real writes: the reader waits read_delay_s after the first event, then
    # reads the whole burst at once (one report, not one per append).
    from memd.watcher import InotifyBackend

    (tmp_path / "alice").mkdir()
    sink = Sink()
    backend = InotifyBackend(sink, read_delay_s=1.0)
    backend.start()
    try:
        backend.watch("alice", tmp_path / "alice")
        for n in range(20):
            with (tmp_path / "alice" / "MEMORY.md").open("a") as handle:
                handle.write(f"append {n}\n")
        assert sink.wait_for(("memory", "alice"))
        time.sleep(1.5)  # (a second batch, if the burst was split, reports by now)
        # One batch; two if the machine stalled the writer past the delay.
        assert 1 <= len(sink.events) <= 2
    finally:
        backend.stop()


# Review 15a, F2: the reader's stale watches are removed from the kernel outside the lock,
# and the tick's watch() adds its watch outside the lock too. alice's folder is
# renamed to carol (a new agent name): the reader finds nothing under "alice",
# puts alice's descriptor in `stale`, releases the lock. The tick's watch("carol")
# gets that same descriptor back from the kernel (it still holds it); the reader
# then removes it; its IN_IGNORED is read before watch() takes the lock and finds
# no key; watch() maps carol to a descriptor the kernel no longer has. carol is
# listed as watched (never "lost" for the tick) and reports nothing.
def test_a_watch_the_reader_removes_is_never_left_mapped(tmp_path):
    import threading

    from memd.watcher import ROOT_KEY, InotifyBackend

    class Sink:
        def __init__(self):
            self.memory = []

        def agents_changed(self, name):
            pass

        def memory_changed(self, agent):
            self.memory.append(agent)

        def descriptor_changed(self, agent):
            pass

    agents = tmp_path / "agents"
    (agents / "alice").mkdir(parents=True)
    (agents / "alice" / "MEMORY.md").write_text("x\n")
    sink = Sink()
    backend = InotifyBackend(sink)
    backend.open()  # no reader thread: reads happen in watched(), in this test's order
    try:
        backend.watch(ROOT_KEY, agents)
        backend.watch("alice", agents / "alice")
        inotify = backend._inotify
        real_add, real_rm = inotify.add_watch, inotify.rm_watch
        added, go = threading.Event(), threading.Event()

        def tick_add(path, mask):  # the tick thread: stalled after the syscall
            wd = real_add(path, mask)
            if threading.current_thread().name == "tick":
                added.set()
                go.wait(5)
            return wd

        tick = threading.Thread(target=backend.watch, args=("carol", agents / "carol"), name="tick")

        def reader_rm(wd):
            if not tick.is_alive() and not added.is_set():
                tick.start()
                # Without the lock the tick's add returns at once; with it, the
                # tick waits for this removal, and this wait times out first.
                added.wait(1)
            real_rm(wd)

        inotify.add_watch, inotify.rm_watch = tick_add, reader_rm
        (agents / "alice").rename(agents / "carol")
        backend.watched()  # the reader's batch: alice's watch is stale
        backend.watched()  # its IN_IGNORED: no key yet
        go.set()
        tick.join(5)
        inotify.add_watch, inotify.rm_watch = real_add, real_rm
        with (agents / "carol" / "MEMORY.md").open("a") as f:
            f.write("y\n")
        watched = backend.watched()
        assert "carol" not in watched or "carol" in sink.memory, (
            f"carol is mapped to descriptor {backend.descriptor_of('carol')}, "
            "which the kernel no longer has"
        )
    finally:
        backend.stop()
