"""``memd-agent.json``: what an agent tells memd about its window (pure; DESIGN §1).

Written by the agent (``memd_swarms.attach``), so it is untrusted input: every
field is checked, out-of-range numbers are clamped (each clamp is reported so
the caller can log it), anything else is refused with one line naming the field.

Format version 1::

    {"format": "memd-agent", "version": 1, "agent": "research-agent",
     "model": "gpt-4o-mini", "context_length": 128000,
     "reserved": {"unit": "text", "text": "<system prompt, rules, tool schemas>"},
     "writer": "memd-swarms 0.1.0 (swarms 16.0.3)"}

``reserved.text`` is what the agent sends beside its memory in every request;
memd counts it with its own tokenizer, the one it counts MEMORY.md with, so
``threshold × context_length − reserved`` subtracts tokens from tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

DESCRIPTOR_NAME: Final = "memd-agent.json"
FORMAT: Final = "memd-agent"
SUPPORTED_VERSIONS: Final = frozenset({1})
#: Larger files are refused unread: a system prompt and tool schemas fit easily.
MAX_BYTES: Final = 1 << 20
CONTEXT_LENGTH_MIN: Final = 1_024
CONTEXT_LENGTH_MAX: Final = 10_000_000
#: The agent may reserve at most this share of its window; the rest is memory.
RESERVED_MAX_SHARE: Final = 0.5


class DescriptorError(ValueError):
    """A descriptor memd will not use; the message is one line naming the field."""


@dataclass(frozen=True, slots=True)
class AgentWindow:
    """The window an agent declared, after bounds: what the threshold is derived from."""

    context_length: int
    reserved_tokens: int
    model: str
    clamped: tuple[str, ...] = ()  # one line per clamp, for the log


def parse_descriptor(data: bytes, count_text: Callable[[str], int]) -> AgentWindow:
    """Validate and bound a descriptor's bytes; DescriptorError when it is unusable."""
    if len(data) > MAX_BYTES:
        raise DescriptorError(f"{DESCRIPTOR_NAME}: larger than {MAX_BYTES} bytes")
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DescriptorError(f"{DESCRIPTOR_NAME}: not UTF-8 JSON ({exc})") from None
    except RecursionError:
        # json's decoder recurses per nesting level: "[" * 200_000 fits in
        # MAX_BYTES and raised past every caller (the daemon did not start).
        raise DescriptorError(f"{DESCRIPTOR_NAME}: JSON nested too deeply") from None
    if not isinstance(document, dict):
        raise DescriptorError(f"{DESCRIPTOR_NAME}: not a JSON object")
    if document.get("format") != FORMAT:
        raise DescriptorError(f"{DESCRIPTOR_NAME}: format is not {FORMAT!r}")
    version = document.get("version")
    if not _is_int(version) or version not in SUPPORTED_VERSIONS:
        raise DescriptorError(
            f"{DESCRIPTOR_NAME}: version {version!r} is not one memd reads "
            f"({', '.join(map(str, sorted(SUPPORTED_VERSIONS)))})"
        )
    model = document.get("model", "")
    if not isinstance(model, str) or len(model) > 200:
        raise DescriptorError(f"{DESCRIPTOR_NAME}: model must be a short string")
    declared = document.get("context_length")
    if not _is_int(declared) or declared <= 0:
        raise DescriptorError(f"{DESCRIPTOR_NAME}: context_length must be a positive integer")
    clamped: list[str] = []
    context_length = min(max(declared, CONTEXT_LENGTH_MIN), CONTEXT_LENGTH_MAX)
    if context_length != declared:
        clamped.append(
            f"context_length {declared} clamped to {context_length} "
            f"(bounds {CONTEXT_LENGTH_MIN}..{CONTEXT_LENGTH_MAX})"
        )
    reserved = document.get("reserved", {})
    if not isinstance(reserved, dict) or reserved.get("unit", "text") != "text":
        raise DescriptorError(f"{DESCRIPTOR_NAME}: reserved must be {{'unit': 'text', 'text': …}}")
    text = reserved.get("text", "")
    if not isinstance(text, str):
        raise DescriptorError(f"{DESCRIPTOR_NAME}: reserved.text must be a string")
    wanted = count_text(text) if text else 0
    ceiling = int(context_length * RESERVED_MAX_SHARE)
    reserved_tokens = min(wanted, ceiling)
    if reserved_tokens != wanted:
        clamped.append(
            f"reserved {wanted} tokens clamped to {reserved_tokens} "
            f"({RESERVED_MAX_SHARE:.0%} of context_length {context_length})"
        )
    return AgentWindow(context_length, reserved_tokens, model, tuple(clamped))


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
