"""Parse and render the Swarms MEMORY.md format, losslessly.

The parser works on bytes and splits a file into segments whose ``raw`` bytes,
concatenated, are exactly the input: nothing is decoded-and-re-encoded, so
invalid UTF-8, CRLF and odd spacing survive a round trip untouched.

An entry is recognised only when a header line ``### {role} — {iso-timestamp}``
opens it *and* it is closed by the ``\\n\\n---\\n\\n`` terminator that is
followed by end-of-file or by another valid entry header, with or without
empty lines between them (``---\\n\\n\\n### …``: a writer's or an editor's extra
line break; those lines end the entry's bytes, not its content: a prefix of
the file that ends with them reads the same entries).  Content may
itself contain ``###`` or ``---`` lines; a single marker never decides a boundary.
Bytes that fit no rule become :class:`RawSegment` and are carried verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from memd.core.sanitize import strip_controls

EM_DASH: Final = "\u2014"
SUMMARY_ROLE: Final = "System"
SUMMARY_MARKER: Final = "[Compressed Memory Summary]"
SUMMARY_PREAMBLE: Final = (
    f"{SUMMARY_MARKER}\n"
    "The following is a compressed summary of earlier conversation turns, "
    "replacing the raw transcript to stay within the context window.\n\n"
)

_NL = rb"\r?\n"
_HEADER_RE: Final = re.compile(
    rb"# Agent Memory"
    + _NL
    + _NL
    + rb"\*\*Conversation:\*\* ([^\r\n]*)"
    + _NL
    + rb"\*\*Created:\*\* ([^\r\n]*)"
    + _NL
    + _NL
    + rb"---"
    + _NL
    + _NL
    + rb"## Interaction Log"
    + _NL
    + _NL
)
# Greedy role: when a role itself contains " — ", the timestamp is what follows
# the last one, and it must parse as ISO-8601 for the line to count.
_ENTRY_HEADER_RE: Final = re.compile(
    rb"(?m)^### ([^\r\n]*) \xe2\x80\x94 ([^\r\n \t]+)[ \t]*(\r?\n)\r?\n"
)
BLOCK_TERMINATOR: Final = b"\n\n---\n\n"
# What may stand between a terminator and the next entry's header: empty lines
# (a run of line breaks after the terminator's own two).
_LINE_BREAKS_RE: Final = re.compile(rb"(?:\r?\n)+")
# A terminator, any empty lines and the start of a header line (found in C: a
# file full of "---" rules is not walked a rule at a time).
_NEXT_ENTRY_RE: Final = re.compile(rb"\n\n---\n\n\n*(?=### )")
_HEADER_LINE: Final = b"\n### "
_TERMINATOR_HEAD: Final = b"\n\n---"  # the terminator up to its own two line breaks
_TERMINATOR_RE: Final = re.compile(rb"\r?\n\r?\n---\r?\n\r?\n\Z")
_MAX_TERMINATOR_LEN: Final = 11  # len("\r\n\r\n---\r\n\r\n")


def parse_timestamp(text: str) -> datetime | None:
    """Any ISO-8601 form Python understands (Swarms writes naive local time)."""
    if not text or len(text) > 64:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class HeaderSegment:
    start: int
    raw: bytes
    conversation: str
    created: str


@dataclass(frozen=True, slots=True)
class EntrySegment:
    start: int
    raw: bytes
    role: str
    timestamp: str
    content: bytes  # between the header's blank line and the terminator

    @property
    def is_summary(self) -> bool:
        return self.role == SUMMARY_ROLE and self.content.lstrip().startswith(
            SUMMARY_MARKER.encode()
        )

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    @property
    def summary_text(self) -> str:
        """The summary body without the fixed preamble (only for summaries)."""
        text = self.text.lstrip()
        preamble = SUMMARY_PREAMBLE
        if text.replace("\r\n", "\n").startswith(preamble):
            return text.replace("\r\n", "\n")[len(preamble) :]
        return text[len(SUMMARY_MARKER) :].lstrip()


@dataclass(frozen=True, slots=True)
class RawSegment:
    """Bytes that are not a complete header or entry: kept verbatim."""

    start: int
    raw: bytes


Segment = HeaderSegment | EntrySegment | RawSegment


class _Ambiguous(Exception):
    """The fast reading cannot decide a boundary locally: use the full parse."""


_MARKER_BYTES: Final = SUMMARY_MARKER.encode()
_PREAMBLE_BYTES: Final = SUMMARY_PREAMBLE.encode()
_WHITESPACE: Final = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips


class MemoryDocument:
    """A memory file's bytes, split into segments on demand (see :func:`parse`).

    ``segments`` is the whole split (built once, when asked for). The compaction
    path asks for less: where the last complete entry ends, the newest turns,
    the last summary block and the turns after it. For a file without ``\\r``
    (what Swarms writes) those are found from the bytes around them: an entry
    starts where a valid header line follows a terminator (and any empty
    lines), so a search for ``\\n\\n---\\n\\n`` and ``### `` (forwards from a
    known entry), or for a ``### `` line with a terminator before it (backwards
    from the end), and the header check at each hit find the same boundaries
    as the whole split, without building the entries in between. A summary block
    is only ever the first entry (:meth:`is_summary_entry`). The one case that is not
    local (a header line right before a terminator that would share its blank
    line: whether the terminator closes an entry then depends on whether that
    header starts one) and any ``\\r`` fall back to the whole split. Property
    tests hold both readings equal.

    A document may be a prefix of a larger buffer (:meth:`prefix`): ``size``
    bytes of it, never copied.
    """

    __slots__ = ("_data", "_first", "_full", "_header", "_header_end", "_local", "size")

    def __init__(self, data: bytes, size: int | None = None) -> None:
        self._data = data
        self.size = len(data) if size is None else size
        self._full: tuple[Segment, ...] | None = None
        header = _HEADER_RE.match(data, 0, self.size)
        self._header = (
            HeaderSegment(
                start=0,
                raw=header.group(0),
                conversation=header.group(1).decode("utf-8", "replace"),
                created=header.group(2).decode("utf-8", "replace"),
            )
            if header is not None
            else None
        )
        self._header_end = header.end() if header is not None else 0
        self._local: bool | None = None  # None: not checked yet
        self._first: int | None = -1  # -1: not searched yet

    # -- the whole split ---------------------------------------------------------
    @property
    def segments(self) -> tuple[Segment, ...]:
        if self._full is None:
            self._full = _split(self._data, self.size, self._header)
        return self._full

    @property
    def header(self) -> HeaderSegment | None:
        return self._header

    @property
    def entries(self) -> list[EntrySegment]:
        return [s for s in self.segments if isinstance(s, EntrySegment)]

    def render(self) -> bytes:
        return self._data if self.size == len(self._data) else self._data[: self.size]

    def prefix(self, end: int) -> MemoryDocument:
        """The document of bytes ``0..end`` (``end`` a segment boundary): the same
        segments as this one's that end by ``end``, on the same buffer."""
        part = MemoryDocument(self._data, end)
        part._local = self._local if self._local is not False else None
        if self._full is not None:
            part._full = tuple(s for s in self._full if s.start + len(s.raw) <= end)
        return part

    def segments_before(self, offset: int) -> list[Segment]:
        return [s for s in self.segments if s.start + len(s.raw) <= offset]

    # -- reading without the whole split -------------------------------------------
    def _is_local(self) -> bool:
        if self._local is None:
            self._local = self._full is None and self._data.find(b"\r", 0, self.size) < 0
        return self._local

    def _give_up(self) -> None:
        self._local = False

    def _valid(self, at: int) -> re.Match[bytes] | None:
        """The entry header match at ``at`` when a valid header line starts there."""
        data = self._data
        if at != 0 and data[at - 1] != 0x0A:
            return None
        match = _ENTRY_HEADER_RE.match(data, at, self.size)
        if match is None or not match.group(1).strip():
            return None
        if parse_timestamp(match.group(2).decode("ascii", "replace")) is None:
            return None
        return match

    def _first_start(self) -> int | None:
        """Where the first entry header after the file header starts (any entry
        starts there, closed or not)."""
        if self._first == -1:
            data, size = self._data, self.size
            at = data.find(b"### ", self._header_end, size)
            while at >= 0 and self._valid(at) is None:
                at = data.find(b"### ", at + 1, size)
            self._first = at if at >= 0 else None
        return self._first

    def _check_not_shared(self, terminator: int) -> None:
        """Raise when a valid header line ends right before ``terminator`` with a
        blank line the terminator shares (its entry would have no room for one)."""
        data = self._data
        line_end = terminator - 1 if terminator and data[terminator - 1] == 0x0A else terminator
        line_start = data.rfind(b"\n", 0, line_end) + 1
        if line_start >= self._header_end and self._valid(line_start) is not None:
            raise _Ambiguous

    def _is_start(self, at: int) -> bool:
        """Whether an entry (closed or not) starts at ``at``, a valid header."""
        if at == self._first_start():
            return True
        terminator = self._terminator_before(at, self._header_end)
        if terminator < 0:
            return False
        self._check_not_shared(terminator)
        return True

    def _terminator_before(self, at: int, floor: int) -> int:
        """Where the terminator that closes an entry at ``at`` starts (at or after
        ``floor``), empty lines between them allowed; -1 when none does."""
        data, plain = self._data, len(BLOCK_TERMINATOR)
        if at - plain >= floor and data.startswith(BLOCK_TERMINATOR, at - plain, at):
            return at - plain  # no empty line between them (what Swarms writes)
        if at - plain - 1 < floor or not data.startswith(b"\n\n\n", at - 3, at):
            return -1
        run = _break_run_start(data, at, floor, b"\n")
        head = run - len(_TERMINATOR_HEAD)
        if head < floor or not data.startswith(_TERMINATOR_HEAD, head):
            return -1
        return head

    def _content_end(self, body: int, end: int) -> int:
        """Where the content of a closed entry whose body starts at ``body`` and
        whose bytes end at ``end`` ends: at its terminator, before the empty lines."""
        if self._data.startswith(b"---\n\n", end - 5, end):
            return end - len(BLOCK_TERMINATOR)
        return _break_run_start(self._data, end, body, b"\n") - len(_TERMINATOR_HEAD)

    def _next_start(self, body: int) -> tuple[int, re.Match[bytes]] | None:
        """The first entry start closing an entry whose content starts at ``body``:
        a valid header after a terminator and any empty lines."""
        data, size = self._data, self.size
        found = _NEXT_ENTRY_RE.search(data, body, size)
        while found is not None:
            match = self._valid(found.end())
            if match is not None:
                return found.end(), match
            found = _NEXT_ENTRY_RE.search(data, found.start() + 1, size)
        return None

    def _prev_start(self, before: int) -> tuple[int, re.Match[bytes]] | None:
        """The last entry start (closed or not) before ``before``."""
        data = self._data
        low = self._header_end
        # Each line opening with "### " before ``before``, newest first, whose
        # line a terminator (and any empty lines) comes before.
        high = min(self.size, before + len(_HEADER_LINE) - 2)
        while True:
            at = data.rfind(_HEADER_LINE, low, high)
            if at < 0:
                break
            start = at + 1
            terminator = self._terminator_before(start, low)
            match = self._valid(start) if terminator >= 0 else None
            if match is not None:
                self._check_not_shared(terminator)
                return start, match
            high = at + len(_HEADER_LINE) - 1
        first = self._first_start()
        if first is not None and first < before:
            match = self._valid(first)
            assert match is not None
            return first, match
        return None

    def _end_of(self, match: re.Match[bytes]) -> tuple[int, tuple[int, re.Match[bytes]] | None]:
        """Where the entry opened by ``match`` ends (-1: never closed, raw to the
        end) and the entry that follows it."""
        body = match.end()
        following = self._next_start(body)
        if following is not None:
            return following[0], following
        # Closed at the end of the file, empty lines after the terminator too.
        if self._terminator_before(self.size, body) >= 0:
            return self.size, None
        return -1, None

    def _entry(self, match: re.Match[bytes], end: int) -> EntrySegment:
        start = match.start()
        return EntrySegment(
            start=start,
            raw=self._data[start:end],
            role=match.group(1).decode("utf-8", "replace"),
            timestamp=match.group(2).decode("ascii", "replace"),
            content=self._data[match.end() : self._content_end(match.end(), end)],
        )

    def _raw(self, start: int, end: int) -> RawSegment:
        return RawSegment(start=start, raw=self._data[start:end])

    def _boundary_local(self) -> int:
        last = self._prev_start(self.size)
        if last is None:
            return self._header_end
        start, match = last
        end, _ = self._end_of(match)
        if end >= 0:
            return end
        return self._header_end if start == self._first_start() else start

    def _reversed_local(self, end: int) -> Iterator[Segment]:
        """The segments ending by ``end``, newest first (as ``reversed(segments_before(end))``)."""
        size = self.size
        first = self._first_start()
        if first is None:
            if self._header_end < size <= end:
                yield self._raw(self._header_end, size)
        else:
            current = self._prev_start(min(end, size))
            stop = size
            if current is not None:
                start, match = current
                stop, _ = self._end_of(match)
                if stop < 0:  # never closed: raw to the end of the file
                    if size <= end:
                        yield self._raw(start, size)
                    stop = start
                    current = self._prev_start(start) if start != first else None
            while current is not None:
                start, match = current
                if stop <= end:
                    yield self._entry(match, stop)
                stop = start
                current = self._prev_start(start) if start != first else None
            if self._header_end < first <= end:
                yield self._raw(self._header_end, first)
        if self._header is not None and self._header_end <= end:
            yield self._header

    def _last_summary_local(self, limit: int) -> tuple[EntrySegment, int] | None:
        """The summary block ending by ``limit``, and where it ends: only ever the
        first entry, right after the header (see :meth:`is_summary_entry`)."""
        first = self._first_start()
        if first is None or first != self._header_end or first >= limit:
            return None
        match = self._valid(first)
        assert match is not None
        end, _ = self._end_of(match)
        if end < 0 or end > limit:
            return None
        entry = self._entry(match, end)
        return (entry, end) if self.is_summary_entry(entry) else None

    def _closed_from(self, start: int | None, limit: int) -> Iterator[tuple[re.Match[bytes], int]]:
        """Each closed entry's header match and end, from the one at ``start`` on,
        ending by ``limit`` (one walk for entry objects and for bare texts)."""
        if start is None or start >= self.size:
            return
        match = self._valid(start)
        assert match is not None
        while True:
            end, following = self._end_of(match)
            if end < 0 or end > limit:
                return
            yield match, end
            if following is None:
                return
            match = following[1]

    def _entries_from(self, start: int | None, limit: int) -> Iterator[EntrySegment]:
        """The closed entries from the one at ``start`` on, ending by ``limit``."""
        for match, end in self._closed_from(start, limit):
            yield self._entry(match, end)

    def _local_or_none(self) -> bool:
        return self._full is None and self._is_local()

    # -- what compaction reads -----------------------------------------------------
    @property
    def boundary(self) -> int:
        """End offset of the last complete entry (or of the header).

        Everything before it can be archived; everything after it (a partial
        trailing write, or trailing bytes we cannot parse) stays in MEMORY.md.
        """
        if self._local_or_none():
            try:
                return self._boundary_local()
            except _Ambiguous:
                self._give_up()
        for segment in reversed(self.segments):
            if isinstance(segment, EntrySegment | HeaderSegment):
                return segment.start + len(segment.raw)
        return 0

    def segments_reversed(self, end: int) -> Iterator[Segment]:
        """The segments ending at or before ``end``, newest first (read as they are
        iterated: a walk that stops early reads only the entries it saw)."""
        yielded = 0
        if self._local_or_none():
            try:
                for segment in self._reversed_local(end):
                    yield segment
                    yielded += 1
                return
            except _Ambiguous:
                self._give_up()
        for index, segment in enumerate(reversed(self.segments_before(end))):
            if index >= yielded:
                yield segment

    def is_summary_entry(self, segment: EntrySegment) -> bool:
        """A summary block only where a re-seed puts one: the first entry, right
        after the header.

        memd re-seeds MEMORY.md as header + its ``System`` block + the turns kept
        or appended since, so its block is never anywhere else. Swarms'
        ContextCompressor (16.x) re-seeds the file with a header and one
        ``### user — …`` (older: ``System``) block holding its full preamble.
        A block of either form further down was written by an agent or a tool
        (Swarms writes a tool's output verbatim: ``cat`` of another MEMORY.md,
        a user pasting one): it is a turn like any other, so it never hides the
        turns before it nor lends its pins (review r9summary F2).
        """
        if segment.start != self._header_end:
            return False
        if segment.is_summary:
            return True
        if self._header is None:
            return False
        if segment.role.strip().lower() not in {"user", "system"}:
            return False
        return segment.content.replace(b"\r\n", b"\n").startswith(_PREAMBLE_BYTES)

    def since_summary(
        self, end: int | None = None
    ) -> tuple[EntrySegment | None, Iterator[EntrySegment]]:
        """The newest summary block ending at or before ``end`` (default: boundary) and
        the entries after it up to ``end``, oldest first (read as they are iterated)."""
        limit = self.boundary if end is None else end
        if self._local_or_none():
            try:
                summary, start = self._since_local(limit)
                return summary, self._entries_from(start, limit)
            except _Ambiguous:
                self._give_up()
        found_summary: EntrySegment | None = None
        pending: list[EntrySegment] = []
        for segment in self.segments:
            if segment.start + len(segment.raw) > limit:
                break
            if isinstance(segment, EntrySegment):
                if self.is_summary_entry(segment):
                    found_summary, pending = segment, []
                else:
                    pending.append(segment)
        return found_summary, iter(pending)

    def since_summary_texts(
        self, end: int | None = None
    ) -> tuple[EntrySegment | None, Iterator[tuple[str, str, str]]]:
        """:meth:`since_summary` with each entry as ``(role, timestamp, text)``, the
        text decoded straight from the buffer (no copy of its bytes first, which
        for one turn of 200 MB is 400 MB less held at once)."""
        limit = self.boundary if end is None else end
        if self._local_or_none():
            try:
                summary, start = self._since_local(limit)
                return summary, self._texts_from(start, limit)
            except _Ambiguous:
                self._give_up()
        summary, entries = self.since_summary(end)
        return summary, ((e.role, e.timestamp, e.text) for e in entries)

    def _since_local(self, limit: int) -> tuple[EntrySegment | None, int | None]:
        """The last summary block ending by ``limit`` and where the entries after it start."""
        found = self._last_summary_local(limit)
        if found is None:
            return None, self._first_start()
        summary, summary_end = found
        return summary, (summary_end if summary_end < self.size else None)

    def _texts_from(self, start: int | None, limit: int) -> Iterator[tuple[str, str, str]]:
        view = memoryview(self._data)
        for match, end in self._closed_from(start, limit):
            yield (
                match.group(1).decode("utf-8", "replace"),
                match.group(2).decode("ascii", "replace"),
                str(view[match.end() : self._content_end(match.end(), end)], "utf-8", "replace"),
            )

    def bytes_between(self, start: int, stop: int) -> bytes:
        """The document's bytes ``start..stop`` (a copy of that stretch only)."""
        return self._data[start : min(stop, self.size)]

    def raw_entries_after(self, offset: int, end: int) -> int | None:
        """Where the first entry starting after ``offset`` starts, when every segment
        from there to ``end`` (a segment boundary) is a closed raw entry that is no
        summary block; None when that is not so or not known without the whole
        split (a file with ``\\r``, an ambiguous terminator). Found from the bytes
        around it, as :meth:`segments_reversed` finds entries, without reading the
        entries in between."""
        if not self._local_or_none() or end > self.size:
            return None
        try:
            found = self._next_start(offset)
            if found is None:
                return None
            start = found[0]
            if start >= end or not self._is_start(start):
                return None
            # A summary block is only ever the first entry (is_summary_entry),
            # and its content starts with the marker.
            if start == self._header_end and self._data.rfind(_MARKER_BYTES, start, end) >= 0:
                return None
            return start
        except _Ambiguous:
            self._give_up()
            return None

    def last_summary(self, end: int | None = None) -> EntrySegment | None:
        """The newest summary block ending at or before ``end`` (default: boundary)."""
        return self.since_summary(end)[0]

    def raw_entries_since_summary(self, end: int | None = None) -> list[EntrySegment]:
        """Entries after the last summary block, up to ``end`` (default: boundary)."""
        return list(self.since_summary(end)[1])

    def unparsed_edges(self) -> tuple[RawSegment | None, RawSegment | None]:
        """The bytes that are no entry: before the first entry (after the header),
        and after the last one (an entry never closed, raw to the end)."""
        if self._local_or_none():
            try:
                return self._edges_local()
            except _Ambiguous:
                self._give_up()
        leading: RawSegment | None = None
        trailing: RawSegment | None = None
        seen_entry = False
        for segment in self.segments:
            if isinstance(segment, EntrySegment):
                seen_entry = True
            elif isinstance(segment, RawSegment):
                if seen_entry or leading is not None:
                    trailing = segment
                else:
                    leading = segment
        return leading, trailing

    def _edges_local(self) -> tuple[RawSegment | None, RawSegment | None]:
        size, header_end = self.size, self._header_end
        first = self._first_start()
        if first is None:
            return (self._raw(header_end, size) if header_end < size else None), None
        leading = self._raw(header_end, first) if first > header_end else None
        last = self._prev_start(size)
        assert last is not None
        end, _ = self._end_of(last[1])
        if end >= 0:
            return leading, None
        trailing = self._raw(last[0], size)
        # Nothing before it: the whole split sees one run of unparsed bytes.
        return (trailing, None) if leading is None and last[0] == first else (leading, trailing)

    def turns_since_summary(self) -> tuple[EntrySegment | None, list[EntrySegment | RawSegment]]:
        """The last summary block and everything after it that is not blank, oldest
        first: entries, and unparsed bytes (never skipped). Without a summary,
        everything."""
        summary, entries = self.since_summary(self.size)
        leading, trailing = self.unparsed_edges()
        turns: list[EntrySegment | RawSegment] = []
        if summary is None and leading is not None and leading.raw.strip():
            turns.append(leading)
        turns.extend(entries)
        if trailing is not None and trailing.raw.strip():
            turns.append(trailing)
        return summary, turns


