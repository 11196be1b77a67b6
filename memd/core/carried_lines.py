"""Carried lines (pure): decisions, open tasks, errors and people a model's summary dropped.

A model that writes a plausible summary naming nothing keeps every durable fact
(the pinned section, :mod:`memd.core.pins`), but not who decided what, what is
still to do, what failed or who is who.  The builtin summarizer's classifier
finds those sentences in what was summarized (:mod:`memd.core.carry`); each one
the reply does not keep — its salient words are not found in the reply again
(:func:`kept_in`) — is carried verbatim in a section of the block::

    Said earlier (verbatim):
    Decisions:
    2026-03-02:
    - Human: We decided to move the queue to the managed broker.

The heading is three words and ends with ":", so a memd from before this
section (format 2 without it) reads the section as summary text: its prompt
shows the lines to the model and its builtin summarizer reads each one under its
section (it skips a short label line), nothing lost.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from memd.core.secrets import contains_secret

CountText = Callable[[str], int]

CARRIED_HEADING: Final = "Said earlier (verbatim):"
# The builtin summary's sections a carried line may be in, in the order rendered.
CARRIED_SECTIONS: Final = ("People", "Decisions", "Open tasks", "Errors")
_MAX_LINE_CHARS: Final = 240

_DAY_RE: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
_DAY_HEADING_RE: Final = re.compile(r"^(\d{4}-\d{2}-\d{2}):$")
_ISO_STAMP_RE: Final = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?")
_DATE_RE: Final = re.compile(
    r"(?<![\w-])\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?![\w-])"
)
_NORMALIZE_RE: Final = re.compile(r"[^\w]+")
# A word of a line: letters, digits and the joints of names and identifiers
# ("OPS-1234", "db-7.internal", "O'Neill"), in any script: ASCII alone left a
# Cyrillic or Chinese task no word, so any reply "kept" it (review r11carry). A
# run of Chinese or Japanese is one word (no spaces to part it).
_WORD_RE: Final = re.compile(r"[^\W_](?:[\w'./-]*[^\W_])?")
# A capitalized word that is not the sentence's first: a name (a person, a product).
_NAME_RE: Final = re.compile(r"(?<=[\w,;:)] )[A-Z][a-z]+(?:[-'][A-Z]?[a-z]+)*\b")
# Words that say nothing of which decision, task, error or person a line is.
_COMMON: Final = (
    "about above after again against also been before being below between both "
    "could does doing down during each from further have having here into just more "
    "most much must need needs only other over same should some still such than that "
    "their them then there these they this those through under until very were what "
    "when where which while will with would your ours yours the and for are was "
    "not but can our you its has had who why how all any few nor off own too out "
    "decided decision agreed going todo error errors failed fails failure please "
    "thanks next later today tomorrow yesterday"
)
_STOPWORDS: Final = frozenset(_COMMON.split())
# Words this long match on their first letters: "migrate"/"migration", "worker"/"workers".
_STEM_CHARS: Final = 5


@dataclass(frozen=True, slots=True)
class CarriedLine:
    """One sentence as said, the builtin summary's section for it, when it was said."""

    section: str  # one of CARRIED_SECTIONS
    stamp: str  # ISO timestamp (or a day) of the turn; "" unknown
    text: str  # "Role: sentence" as the builtin summary writes it, or a summary's line

    @property
    def key(self) -> str:
        """What makes two lines the same (as the builtin summary's ``Line.key``)."""
        said = _ISO_STAMP_RE.sub(" ", said_part(self.text))
        return _NORMALIZE_RE.sub(" ", said.lower()).strip()

    @property
    def day(self) -> str:
        return self.stamp[:10] if _DAY_RE.fullmatch(self.stamp[:10]) else ""


def said_part(text: str) -> str:
    """``text`` without its speaker ("Human: …", "Tool Executor: …"): a prefix of
    a few words with no digit ("ERROR worker w7: …" is said, not a speaker)."""
    speaker, colon, said = text.partition(": ")
    if colon and len(speaker) <= _MAX_ROLE_CHARS and not _has_digit(speaker):
        return said
    return text


