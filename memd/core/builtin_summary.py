"""The offline extractive summarizer (pure, deterministic): no model, no network, no key.

It keeps what an operator would keep when cutting a log by hand: the previous
summary's key lines, then the sentences of the newest and most informative
turns — decisions, open tasks, errors, preferences, numbers and names — each
rendered as a quoted line ``> Role (ts): sentence``, deduplicated, within a
token budget measured by the caller's tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from memd.core.memfile import (
    EntrySegment,
    HeaderSegment,
    MemoryDocument,
    RawSegment,
    parse_timestamp,
    sanitize_summary,
)
from memd.core.summary_block import parse_summary

CountText = Callable[[str], int]

EARLIER_HEADING: Final = "Earlier (carried forward):"
RECENT_HEADING: Final = "Recent turns (most informative):"
_STATS_PREFIX: Final = "Extractive summary of "
_OWN_LINE_RE: Final = re.compile(
    rf"^(?:{re.escape(EARLIER_HEADING)}|{re.escape(RECENT_HEADING)}|{re.escape(_STATS_PREFIX)}.*)$"
)

_MAX_SENTENCE_CHARS: Final = 240
# Huge entries (pasted files, tool dumps) are sampled at both ends: their head
# says what it is, their tail says how it ended.  Bounds the work per entry.
_ENTRY_HEAD_CHARS: Final = 4_000
_ENTRY_TAIL_CHARS: Final = 12_000
_GIVE_UP_AFTER_REJECTIONS: Final = 400
_JOIN: Final = " … "

_SENTENCE_SPLIT_RE: Final = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9])")
_LEADING_MARKUP_RE: Final = re.compile(r"^(?:[>#*\-+•]+\s*|\d+[.)]\s+)+")
_NOISE_LINE_RE: Final = re.compile(r"^(?:```.*|[-=_*~`|: ]*)$")
_NORMALIZE_RE: Final = re.compile(r"[^\w]+")


def _words(pattern: str) -> re.Pattern[str]:
    return re.compile(rf"\b(?:{pattern})\b", re.IGNORECASE)


_FEATURES: Final[tuple[tuple[re.Pattern[str], float], ...]] = (
    # decisions
    (
        _words(
            r"decid\w*|decision|agreed?|chose|choose|going with|settled on|"
            r"will use|we'll use|approved?|confirmed?|selected|switch(?:ed)? to"
        ),
        3.0,
    ),
    # open tasks
    (
        _words(
            r"todo|to-do|next steps?|need to|needs to|must|should|remember|"
            r"don't forget|do not forget|action items?|follow[- ]up|pending|deadline|due"
        ),
        3.0,
    ),
    # errors
    (
        _words(
            r"errors?|failed|failures?|fails?|exceptions?|traceback|bugs?|crash\w*|"
            r"broken|timeouts?|timed out|refused|denied|invalid"
        ),
        3.0,
    ),
    # preferences
    (_words(r"prefer\w*|always|never|i like|i want|i need|don't want|avoid|instead"), 2.0),
    # goals
    (_words(r"goals?|objectives?|aim|plan|want to|trying to|so that"), 1.5),
)
_NUMBER_RE: Final = re.compile(r"\d")
_NAME_RE: Final = re.compile(r"(?<=[\w,;:] )[A-Z][\w-]+")
_PATH_OR_URL_RE: Final = re.compile(
    r"https?://|(?:^|\s)[~.]?/\w|\b\w+\.(?:py|md|json|toml|ya?ml)\b"
)
_FILLER_RE: Final = re.compile(
    r"^(?:ok(?:ay)?|sure|thanks?(?: you)?|thank you|hello|hi|great|got it|yes|no|done)\b",
    re.IGNORECASE,
)

_ROLE_WEIGHTS: Final = {"human": 1.0, "user": 1.0, "system": 0.25, "tool": 0.25}
_DEFAULT_ROLE_WEIGHT: Final = 0.5  # the agent's own turns
_RECENCY_WEIGHT: Final = 2.0
_CARRIED_FORWARD_BASE: Final = 1.5


@dataclass(frozen=True, slots=True)
class _Turn:
    label: str  # "Human (2026-01-02T10:00:00)"
    role_weight: float
    text: str


@dataclass(frozen=True, slots=True)
class _Candidate:
    score: float
    turn_index: int  # -1 for lines carried over from the previous summary
    position: int  # order within the turn (or within the previous summary)
    text: str


def _label(role: str, timestamp: str) -> str:
    clean_role = " ".join(role.split())[:60] or "Unknown"
    parsed = parse_timestamp(timestamp.strip())
    shown = parsed.isoformat(timespec="seconds") if parsed else " ".join(timestamp.split())[:40]
    return f"{clean_role} ({shown})" if shown else clean_role


def _sample(text: str) -> str:
    if len(text) <= _ENTRY_HEAD_CHARS + _ENTRY_TAIL_CHARS:
        return text
    return text[:_ENTRY_HEAD_CHARS] + "\n" + text[-_ENTRY_TAIL_CHARS:]


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``, one line each, markup stripped, long ones clipped."""
    sentences: list[str] = []
    for raw_line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = raw_line.strip()
        if not line or _NOISE_LINE_RE.match(line):
            continue
        line = _LEADING_MARKUP_RE.sub("", line).strip()
        for piece in _SENTENCE_SPLIT_RE.split(line):
            sentence = " ".join(piece.split())
            if len(sentence) < 3:
                continue
            if len(sentence) > _MAX_SENTENCE_CHARS:
                sentence = sentence[: _MAX_SENTENCE_CHARS - 1].rstrip() + "…"
            sentences.append(sentence)
    return sentences