def _entry_starts(data: bytes, begin: int, size: int | None = None) -> list[re.Match[bytes]]:
    """The valid entry headers at or after ``begin``, as ``_ENTRY_HEADER_RE.finditer``
    would find them, but the header regex runs only where a line starts with
    ``### `` (found with ``bytes.find``): a scan of every byte position costs
    more than the rest of the parse."""
    starts = []
    end = len(data) if size is None else size
    find = data.find
    match_at = _ENTRY_HEADER_RE.match
    at = find(b"### ", begin, end)
    while at >= 0:
        # (?m)^ holds at the start of the data or right after a newline.
        match = match_at(data, at, end) if at == 0 or data[at - 1] == 0x0A else None
        if match is None:
            at = find(b"### ", at + 1, end)
            continue
        role = match.group(1)
        stamp = match.group(2).decode("ascii", "replace")
        if role.strip() and parse_timestamp(stamp) is not None:
            starts.append(match)
        # Matches never overlap: a header match holds no other line start with "### ".
        at = find(b"### ", match.end(), end)
    return starts


def _break_run_start(data: bytes, end: int, floor: int, breaks: bytes = b"\r\n") -> int:
    """Where the run of ``breaks`` bytes that ends at ``end`` starts (at ``floor``
    at the lowest), read backwards a window at a time."""
    at, width = end, 64
    while at > floor:
        window = data[max(floor, at - width) : at]
        kept = len(window.rstrip(breaks))
        at -= len(window) - kept
        if kept:
            break
        width = min(width * 4, 1 << 20)
    return at


