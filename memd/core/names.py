"""Agent-name validation (pure): the first line of defence against path escapes."""

from __future__ import annotations

import re

from memd.errors import InvalidAgentName

MAX_AGENT_NAME = 255


def validate_agent_name(name: str) -> str:
    """Return ``name`` if it can only ever mean one folder under ``agents/``.

    Refuses ``/``, ``\\``, NUL, ``.``/``..``, control characters, a leading dot
    (memd's and editors' private folders), bytes that are not UTF-8 and names
    over 255 bytes.
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
    if any("\ud800" <= char <= "\udfff" for char in name):
        # A folder name's undecodable bytes (os.fsdecode's surrogateescape): the
        # name cannot be stored, logged as UTF-8 or sent; the state DB refused
        # every write while one such folder was listed (no heartbeat: memd
        # health and reload said no daemon ran), and recall's sync thread died.
        raise InvalidAgentName(f"invalid agent name '{shown}': not UTF-8")
    if len(name.encode("utf-8")) > MAX_AGENT_NAME:
        raise InvalidAgentName(f"invalid agent name '{shown[:40]}…': longer than 255 bytes")
    return name


# Most names (ASCII letters, digits, ``-``, ``_``, inner dots): valid at a glance.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")


def is_valid_agent_name(name: str) -> bool:
    if _PLAIN_NAME.fullmatch(name) and ".." not in name:
        return True  # the fast path of a scan over 30,000 agent folders
    try:
        validate_agent_name(name)
    except InvalidAgentName:
        return False
    return True
