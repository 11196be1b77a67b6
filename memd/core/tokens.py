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
  end-of-text;
* right after an ASCII letter followed by one space and an ASCII letter
  (between two words): no pre-token holds a letter and the space after it
  (words end at their last letter, spaces only ever lead a word, a
  punctuation run or a whitespace run), so the word ends there both mid-text
  and at end-of-text, and `` word`` starts the next pre-token either way.
  This cut keeps a long single line (no newline) countable in pieces.

The tempting cut *before* ``### `` (right after the ``\\n\\n---\\n\\n``
terminator) is not safe for p50k_base/r50k_base: at end-of-text their
``\\s++$`` alternative makes ``"\\n\\n"`` one pre-token, while mid-text it is
two, and BPE counts them differently.

Both rules cut between two ASCII bytes, so decoding each side with
``errors="replace"`` yields the same characters as decoding the whole: invalid
UTF-8 never straddles a cut.  CRLF lines get no newline cut (``\\r\\n`` at
end-of-text is one pre-token for p50k_base, two mid-text) but still the
header cut.

The end of the file is rarely safe (it is the unsettled tail), but once more
bytes arrive, the old end may turn out to be a cut after all: the *junction*
rule below lets a count settle its old tail with the tokens it already has,
so no byte is tokenized twice (:func:`is_junction_cut`).

Counting functions are passed in (``count_bytes``); this module never imports
tiktoken.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

CountBytes = Callable[[bytes], int]

# The longest run without a safe boundary counted exactly; longer runs are
# estimated from above (``[tokenizer] max_piece_bytes``).
DEFAULT_MAX_PIECE_BYTES: Final = 1 << 20

# The tiktoken encodings memd can load offline (memd.tokenizer holds each one's
# BPE file): the config refuses any other name where it is read, so `memd
# config check` and `memd reload` say it, not the daemon's tokenizer at a reload
# (which kept the old encoding while the reload was reported applied).
ENCODING_NAMES: Final = frozenset(
    {"cl100k_base", "o200k_base", "o200k_harmony", "p50k_base", "p50k_edit", "r50k_base"}
)

# Every alternative starts with a newline or a space, so the regex engine skips
# to those bytes quickly (a run of letters costs little). A match starting with
# a newline ends exactly at a safe boundary; one starting with a space starts
# at one (see :func:`_cut`).
_SAFE_CUT_RE: Final = re.compile(
    rb"\n(?:###(?= )|(?<=[\x21-\x7e]\n)(?=[A-Za-z]))| (?<=[A-Za-z] )(?=[A-Za-z])"
)


def _cut(match: re.Match[bytes]) -> int:
    return match.start() if match.group() == b" " else match.end()


def _may_hold_a_cut(data: bytes, start: int = 0, end: int | None = None) -> bool:
    # Every safe boundary is next to a space or a newline: memchr-fast to rule out.
    return data.find(b" ", start, end) >= 0 or data.find(b"\n", start, end) >= 0


def next_safe_boundary(data: bytes, start: int = 0, end: int | None = None) -> int | None:
    """The first safe boundary after ``start`` (and at most ``end``), if any."""
    stop = len(data) if end is None else end
    if not _may_hold_a_cut(data, start, stop):
        return None
    for match in _SAFE_CUT_RE.finditer(data, start, stop):
        cut = _cut(match)
        if cut > start:
            return cut
    return None


# Prose has a cut between every two words, so a window this small usually
# holds the last one: a count's tail (an appended entry) costs a few matches,
# not one per word of it.
_FIRST_WINDOW: Final = 64


def last_safe_boundary(data: bytes) -> int:
    """The largest safe boundary in ``data`` (0 when there is none).

    Scans backwards in growing windows (×4 each) so a large file with a recent
    entry header costs a little regex work, not a pass over the whole file.
    Any match in a window's suffix is after every match before it (matches are
    at most four bytes and none overlaps a cut inside another), so the last
    match of the first window holding one is the last of all.
    """
    size = len(data)
    window = _FIRST_WINDOW
    while True:
        start = max(0, size - window)
        last = -1
        if _may_hold_a_cut(data, start):
            for match in _SAFE_CUT_RE.finditer(data, start):
                last = _cut(match)
        if last > 0:
            return last
        if start == 0:
            return 0
        window *= 4


# How every entry block ends (DESIGN.md §1), and the largest unsettled tail of
# whole entries a count keeps (PieceCounter's keep_entry_tail).
ENTRY_TERMINATOR: Final = b"\n\n---\n\n"
KEEP_TAIL_MAX_BYTES: Final = 64 << 10

