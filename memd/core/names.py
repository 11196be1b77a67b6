"""Agent-name validation (pure): the first line of defence against path escapes."""

from __future__ import annotations

from memd.errors import InvalidAgentName

MAX_AGENT_NAME = 255


def validate_agent_name(name: str) -> str:
    """Return ``name`` if it can only ever mean one folder under ``agents/``.

    Refuses ``/``, ``\\``, NUL, ``.``/``..``, control characters, a leading dot
    (memd's and editors' private folders) and names over 255 bytes.
    """
    if not name:
        raise InvalidAgentName("invalid agent name '': empty")
    shown = repr(name)[1:-1]
    if "\x00" in name:
        raise InvalidAgentName(f"invalid agent name '{shown}': contains NUL")
    if "/" in name or "\\" in name:
        raise InvalidAgentName(f"invalid agent name '{shown}': contains a path separator")
    if name == ".":
        raise InvalidAgentName("invalid agent name '.': is the agents folder itself")
    if name == ".." or ".." in name:
        raise InvalidAgentName(f"invalid agent name '{shown}': contains '..'")
    if name.startswith("."):
        raise InvalidAgentName(f"invalid agent name '{shown}': starts with '.'")
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        raise InvalidAgentName(f"invalid agent name '{shown}': contains a control character")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_AGENT_NAME:
        raise InvalidAgentName(f"invalid agent name '{shown[:40]}…': longer than 255 bytes")
    return name


def is_valid_agent_name(name: str) -> bool:
    try:
        validate_agent_name(name)
    except InvalidAgentName:
        return False
    return True
