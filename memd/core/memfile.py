"""Parse and render the Swarms MEMORY.md format, losslessly.

The parser works on bytes and splits a file into segments whose ``raw`` bytes,
concatenated, are exactly the input: nothing is decoded-and-re-encoded, so
invalid UTF-8, CRLF and odd spacing survive a round trip untouched.

An entry is recognised only when a header line ``### {role} — {iso-timestamp}``
opens it *and* it is closed by the ``\\n\\n---\\n\\n`` terminator that is
followed by end-of-file or by another valid entry header.  Content may itself
contain ``###`` or ``---`` lines; a single marker never decides a boundary.
Bytes that fit no rule become :class:`RawSegment` and are carried verbatim.
"""

from __future__ import annotations

import re
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


@dataclass(frozen=True, slots=True)
class MemoryDocument:
    segments: tuple[Segment, ...]
    size: int

    @property
    def header(self) -> HeaderSegment | None:
        first = self.segments[0] if self.segments else None
        return first if isinstance(first, HeaderSegment) else None

    @property
    def entries(self) -> list[EntrySegment]:
        return [s for s in self.segments if isinstance(s, EntrySegment)]

    @property
    def boundary(self) -> int:
        """End offset of the last complete entry (or of the header).

        Everything before it can be archived; everything after it (a partial
        trailing write, or trailing bytes we cannot parse) stays in MEMORY.md.
        """
        for segment in reversed(self.segments):
            if isinstance(segment, EntrySegment | HeaderSegment):
                return segment.start + len(segment.raw)
        return 0

    def is_summary_entry(self, segment: EntrySegment) -> bool:
        """memd's ``System`` summary blocks anywhere; Swarms' own only where Swarms writes them.

        Swarms' ContextCompressor (16.x) re-seeds the file with a header and one
        ``### user — …`` (older: ``System``) block holding its full preamble.
        Only that exact place counts, so a user message that merely starts
        with the marker can never hide the raw turns before it.
        """
        if segment.is_summary:
            return True
        if len(self.segments) < 2 or self.segments[1] is not segment:
            return False
        if not isinstance(self.segments[0], HeaderSegment):
            return False
        if segment.role.strip().lower() not in {"user", "system"}:
            return False
        return segment.content.replace(b"\r\n", b"\n").startswith(SUMMARY_PREAMBLE.encode())

    def since_summary(
        self, end: int | None = None
    ) -> tuple[EntrySegment | None, list[EntrySegment]]:
        """The newest summary block ending at or before ``end`` (default: boundary) and
        the entries after it up to ``end``, in one walk."""
        limit = self.boundary if end is None else end
        found: EntrySegment | None = None
        pending: list[EntrySegment] = []
        for segment in self.segments:
            if segment.start + len(segment.raw) > limit:
                break
            if isinstance(segment, EntrySegment):
                if self.is_summary_entry(segment):
                    found, pending = segment, []
                else:
                    pending.append(segment)
        return found, pending

    def last_summary(self, end: int | None = None) -> EntrySegment | None:
        """The newest summary block ending at or before ``end`` (default: boundary)."""
        return self.since_summary(end)[0]

    def segments_before(self, offset: int) -> list[Segment]:
        return [s for s in self.segments if s.start + len(s.raw) <= offset]

    def raw_entries_since_summary(self, end: int | None = None) -> list[EntrySegment]:
        """Entries after the last summary block, up to ``end`` (default: boundary)."""
        return self.since_summary(end)[1]

    def render(self) -> bytes:
        return b"".join(s.raw for s in self.segments)


def _entry_starts(data: bytes, begin: int) -> list[re.Match[bytes]]:
    """The valid entry headers at or after ``begin``, as ``_ENTRY_HEADER_RE.finditer``
    would find them, but the header regex runs only where a line starts with
    ``### `` (found with ``bytes.find``): a scan of every byte position costs
    more than the rest of the parse."""
    starts = []
    find = data.find
    match_at = _ENTRY_HEADER_RE.match
    at = find(b"### ", begin)
    while at >= 0:
        # (?m)^ holds at the start of the data or right after a newline.
        match = match_at(data, at) if at == 0 or data[at - 1] == 0x0A else None
        if match is None:
            at = find(b"### ", at + 1)
            continue
        role = match.group(1)
        stamp = match.group(2).decode("ascii", "replace")
        if role.strip() and parse_timestamp(stamp) is not None:
            starts.append(match)
        # Matches never overlap: a header match holds no other line start with "### ".
        at = find(b"### ", match.end())
    return starts


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
    """Split ``data`` into segments; ``parse(d).render() == d`` always."""
    segments: list[Segment] = []
    pos = 0
    header = _HEADER_RE.match(data)
    if header is not None:
        segments.append(
            HeaderSegment(
                start=0,
                raw=header.group(0),
                conversation=header.group(1).decode("utf-8", "replace"),
                created=header.group(2).decode("utf-8", "replace"),
            )
        )
        pos = header.end()

    starts = _entry_starts(data, pos)
    index = 0
    size = len(data)
    while pos < size:
        while index < len(starts) and starts[index].start() < pos:
            index += 1
        if index < len(starts) and starts[index].start() == pos:
            opener = starts[index]
            body_start = opener.end()
            end = -1
            # Index walk, not a slice: slicing ``starts`` per entry would make
            # parsing quadratic in the number of entries.
            for later in range(index + 1, len(starts)):
                candidate = starts[later].start()
                # The terminator must close *this* entry's body, not overlap
                # its header.
                if candidate < body_start:
                    continue
                if _ends_with_terminator(data, candidate, body_start):
                    end = candidate
                    break
            if end < 0 and _ends_with_terminator(data, size, body_start):
                end = size
            if end < 0:
                segments.append(RawSegment(start=pos, raw=data[pos:]))
                break
            content_end = _terminator_start(data, end, body_start)
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
    return MemoryDocument(segments=tuple(segments), size=size)


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
    cleaned = _LONE_SURROGATE.sub("\ufffd", summary)
    cleaned = cleaned.replace("\r\n", "\n").replace("\r", "\n")
    # Terminal escapes, other controls, NEL, U+2028/9 and bidi overrides: the
    # one sanitizer for LLM replies and --summary text alike.
    cleaned = strip_controls(cleaned).strip()
    return _SUMMARY_UNSAFE_LINE.sub("> ", cleaned)


def render_summary_block(summary: str, timestamp: str) -> bytes:
    return render_entry(SUMMARY_ROLE, timestamp, SUMMARY_PREAMBLE + sanitize_summary(summary))


def contains_entry_header(text: str) -> bool:
    """True when ``text`` holds a line that parses as an entry header."""
    return bool(_entry_starts(text.encode("utf-8", "surrogateescape"), 0))