def _closing_terminator_end(data: bytes, end: int, floor: int) -> int:
    """Where the terminator that closes an entry at ``end`` (the next header's
    start) ends: ``end`` itself, or where the empty lines between them begin;
    -1 when no terminator starting at or after ``floor`` closes it there."""
    if _ends_with_terminator(data, end, floor):
        return end
    if end - len(BLOCK_TERMINATOR) - 1 < floor or not data.startswith(b"\n", end - 1, end):
        return -1
    run = _break_run_start(data, end, floor)
    if data.find(b"\r", run, end) >= 0 and _LINE_BREAKS_RE.fullmatch(data, run, end) is None:
        return -1
    # The terminator's own two line breaks open the run; the rest is empty lines.
    at = run
    for _ in range(2):
        at += 1 if data.startswith(b"\n", at, end) else 2
    if at >= end:
        return -1
    return at if _ends_with_terminator(data, at, floor) else -1


def _ends_with_terminator(data: bytes, end: int, floor: int) -> bool:
    plain = len(BLOCK_TERMINATOR)
    if end - plain >= floor and data.startswith(BLOCK_TERMINATOR, end - plain, end):
        return True  # the common LF form; the regex below also takes CRLF variants
    window_start = max(floor, end - _MAX_TERMINATOR_LEN)
    return _TERMINATOR_RE.search(data, window_start, end) is not None


