"""The offline extractive summarizer (pure, deterministic): no model, no network, no key.

It keeps what an operator would keep when cutting a log by hand, sorted into
sections — people, decisions, open tasks, errors, preferences, facts — each line
a sentence from the transcript under the day it was said::

    Decisions:
    2026-03-02:
    - Human: We decided to move the queue to the managed broker.

Coverage spans the whole history: lines carried from the previous summary
compete with new ones by section and age, not by recency alone.  Near
duplicates collapse (a timestamp does not make a line new), tool output is
read only where its lines do not repeat, no entry gives more than a few lines,
and chatter with no decision, task, error, preference, name or number in it
is left to the archives.  Durable identifiers (paths, URLs, commands, …) are
the pinned section's job (``memd.core.pins``), kept by the transaction.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import Final

from memd.core.line_groups import (
    MIN_SHARED_CHARS,
    Template,
    expand_groups,
    template_of,
    written_alone,
)
from memd.core.memfile import (
    EntrySegment,
    MemoryDocument,
    parse_timestamp,
    sanitize_summary,
)
from memd.core.pins import extract_facts, is_tool_role, non_repeating_lines
from memd.core.prompts import since_last_summary
from memd.core.summary_block import parse_summary

CountText = Callable[[str], int]

# Section name -> priority (higher is kept longer under a tight budget).
SECTIONS: Final = {
    "Goal": 4,
    # Who is who: a name with a role ("our contact is …", "ask …", "… owns the
    # billing service"). Few in a session, and once lost no later turn says it.
    "People": 5,
    "Decisions": 5,
    "Open tasks": 4,
    "Errors": 4,
    "Preferences": 5,
    "Facts": 3,
    "Earlier": 2,  # lines of a previous summary written by someone else (a model)
    # What was said when, for turns with nothing above: the first words of each.
    "Timeline": 0,
    # Open tasks and errors a later turn said are done or fixed (:func:`_resolved_lines`),
    # the first lines to go; under their own heading they stay resolved when carried.
    "Resolved": 0,
}
_STATS_PREFIX: Final = "Extractive summary of "
_MAX_SENTENCE_CHARS: Final = 240
_MAX_LINES_PER_ENTRY: Final = 4
# Huge entries (pasted files, tool dumps) are sampled at both ends: their head
# says what it is, their tail says how it ended.  Bounds the work per entry.
_ENTRY_HEAD_CHARS: Final = 20_000
_ENTRY_TAIL_CHARS: Final = 20_000

_SENTENCE_SPLIT_RE: Final = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[A-Z0-9`])")
_LEADING_MARKUP_RE: Final = re.compile(r"^(?:[>#*\-+•]+\s*|\d+[.)]\s+)+")
_NOISE_LINE_RE: Final = re.compile(r"^(?:```.*|[-=_*~`|: ]*)$")
# A line as memd wrote it before day headings: "- (2026-03-02T10:30:09) Human: …".
_LINE_RE: Final = re.compile(r"^- \((\S+)\) (.*)$")
_DAY_RE: Final = re.compile(r"\d{4}-\d{2}-\d{2}")
# A line as memd wrote it before sections (726ab50), under "Earlier (carried
# forward):" or "Recent turns (most informative):": "> Human (2026-11-30T09:00:00): …".
_QUOTED_LINE_RE: Final = re.compile(
    r"^(?:> )?([^():\n]{1,40}) \((\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)\): (.+)$"
)
_OLD_HEADINGS: Final = frozenset(("Earlier (carried forward):", "Recent turns (most informative):"))
# A day heading in a section (:func:`_render`): the lines after it were said that day.
_DAY_HEADING_RE: Final = re.compile(r"^(\d{4}-\d{2}-\d{2}):$")
_ISO_STAMP_RE: Final = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?")
_NORMALIZE_RE: Final = re.compile(r"[^\w]+")


def _words(pattern: str) -> re.Pattern[str]:
    return re.compile(rf"\b(?:{pattern})\b", re.IGNORECASE)


_CLASSIFIERS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    (
        "Errors",
        _words(
            r"errors?|failed|failures?|fails?|exceptions?|traceback|bugs?|crash\w*|fatal|"
            r"broken|timeouts?|timed out|refused|denied|invalid|reset by peer|panic"
        ),
    ),
    (
        "Decisions",
        _words(
            r"decid\w*|decision|agreed?|chose|choose|going with|settled on|will use|"
            r"we'll use|approved?|selected|switch(?:ed)? to"
        ),
    ),
    (
        "Open tasks",
        _words(
            r"todo|to-do|next steps?|need to|needs to|still needs?|must|action items?|"
            r"follow[- ]up|deadline|due|blocked|in progress|not yet"
        ),
    ),
    (
        "Goal",
        _words(r"goals?|objectives?|aim to|trying to|plan to|so that|by (?:the end of )?\w+day"),
    ),
    (
        "Preferences",
        _words(
            r"prefer\w*|always|never|i like|i want|i need|don't want|do not want|avoid|"
            r"remember|note|important"
        ),
    ),
)
# A name mid-sentence ("contact is Priya Raman"): worth a Facts line.
_NAME_RE: Final = re.compile(r"(?<=[\w,;:] )[A-Z][a-z]+(?: [A-Z][\w-]+)+")
# A person's name anywhere in a sentence: two or three capitalized words
# ("Dana Whitfield", "Ana de Souza", "Sean O'Neill", "Mary-Jane Okafor"), the first
# not a word that opens a sentence ("The", "Our", …).
_PERSON_NAME_RE: Final = re.compile(
    r"\b(?!(?:The|This|That|These|Those|Our|Their|His|Her|Its|My|Your|We|They|It|If|"
    r"When|Then|And|But|For|Ask|Please|Hi|Hello|Thanks|Dear)\b)"
    r"[A-Z][a-z]+(?:-[A-Z][a-z]+)?"
    r"(?: (?:(?:van|von|de|da|del|der|di|du|la|le|bin|al)[ -])?(?:O'|Mc|Mac)?[A-Z][a-z]+"
    r"(?:-[A-Z][a-z]+)?){1,2}\b"
)
# What says a sentence is a task whatever else it names (a person to ask, a decision).
_TASK_MARKER_RE: Final = _words(
    r"todo|to-do|fixme|action items?|next steps?|need to|needs to|still needs?"
)
# What makes a name a person's role in the work, not a passing mention.
_ROLE_RE: Final = _words(
    r"contacts?|point of contact|owners?|owns|owned by|on-?call|on call|reviewers?|reviews|"
    r"reviewed by|managers?|manages|managed by|lead|led by|maintainers?|maintains|"
    r"ask|asked|responsible|in charge|approvers?|approves|approved by|assigned to|assignees?|"
    r"sponsors?|stakeholders?|escalate to|escalations?|admins?|administrators?|architects?|"
    r"product owner|PM|SRE|DBA|account manager|signs? off|sign-off|liaison|representative|"
    r"counterpart"
)


@dataclass(frozen=True, slots=True)
class Line:
    section: str
    stamp: str  # ISO timestamp of the entry ("" unknown)
    text: str  # "Role: sentence" or a carried line as written

    @property
    def key(self) -> str:
        without_stamps = _ISO_STAMP_RE.sub(" ", self.text.split(": ", 1)[-1])
        return _NORMALIZE_RE.sub(" ", without_stamps.lower()).strip()

    @property
    def day(self) -> str:
        """The day heading this line goes under ("" undated)."""
        return self.stamp[:10] if _DAY_RE.fullmatch(self.stamp[:10]) else ""

    def render(self) -> str:
        """The line alone, as :func:`_render` writes it under its day (for its cost)."""
        return f"- {self.text}"


def _stamp(timestamp: str) -> str:
    parsed = parse_timestamp(timestamp.strip())
    return parsed.isoformat(timespec="seconds") if parsed else ""


def _role(role: str) -> str:
    return " ".join(role.split())[:40] or "Unknown"


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


def classify(sentence: str) -> str | None:
    """The section a sentence belongs to, or None when it carries nothing worth keeping.

    A task that names who to ask is a task ("TODO: rotate the key, ask Priya
    Raman"): filed under People it stayed there once done (s11long)."""
    if (
        _ROLE_RE.search(sentence)
        and _PERSON_NAME_RE.search(sentence)
        and not _TASK_MARKER_RE.search(sentence)
    ):
        return "People"
    for section, pattern in _CLASSIFIERS:
        if pattern.search(sentence):
            return section
    if _NAME_RE.search(sentence) or extract_facts(sentence):
        return "Facts"
    return None


def _entry_lines(
    role: str, stamp: str, text: str, resolved: list[tuple[str, str]] | None = None
) -> list[Line]:
    """Up to a few lines from one entry; tool output only where its lines do not repeat.

    Its sentences that say something is done or fixed go to ``resolved`` as
    ``(stamp, sentence)`` (see :func:`_resolved_lines`)."""
    body = _sample(text)
    if is_tool_role(role) or body.lstrip().startswith("Tool Output"):
        body = "\n".join(non_repeating_lines(body))
    found: list[Line] = []
    sentences = split_sentences(body)
    for sentence in sentences:
        if resolved is not None and _says_done(sentence):
            resolved.append((stamp, sentence))
        section = classify(sentence)
        if section is not None:
            found.append(Line(section, stamp, f"{_role(role)}: {sentence}"))
    if not found and not is_tool_role(role):
        opening = next((s for s in sentences if len(s.split()) >= 4), None)
        if opening is not None:
            found.append(Line("Timeline", stamp, f"{_role(role)}: {opening}"))
    # The most telling lines of a long entry first: sections by priority.
    found.sort(key=lambda line: -SECTIONS[line.section])
    return found[:_MAX_LINES_PER_ENTRY]


def entry_lines(
    role: str, timestamp: str, text: str, resolved: list[tuple[str, str]] | None = None
) -> list[Line]:
    """The lines this summary takes from one entry (``timestamp`` as its header has
    it), and its done/fixed sentences into ``resolved``: :mod:`memd.core.carry`
    finds what a model's summary dropped with the same classifier."""
    return _entry_lines(role, _stamp(timestamp), text, resolved)


def resolved_lines(lines: list[Line], resolved: list[tuple[str, str]]) -> set[int]:
    """The indices of the open tasks and errors in ``lines`` that a sentence of
    ``resolved`` says are done or fixed (as this summary ranks them)."""
    return _resolved_lines(lines, resolved)


def _carried_lines(previous_body: str, fallback_stamp: str) -> list[Line]:
    """Lines of the previous summary: its own sections when memd wrote it, else 'Earlier'."""
    lines: list[Line] = []
    section = "Earlier"
    day = ""
    # A line written for several (:func:`_render`): read as each of them.
    for raw in expand_groups(sanitize_summary(previous_body)).split("\n"):
        line = raw.strip()
        if not line or line.startswith(_STATS_PREFIX) or _NOISE_LINE_RE.match(line):
            continue
        heading = line[:-1] if line.endswith(":") else None
        if heading in SECTIONS:
            section, day = heading, ""
            continue
        day_heading = _DAY_HEADING_RE.match(line)
        if day_heading:
            day = day_heading.group(1)
            continue
        if line.endswith(":") and (len(line.split()) <= 3 or line in _OLD_HEADINGS):
            day = ""
            continue  # another writer's section label ("Goals:"), or an old memd's
        match = _LINE_RE.match(line)
        if match:
            lines.append(Line(section, match.group(1), match.group(2)))
            continue
        quoted = _QUOTED_LINE_RE.match(line)
        if quoted:
            # An old memd's line: its own time, and the section its sentence
            # would have now (it was read as undated, dated the day of the
            # summary, and so outlived newer lines).
            role, stamp, said = quoted.groups()
            lines.append(Line(classify(said) or section, _stamp(stamp), f"{_role(role)}: {said}"))
            continue
        bare = _LEADING_MARKUP_RE.sub("", line).strip()
        if bare.lower() in {"none", "none.", "n/a"} or not bare:
            continue
        if len(bare) > _MAX_SENTENCE_CHARS * 2:
            bare = bare[: _MAX_SENTENCE_CHARS * 2 - 1].rstrip() + "…"
        lines.append(Line(section, day or fallback_stamp, bare))
    return lines


def _collect(
    document: MemoryDocument, resolved: list[tuple[str, str]]
) -> tuple[list[Line], int, str, str]:
    """(lines oldest first, turns read, first stamp, last stamp); the turns'
    sentences that say something is done or fixed are added to ``resolved``.

    The same walk of "last summary + turns since it" as the LLM prompt's.
    """
    since = since_last_summary(document)
    lines: list[Line] = []
    if since.summary is not None:
        previous = parse_summary(since.summary.summary_text)
        lines = _carried_lines(previous.body, _stamp(since.summary.timestamp))
        # What memd carried beside a model's summary, each under its own section.
        lines += [Line(line.section, line.stamp, line.text) for line in previous.carried]
    turns = 0
    first = last = ""
    for turn in since.turns:
        turns += 1
        if isinstance(turn, EntrySegment):
            stamp = _stamp(turn.timestamp)
            first = first or stamp
            last = stamp or last
            lines.extend(_entry_lines(turn.role, stamp, turn.text, resolved))
        else:
            raw = turn.raw.decode("utf-8", "replace")
            lines.extend(_entry_lines("(unparsed text)", "", raw, resolved))
    return lines, turns, first, last


def _deduplicated(lines: list[Line]) -> list[Line]:
    """One line per key, at its newest mention; order by time."""
    newest: dict[str, Line] = {}
    for line in lines:
        if line.key:
            newest.pop(line.key, None)
            newest[line.key] = line
    return list(newest.values())


def _priority(line: Line) -> int:
    """A Facts line whose facts are all pinned anyway goes before one the pins cannot keep."""
    priority = SECTIONS[line.section]
    if line.section == "Facts" and extract_facts(line.text):
        priority -= 2
    return priority


# A sentence saying a task is done or an error fixed ("Rotated the token, done.",
# "The kappa-7 checksum is fixed now", "closed OPS-12").
_RESOLVED_RE: Final = _words(
    r"done|fixed|resolved|closed|completed|finished|shipped|merged|solved|"
    r"works now|working again|no longer fails|passes now|now passes"
)
# What makes "done" not said of anything yet: a question ("Is the backfill
# done?"), or a negation or condition in the words of its clause before it
# ("still not fixed", "isn't done", "once the orders_2019 backfill is done").
_NOT_DONE: Final = (
    "not never no-one nobody nothing isn't aren't wasn't weren't hasn't haven't hadn't "
    "didn't doesn't don't won't can't cannot yet if once when until unless whether "
    "before after"
)
_NOT_DONE_WORDS: Final = frozenset(_NOT_DONE.split())
_NOT_DONE_WINDOW: Final = 6


def _says_done(sentence: str) -> bool:
    """Whether ``sentence`` says something is done or fixed (:func:`_resolved_lines`)."""
    if sentence.rstrip().endswith("?") or _TASK_MARKER_RE.search(sentence):
        return False
    for match in _RESOLVED_RE.finditer(sentence):
        clause = re.split(r"[,;:]", sentence[: match.start()])[-1]
        before = clause.lower().replace("\u2019", "'").split()[-_NOT_DONE_WINDOW:]
        if not _NOT_DONE_WORDS.intersection(before):
            return True
    return False


_SUBJECT_WORD_RE: Final = re.compile(r"[A-Za-z0-9][\w./-]{2,}[A-Za-z0-9]")
# Words too common to say what a task is about.
_COMMON: Final = (
    "that this with from have will should must todo error errors failed fails before "
    "after still need needs again when then them they there what which into about done "
    "fixed resolved closed completed finished shipped merged solved works working now "
    "just also some more most only than their these those were been being does could "
    "would make sure check follow next today tomorrow week please thanks"
)
_COMMON_WORDS: Final = frozenset(_COMMON.split())


def _subject_words(text: str) -> set[str]:
    said = text.split(": ", 1)[-1]
    words = {word.lower() for word in _SUBJECT_WORD_RE.findall(said)}
    return words - _COMMON_WORDS


def _resolved_lines(lines: list[Line], resolved: list[tuple[str, str]]) -> set[int]:
    """The open tasks and errors a later sentence says are done or fixed.

    A task is matched by a word of its own that no other open task or error
    holds ("TODO: rotate the staging token" … "Rotated the staging token,
    done."): a word several share ("the billing docs", "the billing job") says
    nothing of which one was done; and a plain word ("staging") counts only
    beside another of the task's own, where a code or a file ("kappa-7",
    "orders_2019") counts alone. A question, a negation or a condition ("Is it
    done?", "still not fixed", "once it is done") says nothing is done
    (:func:`_says_done`). Such a line moves to the Resolved section,
    the first to go: the open ones keep their places (s10retain), and carried
    to the next summary it stays resolved, where under Open tasks it was open
    again once the turn saying it was done had been summarized (s11long).
    Deterministic.
    """
    candidates = [i for i, line in enumerate(lines) if line.section in ("Open tasks", "Errors")]
    if not candidates or not resolved:
        return set()
    words = {i: _subject_words(lines[i].text) for i in candidates}
    holders: dict[str, int] = {}
    for i in candidates:
        for word in words[i]:
            holders[word] = holders.get(word, 0) + 1
    # word -> (stamp, sentence, its subject words) of the sentences saying it is done
    saying: dict[str, list[tuple[str, str, set[str]]]] = {}
    for stamp, sentence in resolved:
        subject = _subject_words(sentence)
        for word in subject:
            if holders.get(word) == 1:
                saying.setdefault(word, []).append((stamp, sentence, subject))
    done: set[int] = set()
    for i in candidates:
        line = lines[i]
        said = line.text.split(": ", 1)[-1]
        for word in sorted(words[i]):
            if any(
                sentence != said
                and (not (stamp and line.stamp) or stamp >= line.stamp)
                and (_DISTINCTIVE_RE.search(word) or len(subject & words[i]) >= 2)
                for stamp, sentence, subject in saying.get(word, ())
            ):
                done.add(i)
                break
    return done


# A word that names one thing (a code, a file, a table: "kappa-7", "orders_2019"):
# alone it says which task is done. A plain word ("staging") names a subject
# several tasks may have, said or not: "The staging deploy is done" resolved
# "TODO: rotate the staging API token" (r11long); two of its words must be said.
_DISTINCTIVE_RE: Final = re.compile(r"[\d_./-]")


def _eviction_order(
    lines: list[Line],
    done: Set[int] = frozenset(),
    costs: Sequence[int] = (),
    newest_tokens: int = 0,
) -> list[int]:
    """Every line's index, the first to go first.

    Least valuable first (:data:`SECTIONS`), then oldest (in Facts, a line whose
    facts are pinned anyway before one the pins cannot keep), except that each
    valued section keeps its newest lines, worth up to ``newest_tokens`` of
    ``costs`` (and at least :data:`_NEWEST_KEPT`), until every other line has
    gone: weeks of carried Decisions and Preferences would otherwise crowd out
    today's open task and error (review r9summary F6). With 5 lines each, after
    30 builtin compactions the summary kept 10 % of open tasks and errors
    behind 100 % of decisions, people and preferences; with a fifth of the
    budget each, 53-59 % and 74 % (all kinds 86.2 -> 89.3 %, durable facts
    still 100 %: lines written as one left the pins room, where before a fair
    share lost durable facts, 96 -> 84 %, s10retain). The open tasks and
    errors in ``done`` (:func:`_resolved_lines`) go before any other line.
    Deterministic.
    """
    by_value = sorted(
        range(len(lines)), key=lambda i: (i not in done, _priority(lines[i]), lines[i].stamp, i)
    )
    newest: dict[str, list[int]] = {}
    spent: dict[str, int] = {}
    for index in sorted(range(len(lines)), key=lambda i: (lines[i].stamp, i), reverse=True):
        section = lines[index].section
        if index in done or SECTIONS[section] < _PROTECTED_VALUE:
            continue
        kept = newest.setdefault(section, [])
        cost = costs[index] if costs else 0
        if len(kept) < _NEWEST_KEPT or spent.get(section, 0) + cost <= newest_tokens:
            kept.append(index)
            spent[section] = spent.get(section, 0) + cost
    protected = {index for kept in newest.values() for index in kept}
    first = [index for index in by_value if index not in protected]
    return first + [index for index in by_value if index in protected]


# How many of each section's newest lines stay until all others have gone (at
# least, and worth up to a share of the budget), for the sections valued this
# much or more (Goal, Decisions, Open tasks, Errors, Preferences: Facts' facts
# are pinned, the Timeline is what fills the rest).
_NEWEST_KEPT: Final = 5
_NEWEST_SHARE: Final = 0.2
_PROTECTED_VALUE: Final = 4


@dataclass(frozen=True, slots=True)
class _Group:
    """Lines of one section and day written as one (:mod:`memd.core.line_groups`)."""

    number: int
    template: Template


# How many earlier lines of its section and day a line is compared with to
# start a group: bounds the work on a long section of undated lines.
_GROUP_CANDIDATES: Final = 64
# Half of the shared text a template needs: at its start or at its end.
_SHARED_END_CHARS: Final = MIN_SHARED_CHARS // 2
# Lines written as one at most: a line stays one a reader takes in at a glance.
_GROUP_MEMBERS: Final = 12
# A fact of fewer spaces than this is a name, a path, a quantity: never cut.
_MAX_WHOLE_SPACES: Final = 4


def _groups(lines: Sequence[Line]) -> dict[Line, _Group]:
    """The lines written as one with others: each joins the first group of its
    section and day its text fits (of fewer than :data:`_GROUP_MEMBERS`), else
    starts one with the first earlier line of them it shares a template with.
    No fact the pins would find (a path, a quantity, …) nor a person's name is
    cut by the braces:
    a summary line keeps it as it was said. Deterministic."""
    found: dict[Line, _Group] = {}
    sizes: list[int] = []  # by group number
    # The groups of each section and day not yet full, oldest first.
    buckets: dict[tuple[str, str], list[_Group]] = {}
    # The lines not yet in a group, by their section, day and first or last
    # characters: two lines share a template only if they share one or the other
    # (half of the shared text or more), so a line is compared with those alone.
    alone: dict[tuple[str, str, str], list[tuple[int, Line]]] = {}
    whole: dict[Line, list[str]] = {}

    def whole_of(line: Line) -> list[str]:
        if line not in whole:
            # A whole sentence (a preference, a "Remember:" line) may be cut: it
            # is read back whole (expand_groups) before the pins look for it.
            facts = [f.text for f in extract_facts(line.text)]
            facts += _PERSON_NAME_RE.findall(line.text)  # "Ilse {Brivim | Zelquin}": no
            whole[line] = [f for f in facts if f.count(" ") < _MAX_WHOLE_SPACES]
        return whole[line]

    def fits(template: Template, line: Line) -> bool:
        return template.slot(line.text) is not None and not template.cuts(line.text, whole_of(line))

    def shared(first: Line, second: Line) -> Template | None:
        """The template of two lines, widened over what it would cut of either."""
        template = template_of(first.text, second.text)
        for _ in range(3):
            if template is None:
                return None
            wider = template.widened(first.text, whole_of(first))
            wider = wider.widened(second.text, whole_of(second))
            if wider == template:
                break
            template = wider
        return template

    for position, line in enumerate(lines):
        if line.section == "Timeline":
            continue  # a turn's first words: what differs is what it says
        groups = buckets.setdefault((line.section, line.day), [])
        # The newest of them only: every group of a day, full or not, read for
        # each line, made a day of 5,000 lines of one error (416 groups) 5 s.
        group = next((g for g in groups[-_GROUP_CANDIDATES:] if fits(g.template, line)), None)
        ends = [
            (line.section, line.day, line.text[:_SHARED_END_CHARS]),
            (line.section, line.day, "…" + line.text[-_SHARED_END_CHARS:]),
        ]
        if group is None:
            # The newest of them only: a whole list, read for each line, made a
            # day of 5,000 lines of one tool's errors (their first characters its
            # role's) take 17 s, where it took 0.3 s before line groups.
            newest = {i: other for end in ends for i, other in _newest_alone(alone.get(end), found)}
            for _, other in sorted(newest.items())[-_GROUP_CANDIDATES:]:
                template = shared(other, line)
                if template is not None and fits(template, other) and fits(template, line):
                    group = _Group(len(sizes), template)
                    groups.append(group)
                    found[other] = group
                    sizes.append(1)
                    break
        if group is None:
            for end in ends:
                alone.setdefault(end, []).append((position, line))
        else:
            found[line] = group
            sizes[group.number] += 1
            if sizes[group.number] == _GROUP_MEMBERS:
                groups.remove(group)
    return found


def _newest_alone(
    alone: list[tuple[int, Line]] | None, found: Mapping[Line, _Group]
) -> list[tuple[int, Line]]:
    """The newest :data:`_GROUP_CANDIDATES` of ``alone`` not in a group yet;
    those that are leave the list (each is passed over once)."""
    if not alone:
        return []
    newest: list[tuple[int, Line]] = []
    at = len(alone)
    while at and len(newest) < _GROUP_CANDIDATES:
        at -= 1
        if alone[at][1] in found:
            del alone[at]
        else:
            newest.append(alone[at])
    return newest


def _render(lines: list[Line], stats: str, groups: Mapping[Line, _Group]) -> str:
    """Each section's lines under the days they were said (undated ones first)::

        Decisions:
        2026-03-02:
        - Human: We decided to move the queue to the managed broker.

    A day opening each line cost a third of its tokens (14 of ~35 in cl100k,
    with the time of day): under a day heading as many more lines fit. Lines of
    a day that differ in a few words only are one line (``groups``), the words
    that differ between braces: "- Human: We decided to move the {a | b} queue …".
    """
    parts = [stats] if stats else []
    for section in SECTIONS:
        chosen = [line for line in lines if line.section == section]
        if not chosen:
            continue
        parts.append(f"{section}:")
        day = ""
        members: dict[_Group, list[Line]] = {}
        for line in chosen:
            if line in groups:
                members.setdefault(groups[line], []).append(line)
        for line in sorted(chosen, key=lambda line: line.day):
            if line.day != day:
                day = line.day
                parts.append(f"{day}:")
            group = groups.get(line)
            together = members[group] if group is not None else []
            if group is None or len(together) < 2:
                parts.append(written_alone(f"- {line.text}"))
            elif line is together[0]:
                slots = [group.template.slot(member.text) or "" for member in together]
                parts.append(f"- {group.template.render(slots)}")
    return sanitize_summary("\n".join(parts))


def extractive_summary(document: MemoryDocument, *, max_tokens: int, count_text: CountText) -> str:
    """A bounded summary of ``document``: ``count_text(result) <= max_tokens``.

    Deterministic: the same document and budget give the same text.  Returns
    ``""`` only when nothing fits (a budget of a few tokens) or there is
    nothing to summarize.
    """
    if max_tokens <= 0:
        return ""
    resolved: list[tuple[str, str]] = []
    collected, turns, first, last = _collect(document, resolved)
    lines = _deduplicated(collected)
    if not lines:
        return ""
    span = f", {first} to {last}" if first and last and first != last else ""
    stats = f"{_STATS_PREFIX}{turns} new turn(s){span}." if turns else ""
    for index in _resolved_lines(lines, resolved):
        lines[index] = replace(lines[index], section="Resolved")
    done = {index for index, line in enumerate(lines) if line.section == "Resolved"}
    groups = _groups(lines)
    costs = [count_text(line.render()) + 1 for line in lines]
    eviction = _eviction_order(lines, done, costs, int(max_tokens * _NEWEST_SHARE))
    # A line written with others costs its words that differ; the group, its
    # shared text once (and a lone member its whole line again).
    members: dict[_Group, set[int]] = {}
    slot_costs: dict[int, int] = {}
    for index, line in enumerate(lines):
        group = groups.get(line)
        if group is not None:
            members.setdefault(group, set()).add(index)
            slot_costs[index] = count_text(group.template.slot(line.text) or "") + 1
    shared_costs = {group: count_text(group.template.render([""])) + 1 for group in members}

    def group_cost(group: _Group) -> int:
        kept = members[group]
        if len(kept) < 2:
            return sum(costs[index] for index in kept)
        return shared_costs[group] + sum(slot_costs[index] for index in kept)

    # A day heading is paid for while any line under it is kept.
    days: dict[tuple[str, str], int] = {}
    for line in lines:
        if line.day:
            days[line.section, line.day] = days.get((line.section, line.day), 0) + 1
    heading_cost = count_text("2026-01-01:") + 1
    total = (
        sum(cost for index, cost in enumerate(costs) if index not in slot_costs)
        + sum(group_cost(group) for group in members)
        + count_text(stats)
        + 4 * len(SECTIONS)
        + heading_cost * len(days)
    )
    dropped: set[int] = set()
    for index in eviction:
        if total <= max_tokens:
            break
        dropped.add(index)
        line = lines[index]
        group = groups.get(line)
        if group is None:
            total -= costs[index]
        else:
            before = group_cost(group)
            members[group].discard(index)
            total -= before - group_cost(group)
        if line.day:
            days[line.section, line.day] -= 1
            if not days[line.section, line.day]:
                total -= heading_cost
    kept = [line for i, line in enumerate(lines) if i not in dropped]
    text = _render(kept, stats, groups)
    if dropped and count_text(text) <= max_tokens:
        # Per-line costs over-count the joined text (a line's newline often joins
        # its first token): the last lines dropped that still fit are taken back,
        # the fewest to drop found by bisection (the budget was ~6 % unused).
        def fits(count: int) -> bool:
            gone = set(eviction[:count])
            kept = [x for i, x in enumerate(lines) if i not in gone]
            return count_text(_render(kept, stats, groups)) <= max_tokens

        low, high = 0, len(dropped)
        while low < high:
            middle = (low + high) // 2
            if fits(middle):
                high = middle
            else:
                low = middle + 1
        dropped = set(eviction[:high])
        kept = [line for i, line in enumerate(lines) if i not in dropped]
        text = _render(kept, stats, groups)
    remaining = [i for i in eviction if i not in dropped]
    # Per-line costs only estimate the joined text: verify, dropping more.
    while count_text(text) > max_tokens and (remaining or stats):
        if remaining:
            dropped.add(remaining.pop(0))
        else:
            stats = ""
        kept = [line for i, line in enumerate(lines) if i not in dropped]
        text = _render(kept, stats, groups)
    if kept and count_text(text) <= max_tokens:
        return text
    return _clip(lines[eviction[-1]].render(), max_tokens, count_text)


def _clip(line: str, max_tokens: int, count_text: CountText) -> str:
    """Under a tiny budget: as much of the single best line as fits."""
    low, high = 0, len(line)
    while low < high:
        middle = (low + high + 1) // 2
        if count_text(sanitize_summary(line[:middle] + "…")) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    return sanitize_summary(line[:low] + "…") if low else ""
