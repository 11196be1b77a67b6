"""The summary block's body, versioned (pure): summary text, pinned facts, provenance.

Format 1 (memd before pinned facts, and Swarms' own summaries): the whole text
after the preamble is the summary.  Format 2 appends a ``Pinned facts`` section
and ends with one line naming the format and the archive(s) holding the raw
turns the summary replaced::

    {summary}

    Pinned facts (…):
    2026-03-02:
    - /srv/app/config.yaml

    memd-summary: v2; raw turns in archive/history_2026-03-02_10-00-00.md (+3 earlier)

A block whose last line names a format newer than this code knows is carried
as plain summary text (nothing in it is lost or rewritten), and said so.

Just before the version line, memd (since retention) says what happens to the
raw turns, so the preamble's "replacing the raw transcript" is not read as
"the transcript is gone" nor as "kept forever"::

    memd-archive: raw turns are archived verbatim in archive/ (kept 30 days), then deleted
    memd-summary: v2; raw turns in archive/history_2026-03-02_10-00-00.md

This stays format 2: the version line is unchanged, so older code still reads
the block (it ignores the line inside the pinned section, or carries it as a
line of summary text when there are no pins); newer code lifts it out of the
body and writes a fresh one each time.

Since s11, after a model's summary (never the builtin one, which keeps them
itself) and before the pinned facts, the decisions, open tasks, errors and
people the reply did not keep, verbatim (:mod:`memd.core.carried_lines`)::

    {summary}

    Said earlier (verbatim):
    Decisions:
    2026-03-02:
    - Human: We decided to move the queue to the managed broker.

    Pinned facts (…):

Format 2 still, on purpose: a memd from before reads the section as the last
lines of the summary text (it only lifts out the last paragraph when that is
the pinned section), so it shows them to its model and its builtin summarizer
keeps them; a format 3 would have made it read the whole block, pinned facts
and all, as plain text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from memd.core.carried_lines import (
    CARRIED_HEADING,
    CarriedLine,
    CarriedSection,
    dropped_by,
    fit_carried,
    parse_carried,
)
from memd.core.line_groups import expand_groups
from memd.core.memfile import MemoryDocument, is_summary_form
from memd.core.pins import (
    PINNED_HEADING,
    Pin,
    covered_keys,
    extract_facts,
    extract_from_entry,
    fit_pins,
    is_tool_role,
    merge_pins,
    parse_pinned,
    pins_of_entries,
)
from memd.core.retention import RetentionLimits

CountText = Callable[[str], int]

SUMMARY_FORMAT: Final = 2
_VERSION_LINE_RE: Final = re.compile(
    r"^memd-summary: v(\d+)(?:; raw turns in (\S+)(?: \(\+(\d+) earlier\))?)?\s*$"
)

_ARCHIVE_NOTE_PREFIX: Final = "memd-archive: "
_ARCHIVED: Final = "raw turns are archived verbatim in archive/"
_ARCHIVE_NOTE_RE: Final = re.compile(r"^memd-archive: raw turns .*$")


def archive_note(limits: RetentionLimits) -> str:
    """The line that says what happens to the raw turns this summary stands for."""
    if not limits.active:
        return f"{_ARCHIVE_NOTE_PREFIX}{_ARCHIVED} (kept until deleted)"
    return f"{_ARCHIVE_NOTE_PREFIX}{_ARCHIVED} ({limits.describe()}), then deleted"


@dataclass(frozen=True, slots=True)
class ParsedSummary:
    body: str
    pins: tuple[Pin, ...] = ()
    version: int = 1
    latest_archive: str = ""
    earlier_archives: int = 0
    archive_note: str = ""  # the memd-archive line, when the block has one
    carried: tuple[CarriedLine, ...] = ()  # the "Said earlier" section's lines


def parse_summary(text: str) -> ParsedSummary:
    """Split a summary block's text (after the preamble) into its parts, any format."""
    normalized = text.replace("\r\n", "\n").strip()
    lines = normalized.split("\n")
    match = _VERSION_LINE_RE.match(lines[-1].strip()) if lines else None
    if match is None:
        return ParsedSummary(body=normalized)
    version = int(match.group(1))
    if version > SUMMARY_FORMAT:
        return ParsedSummary(body=normalized, version=version)
    rest_lines = lines[:-1]
    note = ""
    if rest_lines and _ARCHIVE_NOTE_RE.match(rest_lines[-1].strip()):
        note = rest_lines.pop().strip()
    rest = "\n".join(rest_lines).rstrip()
    body, pins_text = rest, ""
    # memd's own section is the last paragraph before the tail (compose_summary
    # joins body, section and tail with a blank line; the section has none).
    # A heading line anywhere else is text a turn or a model wrote: it neither
    # cuts the body short nor pins what follows it (review r9summary F1).
    at = rest.rfind("\n\n") + 2 if "\n\n" in rest else 0
    if rest.startswith(PINNED_HEADING, at):
        body = rest[:at].rstrip()
        pins_text = rest[at:]
    # The carried section is the paragraph just before the pinned one (or the
    # tail), under the same rule.
    at = body.rfind("\n\n") + 2 if "\n\n" in body else 0
    carried_text = ""
    if body.startswith(CARRIED_HEADING, at):
        body, carried_text = body[:at].rstrip(), body[at:]
    return ParsedSummary(
        body=body.strip(),
        pins=tuple(parse_pinned(pins_text)),
        carried=tuple(parse_carried(carried_text)),
        version=version,
        latest_archive=match.group(2) or "",
        earlier_archives=int(match.group(3) or 0),
        archive_note=note,
    )