def _terminator_start(data: bytes, end: int, floor: int) -> int:
    # The plain LF terminator wins when present: the regex's leftmost match
    # would otherwise swallow a "\r" that ends the content itself.
    plain = len(BLOCK_TERMINATOR)
    if end - plain >= floor and data[end - plain : end] == BLOCK_TERMINATOR:
        return end - plain
    window_start = max(floor, end - _MAX_TERMINATOR_LEN)
    match = _TERMINATOR_RE.search(data, window_start, end)
    assert match is not None
    return match.start()


def parse(data: bytes) -> MemoryDocument:
    """Split ``data`` into segments; ``parse(d).render() == d`` always.

    The split is made when it is asked for (:class:`MemoryDocument`)."""
    return MemoryDocument(data)


def _split(data: bytes, size: int, header: HeaderSegment | None) -> tuple[Segment, ...]:
    """The segments of ``data[:size]``, whole (the reference reading)."""
    segments: list[Segment] = []
    pos = 0
    if header is not None:
        segments.append(header)
        pos = len(header.raw)

    starts = _entry_starts(data, pos, size)
    index = 0
    while pos < size:
        while index < len(starts) and starts[index].start() < pos:
            index += 1
        if index < len(starts) and starts[index].start() == pos:
            opener = starts[index]
            body_start = opener.end()
            end = terminator_end = -1
            # Index walk, not a slice: slicing ``starts`` per entry would make
            # parsing quadratic in the number of entries.
            for later in range(index + 1, len(starts)):
                candidate = starts[later].start()
                # The terminator must close *this* entry's body, not overlap
                # its header.
                if candidate < body_start:
                    continue
                # Empty lines may stand between the terminator and it.
                closing = _closing_terminator_end(data, candidate, body_start)
                if closing >= 0:
                    end, terminator_end = candidate, closing
                    break
            if end < 0:
                closing = _closing_terminator_end(data, size, body_start)
                if closing >= 0:
                    end, terminator_end = size, closing
            if end < 0:
                segments.append(RawSegment(start=pos, raw=data[pos:size]))
                break
            content_end = _terminator_start(data, terminator_end, body_start)
            segments.append(
                EntrySegment(
                    start=pos,
                    raw=data[pos:end],
                    role=opener.group(1).decode("utf-8", "replace"),
                    timestamp=opener.group(2).decode("ascii", "replace"),
                    content=data[body_start:content_end],
                )
            )
            pos = end
            continue
        next_start = next(
            (starts[i].start() for i in range(index, len(starts)) if starts[i].start() > pos),
            size,
        )
        segments.append(RawSegment(start=pos, raw=data[pos:next_start]))
        pos = next_start
    return tuple(segments)


