"""The plain counting algorithm the tests compare memd's counting against: a
whole-file count cut once at the last safe boundary, extended by re-tokenizing
the tail plus the appended bytes; every safe boundary of a text; chunks cut at
safe boundaries, counted in a process pool.

memd itself counts with :class:`memd.core.tokens.PieceCounter` (bounded pieces,
:mod:`memd.counting`); these are the references it must agree with.
"""

from __future__ import annotations

from memd.core.tokens import (
    CountBytes,
    CountState,
    PieceCounter,
    last_safe_boundary,
    next_safe_boundary,
)
from memd.tokenizer import shared_counter


def safe_boundaries(data: bytes) -> list[int]:
    """Every safe boundary of ``data``, in order (one :func:`next_safe_boundary` after another)."""
    cuts: list[int] = []
    position = 0
    while (cut := next_safe_boundary(data, position)) is not None:
        cuts.append(cut)
        position = cut
    return cuts


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
        cut = next_safe_boundary(data, start + target - 1)
        if cut is None:
            break
        bounds.append((start, cut))
        start = cut
    if start < size or not bounds:
        bounds.append((start, size))
    return bounds


def count_bytes_with(encoding_name: str, data: bytes) -> int:
    """``TokenCounter(encoding_name).count_bytes(data)``, picklable for process pools."""
    return shared_counter(encoding_name).count_bytes(data)


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
    if state.open_run:
        counter = PieceCounter.resume(state, count_bytes, max_piece_bytes=len(appended) + 1)
        counter.feed(appended)
        return counter.finish(state.dev, state.ino)
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
        estimated=state.estimated,
    )
