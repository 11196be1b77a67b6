"""Files bundled in litellm's wheel (model map, tiktoken encodings), found without importing it.

Importing litellm takes seconds and may phone home; ``find_spec`` on a
top-level package only locates it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def litellm_file(*parts: str) -> Path | None:
    """``litellm/<parts…>`` inside the installed package, if it exists there."""
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location).joinpath(*parts)
        if candidate.exists():
            return candidate
    return None