_MAX_ROLE_CHARS: Final = 40


def clip(text: str) -> str:
    """``text`` on one line, at most a sentence's length."""
    line = " ".join(text.split())
    if len(line) > _MAX_LINE_CHARS:
        line = line[: _MAX_LINE_CHARS - 1].rstrip() + "…"
    return line


# -- did the reply keep it? ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReplyWords:
    """The words of a reply, as :func:`kept_in` looks them up."""

    words: frozenset[str]
    prefixes: frozenset[str]  # each word's first 4 and 5 letters

    @classmethod
    def of(cls, text: str) -> ReplyWords:
        words = {word.lower() for word in _WORD_RE.findall(text)}
        # "the tarvok42 queue's" holds "tarvok42": split at joints too.
        words |= {part for word in list(words) for part in re.split(r"[-'./]", word) if part}
        prefixes = {word[:size] for word in words for size in (4, 5) if len(word) >= size}
        return cls(frozenset(words), frozenset(prefixes))

    def has(self, word: str) -> bool:
        """``word`` or, with no digit, a word it opens or shares five letters with
        ("move"/"moves", "migrated"/"migration", "worker"/"workers")."""
        if word in self.words:
            return True
        if _has_digit(word) or len(word) < 4:
            return False
        return word[:_STEM_CHARS] in self.prefixes


def _has_digit(word: str) -> bool:
    return any(ch.isdigit() for ch in word)


def salient_words(text: str) -> tuple[set[str], set[str]]:
    """(anchors, words) of a line: anchors name *which* one it is (a word with a
    digit, an identifier, a name), words say what it is about (the rest but
    stopwords and words under four letters)."""
    # A date says when, not which one: a model that writes "(as of 2026-03-05)"
    # in each summary made each wording a new line, one more carried per
    # compaction (r11carry); the date itself is a pinned fact.
    said = _DATE_RE.sub(" ", said_part(text))
    anchors = {name.lower() for name in _NAME_RE.findall(said)}
    words: set[str] = set()
    for word in _WORD_RE.findall(said):
        lowered = word.lower()
        if _has_digit(word) or (len(word) > 3 and any(ch in word for ch in "-./")):
            anchors.add(lowered)
        elif len(lowered) >= 4 and lowered not in _STOPWORDS:
            words.add(lowered)
    return anchors, words - anchors


def kept_in(reply: ReplyWords, line: CarriedLine, rarest: frozenset[str] = frozenset()) -> bool:
    """Whether ``reply`` keeps ``line``: every anchor found again, and at least
    half of its other salient words (on their first letters: a model changes
    "migrated" to "migration").

    ``rarest``: the line's words that fewest other lines hold, its anchors when
    it has none of its own ("the kalvoren queue" beside other queues: a reply
    naming "a queue" has not kept which one).  A substring test is not enough
    (a model writes "the managed broker" without saying which queue moves to
    it) and an exact one too much: it rewords.  A line with nothing salient
    says nothing a reply could drop."""
    anchors, words = salient_words(line.text)
    if not anchors:
        anchors = set(rarest & words)
        words -= anchors
    if not all(reply.has(anchor) for anchor in anchors):
        return False
    if not words:
        return True
    found = sum(1 for word in words if reply.has(word))
    return 2 * found >= len(words)


def dropped_by(reply_text: str, lines: Sequence[CarriedLine]) -> list[CarriedLine]:
    """The ``lines`` the reply does not keep (:func:`kept_in`).

    A line's rarest words are its salient words held by the fewest of ``lines``,
    when some are held by more (none when every word is held alike: nothing
    tells which of its words says which one it is, and a model rewords; half of
    them must be found, as of any line's other words)."""
    reply = ReplyWords.of(reply_text)
    salient = [salient_words(line.text)[1] for line in lines]
    held: dict[str, int] = {}
    for words in salient:
        for word in words:
            held[word] = held.get(word, 0) + 1
    dropped: list[CarriedLine] = []
    for line, words in zip(lines, salient, strict=True):
        counts = [held[word] for word in words]
        fewest = min(counts, default=0)
        alike = fewest == max(counts, default=0)
        rarest = frozenset() if alike else frozenset(w for w in words if held[w] == fewest)
        if not kept_in(reply, line, rarest):
            dropped.append(line)
    return dropped


