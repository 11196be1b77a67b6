"""Exact, incremental token accounting for append-only files (pure).

tiktoken's ``encode_ordinary`` first cuts the text into pre-tokens with a
regex, then runs BPE inside each pre-token.  So ``count(a + b) == count(a) +
count(b)`` exactly when the cut between ``a`` and ``b`` is a pre-token
boundary both in ``a + b`` and when ``a`` is encoded on its own.  The file's
byte offsets where that holds for cl100k_base, o200k_base, p50k_base and
r50k_base alike, whatever bytes come before or after ("safe boundaries"):

* right after the ``###`` of a line that starts ``### `` (an entry header):
  no pre-token of these patterns contains ``#`` followed by a space, and the
  punctuation run ``###`` ends the same way at end-of-text;
* right after a ``\\n`` that follows a printable non-space ASCII character
  and precedes an ASCII letter: no pre-token joins a newline to a following
  letter, and the lone ``\\n`` is one pre-token both mid-text and at
  end-of-text.

The tempting cut *before* ``### `` (right after the ``\\n\\n---\\n\\n``
terminator) is not safe for p50k_base/r50k_base: at end-of-text their
``\\s++$`` alternative makes ``"\\n\\n"`` one pre-token, while mid-text it is
two, and BPE counts them differently.

Both rules cut between two ASCII bytes, so decoding each side with
``errors="replace"`` yields the same characters as decoding the whole: invalid
UTF-8 never straddles a cut.  CRLF lines get no newline cut (``\\r\\n`` at
end-of-text is one pre-token for p50k_base, two mid-text) but still the
header cut.

Counting functions are passed in (``count_bytes``); this module never imports
tiktoken.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

CountBytes = Callable[[bytes], int]

# Each match ends exactly at a safe boundary.
_SAFE_CUT_RE: Final = re.compile(rb"\n###(?= )|[\x21-\x7e]\n(?=[A-Za-z])")
_FIRST_WINDOW: Final = 4096


def last_safe_boundary(data: bytes) -> int:
    """The largest safe boundary in ``data`` (0 when there is none).

    Scans backwards in growing windows so a large file with a recent entry
    header costs a few KB of regex work, not a pass over the whole file.
    """
    size = len(data)
    window = _FIRST_WINDOW
    while True:
        start = max(0, size - window)
        last = -1
        for match in _SAFE_CUT_RE.finditer(data, start):
            last = match.end()
        if last >= 0:
            return last
        if start == 0:
            return 0
        window *= 4


def safe_boundaries(data: bytes, start: int = 0) -> list[int]:
    """All safe boundaries at or after ``start`` (mostly for tests and tools)."""
    return [match.end() for match in _SAFE_CUT_RE.finditer(data, start)]


def safe_chunk_bounds(data: bytes, target: int) -> list[tuple[int, int]]:
    """Cut ``data`` into ``(start, end)`` spans of about ``target`` bytes at safe boundaries.

    Counting each span separately and summing equals counting ``data`` whole.
    A span is longer than ``target`` only when no safe boundary falls inside it.
    """
    size = len(data)
    target = max(1, target)
    bounds: list[tuple[int, int]] = []
    start = 0
    while size - start > target:
        match = _SAFE_CUT_RE.search(data, start + target)
        if match is None:
            break
        bounds.append((start, match.end()))
        start = match.end()
    if start < size or not bounds:
        bounds.append((start, size))
    return bounds


@dataclass(frozen=True, slots=True)
class CountState:
    """What the counter remembers about one file between appends.

    ``safe_tokens`` counts ``file[:safe_offset]`` (which ends at a safe boundary,
    so it never changes while the file only grows); ``tail_tokens`` counts
    ``file[safe_offset:size]``, re-counted on every append.
    """

    dev: int
    ino: int
    size: int
    safe_offset: int
    safe_tokens: int
    tail_tokens: int

    @property
    def tokens(self) -> int:
        return self.safe_tokens + self.tail_tokens


def full_count(count_bytes: CountBytes, data: bytes, dev: int, ino: int) -> CountState:
    """Count ``data`` (a whole file) from scratch."""
    safe_offset = last_safe_boundary(data)
    safe_tokens = count_bytes(data[:safe_offset]) if safe_offset else 0
    tail = data[safe_offset:]
    return CountState(
        dev=dev,
        ino=ino,
        size=len(data),
        safe_offset=safe_offset,
        safe_tokens=safe_tokens,
        tail_tokens=count_bytes(tail) if tail else 0,
    )


def extend_count(
    state: CountState, count_bytes: CountBytes, appended: bytes, new_size: int
) -> CountState:
    """Update ``state`` after the file grew to ``new_size``.

    ``appended`` must be the file's bytes from ``state.safe_offset`` to
    ``new_size``: the old unsafe tail *and* the new bytes.  Only those are
    tokenized; the prefix before ``state.safe_offset`` is never read again.
    Raises ValueError when the file shrank or ``appended`` has the wrong length
    (the caller must then do a :func:`full_count`).
    """
    if new_size < state.size:
        raise ValueError(f"file shrank from {state.size} to {new_size} bytes: recount fully")
    expected = new_size - state.safe_offset
    if len(appended) != expected:
        raise ValueError(
            f"extend_count needs the {expected} bytes from offset {state.safe_offset} "
            f"to {new_size}, got {len(appended)}"
        )
    cut = last_safe_boundary(appended)
    settled = count_bytes(appended[:cut]) if cut else 0
    tail = appended[cut:]
    return CountState(
        dev=state.dev,
        ino=state.ino,
        size=new_size,
        safe_offset=state.safe_offset + cut,
        safe_tokens=state.safe_tokens + settled,
        tail_tokens=count_bytes(tail) if tail else 0,
    )
