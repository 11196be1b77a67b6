"""``memd-agent.json``: what the agent tells memd about its requests (DESIGN §1).

Format version 1::

    {"format": "memd-agent", "version": 1,
     "agent": "research-agent", "model": "gpt-4o-mini", "context_length": 128000,
     "reserved": {"unit": "text", "text": "<system prompt, rules, tool schemas>"},
     "writer": "memd-swarms 0.1.0 (swarms 16.0.3)"}

``reserved.text`` is what the agent sends beside its memory in every request,
as text: memd counts it with its own tokenizer (the one it counts MEMORY.md
with), so both sides of ``threshold × context_length − reserved`` are in the
same tokens. memd treats the file as untrusted input and bounds every field.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any

DESCRIPTOR_NAME = "memd-agent.json"
FORMAT = "memd-agent"
VERSION = 1


def reserved_text(agent: Any) -> str:
    """The text an agent sends in every request besides its memory and the task."""
    parts: list[str] = []
    llm = getattr(agent, "llm", None)
    # The LLM wrapper copies the system prompt once; that copy is what is sent.
    system_prompt = getattr(llm, "system_prompt", None) or getattr(agent, "system_prompt", "")
    conversation = getattr(agent, "short_memory", None)
    for text in (
        system_prompt,
        getattr(conversation, "rules", None),
        getattr(conversation, "custom_rules_prompt", None),
        getattr(agent, "_skills_prompt", None),
    ):
        if isinstance(text, str) and text.strip():
            parts.append(text)
    tools = getattr(llm, "tools_list_dictionary", None)
    if tools:
        parts.append(json.dumps(tools, ensure_ascii=False, default=str))
    return "\n\n".join(parts)


def descriptor_for(agent: Any, writer: str) -> dict[str, Any]:
    context_length = getattr(agent, "context_length", None)
    return {
        "format": FORMAT,
        "version": VERSION,
        "agent": str(getattr(agent, "agent_name", "")),
        "model": str(getattr(agent, "model_name", "") or ""),
        "context_length": context_length if isinstance(context_length, int) else None,
        "reserved": {"unit": "text", "text": reserved_text(agent)},
        "writer": writer,
    }


def write_descriptor(folder: str, descriptor: dict[str, Any]) -> str:
    """Atomically replace ``folder/memd-agent.json`` (readers never see half a file)."""
    path = os.path.join(folder, DESCRIPTOR_NAME)
    data = json.dumps(descriptor, ensure_ascii=False, indent=2).encode("utf-8") + b"\n"
    try:
        with open(path, "rb") as handle:
            if handle.read() == data:
                return path  # unchanged: no event for memd, no new inode
    except FileNotFoundError:
        pass
    os.makedirs(folder, exist_ok=True)
    # Same permissions as the memory it describes: whoever may read MEMORY.md.
    try:
        mode = os.stat(os.path.join(folder, "MEMORY.md")).st_mode & 0o666
    except OSError:  # missing, or a symlink loop (attach goes on; the run says why)
        mode = 0o644
    fd, temporary = tempfile.mkstemp(prefix=".memd-agent.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return path
