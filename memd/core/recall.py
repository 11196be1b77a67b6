"""Recall rules (pure): which entries are indexed, and plain text → an FTS5 query.

A person or an agent asks in plain words ("where is the kalomiren report?").
FTS5's own syntax would read that as an AND of every word, and ``?``, ``"``,
``-`` or ``:`` as operators (some a syntax error). So the question is split
into words, each word is quoted as an FTS5 string (never an operator), common
words that carry no meaning are dropped, and the rest are OR-ed: bm25 then
ranks an entry sharing the question's rarest word above one sharing only its
frequent ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from memd.core.memfile import MemoryDocument, parse_timestamp
from memd.errors import MemdError

# Words in FTS5's unicode61 sense: letters and digits (any script), so the
# split here matches how the index tokenized the entries.
_WORD_RE: Final = re.compile(r"[^\W_]+", re.UNICODE)
# At most this many words from one question: a pasted page is not a query,
# and every term costs a posting-list walk.
MAX_QUERY_TERMS: Final = 32
# Markers around matches in FTS5 ``highlight()``; stripped from indexed text
# so they can only come from the highlighter.
MATCH_OPEN: Final = "\x02"
MATCH_CLOSE: Final = "\x03"

# Function words of English questions: they match almost every entry, so
# they only add cost (and noise) to an OR query.
_STOPWORD_LIST: Final = """
    a about above after again all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers him his how i if in into is it its itself
    just me more most my no nor not now of off on once only or other our ours out over own
    same she should so some such than that the their theirs them then there these they
    this those through to too under until up very was we were what when where which while
    who whom why will with would you your yours
"""
STOPWORDS: Final = frozenset(_STOPWORD_LIST.split())


class RecallQueryError(MemdError, ValueError):
    """A question with no word to search for, or a bad filter."""

    exit_code = 2


def query_terms(question: str) -> list[str]:
    """The words of ``question`` worth searching for, lower-cased, first seen first.

    Raises RecallQueryError when the question holds no word at all.
    """
    words = [w.lower() for w in _WORD_RE.findall(question)]
    if not words:
        raise RecallQueryError(f"query {question!r} has no word to search for")
    kept = [w for w in words if w not in STOPWORDS] or words
    unique = list(dict.fromkeys(kept))
    return unique[:MAX_QUERY_TERMS]


def fts_expression(terms: list[str]) -> str:
    """``terms`` OR-ed, each quoted as an FTS5 string."""
    # A quoted FTS5 string is always a term, never an operator; a word from
    # _WORD_RE cannot contain a quote, but double it anyway so this stays
    # safe if the word rule ever changes.
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


def index_text(text: str) -> str:
    """Entry text as stored: the highlight markers removed, nothing else changed."""
    return text.replace(MATCH_OPEN, "").replace(MATCH_CLOSE, "")


@dataclass(frozen=True, slots=True)
class Highlighted:
    text: str
    spans: tuple[tuple[int, int], ...]  # [start, end) character offsets of matches


def split_highlight(marked: str) -> Highlighted:
    """Turn FTS5 ``highlight()`` output into plain text plus match spans."""
    plain: list[str] = []
    spans: list[tuple[int, int]] = []
    position = 0
    start = -1
    for char in marked:
        if char == MATCH_OPEN:
            start = position
        elif char == MATCH_CLOSE:
            if start >= 0:
                spans.append((start, position))
            start = -1
        else:
            plain.append(char)
            position += 1
    return Highlighted("".join(plain), tuple(spans))


def excerpt(found: Highlighted, width: int = 400) -> Highlighted:
    """At most ``width`` characters of ``found`` around its first match.

    Cut points are moved to white space where one is near, and marked with
    an ellipsis; the spans are shifted to the excerpt's own offsets.
    """
    text = found.text
    if len(text) <= width:
        return found
    first = found.spans[0][0] if found.spans else 0
    start = max(0, min(first - width // 4, len(text) - width))
    end = min(len(text), start + width)
    if start > 0:
        space = text.find(" ", start, start + 20)
        start = space + 1 if space >= 0 else start
    if end < len(text):
        space = text.rfind(" ", end - 20, end)
        end = space if space > start else end
    prefix = "… " if start > 0 else ""
    suffix = " …" if end < len(text) else ""
    shift = len(prefix) - start
    spans = tuple(
        (max(s, start) + shift, min(e, end) + shift)
        for s, e in found.spans
        if s < end and e > start
    )
    return Highlighted(prefix + text[start:end] + suffix, spans)


@dataclass(frozen=True, slots=True)
class IndexedEntry:
    """One raw entry as the index stores it."""

    offset: int  # byte offset of the entry's header line in its file
    length: int  # bytes, header to terminator included
    role: str
    timestamp: str  # as written in the file
    epoch: float | None  # the timestamp as seconds since the epoch (naive = local)
    text: str


def raw_entries_for_index(document: MemoryDocument) -> list[IndexedEntry]:
    """The document's raw entries (summary blocks are not raw history)."""
    found: list[IndexedEntry] = []
    for entry in document.entries:
        if document.is_summary_entry(entry):
            continue
        found.append(
            IndexedEntry(
                offset=entry.start,
                length=len(entry.raw),
                role=entry.role,
                timestamp=entry.timestamp,
                epoch=timestamp_epoch(entry.timestamp),
                text=index_text(entry.text),
            )
        )
    return found


def timestamp_epoch(stamp: str) -> float | None:
    parsed = parse_timestamp(stamp)
    if parsed is None:
        return None
    try:
        # Naive stamps are local time, as Swarms writes them.
        return parsed.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def parse_since(text: str) -> datetime:
    """``--since``: an ISO date or date-time (naive = local time)."""
    parsed = parse_timestamp(text.strip())
    if parsed is None:
        raise RecallQueryError(
            f"--since {text!r} is not a date (use ISO-8601, e.g. 2026-11-30 or 2026-11-30T14:00)"
        )
    return parsed


def since_epoch(text: str) -> float:
    """``--since`` as seconds since the epoch (naive = local time); a date the
    clock cannot hold (year 1 in local time, past 9999) is refused in one line."""
    parsed = parse_since(text)
    try:
        return parsed.timestamp()
    except (OverflowError, OSError, ValueError):
        raise RecallQueryError(
            f"--since {text!r} is out of range (use a date between 1970 and 9999)"
        ) from None


__all__ = [
    "MATCH_CLOSE",
    "MATCH_OPEN",
    "MAX_QUERY_TERMS",
    "STOPWORDS",
    "Highlighted",
    "IndexedEntry",
    "RecallQueryError",
    "excerpt",
    "fts_expression",
    "index_text",
    "parse_since",
    "query_terms",
    "raw_entries_for_index",
    "since_epoch",
    "split_highlight",
    "timestamp_epoch",
]