def sentence_score(sentence: str) -> float:
    """Informativeness of one sentence, regardless of who said it or when."""
    score = 0.0
    for pattern, weight in _FEATURES:
        if pattern.search(sentence):
            score += weight
    if _NUMBER_RE.search(sentence):
        score += 0.75
    if _NAME_RE.search(sentence):
        score += 0.5
    if _PATH_OR_URL_RE.search(sentence):
        score += 0.5
    if len(sentence.split()) < 4:
        score -= 1.5
    if _FILLER_RE.match(sentence):
        score -= 1.5
    return score


def _is_filler(sentence: str) -> bool:
    """Short acknowledgements ("ok thanks", "Sure.") that carry no information."""
    return len(sentence.split()) < 4 and bool(_FILLER_RE.match(sentence))


def _normalized(text: str) -> str:
    return _NORMALIZE_RE.sub(" ", text.lower()).strip()


def _turns_after_summary(document: MemoryDocument) -> tuple[str, list[_Turn]]:
    previous = ""
    turns: list[_Turn] = []
    for segment in document.segments:
        if isinstance(segment, HeaderSegment):
            continue
        if isinstance(segment, EntrySegment):
            if document.is_summary_entry(segment):
                # The body only: memd carries the pinned facts itself.
                previous = parse_summary(segment.summary_text).body
                turns = []
                continue
            weight = _ROLE_WEIGHTS.get(segment.role.strip().lower(), _DEFAULT_ROLE_WEIGHT)
            turns.append(_Turn(_label(segment.role, segment.timestamp), weight, segment.text))
        elif isinstance(segment, RawSegment):
            text = segment.raw.decode("utf-8", "replace")
            if text.strip():
                turns.append(_Turn("(unparsed text)", _DEFAULT_ROLE_WEIGHT, text))
    return previous, turns


def _carried_lines(previous_summary: str) -> list[str]:
    lines = []
    for raw_line in sanitize_summary(previous_summary).split("\n"):
        line = raw_line.strip()
        if not line or _OWN_LINE_RE.match(line) or _NOISE_LINE_RE.match(line):
            continue
        bare = _LEADING_MARKUP_RE.sub("", line).strip().lower()
        # Section labels ("Goals:") and empty bullets carry nothing on their own.
        if bare in {"none", "none.", "n/a"} or (line.endswith(":") and len(line.split()) <= 3):
            continue
        if len(line) > _MAX_SENTENCE_CHARS * 2:
            line = line[: _MAX_SENTENCE_CHARS * 2 - 1].rstrip() + "…"
        lines.append(line)
    return lines


def _candidates(previous_summary: str, turns: list[_Turn]) -> list[_Candidate]:
    found: list[_Candidate] = []
    for position, line in enumerate(_carried_lines(previous_summary)):
        score = _CARRIED_FORWARD_BASE + sentence_score(line)
        found.append(_Candidate(score, -1, position, line))
    count = len(turns)
    for index, turn in enumerate(turns):
        recency = _RECENCY_WEIGHT * (index + 1) / count
        for position, sentence in enumerate(split_sentences(_sample(turn.text))):
            score = recency + turn.role_weight + sentence_score(sentence)
            found.append(_Candidate(score, index, position, sentence))
    # Deduplicate, keeping the newest occurrence of each sentence.
    seen: set[str] = set()
    unique: list[_Candidate] = []
    for candidate in sorted(found, key=lambda c: (c.turn_index, c.position), reverse=True):
        key = _normalized(candidate.text)
        if key and key not in seen:
            seen.add(key)
            unique.append(candidate)
    return unique