def is_summary_form(role: str, content: str) -> bool:
    """Whether an entry reads as a summary block (memd's ``System`` one, or
    Swarms' ``user``/``System`` one): true of the re-seeded block, and of one an
    agent or a tool quoted further down (which :meth:`MemoryDocument.is_summary_entry`
    takes for a turn)."""
    return role.strip().lower() in {"user", "system"} and content.lstrip().startswith(
        SUMMARY_MARKER
    )


def render_header(conversation: str, created: str) -> bytes:
    return (
        f"# Agent Memory\n\n**Conversation:** {conversation}\n**Created:** {created}\n\n"
        "---\n\n## Interaction Log\n\n"
    ).encode()


def render_entry(role: str, timestamp: str, content: str) -> bytes:
    return f"### {role} {EM_DASH} {timestamp}\n\n{content}\n\n---\n\n".encode(
        "utf-8", "surrogateescape"
    )


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SUMMARY_UNSAFE_LINE = re.compile(r"(?m)^(?=###[^\r\n]* \u2014 )")


def sanitize_summary(summary: str) -> str:
    """Clean a summary of controls, and make sure no line can be read as an entry header.

    Any line starting with ``###`` that contains an em dash is quoted with
    ``> ``: that is stricter than the entry-header rule (which also needs a
    valid timestamp), so no reader can mistake it for a raw entry.  Runs of
    ``---`` lines are left alone; without an entry header after them they
    never close a block.
    """
    # Lone surrogates (from JSON-decoded LLM output) cannot be encoded, and a
    # lone "\r" is a line break to readers in text mode (Swarms): normalize
    # both before quoting, so the quoting sees the lines every reader sees.
    # (ASCII-only text, known in O(1), holds no surrogate.)
    cleaned = summary if summary.isascii() else _LONE_SURROGATE.sub("\ufffd", summary)
    cleaned = cleaned.replace("\r\n", "\n").replace("\r", "\n")
    # Terminal escapes, other controls, NEL, U+2028/9 and bidi overrides: the
    # one sanitizer for LLM replies and --summary text alike.
    cleaned = strip_controls(cleaned).strip()
    return _SUMMARY_UNSAFE_LINE.sub("> ", cleaned)


