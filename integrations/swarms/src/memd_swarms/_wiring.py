"""What ``attach`` does to a Swarms agent: deliver the MEMORY.md preload, follow re-seeds.

Swarms 16.0.3 loads MEMORY.md into the agent's conversation as one row with role
``"System"`` and ``Conversation.to_messages`` drops such rows, so the memory
never reaches the model. The wiring here replaces that row with one in chat form
(role ``"system"``), which ``to_messages`` passes through as given, and before
each ``run`` checks whether MEMORY.md is still the file it loaded: when memd has
re-seeded it (a new inode), the conversation is rebuilt from the new file.

A run can end with a tool call whose results the model has not read yet (Swarms
keeps them in the call's row; a failed tool adds a ``Tool Executor`` row). A
rebuild keeps that open exchange, in order, after the memory rows, so the next
request still answers the call and already carries the new memory.

Nothing here writes to MEMORY.md: the preload row is put into the history
directly, the way Swarms puts its own, never through ``Conversation.add``.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("memd_swarms")

#: Swarms' own wording for the preload (conversation.py, ``_preload_memory_md``),
#: kept so the model sees the same thing whether Swarms or memd_swarms loaded it.
PRELOAD_PREAMBLE = (
    "[Persistent Memory — MEMORY.md]\n"
    "The following is this conversation's persistent memory from prior sessions. "
    "Use it to continue context coherently.\n\n"
)
PRELOAD_MARKER = PRELOAD_PREAMBLE.split("\n", 1)[0]
#: Marks the row memd_swarms put into the history (ignored by ``to_messages``).
ROW_TAG = "memd_swarms"
#: Roles Swarms records for tool bookkeeping rather than for a speaker.
TOOL_EXECUTOR_ROLE = "Tool Executor"
#: Rows that answer a tool call rather than speak.
RESULT_ROLES = (TOOL_EXECUTOR_ROLE, "tool")

FileIdentity = tuple[int, int]  # (st_dev, st_ino): a re-seed is a new inode


@dataclass(frozen=True, slots=True)
class Snapshot:
    """MEMORY.md as read once: its identity and its text (None when it is missing)."""

    identity: FileIdentity | None
    text: str


def read_memory(path: str) -> Snapshot:
    """Read MEMORY.md through one descriptor, so the identity and the text agree."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return Snapshot(None, "")
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path}: not a regular file")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        os.close(fd)
    # Swarms reads it as UTF-8 too; a stray byte must not cost the agent its memory.
    return Snapshot((info.st_dev, info.st_ino), b"".join(chunks).decode("utf-8", "replace"))


def current_identity(path: str) -> FileIdentity | None:
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return None
    return (info.st_dev, info.st_ino)


def preload_row(text: str) -> dict[str, Any] | None:
    """The history row carrying MEMORY.md to the model; None when it holds no entry yet.

    The same rule as Swarms': a file without an entry header (``### ``) is only
    a header and is not preloaded.
    """
    if "### " not in text:
        return None
    return {"role": "system", "content": PRELOAD_PREAMBLE + text, ROW_TAG: "preload"}


def static_prefix_length(conversation: Any) -> int:
    """How many leading rows are the agent's static context, re-sent on every request.

    ``Conversation`` starts its history with the system prompt (role System),
    then the rules and the custom rules prompt (role user), each only when set,
    and never writes them to MEMORY.md. Everything after them is in the file.
    """
    expected = [
        getattr(conversation, name, None)
        for name in ("system_prompt", "rules", "custom_rules_prompt")
    ]
    history: list[dict[str, Any]] = conversation.conversation_history
    count = 0
    for want in (value for value in expected if value is not None):
        if count < len(history) and history[count].get("content") == want:
            count += 1
        else:
            break
    return count


def open_tool_exchange(rows: list[dict[str, Any]]) -> int | None:
    """Where the model's open tool exchange starts in ``rows``, or None.

    Open: the last row that is not a tool result made tool calls, so the model
    has not answered their results yet. Swarms keeps a call and its results in
    one row (``tool_calls`` plus ``tool_results``); a failed tool adds a ``Tool
    Executor`` row after it; chat-form rows (``messages=``) carry the calls in
    ``metadata`` and the results as ``tool`` rows. The results are not in
    MEMORY.md, so a rebuild keeps these rows: dropping them would take the
    results from the model before it read them.
    """
    for index in range(len(rows) - 1, -1, -1):
        row = rows[index]
        if row.get("role") in RESULT_ROLES:
            continue
        metadata = row.get("metadata")
        calls = row.get("tool_calls") or (
            metadata.get("tool_calls") if isinstance(metadata, dict) else None
        )
        return index if calls else None
    return None


@dataclass
class Wiring:
    """Per-agent state of an attached agent (stored on the agent as ``_memd_swarms``)."""

    conversation: Any
    memory_path: str
    static_rows: int
    loaded: FileIdentity | None = None
    rebuilds: int = 0
    warned_messages: bool = False
    # Appended to the preload (attach(recall=True) names the recall tool there).
    notice: str = ""
    lock: threading.RLock = field(default_factory=threading.RLock)

    def rebuild(self) -> int:
        """Replace everything after the static rows with a preload of the current file.

        An open tool exchange (the model's tool calls and their results) stays
        after the preload, in order. Returns the number of rows dropped. Every
        dropped row is in the file (verbatim, or in memd's summary of it), so
        nothing is sent twice.
        """
        with self.lock:
            snapshot = read_memory(self.memory_path)
            history: list[dict[str, Any]] = self.conversation.conversation_history
            kept = history[: self.static_rows]
            tail = history[self.static_rows :]
            start = open_tool_exchange(tail)
            exchange = [] if start is None else tail[start:]
            dropped = len(tail) - len(exchange)
            row = preload_row(snapshot.text)
            if row is not None:
                if self.notice:
                    row["content"] += "\n\n" + self.notice
                kept.append(row)
            kept.extend(exchange)
            # In place: Agent._run holds no reference across runs, but callers may.
            history[:] = kept
            if hasattr(self.conversation, "_str_cache"):
                self.conversation._str_cache = None  # Swarms' cached rendering of the history
            self.loaded = snapshot.identity
            return dropped

    def before_run(self, kwargs: dict[str, Any]) -> None:
        """Called at the start of every ``run``: follow a re-seed of MEMORY.md."""
        with self.lock:
            if kwargs.get("messages") and not self.warned_messages:
                self.warned_messages = True
                log.warning(
                    "memd_swarms: run(messages=...) writes those messages into MEMORY.md "
                    "and sends them instead of the agent's memory; pass earlier turns "
                    "through MEMORY.md (or the system prompt) instead"
                )
            identity = current_identity(self.memory_path)
            if identity == self.loaded:
                return
            dropped = self.rebuild()
            self.rebuilds += 1
            log.info(
                "memd_swarms: MEMORY.md was re-seeded; working context rebuilt from the "
                "new file (%d rows replaced)",
                dropped,
            )


def wrap_run(agent: Any, wiring: Wiring) -> None:
    """Make ``agent.run`` follow re-seeds first (an instance attribute over the method)."""
    original: Callable[..., Any] = agent.run

    @functools.wraps(original)
    def run(*args: Any, **kwargs: Any) -> Any:
        wiring.before_run(kwargs)
        return original(*args, **kwargs)

    agent.run = run
