"""Threads named in the kernel: what ``top -H`` and /proc/PID/task/*/comm show."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon_proc import DaemonProcess
from support.memfiles import AgentWorkspace

from memd.threads import name_native_threads

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, prctl")


def comm(pid: int | str, tid: int) -> str:
    return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()


@pytest.fixture
def naming() -> Iterator[None]:
    name_native_threads()
    try:
        yield
    finally:
        threading.setprofile(None)  # type: ignore[arg-type]


def test_a_thread_started_afterwards_carries_its_name_and_no_profile_hook(naming: None) -> None:
    seen: dict[str, object] = {}

    def target() -> None:
        me = threading.get_native_id()
        seen["comm"] = comm("self", me)
        seen["profile"] = sys.getprofile()

    thread = threading.Thread(target=target, name="memd-recall-sync")
    thread.start()
    thread.join()
    assert seen == {"comm": "memd-recall-syn", "profile": None}  # 15 bytes kept, hook gone


def test_memd_run_names_its_threads(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha", entries=2)
    with DaemonProcess(ws.root, tmp_path / "state") as daemon:
        daemon.wait_ready()
        expected = {"memd-count", "memd-inotify", "memd-watch", "APScheduler", "memd-periodic_0"}
        # A thread started just before READY is named once it first runs Python.
        deadline = time.monotonic() + 20
        while not expected <= (names := thread_names(daemon.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon.stop() == 0
    assert expected <= names, names


def thread_names(pid: int) -> set[str]:
    names = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            names.add(comm(pid, int(task.name)))
    return names