# A guess of bytes per token, for where to try a first cut (any guess stays exact).
_BYTES_PER_TOKEN_GUESS: Final = 6


def count_at_least(data: bytes, floor: int, count_bytes: CountBytes) -> int:
    """The token count of ``data`` when it is under ``floor``; else a number of at
    least ``floor``, enough to decide ``count < floor`` exactly.

    A long text is counted up to a safe boundary past what ``floor`` tokens
    usually take: a prefix cut there never has more tokens than the whole (the
    rest adds its own), so reaching the floor there settles it. Otherwise the
    rest is counted too, and the sum is the whole count: never more work than
    counting the whole.
    """
    start = floor * _BYTES_PER_TOKEN_GUESS
    cut = next_safe_boundary(data, start) if 0 < start < len(data) else None
    if cut is None:
        return count_bytes(data)
    head = count_bytes(data[:cut])
    return head if head >= floor else head + count_bytes(data[cut:])


# Encodings for which :func:`is_junction_cut` holds (proof in its docstring).
JUNCTION_CUT_ENCODINGS: Final = frozenset({"cl100k_base", "o200k_base"})


def is_junction_cut(before: bytes, after: bytes) -> bool:
    """Whether ``count(before + after) == count(before) + count(after)`` for
    :data:`JUNCTION_CUT_ENCODINGS`, when ``before`` ends with ``\\n`` and
    ``after`` starts with ``#`` (an entry appended after a complete one).

    Why, for cl100k_base and o200k_base: the newline at the end of ``before``
    is covered by a pre-token of the punctuation form (an optional space, then
    ``[^\\s\\p{L}\\p{N}]+[\\r\\n]*``; o200k: ``[\\r\\n/]*``), of
    ``\\s*[\\r\\n]+`` or, after those fail,
    ``\\s+``-forms; the first two are tried first and succeed on any whitespace
    run holding a newline, and both stop at the last newline of the run: at the
    cut, since ``#`` is neither whitespace nor a newline (nor ``/``). No
    alternative lets a pre-token hold a newline and then ``#`` (the letter
    forms exclude ``\\r\\n`` as their optional first character). So the cut
    ends a pre-token both mid-text and at end-of-text, the pre-tokens before it
    are the same in both (none looks past the cut), and with no look-behind
    in these patterns the text from ``#`` on splits the same alone. BPE runs
    per pre-token, and both sides of the cut are ASCII (UTF-8 decoding with
    ``errors="replace"`` cannot straddle it). p50k_base and r50k_base are
    excluded: their ``\\s+(?!\\S)`` splits ``"\\n\\n#"`` as ``"\\n", "\\n"``
    mid-text but keeps ``"\\n\\n"`` whole at end-of-text.
    """
    return before.endswith(b"\n") and after.startswith(b"#")


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
    # Some bytes were counted by a conservative estimate (a run longer than
    # ``max_piece_bytes`` with no safe cut inside): ``tokens`` is an upper bound.
    estimated: bool = False
    # ``safe_offset`` is a forced cut inside such a run: the bytes after it, up
    # to the next safe boundary, are estimated too.
    open_run: bool = False

    @property
    def tokens(self) -> int:
        return self.safe_tokens + self.tail_tokens


def upper_bound(data: bytes) -> int:
    """At least the token count of ``data`` wherever it sits in a file.

    Every token is at least one byte of the decoded text's UTF-8 (``errors=
    "replace"`` can only make it longer), plus one for the pre-token that
    straddles each end of the piece.
    """
    return len(str(data, "utf-8", "replace").encode("utf-8")) + 2


