"""Reading the counter's hint queue in watch tests: what a real watcher's thread
put there so far, or the wait for one hint."""

from __future__ import annotations

import queue
import time

from memd.daemon.counter import Hint, HintKind


def drain_hints(inbox: queue.SimpleQueue[Hint]) -> list[tuple[HintKind, str | None]]:
    """The hints queued so far, as (kind, name)."""
    hints: list[tuple[HintKind, str | None]] = []
    while True:
        try:
            hint = inbox.get_nowait()
        except queue.Empty:
            return hints
        hints.append((hint.kind, hint.name))


def wait_for_hint(
    inbox: queue.SimpleQueue[Hint], kind: HintKind, name: str | None, timeout: float
) -> bool:
    """Wait for one hint (a real inotify event on the watcher's thread); the hints
    before it are taken off the queue."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            hint = inbox.get(timeout=left)
        except queue.Empty:
            return False
        if (hint.kind, hint.name) == (kind, name):
            return True
    return False
