"""Feature detection: how does the installed Swarms deliver its MEMORY.md preload?

Asked of the running code, not of a version table: a scratch ``Conversation``
(the agent's own class) preloads a scratch MEMORY.md holding one marked entry,
and its ``to_messages`` shows whether the entry reaches the request.
"""

from __future__ import annotations

import enum
import os
import tempfile
import uuid
from importlib import metadata
from typing import Any

from memd_swarms._wiring import PRELOAD_MARKER


class Delivery(enum.Enum):
    NATIVE = "native"  # Swarms already sends its preload: nothing to do
    SYSTEM_ROW = "system_row"  # the preload is a role-"System" row to_messages drops


class UnsupportedSwarms(RuntimeError):
    """The installed swarms' internals are not the ones memd_swarms knows how to wire."""


def swarms_version() -> str:
    try:
        return metadata.version("swarms")
    except metadata.PackageNotFoundError:
        return "unknown"


def unsupported(reason: str) -> UnsupportedSwarms:
    return UnsupportedSwarms(
        f"memd_swarms cannot wire this agent: swarms {swarms_version()} {reason} "
        "(memd_swarms knows swarms 16.0.x)"
    )


_HEADER = (
    "# Agent Memory\n\n**Conversation:** memd-swarms-probe\n"
    "**Created:** 2000-01-01T00:00:00\n\n---\n\n## Interaction Log\n\n"
)


def probe_delivery(conversation_class: type[Any], agent_name: str) -> Delivery:
    """Run the installed Conversation's preload on a scratch file and see what it sends."""
    token = f"memd-swarms-probe-{uuid.uuid4().hex}"
    with tempfile.TemporaryDirectory(prefix="memd-swarms-probe-") as scratch:
        memory = os.path.join(scratch, "MEMORY.md")
        with open(memory, "w", encoding="utf-8") as handle:
            handle.write(f"{_HEADER}### Human — 2000-01-01T00:00:00\n\n{token}\n\n---\n\n")
        try:
            conversation = conversation_class(
                system_prompt=None,
                memory_md_path=memory,
                conversations_dir=scratch,
                autosave=False,
            )
            history: list[dict[str, Any]] = list(conversation.conversation_history)
            sent = conversation.to_messages(agent_name, 0, ())
        except Exception as error:  # any failure means internals we do not know
            raise unsupported(f"has a Conversation this probe cannot drive ({error})") from error
        with open(memory, encoding="utf-8") as handle:
            if handle.read().count(token) != 1:
                raise unsupported("writes its MEMORY.md preload back into the file")
    if sum(token in str(message.get("content")) for message in sent) == 1:
        return Delivery.NATIVE
    rows = [row for row in history if token in str(row.get("content"))]
    if len(rows) != 1 or not str(rows[0].get("content")).startswith(PRELOAD_MARKER):
        raise unsupported("does not preload MEMORY.md as one history row")
    if rows[0].get("role") != "System":
        raise unsupported(f"preloads MEMORY.md with role {rows[0].get('role')!r}")
    return Delivery.SYSTEM_ROW