# -- the section -------------------------------------------------------------------


def render_carried(lines: Sequence[CarriedLine]) -> str:
    """The section: the lines under their section, then the day they were said."""
    if not lines:
        return ""
    parts = [CARRIED_HEADING]
    for section in CARRIED_SECTIONS:
        chosen = sorted((line for line in lines if line.section == section), key=_order)
        if not chosen:
            continue
        parts.append(f"{section}:")
        day = ""
        for line in chosen:
            if line.day and line.day != day:
                day = line.day
                parts.append(f"{day}:")
            parts.append(f"- {line.text}")
    return "\n".join(parts)


def _order(line: CarriedLine) -> tuple[str, str]:
    # Undated lines (read from a summary) first: they are older than any dated one.
    return (line.day, line.stamp)


def parse_carried(section: str) -> list[CarriedLine]:
    """The lines of a rendered section (its heading line included or not)."""
    lines: list[CarriedLine] = []
    current = ""
    day = ""
    for raw in section.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if not line or line == CARRIED_HEADING:
            continue
        if line.endswith(":") and line[:-1] in CARRIED_SECTIONS:
            current, day = line[:-1], ""
            continue
        day_heading = _DAY_HEADING_RE.match(line)
        if day_heading is not None:
            day = day_heading.group(1)
            continue
        if not current or not line.startswith("- "):
            continue
        text = clip(line[2:])
        if text and "[REDACTED:" not in text and not contains_secret(text):
            lines.append(CarriedLine(current, day, text))
    return lines


def merge_carried(*groups: Sequence[CarriedLine]) -> list[CarriedLine]:
    """One line per key, at its newest mention (a dated one over an undated one)."""
    merged: dict[str, CarriedLine] = {}
    for group in groups:
        for line in group:
            if not line.key:
                continue
            current = merged.get(line.key)
            if current is None or line.stamp > current.stamp:
                merged[line.key] = line
    return list(merged.values())


@dataclass(frozen=True, slots=True)
class CarriedSection:
    lines: tuple[CarriedLine, ...]
    text: str
    evicted: int


def fit_carried(
    lines: Sequence[CarriedLine],
    max_tokens: int,
    count_text: CountText,
    first_to_go: frozenset[str] = frozenset(),
) -> CarriedSection:
    """The lines that fit ``max_tokens``: the ones whose key is in ``first_to_go``
    (a task a later turn says is done, an error said fixed) go first, then the
    oldest (undated ones before any dated one): the newest are kept.

    Deterministic; evicted lines stay in the archives (``memd recall``)."""
    order = sorted(
        range(len(lines)),
        key=lambda i: (lines[i].key not in first_to_go, lines[i].stamp, i),
    )
    if max_tokens <= 0:
        return CarriedSection((), "", len(lines))
    text = render_carried(lines)
    if not text or count_text(text) <= max_tokens:
        return CarriedSection(tuple(lines), text, 0)
    # Estimate per-line costs once, drop until the estimate fits, then verify.
    costs = [count_text(f"- {line.text}") + 1 for line in lines]
    excess = count_text(text) - max_tokens
    dropped = 0
    while excess > 0 and dropped < len(order):
        excess -= costs[order[dropped]]
        dropped += 1
    while True:
        gone = set(order[:dropped])
        kept = [line for i, line in enumerate(lines) if i not in gone]
        text = render_carried(kept)
        if not kept or count_text(text) <= max_tokens:
            return CarriedSection(tuple(kept), text, dropped)
        dropped += 1