# A line of the builtin summary as it was written until session 10:
# "- (2026-03-02T10:30:09) Human: …", stamped with the time of the turn it comes from.
_STAMPED_LINE_RE: Final = re.compile(r"^[ \t]*- \((\d{4}-\d{2}-\d{2}T[\d:.]+)\) ")
# Its lines now, under a heading of the day they were said: "2026-03-02:" then
# "- Human: …" (a line of its own: a model's "2026-03-02: deployed" is a day line).
_DAY_HEADING_RE: Final = re.compile(r"^[ \t]*(\d{4}-\d{2}-\d{2}):[ \t]*$")
_BULLET_RE: Final = re.compile(r"^[ \t]*- ")
# A model's timeline line opens with its day: "- 2026-03-02: …", "* **2026-03-02** — …",
# "1. [2026-03-02 10:30] …".
_DAY_LINE_RE: Final = re.compile(
    r"^[ \t]*+(?:[-*+][ \t]++|\d{1,3}\.[ \t]++)?[(\[*]{0,2}(\d{4}-\d{2}-\d{2})"
    r"(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?[)\]*]{0,2}[ \t]*(?:[:\u2014\u2013-]|$)"
)


def carried_pins(previous: ParsedSummary, previous_timestamp: str) -> list[Pin]:
    """What the previous summary pinned, plus the facts its body still names.

    A fact the last model kept in its own words is no longer in the pinned
    section; reading it back from the body is what keeps it pinned if the next
    model drops it.  Each keeps the date it was last mentioned: a pinned fact
    its section's, a fact on a stamped line (the builtin summary's) that line's,
    one on a line a day opens (a model's timeline) that day unless it is after
    the previous summary's (``previous_timestamp``: a date to come is no
    mention); a fact the body alone names on no dated line is undated: it was
    dated by the previous summary itself, as if mentioned the day of the
    compaction, and so outlived the facts really mentioned since.
    """
    stamped: list[Pin] = []
    unstamped: list[str] = []
    written = previous_timestamp[:10]
    heading = ""  # the day heading the lines below are under (the builtin summary's)
    # A builtin summary's line written for several (memd.core.line_groups): each of them.
    for line in expand_groups(previous.body).split("\n"):
        day_heading = _DAY_HEADING_RE.match(line)
        if day_heading is not None and not (written and day_heading.group(1) > written):
            heading = day_heading.group(1)
            continue
        bullet = _BULLET_RE.match(line)
        if bullet is None:
            heading = ""
        stamp = _STAMPED_LINE_RE.match(line)
        line_start = None
        if stamp is not None:
            when, line_start = stamp.group(1), stamp.end()
        elif bullet is not None and heading:
            when, line_start = heading, bullet.end()
        if line_start is not None:
            role, _, said = line[line_start:].partition(": ")
            if said and is_tool_role(role):
                # The builtin summary's line of a tool's output: read as the tool's
                # entry was (a marked line there pins only its facts).
                stamped += [Pin(f.kind, f.text, when) for f in extract_from_entry(role, said)]
                continue
        else:
            day = _DAY_LINE_RE.match(line)
            if day is None or (written and day.group(1) > written):
                unstamped.append(line)
                continue
            when = day.group(1)
        stamped += [Pin(f.kind, f.text, when) for f in extract_facts(line)]
    dated = merge_pins(stamped, list(previous.pins))
    known = {pin.key for pin in dated}
    from_body = [
        Pin(f.kind, f.text, "") for f in extract_facts("\n".join(unstamped)) if f.key not in known
    ]
    return merge_pins(from_body, dated)


@dataclass(frozen=True, slots=True)
class ComposedSummary:
    text: str
    pinned: int  # facts in the pinned section
    covered: int  # pinned-kind facts the summary itself kept (same extractor)
    evicted: int  # facts dropped from the pinned section for its budget
    carried: int = 0  # lines in the "Said earlier" section
    carried_evicted: int = 0  # lines the reply dropped that did not fit beside it


