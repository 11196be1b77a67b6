"""One sanitizer for text memd writes into MEMORY.md on someone else's behalf (pure).

A summary comes from an LLM reply or from ``compact-now --summary``: either can
carry terminal escape sequences (which repaint an operator's terminal when
they ``cat`` the file), other control characters, line separators that some
readers treat as newlines (so a summary could smuggle in what looks like an
entry header) and bidirectional overrides (which make text read differently
than it is stored). All of them are removed; newline and tab are kept.
"""

from __future__ import annotations

import re
from typing import Final

# Whole escape sequences first, so no "[31m" residue is left behind:
# CSI (ESC [ params final), OSC (ESC ] ... BEL or ESC \), and two-byte ESC x.
_ESCAPE_SEQUENCE: Final = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)?"  # OSC, terminated or not (never past its line)
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
    r"|\x1b[@-_]"  # other two-byte escapes
)

_REMOVED: Final = (
    # C0 controls except tab (09) and newline (0A); DEL; C1 controls (incl. NEL 0x85)
    "\x00-\x08\x0b-\x1f\x7f\x80-\x9f"
    # line and paragraph separators
    "\u2028\u2029"
    # bidirectional embeddings/overrides, isolates and marks
    "\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c"
)
_CONTROL: Final = re.compile(f"[{_REMOVED}]")


def strip_controls(text: str) -> str:
    """``text`` without escape sequences, control characters (but newline and tab),
    NEL, U+2028/U+2029 and bidirectional controls.

    Callers that want a lone carriage return read as a line break (as text-mode
    readers do) turn it into a newline first; here it is removed.
    """
    if "\x1b" in text or "\x9b" in text:  # a plain find: most text has no escape at all
        text = _ESCAPE_SEQUENCE.sub("", text)
    return _CONTROL.sub("", text)


__all__ = ["strip_controls"]
