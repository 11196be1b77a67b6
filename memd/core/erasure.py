"""Erasure rules, pure: the tombstone ``memd forget`` leaves, when an agent comes
back, and what ``memd forget AGENT --match REGEX`` keeps of a memory file.

After ``memd forget AGENT`` a running daemon still knows the agent (its folder
stays, its in-memory count and job go on): left alone it would write the
agent's row straight back into the state DB and keep its metrics series. The
tombstone tells it not to, until the agent really writes again: a MEMORY.md
that appeared after the erasure.

"After the erasure" is judged with the file system's own clock (a file's
ctime against the agent folder's ctime once the erasure's unlinks were done),
never with ``time.time()`` against a ctime: the kernel stamps files with a
coarse clock that can lag the wall clock by a tick, so a file created just
after the erasure could otherwise look older than it. An erased MEMORY.md
with other hard links lives on under its inode number, which the tombstone
records: that inode linked back as MEMORY.md is the old memory, not a new one
(a freed inode number, on the other hand, may be reused by a new file, which
is why only a surviving inode is recorded).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from memd.core.carried_lines import said_part
from memd.core.memfile import SUMMARY_PREAMBLE, EntrySegment, HeaderSegment, parse
from memd.core.pins import PINNED_HEADING
from memd.errors import MemdError


@dataclass(frozen=True, slots=True)
class FileStamp:
    """What the revival rule needs of a MEMORY.md (from ``os.stat``)."""

    dev: int
    ino: int
    ctime_ns: int


@dataclass(frozen=True, slots=True)
class Tombstone:
    # A salted hash of the agent's name (see ``agent_key``): an erased agent's
    # name does not stay in the state DB's bytes.
    key: str
    erased_at_ns: int  # the agent folder's ctime once the erasure's unlinks were done
    survivor_dev: int = 0  # the erased MEMORY.md's inode when other links keep it alive
    survivor_ino: int = 0


def agent_key(salt: bytes, agent: str) -> str:
    """The name as the tombstone stores it: salted, so a name list cannot be
    checked against a copy of the DB without its salt table."""
    digest = hashlib.sha256(salt + agent.encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def revives(tombstone: Tombstone, memory: FileStamp | None) -> bool:
    """Whether ``memory`` (the agent's MEMORY.md now, None when absent) ends the erasure."""
    if memory is None:
        return False
    if tombstone.survivor_ino and (memory.dev, memory.ino) == (
        tombstone.survivor_dev,
        tombstone.survivor_ino,
    ):
        return False
    return memory.ctime_ns >= tombstone.erased_at_ns


# -- erase by pattern ---------------------------------------------------------------
#
# An entry (its header line and content) that the pattern matches goes whole.
# The pattern is searched in the whole entry with re.MULTILINE: ``^`` and ``$``
# anchor at each line, as they do in the summary lines below (each searched on
# its own, its line ending left off: CRLF reads as LF here), and a pattern may
# still span lines (``card\s+number``). Without it a
# line-anchored pattern took a summary's line and kept the same line in raw turns.
# Inside a summary block (memd's, or Swarms' own) the pattern is applied line by
# line: the lines of the summary and of its pinned facts that match go, the
# rest of the summary stays (no model call: nothing is re-summarized), and the
# block's fixed first lines stay so it still reads as a summary. Bytes that are
# not an entry (a torn write in an old archive) go line by line too: an
# erasure does not keep a match because it could not be parsed.


class BadPattern(MemdError, ValueError):
    """``--match`` is not a usable regular expression."""

    exit_code = 2


def compile_pattern(text: str) -> re.Pattern[str]:
    """The ``--match`` regex; one line naming it when it is bad or would match everything."""
    try:
        pattern = re.compile(text)
    except re.error as exc:
        raise BadPattern(f"--match {text!r} is not a valid regular expression: {exc}") from None
    if pattern.search("") is not None:
        raise BadPattern(
            f"--match {text!r} matches the empty string, so it would erase everything; "
            "to erase the whole memory use `memd forget AGENT --yes`"
        )
    return pattern


@dataclass(frozen=True, slots=True)
class Filtered:
    """A memory file with the matches taken out, and what went."""

    data: bytes
    entries: int = 0  # whole entries (and lines of unparsed bytes)
    summary_lines: int = 0
    pinned_lines: int = 0

    @property
    def removed(self) -> int:
        return self.entries + self.summary_lines + self.pinned_lines


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _drop_lines(raw: bytes, pattern: re.Pattern[str], keep_first: int) -> tuple[bytes, int, int]:
    """``raw`` without the lines ``pattern`` finds (the first ``keep_first`` always stay).

    Returns (kept bytes, summary lines dropped, pinned lines dropped): a line
    counts as pinned from the ``Pinned facts`` heading on.
    """
    kept: list[bytes] = []
    summary = pinned = 0
    in_pinned = False
    for index, line in enumerate(raw.splitlines(keepends=True)):
        text = _text(line).rstrip("\r\n")
        if text.strip() == PINNED_HEADING:
            in_pinned = True
        if index >= keep_first and _line_matches(text, pattern):
            if in_pinned:
                pinned += 1
            else:
                summary += 1
            continue
        kept.append(line)
    return b"".join(kept), summary, pinned


# A summary's line of what a turn said: "- Human: …" (memd's carried lines and
# the builtin summary's), "- (2026-03-02T10:30:09) Human: …" (the builtin's before
# session 10).
_SAID_LINE_RE = re.compile(r"^[ \t]*[-*][ \t]+(?:\(\d{4}-\d{2}-\d{2}[^)]*\)[ \t]+)?")


def _line_matches(text: str, pattern: re.Pattern[str]) -> bool:
    """Whether ``pattern`` finds ``text``, or what the turn said in it when it is a
    line quoting a turn: ``^We decided …`` took the raw turn whose line opens so,
    and must take the summary's ``- Human: We decided …`` with it."""
    if pattern.search(text):
        return True
    bullet = _SAID_LINE_RE.match(text)
    if bullet is None:
        return False
    line = text[bullet.end() :]
    said = said_part(line)
    return bool(pattern.search(line)) or (said is not line and bool(pattern.search(said)))


def _split_entry(segment: EntrySegment) -> tuple[bytes, bytes, bytes] | None:
    """(header line and blank line, content, terminator) of an entry's raw bytes."""
    raw = segment.raw
    head_end = raw.find(b"\n") + 1
    if raw[head_end : head_end + 1] == b"\r":
        head_end += 1
    if raw[head_end : head_end + 1] != b"\n":
        return None
    head_end += 1
    content = segment.content
    if raw[head_end : head_end + len(content)] != content:
        return None
    return raw[:head_end], content, raw[head_end + len(content) :]


def _filtered_summary(segment: EntrySegment, pattern: re.Pattern[str]) -> tuple[bytes, int, int]:
    parts = _split_entry(segment)
    if parts is None:  # cannot happen for a parsed entry; keep nothing that matches
        return (b"", 1, 0) if pattern.search(_text(segment.raw)) else (segment.raw, 0, 0)
    head, content, terminator = parts
    # The preamble's lines are memd's fixed text, not memory: they stay, so the
    # block still reads as a summary.
    content, summary, pinned = _drop_lines(content, pattern, SUMMARY_PREAMBLE.count("\n"))
    if summary + pinned == 0:
        return segment.raw, 0, 0
    return head + content.rstrip(b"\r\n") + terminator, summary, pinned


def erase_matching(data: bytes, pattern: re.Pattern[str]) -> Filtered:
    """``data`` (a MEMORY.md or an archive, up to an entry boundary) without what
    ``pattern`` matches; everything else byte for byte as it was."""
    document = parse(data)
    # Per line in summaries (_drop_lines), anchored at lines in raw entries.
    in_entries = re.compile(pattern.pattern, pattern.flags | re.MULTILINE)
    out: list[bytes] = []
    entries = summary = pinned = 0
    for segment in document.segments:
        if isinstance(segment, HeaderSegment):
            out.append(segment.raw)
        elif isinstance(segment, EntrySegment):
            if document.is_summary_entry(segment):
                raw, dropped, dropped_pins = _filtered_summary(segment, pattern)
                summary += dropped
                pinned += dropped_pins
                out.append(raw)
            elif in_entries.search(_text(segment.raw).replace("\r\n", "\n")):
                entries += 1
            else:
                out.append(segment.raw)
        else:
            raw, dropped, dropped_pins = _drop_lines(segment.raw, pattern, 0)
            entries += dropped + dropped_pins
            out.append(raw)
    if entries + summary + pinned == 0:
        return Filtered(data)
    return Filtered(b"".join(out), entries, summary, pinned)


__all__ = [
    "BadPattern",
    "FileStamp",
    "Filtered",
    "Tombstone",
    "agent_key",
    "compile_pattern",
    "erase_matching",
    "revives",
]