def compose_summary(
    body: str,
    pins: Sequence[Pin],
    *,
    pinned_tokens: int,
    count_text: CountText,
    archive: str = "",
    earlier_archives: int = 0,
    note: str = "",
    carried: Sequence[CarriedLine] = (),
    carried_done: frozenset[str] = frozenset(),
    block_tokens: int = 0,
    max_bytes: int | None = None,
) -> ComposedSummary:
    """The format-2 text: ``body`` + the ``carried`` lines it does not keep itself
    + the pins it does not keep itself + ``note`` (see :func:`archive_note`) + the
    version line.

    The carried lines get what ``block_tokens`` (the cap the summary and pinned
    budgets make together) leaves beside the body and the pins: they never push
    the block over its cap, and never take a pin's place.  ``carried_done``: the
    keys of the lines a later turn says are done or fixed, the first to go.

    ``max_bytes``: what the text must stay under for the block to shrink the
    file (the daemon refuses a block that does not, after paying for the reply):
    the carried lines give way to it too, never the reply or the pins."""
    body = quote_own_lines(body)
    covered = covered_keys(expand_groups(body))
    missing = [pin for pin in pins if pin.key not in covered]
    section = fit_pins(missing, pinned_tokens, count_text)
    parts = [body.strip()] if body.strip() else []
    kept_lines = 0
    evicted_lines = 0
    if carried:
        dropped = dropped_by(body, carried)
        used = sum(count_text(part) for part in (*parts, section.text) if part)
        room = block_tokens - used - _SECTION_JOINS
        lines = fit_carried(dropped, room, count_text, carried_done)
        if max_bytes is not None and lines.text:
            tail_bytes = _utf8_len(note) + _utf8_len(version_line(archive, earlier_archives)) + 1
            others = sum(_utf8_len(part) + 2 for part in (*parts, section.text) if part)
            byte_room = max_bytes - others - tail_bytes - 2
            if _utf8_len(lines.text) > byte_room:
                shrunk = fit_carried(lines.lines, byte_room, _utf8_len, carried_done)
                lines = CarriedSection(shrunk.lines, shrunk.text, lines.evicted + shrunk.evicted)
        if lines.text:
            parts.append(lines.text)
        kept_lines, evicted_lines = len(lines.lines), lines.evicted
    if section.text:
        parts.append(section.text)
    tail = version_line(archive, earlier_archives)
    parts.append(f"{note}\n{tail}" if note else tail)
    return ComposedSummary(
        text="\n\n".join(parts),
        pinned=len(section.pins),
        covered=len(pins) - len(missing),
        evicted=section.evicted,
        carried=kept_lines,
        carried_evicted=evicted_lines,
    )


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogateescape"))


# The blank lines between the body, the carried and the pinned sections (a few
# tokens each): counted parts joined cost a little more than their sum.
_SECTION_JOINS: Final = 8


# A body line that reads as one of memd's own (the pinned section's heading, the
# archive note, the version line): the reply quoted it, from a turn that read a
# memory file aloud or from the previous summary.
_OWN_LINE_IN_BODY_RE: Final = re.compile(
    r"(?m)^(?=[ \t]*(?:"
    + re.escape(PINNED_HEADING)
    + "|"
    + re.escape(CARRIED_HEADING)
    + r"|memd-archive: |memd-summary: v))"
)


def quote_own_lines(body: str) -> str:
    """``body`` with each line that reads as memd's own quoted with ``> ``: no
    reader takes text a model or a turn wrote for memd's metadata or pins."""
    return _OWN_LINE_IN_BODY_RE.sub("> ", body)


def version_line(archive: str, earlier_archives: int) -> str:
    if not archive:
        return f"memd-summary: v{SUMMARY_FORMAT}"
    earlier = f" (+{earlier_archives} earlier)" if earlier_archives else ""
    return f"memd-summary: v{SUMMARY_FORMAT}; raw turns in {archive}{earlier}"


@dataclass(frozen=True, slots=True)
class Material:
    """What one compaction summarizes: the previous summary and the raw turns after it."""

    previous: ParsedSummary
    pins: tuple[Pin, ...]  # carried from the previous block, and new from the turns
    input_tokens: int  # previous body + raw turns
    turns: int
    earlier_archives: int  # archives the provenance line names besides the new one


def material_of(prefix: MemoryDocument, count_text: CountText | None) -> Material:
    """The summary material of ``prefix`` (the part of MEMORY.md being compacted).

    One walk: each turn since the last summary is read (and decoded) once, as
    the pin extraction takes it. ``count_text`` None: the caller knows the
    input's size already (the daemon's incremental count), so no turn is
    counted (``input_tokens`` is then 0).
    """
    block, texts = prefix.since_summary_texts()
    previous = parse_summary(block.summary_text) if block is not None else ParsedSummary(body="")
    carried = carried_pins(previous, block.timestamp) if block is not None else []
    turns = 0
    input_tokens = count_text(previous.body) if count_text is not None else 0

    def read() -> Iterator[tuple[str, str, str]]:
        nonlocal turns, input_tokens
        for role, timestamp, text in texts:
            turns += 1
            if count_text is not None:
                input_tokens += count_text(text)
            # A summary block quoted in a turn (another MEMORY.md printed by a
            # tool) is summarized as a turn, but its pins are another memory's:
            # none is carried (review r9summary F2).
            if not is_summary_form(role, text):
                yield role, timestamp, text

    new = pins_of_entries(read())
    return Material(
        previous=previous,
        pins=tuple(merge_pins(carried, new)),
        input_tokens=input_tokens,
        turns=turns,
        earlier_archives=previous.earlier_archives + (1 if previous.latest_archive else 0),
    )
