"""Lines that say the same thing of different subjects, written as one (pure).

The builtin summary (:mod:`memd.core.builtin_summary`) writes lines of one
section and day that differ in a few words only as one line, the words that
differ between braces::

    - Tool Executor: ERROR worker {w12 | w31 | w7}: connection reset by peer

which costs a third of the three lines it stands for (cl100k), and reads back
(:func:`expand_line`) as the lines it was written from: the next summary ranks,
resolves and drops them one by one, and the pinned facts find each one's facts
(:func:`expand_groups`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

SEPARATOR: Final = " | "
# One group of alternatives a line reads back as several: "{a | b | c}".
_GROUP_RE: Final = re.compile(r"\{([^{}|\n]+(?: \| [^{}|\n]+)+)\}")
# What may differ between lines written as one: a few words (a name, a code, a
# number), not a clause: "the {a | b} queue", not "we {moved | did not move} it".
_MAX_SLOT_CHARS: Final = 60
_MAX_SLOT_WORDS: Final = 4
# What the lines must share: enough that the one line says what each said.
MIN_SHARED_CHARS: Final = 24
# Where a word ends: a space, or closing punctuation then a space or the end.
_WORD_END_RE: Final = re.compile(r"[.,;:!?)\]\"'`]*(?:\s|$)")


@dataclass(frozen=True, slots=True)
class Template:
    """What lines written as one share: the text before and after their words that differ."""

    prefix: str
    suffix: str

    def slot(self, text: str) -> str | None:
        """The words ``text`` has where the template differs, or None when it does not fit."""
        if not (text.startswith(self.prefix) and text.endswith(self.suffix)):
            return None
        end = len(text) - len(self.suffix)
        if end <= len(self.prefix):
            return None
        slot = text[len(self.prefix) : end]
        return slot if _valid_slot(slot, text) else None

    def cuts(self, text: str, whole: Sequence[str]) -> bool:
        """Whether the words ``text`` differs in start or end inside one of ``whole``
        (a quantity "704.8 ms": "{a is 704.8 | b is 304.4} ms" says it, but not as
        it was said, to be found)."""
        start, end = len(self.prefix), len(text) - len(self.suffix)
        for part in whole:
            at = text.find(part)
            while at >= 0:
                if at < start < at + len(part) or at < end < at + len(part):
                    return True
                at = text.find(part, at + 1)
        return False

    def widened(self, text: str, whole: Sequence[str]) -> Template:
        """This template, its differing words widened over each of ``whole`` they
        cut in ``text`` ("is Ilse {Brivim | Zelquin}" -> "is {Ilse Brivim | Ilse Zelquin}")."""
        start, end = len(self.prefix), len(text) - len(self.suffix)
        old_end = end
        for part in whole:
            at = text.find(part)
            while at >= 0:
                if at < start < at + len(part):
                    start = at
                if at < end < at + len(part):
                    end = at + len(part)
                at = text.find(part, at + 1)
        return Template(self.prefix[:start], self.suffix[end - old_end :])

    def render(self, slots: Sequence[str]) -> str:
        return f"{self.prefix}{{{SEPARATOR.join(slots)}}}{self.suffix}"


def _valid_slot(slot: str, text: str) -> bool:
    return (
        0 < len(slot) <= _MAX_SLOT_CHARS
        and slot == slot.strip()
        and slot.count(" ") < _MAX_SLOT_WORDS
        and not any(mark in slot for mark in "{}|\n")
        and 2 * (len(text) - len(slot)) >= len(text)
    )


def template_of(first: str, second: str) -> Template | None:
    """The template two lines share, when they differ in a few words only; else None.

    The shared text ends and starts between words ("the " … " queue", "is "
    … "."), so a path, version or code that shares its first characters with
    another stays whole, to be found as it was said."""
    if first == second or "{" in first + second or "}" in first + second:
        return None
    shortest = min(len(first), len(second))
    start = _shared_length(first, second, shortest)
    tail = _shared_length(first[::-1], second[::-1], shortest - start)
    if start + tail < MIN_SHARED_CHARS or 2 * (start + tail) < max(len(first), len(second)):
        # Most pairs: before the word and quotation rules below. The rules only
        # shrink what is shared, and a slot leaves half of each line shared.
        return None
    while start > 0 and not first[start - 1].isspace():
        start -= 1
    tail = _shared_length(first[::-1], second[::-1], shortest - start)
    while tail > 0 and not _WORD_END_RE.match(first, len(first) - tail):
        tail -= 1
    # Never inside a code span or a quotation: "`make {a | b} SHARD=4`" is no
    # command anyone can copy (nor a fact the pins find as it was said).
    while any(first[:start].count(mark) % 2 for mark in '`"'):
        start = first.rfind(" ", 0, start - 1) + 1
    while tail and any(first[len(first) - tail :].count(mark) % 2 for mark in '`"'):
        cut = first.find(" ", len(first) - tail + 1)
        tail = len(first) - cut if cut >= 0 else 0
    if start + tail < MIN_SHARED_CHARS:
        return None
    template = Template(first[:start], first[len(first) - tail :])
    if template.slot(first) is None or template.slot(second) is None:
        return None
    return template


def _shared_length(first: str, second: str, most: int) -> int:
    """How many first characters ``first`` and ``second`` share, up to ``most``
    (by bisection on slices: a character loop in Python cost 10x)."""
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        if first[:middle] == second[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def expand_line(line: str) -> list[str]:
    """The lines ``line`` was written from: itself unless it holds one group of alternatives."""
    groups = list(_GROUP_RE.finditer(line))
    if len(groups) != 1:
        return [line]
    group = groups[0]
    before, after = line[: group.start()], line[group.end() :]
    slots = group.group(1).split(SEPARATOR)
    if not _written_as_one(before, slots):
        return [line]
    return [f"{before}{slot}{after}" for slot in slots]


def _written_as_one(before: str, slots: Sequence[str]) -> bool:
    """Whether a group could be one :meth:`Template.render` wrote: its words as a
    template's slots are (no space inside the braces, a few words each) and not
    inside a code span or a quotation. A line quoted from a transcript may hold
    braces and bars of its own (a TypeScript type, `{ kind: "a" | "b" }`): read
    back as alternatives it would be lines nobody wrote."""
    if any(before.count(mark) % 2 for mark in '`"'):
        return False
    return all(
        0 < len(slot) <= _MAX_SLOT_CHARS
        and slot == slot.strip()
        and slot.count(" ") < _MAX_SLOT_WORDS
        for slot in slots
    )


def written_alone(line: str) -> str:
    """``line``, written so that it reads back as itself (:func:`expand_line`): a
    line said with braces and bars of its own ("Use {dev | prod} profile") has
    its bars written tight ("{dev|prod}"), where read back it was two lines
    nobody wrote, and each cost a line of the next summary's budget."""
    groups = list(_GROUP_RE.finditer(line))
    if len(groups) != 1 or expand_line(line) == [line]:
        return line
    group = groups[0]
    tight = group.group().replace(SEPARATOR, SEPARATOR.strip())
    return f"{line[: group.start()]}{tight}{line[group.end() :]}"


def expand_groups(text: str) -> str:
    """``text`` with each line written for several (:func:`expand_line`) as those lines."""
    if "{" not in text:
        return text
    return "\n".join(expanded for line in text.split("\n") for expanded in expand_line(line))
