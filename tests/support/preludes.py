"""Code run first in a child interpreter, to take something away from it."""

from __future__ import annotations

import textwrap

# Makes `litellm` unfindable, as on a machine without it.
NO_LITELLM_PRELUDE = textwrap.dedent(
    """
    import sys

    class _HideLitellm:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "litellm" or name.startswith("litellm."):
                raise ModuleNotFoundError(name)
            return None

    sys.meta_path.insert(0, _HideLitellm)
    """
)
