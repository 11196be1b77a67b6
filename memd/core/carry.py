"""What a model's summary may drop (pure): the decisions, open tasks, errors and
people in what one compaction summarizes, found with the builtin summarizer's
classifier (:func:`memd.core.builtin_summary.entry_lines`), not a second one.

The candidates are the lines the previous block carried, the lines of the
previous summary's own text (a decision the last model kept in its words is
carried if the next one drops it, as a fact it kept stays pinned) and the lines
of every turn since; :func:`memd.core.summary_block.compose_summary` keeps
verbatim the ones the reply does not keep.  Credentials are never carried: a
line holding one (or a placeholder for one) is not a candidate.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Final

from memd.core.builtin_summary import Line as BuiltinLine
from memd.core.builtin_summary import classify, entry_lines, resolved_lines, split_sentences
from memd.core.carried_lines import CARRIED_SECTIONS, CarriedLine, clip, merge_carried
from memd.core.memfile import MemoryDocument, is_summary_form
from memd.core.secrets import contains_secret, find_secrets_by_context, replace_spans
from memd.core.summary_block import parse_summary

_PLACEHOLDER = "[REDACTED:"


@dataclass(frozen=True, slots=True)
class CarryMaterial:
    lines: tuple[CarriedLine, ...]  # candidates, one per key, newest mention kept
    done: frozenset[str]  # keys of the tasks and errors a later turn says are done/fixed
    # The credential values the turns' context gave away ("api key: 3fa9…").
    credentials: frozenset[str] = frozenset()

    def names_a_credential(self, text: str) -> bool:
        """Whether ``text`` holds one of :attr:`credentials` as a word (said bare
        in another turn, a pin's fact or a line no longer reads as one)."""
        return bool(self.credentials) and _word_pattern(self.credentials).search(text) is not None


def carry_material(prefix: MemoryDocument) -> CarryMaterial:
    """The candidate lines of ``prefix`` (the part of MEMORY.md being compacted)."""
    block, texts = prefix.since_summary_texts()
    carried: list[CarriedLine] = []
    from_body: list[CarriedLine] = []
    if block is not None:
        previous = parse_summary(block.summary_text)
        carried = list(previous.carried)
        from_body = _body_lines(previous.body)
    resolved: list[tuple[str, str]] = []
    from_turns: list[CarriedLine] = []
    values: set[str] = set()
    for role, timestamp, text in texts:
        # A summary block quoted in a turn is another memory's (as for pins).
        if is_summary_form(role, text):
            continue
        screened = _without_credentials(text, values)
        for line in entry_lines(role, timestamp, screened, resolved):
            if line.section in CARRIED_SECTIONS and _clean(line.text):
                from_turns.append(CarriedLine(line.section, line.stamp, clip(line.text)))
    lines = merge_carried(from_body, carried, from_turns)
    if values:
        # A value its context gave away once, said bare elsewhere ("rotate the
        # secret key 3fa9…"): the reply of a model sent placeholders is not
        # searched for it, and these lines are copied from the turns as written.
        said_again = _word_pattern(values)
        lines = [line for line in lines if said_again.search(line.text) is None]
    builtin = [BuiltinLine(line.section, line.stamp, line.text) for line in lines]
    done = frozenset(lines[i].key for i in resolved_lines(builtin, resolved))
    return CarryMaterial(tuple(lines), done, frozenset(values))


def _body_lines(body: str) -> list[CarriedLine]:
    """The previous summary's own sentences the classifier puts in a carried
    section, undated (the summary stands for turns of many days): the first to go."""
    lines: list[CarriedLine] = []
    for sentence in split_sentences(body):
        if sentence.endswith(":") and len(sentence.split()) <= 3:
            continue  # a heading ("Errors:", "2026-03-02:")
        section = classify(sentence)
        if section in CARRIED_SECTIONS and _clean(sentence):
            lines.append(CarriedLine(section, "", clip(sentence)))
    return lines


def _without_credentials(text: str, values: set[str]) -> str:
    """``text`` with each credential its context gives away replaced by a
    placeholder: a sentence holding one is then no candidate (a lone value,
    ``3fa9…`` on the line after ``api_key =``, reads as no credential). The
    values replaced are added to ``values`` (those worth searching for)."""
    if not text:
        return text
    spans = find_secrets_by_context(text)
    if not spans:
        return text
    for span in spans:
        value = span.value(text)
        if len(value) >= _MIN_VALUE_CHARS and not value.isalpha():
            values.add(value)
    return replace_spans(text, spans, lambda span, _value: f"{_PLACEHOLDER}{span.kind}]")


# A value searched for wherever it stands: not a short plain word ("postgres" in
# POSTGRES_PASSWORD=postgres would take every line naming the database).
_MIN_VALUE_CHARS: Final = 6


def _word_pattern(values: Collection[str]) -> re.Pattern[str]:
    # Longest first: a value that holds another one is found whole.
    ordered = sorted(values, key=len, reverse=True)
    return re.compile(
        r"(?<![A-Za-z0-9_])(?:" + "|".join(map(re.escape, ordered)) + r")(?![A-Za-z0-9_])"
    )


def _clean(line: str) -> bool:
    return _PLACEHOLDER not in line and not contains_secret(line)