def _render(chosen: list[_Candidate], turns: list[_Turn], stats: str, *, with_stats: bool) -> str:
    carried = sorted((c for c in chosen if c.turn_index < 0), key=lambda c: c.position)
    recent = sorted(
        (c for c in chosen if c.turn_index >= 0), key=lambda c: (c.turn_index, c.position)
    )
    lines: list[str] = [stats] if with_stats else []
    if carried:
        lines.append(EARLIER_HEADING)
        lines += [c.text for c in carried]
    if recent:
        lines.append(RECENT_HEADING)
        grouped: list[tuple[int, list[str]]] = []
        for candidate in recent:
            if grouped and grouped[-1][0] == candidate.turn_index:
                grouped[-1][1].append(candidate.text)
            else:
                grouped.append((candidate.turn_index, [candidate.text]))
        for turn_index, sentences in grouped:
            lines.append(f"> {turns[turn_index].label}: {_JOIN.join(sentences)}")
    return sanitize_summary("\n".join(lines))


def _stats_line(turns: list[_Turn], had_previous: bool) -> str:
    span = ""
    labelled = [t.label for t in turns if t.label.endswith(")")]
    if labelled:
        first = labelled[0].rsplit("(", 1)[-1].rstrip(")")
        last = labelled[-1].rsplit("(", 1)[-1].rstrip(")")
        span = f", {first} to {last}" if first != last else f", {first}"
    since = " since the previous summary" if had_previous else ""
    return f"{_STATS_PREFIX}{len(turns)} turn(s){since}{span}."


def extractive_summary(document: MemoryDocument, *, max_tokens: int, count_text: CountText) -> str:
    """A bounded summary of ``document``: ``count_text(result) <= max_tokens``.

    Deterministic: the same document and budget give the same text.  Returns
    ``""`` only when nothing fits (a budget of a few tokens) or there is
    nothing to summarize.
    """
    if max_tokens <= 0:
        return ""
    previous, turns = _turns_after_summary(document)
    candidates = _candidates(previous, turns)
    if not candidates:
        return ""
    stats = _stats_line(turns, bool(previous.strip()))

    ranked = sorted(candidates, key=lambda c: (-c.score, -c.turn_index, c.position))
    # Filler ("ok", "Sure.") scores at or below zero: never worth a token
    # unless it is all there is.
    eligible = [c for c in ranked if c.score > 0 and not _is_filler(c.text)] or ranked[:1]
    stats_cost = count_text(stats) + 1
    # The stats line is context, not content: skip it when the budget is tight.
    with_stats = stats_cost * 5 <= max_tokens
    remaining = max_tokens - (stats_cost if with_stats else 0)
    heading_cost = {
        True: count_text(EARLIER_HEADING) + 1,
        False: count_text(RECENT_HEADING) + 1,
    }
    headings_paid: set[bool] = set()
    chosen: list[_Candidate] = []
    labelled_turns: set[int] = set()
    rejections = 0
    for candidate in eligible:
        if remaining <= 2 or rejections >= _GIVE_UP_AFTER_REJECTIONS:
            break
        carried = candidate.turn_index < 0
        if not carried and candidate.turn_index not in labelled_turns:
            cost = count_text(f"> {turns[candidate.turn_index].label}: {candidate.text}") + 1
        elif carried:
            cost = count_text(candidate.text) + 1
        else:
            cost = count_text(_JOIN + candidate.text)
        if carried not in headings_paid:
            cost += heading_cost[carried]
        if cost > remaining:
            rejections += 1
            continue
        chosen.append(candidate)
        remaining -= cost
        headings_paid.add(carried)
        if not carried:
            labelled_turns.add(candidate.turn_index)

    # Per-piece costs only estimate the joined text: verify, dropping the
    # least informative pick until it fits, then the stats line if need be.
    text = _render(chosen, turns, stats, with_stats=with_stats)
    while count_text(text) > max_tokens:
        if chosen:
            chosen.remove(min(chosen, key=lambda c: (c.score, c.turn_index, -c.position)))
        elif with_stats:
            with_stats = False
        else:
            break
        text = _render(chosen, turns, stats, with_stats=with_stats)
    if chosen and count_text(text) <= max_tokens:
        return text
    return _clip_best(eligible[0], turns, max_tokens, count_text)


def _clip_best(best: _Candidate, turns: list[_Turn], max_tokens: int, count_text: CountText) -> str:
    """Under a tiny budget: as much of the single best line as fits."""
    line = best.text if best.turn_index < 0 else f"> {turns[best.turn_index].label}: {best.text}"
    low, high = 0, len(line)
    while low < high:
        middle = (low + high + 1) // 2
        if count_text(sanitize_summary(line[:middle] + "…")) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return sanitize_summary(line[:low] + "…") if low else ""
