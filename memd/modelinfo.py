"""Context-window sizes of LLMs, from the model map bundled in litellm's wheel.

The JSON is read straight from litellm's package directory (found with
``importlib.util.find_spec``): importing litellm takes seconds and fetches the
map over the network, neither of which ``memd status`` can afford.
"""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path
from typing import Any, Final

from memd.core.chunking import Window, summarizer_window
from memd.core.config import SummarizerConfig
from memd.litellm_data import litellm_file

MODEL_MAP_FILENAME: Final = "model_prices_and_context_window_backup.json"

_lock = threading.Lock()
_context_lengths: dict[str, int] | None = None


def bundled_model_map_path() -> Path | None:
    found = litellm_file(MODEL_MAP_FILENAME)
    return found if found is not None and found.is_file() else None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value) if value > 0 else None


def read_context_lengths(path: Path) -> dict[str, int]:
    """Lower-cased model name -> context length, from a litellm-format model map.

    An unreadable or malformed file gives an empty table: context lengths are a
    convenience, the configured ``context_length`` is the fallback.
    """
    try:
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    lengths: dict[str, int] = {}
    for name, info in raw.items():
        if not isinstance(info, dict):
            continue  # e.g. a malformed entry; "sample_spec" holds strings and drops out below
        length = _positive_int(info.get("max_input_tokens")) or _positive_int(
            info.get("max_tokens")
        )
        if length is not None:
            lengths[name.lower()] = length
    return lengths


def _table() -> dict[str, int]:
    global _context_lengths
    with _lock:
        if _context_lengths is None:
            path = bundled_model_map_path()
            _context_lengths = {} if path is None else read_context_lengths(path)
        return _context_lengths


def _lookup(table: dict[str, int], name: str) -> int | None:
    if name in table:
        return table[name]
    _, slash, bare = name.partition("/")
    if slash and bare in table:
        # "openai/gpt-4o-mini", "anthropic/claude-sonnet-4-6": litellm keys the
        # provider's own models without its prefix.
        return table[bare]
    if not slash:
        # A bare name only some provider lists ("llama3.1" -> "ollama/llama3.1"):
        # accept it when every listing agrees.
        found = {length for key, length in table.items() if key.rpartition("/")[2] == name}
        if len(found) == 1:
            return found.pop()
    return None


@functools.lru_cache(maxsize=1024)
def context_length_for_model(model: str) -> int | None:
    """Input context window of ``model`` in tokens, or None when litellm's map lacks it.

    Accepts litellm names with or without the provider prefix
    ("claude-sonnet-4-6", "openai/gpt-4o-mini", "ollama/llama3.1"); an Ollama
    size tag ("ollama/llama3:8b") falls back to the untagged model.  Uses
    ``max_input_tokens``, else ``max_tokens``.
    """
    name = model.strip().lower()
    if not name:
        return None
    table = _table()
    found = _lookup(table, name)
    if found is None and ":" in name:
        found = _lookup(table, name.split(":", 1)[0])
    return found


def window_for(config: SummarizerConfig) -> Window:
    """The summarizer's window: configured, else litellm's map, else a default (warned).

    The one context-length lookup for a summarizer (litellm's bundled map, read
    without importing litellm)."""
    return summarizer_window(config.context_length, context_length_for_model(config.model))