def render_summary_block(summary: str, timestamp: str) -> bytes:
    return render_entry(SUMMARY_ROLE, timestamp, SUMMARY_PREAMBLE + sanitize_summary(summary))


# memd's own last line of a block (the format and archive line): printable ASCII.
_OWN_LINE_RE: Final = re.compile(r"[!-~](?:[ -~]*[!-~])?")


def render_clean_summary_block(clean: str, timestamp: str, last_line: str) -> bytes:
    """A summary block from text :func:`sanitize_summary` already cleaned, with memd's
    own ``last_line`` after it.

    The transaction renders its block twice (to check it, then with the archive's
    final name in that line) and sanitizes the reply once; the line is added
    after the sanitizer, so nothing in the reply (an unterminated escape
    sequence, a trailing carriage return) can reach into it.
    """
    if not _OWN_LINE_RE.fullmatch(last_line) or last_line.startswith("#"):
        raise ValueError(f"not a line memd writes as it is: {last_line!r}")
    text = f"{clean}\n{last_line}" if clean else last_line
    return render_entry(SUMMARY_ROLE, timestamp, SUMMARY_PREAMBLE + text)


def contains_entry_header(text: str) -> bool:
    """True when ``text`` holds a line that parses as an entry header."""
    return bool(_entry_starts(text.encode("utf-8", "surrogateescape"), 0))
