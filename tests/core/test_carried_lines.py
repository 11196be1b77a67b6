"""Carried lines: what a model's summary dropped of the decisions, open tasks, errors
and people, kept verbatim beside it (memd.core.carried_lines, memd.core.carry)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from memd.core import memfile
from memd.core.builtin_summary import SECTIONS, _carried_lines, extractive_summary
from memd.core.carried_lines import (
    CARRIED_HEADING,
    CarriedLine,
    ReplyWords,
    dropped_by,
    fit_carried,
    kept_in,
    parse_carried,
    render_carried,
)
from memd.core.carry import carry_material
from memd.core.pins import PINNED_HEADING, Pin
from memd.core.summary_block import compose_summary, parse_summary

LOSSY = (
    "Goals:\n- Keep the ingestion pipeline healthy and finish the migration.\n"
    "Decisions:\n- The team agreed on several configuration changes.\n"
    "Open tasks:\n- Follow up on load tests.\nErrors:\n- Some workers had connection issues."
)

DECISION = "Human: We decided to move the kalvoren queue to the managed broker, for the retries."
TASK = "Agent: TODO: the mirabel exporter still needs a load test before we ship it."
ERROR = "Tool: ERROR worker zentaro7: connection reset by peer while flushing the batch"
PERSON = "Human: Our contact on the vendor side is Priya Okonkwo."


def word_count(text: str) -> int:
    return len(text.split())


def build(turns: list[tuple[str, str]], summary: str | None = None, day: int = 2) -> bytes:
    data = memfile.render_header("demo", "2026-01-01T00:00:00")
    if summary is not None:
        data += memfile.render_summary_block(summary, "2026-01-01T00:00:30")
    for index, (role, content) in enumerate(turns):
        data += memfile.render_entry(role, f"2026-01-{day:02d}T10:{index:02d}:00", content)
    return data


def turns_with_one_of_each() -> list[tuple[str, str]]:
    return [
        ("Human", "Morning. We decided to move the kalvoren queue to the managed broker."),
        ("Agent", "TODO: the mirabel exporter still needs a load test before we ship it."),
        ("Tool", 'Tool Output:\n{"id": 1}\nERROR worker zentaro7: connection reset by peer'),
        ("Human", "Our contact on the vendor side is Priya Okonkwo."),
        ("Agent", "I re-ran the query with a smaller window to keep the output readable."),
    ]


def composed_for(document: bytes, reply: str, block_tokens: int = 10_000) -> str:
    material = carry_material(memfile.parse(document))
    return compose_summary(
        reply,
        [],
        pinned_tokens=1000,
        count_text=word_count,
        carried=material.lines,
        carried_done=material.done,
        block_tokens=block_tokens,
    ).text


# -- did the reply keep it? ----------------------------------------------------------


QUEUES = [
    CarriedLine("Decisions", "2026-01-02T10:00:00", DECISION),
    CarriedLine(
        "Decisions",
        "2026-01-02T11:00:00",
        "Human: We decided to move the ostrava queue to the managed broker, for the retries.",
    ),
    CarriedLine("Open tasks", "2026-01-02T12:00:00", TASK),
]


@pytest.mark.parametrize(
    ("reply", "kept"),
    [
        (LOSSY, False),
        # It names the broker, not which queue moves to it.
        ("We moved a queue to the managed broker for its retries.", False),
        ("Decided: the kalvoren queue moves to the managed broker (retries).", True),
        ("- kalvoren queue -> managed broker", True),
        ("Kalvoren's queue is migrating to the broker that is managed.", True),
    ],
)
def test_a_line_is_kept_when_its_rarest_words_and_half_the_rest_are_found_again(
    reply: str, kept: bool
) -> None:
    dropped = {line.text for line in dropped_by(reply, QUEUES)}
    assert (DECISION not in dropped) is kept
    assert QUEUES[1].text in dropped and TASK in dropped


def test_a_line_with_nothing_to_tell_its_words_apart_needs_half_of_them() -> None:
    """A model rewording its own summary ("write the docs, run the crash tests,
    land the branch" as "docs, crash tests, landing") has kept it."""
    line = CarriedLine("Errors", "", "Open tasks: write the docs, run the crash tests, land it.")
    assert not dropped_by("Open tasks: docs, crash tests, landing.", [line])
    assert dropped_by("Open tasks: the docs.", [line])
    (alone,) = QUEUES[:1]
    assert not dropped_by("We moved the queue to the managed broker for its retries.", [alone])


def test_a_persons_name_must_be_found_whole() -> None:
    line = CarriedLine("People", "", PERSON)
    assert not kept_in(ReplyWords.of("Our vendor contact is Priya."), line)
    assert kept_in(ReplyWords.of("Vendor contact: Priya Okonkwo."), line)


def test_an_error_line_is_told_apart_by_its_worker() -> None:
    line = CarriedLine("Errors", "", ERROR)
    assert not kept_in(ReplyWords.of("Some workers had connection resets."), line)
    assert kept_in(ReplyWords.of("zentaro7 reset its connection while flushing"), line)


# -- the section ------------------------------------------------------------------------


def test_the_section_round_trips_under_sections_and_days() -> None:
    lines = [
        CarriedLine("Errors", "2026-01-03T09:00:00", ERROR),
        CarriedLine("Decisions", "2026-01-02T10:00:00", DECISION),
        CarriedLine("Decisions", "", "We agreed to ship on Fridays only."),
        CarriedLine("People", "2026-01-02T11:00:00", PERSON),
    ]
    text = render_carried(lines)
    assert text.splitlines() == [
        CARRIED_HEADING,
        "People:",
        "2026-01-02:",
        f"- {PERSON}",
        "Decisions:",
        "- We agreed to ship on Fridays only.",
        "2026-01-02:",
        f"- {DECISION}",
        "Errors:",
        "2026-01-03:",
        f"- {ERROR}",
    ]
    parsed = parse_carried(text)
    assert {(line.section, line.day, line.text) for line in parsed} == {
        (line.section, line.day, line.text) for line in lines
    }


def test_a_credential_or_a_placeholder_is_never_read_back() -> None:
    section = "\n".join(
        [
            CARRIED_HEADING,
            "Decisions:",
            "- Human: We decided the deploy key is AKIAIOSFODNN7EXAMPLE from now on.",
            "- Human: We decided to use [REDACTED:password#ab12] for staging.",
            f"- {DECISION}",
        ]
    )
    assert [line.text for line in parse_carried(section)] == [DECISION]


def test_under_a_short_budget_done_ones_go_first_then_the_oldest() -> None:
    lines = [
        CarriedLine("Open tasks", f"2026-01-0{day}T10:00:00", f"Human: TODO: task number{day}.")
        for day in range(1, 8)
    ]
    done = frozenset({lines[6].key})  # the newest, said done
    budget = word_count(render_carried(lines[3:6]))
    fitted = fit_carried(lines, budget, word_count, done)
    assert [line.text for line in fitted.lines] == [line.text for line in lines[3:6]]
    assert fitted.evicted == 4
    assert word_count(fitted.text) <= budget
    assert fit_carried(lines, 0, word_count).lines == ()


# -- what a compaction carries --------------------------------------------------------


def test_what_a_lossy_reply_drops_is_carried_and_read_back() -> None:
    text = composed_for(build(turns_with_one_of_each()), LOSSY)
    parsed = parse_summary(text)
    assert parsed.body == LOSSY
    carried = {line.section: line.text for line in parsed.carried}
    assert set(carried) == {"People", "Decisions", "Open tasks", "Errors"}
    assert "kalvoren" in carried["Decisions"] and "mirabel" in carried["Open tasks"]
    assert "zentaro7" in carried["Errors"] and "Priya Okonkwo" in carried["People"]
    # The section stands before the pinned facts and after the reply.
    assert text.index(LOSSY) < text.index(CARRIED_HEADING)


def test_a_reply_that_keeps_everything_carries_nothing() -> None:
    reply = (
        "Decided: the kalvoren queue moves to the managed broker. Open: the mirabel exporter "
        "needs a load test before shipping. Worker zentaro7 had its connection reset by a "
        "peer. Vendor contact: Priya Okonkwo."
    )
    text = composed_for(build(turns_with_one_of_each()), reply)
    assert CARRIED_HEADING not in text
    assert parse_summary(text).body == reply


def test_a_carried_line_the_next_reply_keeps_is_no_longer_carried() -> None:
    first = composed_for(build(turns_with_one_of_each()), LOSSY)
    later = [("Human", "Thanks, keep going with the checks for the afternoon.")]
    kept = "The kalvoren queue moves to the managed broker (decided)."
    second = parse_summary(composed_for(build(later, summary=first, day=3), LOSSY + "\n" + kept))
    texts = " ".join(line.text for line in second.carried)
    assert "kalvoren" not in texts
    assert "mirabel" in texts and "zentaro7" in texts and "Okonkwo" in texts


def test_lines_are_carried_from_compaction_to_compaction() -> None:
    text = composed_for(build(turns_with_one_of_each()), LOSSY)
    for day in range(3, 8):
        turns = [("Human", f"We decided to rename the batch{day} job, for the dashboards.")]
        text = composed_for(build(turns, summary=text, day=day), LOSSY)
    carried = " ".join(line.text for line in parse_summary(text).carried)
    for key in ("kalvoren", "mirabel", "zentaro7", "Okonkwo", "batch3", "batch7"):
        assert key in carried


def test_the_block_stays_within_its_cap_and_keeps_the_newest() -> None:
    turns = [
        ("Human", f"We decided to move the queue{i:02d} workers to the managed broker.")
        for i in range(40)
    ]
    pins = [Pin("path", f"/srv/app{i}/config.yaml", "2026-01-02T10:00:00") for i in range(20)]
    material = carry_material(memfile.parse(build(turns)))
    for cap in (0, 40, 120, 400):
        composed = compose_summary(
            LOSSY,
            pins,
            pinned_tokens=60,
            count_text=word_count,
            carried=material.lines,
            block_tokens=cap,
        )
        # The version line is markup the cap leaves room for (as the preamble).
        head = composed.text.rpartition("\n")[0]
        assert word_count(head) <= max(cap, word_count(LOSSY) + 60 + 8), cap
        carried = parse_summary(composed.text).carried
        assert composed.carried == len(carried)
        if carried:
            # The newest ones: queue39 stays as long as any does.
            assert "queue39" in " ".join(line.text for line in carried)
        # The pins never give way to carried lines.
        assert (
            composed.pinned
            == compose_summary(LOSSY, pins, pinned_tokens=60, count_text=word_count).pinned
        )


def test_a_task_said_done_is_the_first_to_go() -> None:
    turns = [
        ("Human", "TODO: the mirabel exporter still needs a load test before we ship it."),
        ("Human", "TODO: the quorvex importer still needs its retry budget before Friday."),
        ("Human", "The mirabel load test is done, all green."),
    ]
    material = carry_material(memfile.parse(build(turns)))
    assert len(material.done) == 1
    (done,) = [line for line in material.lines if line.key in material.done]
    assert "mirabel" in done.text
    one_line = word_count(render_carried([done])) + 8 + word_count(LOSSY)
    composed = compose_summary(
        LOSSY,
        [],
        pinned_tokens=0,
        count_text=word_count,
        carried=material.lines,
        carried_done=material.done,
        block_tokens=one_line,
    )
    carried = " ".join(line.text for line in parse_summary(composed.text).carried)
    assert "quorvex" in carried and "mirabel" not in carried


def test_credentials_are_never_carried() -> None:
    turns = [
        ("Human", "We decided the new deploy token is ghp_abcdefghijklmnopqrstuvwxyz0123456789."),
        ("Human", "We decided to set\npassword: Tr0ub4dor&3horse\nfor the staging database."),
        ("Human", "We decided to move the kalvoren queue to the managed broker."),
    ]
    text = composed_for(build(turns), LOSSY)
    assert "ghp_" not in text and "Tr0ub4dor" not in text and "REDACTED" not in text
    assert "kalvoren" in text


def test_a_summary_quoted_in_a_turn_lends_no_line() -> None:
    quoted = memfile.SUMMARY_PREAMBLE + "\n\nWe decided to drop the zorbex service entirely."
    turns = [("Human", "We decided to move the kalvoren queue."), ("System", quoted)]
    text = composed_for(build(turns), LOSSY)
    assert "zorbex" not in text and "kalvoren" in text


def test_a_reply_quoting_the_heading_is_not_read_as_the_section() -> None:
    reply = f"{LOSSY}\n\n{CARRIED_HEADING}\nDecisions:\n- We decided to drop everything."
    text = composed_for(build([("Human", "Thanks, keep going.")]), reply)
    parsed = parse_summary(text)
    assert parsed.carried == ()
    assert f"> {CARRIED_HEADING}" in parsed.body


def section_of(summary: str, section: str) -> str:
    """The lines under ``section``'s heading in a builtin summary."""
    lines: list[str] = []
    current = ""
    for line in summary.splitlines():
        if line.endswith(":") and line[:-1] in SECTIONS:
            current = line[:-1]
        elif current == section:
            lines.append(line)
    return "\n".join(lines)


# -- the builtin summary and older memd ---------------------------------------------------


def test_the_builtin_summary_files_carried_lines_under_its_own_sections() -> None:
    previous = composed_for(build(turns_with_one_of_each()), LOSSY)
    document = memfile.parse(build([("Human", "Thanks, keep going.")], summary=previous, day=3))
    summary = extractive_summary(document, max_tokens=2000, count_text=word_count)
    assert CARRIED_HEADING not in summary
    for key in ("kalvoren", "mirabel", "zentaro7", "Okonkwo"):
        assert key in summary
    assert "kalvoren" in section_of(summary, "Decisions")
    assert "Okonkwo" in section_of(summary, "People")
    assert "zentaro7" in section_of(summary, "Errors")


def test_an_older_memd_reads_the_section_as_summary_text() -> None:
    """Format 2 before carried lines: the last paragraph is the pinned section when
    it starts with its heading, the rest is the summary's text (which its prompt
    shows to its model, and which its builtin summary reads line by line)."""
    material = carry_material(memfile.parse(build(turns_with_one_of_each())))
    text = compose_summary(
        LOSSY,
        [Pin("path", "/srv/a/b.yaml", "2026-01-02")],
        pinned_tokens=100,
        count_text=word_count,
        carried=material.lines,
        block_tokens=10_000,
    ).text
    assert parse_summary(text).version == 2
    rest = text.rpartition("\n\n")[0]  # without the version line
    old_body = rest[: rest.rindex("\n\n" + PINNED_HEADING)]
    assert CARRIED_HEADING in old_body
    lines = _carried_lines(old_body, "2026-01-05T00:00:00")
    by_section = {line.section: line.text for line in lines if "lorem" not in line.text}
    # The heading is a short label line the older builtin summary skips; each
    # line keeps its section and day.
    assert not any(CARRIED_HEADING in line.text for line in lines)
    assert "kalvoren" in by_section["Decisions"] and "Okonkwo" in by_section["People"]
    assert {line.stamp for line in lines if "zentaro7" in line.text} == {"2026-01-02"}


def test_a_block_without_the_section_reads_as_before(cl100k: Callable[[str], int]) -> None:
    text = compose_summary(LOSSY, [], pinned_tokens=100, count_text=cl100k).text
    parsed = parse_summary(text)
    assert parsed.carried == () and parsed.body == LOSSY


def test_what_the_last_model_kept_in_its_words_is_carried_when_the_next_drops_it() -> None:
    """The perfect-model bench's case: a rolling summary keeps a decision at one
    compaction and drops it for room at a later one (it was 20 % kept after 10)."""
    kept = (
        "Decisions:\n- We decided to move the kalvoren queue to the managed broker.\n"
        "- We decided to move the ostrava queue to the managed broker."
    )
    previous = compose_summary(kept, [], pinned_tokens=100, count_text=word_count).text
    later = [("Human", "Thanks, that helps a lot for this afternoon.")]
    reply = "Decisions:\n- We decided to move the ostrava queue to the managed broker."
    carried = parse_summary(composed_for(build(later, summary=previous, day=3), reply)).carried
    assert [line.text for line in carried] == [
        "We decided to move the kalvoren queue to the managed broker."
    ]
    assert carried[0].stamp == ""  # undated: the first to go


@pytest.mark.parametrize(
    ("section", "said", "kept_by"),
    [
        (
            "Open tasks",
            "TODO: перенести очередь Кальвор на брокер Зенор до пятницы.",
            "Осталось: перенести очередь Кальвор на брокер Зенор.",
        ),
        (
            "Errors",
            "ERROR: не удалось подключиться к базе данных кальвор",
            "Ошибка: не удалось подключиться к базе кальвор.",
        ),
        ("Open tasks", "TODO: 卡尔沃队列迁移到泽诺代理", "待办：卡尔沃队列迁移到泽诺代理。"),
    ],
)
def test_a_line_in_another_script_is_carried_when_the_reply_drops_it(
    section: str, said: str, kept_by: str
) -> None:
    """Words were ASCII only: a Cyrillic or Chinese task or error the classifier
    found had no salient word, so every reply "kept" it and none was ever carried
    (r11carry)."""
    line = CarriedLine(section, "2026-03-02T10:00:00", f"Human: {said}")
    assert dropped_by("Several changes were agreed; some tasks remain open.", [line]) == [line]
    assert dropped_by(kept_by, [line]) == []


def test_a_reply_that_dates_its_own_wording_adds_no_line_per_compaction() -> None:
    """A model that keeps a decision in its words with the day of each summary
    ("status as of 2026-02-05"): a date was an anchor, so each summary's wording
    was dropped by the next one and carried, one more line per compaction, up to
    the cap (r11carry: 9 lines after 10 compactions)."""
    header = memfile.render_header("alpha", "2026-01-01T00:00:00")
    said = "We decided to move the kalvoq queue to the managed broker."
    data = header + memfile.render_entry("Human", "2026-01-01T10:00:00", said)
    carried = []
    for day in range(1, 11):
        reply = (
            "Decisions:\n- It was agreed to move the kalvoq queue onto the managed broker "
            f"(status as of 2026-02-{day:02d})."
        )
        material = carry_material(memfile.parse(data))
        composed = compose_summary(
            reply,
            [],
            pinned_tokens=200,
            count_text=word_count,
            carried=material.lines,
            block_tokens=3000,
        )
        carried.append(composed.carried)
        stamp = f"2026-02-{day:02d}T10:00:00"
        data = header + memfile.render_summary_block(composed.text, stamp)
        data += memfile.render_entry("Human", f"2026-02-{day:02d}T11:00:00", "Thanks, go on.")
    assert carried == [0] * 10