class PieceCounter:
    """Counts a file fed block by block, holding at most ``max_piece_bytes`` plus
    one block: the bytes are settled (counted into ``safe_tokens``) at safe
    boundaries, at most ``max_piece_bytes`` at a time.

    A stretch of ``max_piece_bytes`` with no safe boundary inside (a 200 MB line
    of letters is one pre-token, which BPE would merge whole: gigabytes) gets a
    forced cut and is estimated from above, as are the bytes after it up to the
    next safe boundary; the state is then marked ``estimated``. Everything else
    is counted exactly: the sum equals ``count_bytes`` of the whole.

    Start from scratch (``offset=0``) or resume a :class:`CountState` at its
    safe offset (:meth:`resume`); ``recent`` holds the last settled bytes (up
    to ``window_bytes``), for the caller's digest of the window before the cut.
    """

    def __init__(
        self,
        count_bytes: CountBytes,
        *,
        max_piece_bytes: int = DEFAULT_MAX_PIECE_BYTES,
        window_bytes: int = 4096,
        offset: int = 0,
        safe_tokens: int = 0,
        estimated: bool = False,
        open_run: bool = False,
        recent: bytes = b"",
        keep_entry_tail: bool = False,
    ) -> None:
        self._count_bytes = count_bytes
        self._keep_entry_tail = keep_entry_tail
        self._max_piece = max(1, max_piece_bytes)
        self._window = window_bytes
        self.offset = offset
        self.safe_tokens = safe_tokens
        self.estimated = estimated
        self.open_run = open_run
        self.recent = recent[-window_bytes:] if window_bytes else b""
        self._carry = b""
        self.size = offset
        self.tail = b""  # after finish(): the unsettled bytes (the state's tail)

    @classmethod
    def resume(
        cls,
        state: CountState,
        count_bytes: CountBytes,
        *,
        max_piece_bytes: int = DEFAULT_MAX_PIECE_BYTES,
        window_bytes: int = 4096,
        recent: bytes = b"",
        keep_entry_tail: bool = False,
    ) -> PieceCounter:
        """Continue ``state`` from its safe offset (feed the bytes from there on).

        ``keep_entry_tail``: the bytes fed start an entry right after a junction
        cut (:func:`is_junction_cut`), for an encoding where that cut holds; when
        they end with a complete entry, :meth:`finish` keeps them all as the tail.
        """
        return cls(
            count_bytes,
            max_piece_bytes=max_piece_bytes,
            window_bytes=window_bytes,
            offset=state.safe_offset,
            safe_tokens=state.safe_tokens,
            estimated=state.estimated,
            open_run=state.open_run,
            recent=recent,
            keep_entry_tail=keep_entry_tail,
        )

    def _settle(self, piece: bytes, *, estimate: bool) -> None:
        if estimate:
            self.safe_tokens += upper_bound(piece)
            self.estimated = True
        else:
            self.safe_tokens += self._count_bytes(piece)
        self.offset += len(piece)
        if self._window:
            if len(piece) >= self._window:
                self.recent = piece[-self._window :]
            else:
                self.recent = (self.recent + piece)[-self._window :]

    def feed(self, block: bytes) -> None:
        """The file's next bytes."""
        self.size += len(block)
        buf = self._carry + block if self._carry else block
        limit = self._max_piece
        position = 0
        while len(buf) - position >= limit:
            end = position + limit
            if self.open_run:
                # Still inside the run being estimated, up to its next safe cut.
                found = next_safe_boundary(buf, position, end)
                cut = end if found is None else found
                self._settle(buf[position:cut], estimate=True)
                self.open_run = found is None
                position = cut
                continue
            window = buf[position:end]
            cut = last_safe_boundary(window)
            if cut:
                self._settle(window[:cut], estimate=False)
                position += cut
            else:
                self._settle(window, estimate=True)
                self.open_run = True
                position = end
        self._carry = buf[position:]

    def finish(self, dev: int, ino: int) -> CountState:
        """The count of everything fed (the last bytes stay the unsettled tail)."""
        buf, self._carry = self._carry, b""
        if self.open_run and buf:
            found = next_safe_boundary(buf)
            if found is not None:
                self._settle(buf[:found], estimate=True)
                self.open_run = False
                buf = buf[found:]
        if self.open_run:
            tail_tokens = upper_bound(buf) if buf else 0
        elif (
            self._keep_entry_tail
            and len(buf) <= KEEP_TAIL_MAX_BYTES
            and buf.endswith(ENTRY_TERMINATOR)
        ):
            # Whole entries, the next of which will start at a junction cut
            # (then these tokens settle as they are): no search for the last
            # safe cut, which in a tool's JSON output (no cut for kilobytes)
            # cost as much as tokenizing it. Bounded: should the next bytes
            # not start an entry, this tail is tokenized once more, at most.
            tail_tokens = self._count_bytes(buf) if buf else 0
        else:
            cut = last_safe_boundary(buf)
            if cut:
                self._settle(buf[:cut], estimate=False)
                buf = buf[cut:]
            tail_tokens = self._count_bytes(buf) if buf else 0
        self.tail = buf
        return CountState(
            dev=dev,
            ino=ino,
            size=self.size,
            safe_offset=self.offset,
            safe_tokens=self.safe_tokens,
            tail_tokens=tail_tokens,
            estimated=self.estimated,
            open_run=self.open_run,
        )
