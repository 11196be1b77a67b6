from __future__ import annotations

from memd.core.line_groups import (
    Template,
    expand_groups,
    expand_line,
    template_of,
    written_alone,
)


def test_lines_that_differ_in_a_few_words_share_a_template() -> None:
    first = "Tool Executor: ERROR worker w12: connection reset by peer while flushing the batch"
    second = "Tool Executor: ERROR worker w7: connection reset by peer while flushing the batch"
    template = template_of(first, second)
    assert template == Template(
        "Tool Executor: ERROR worker ", ": connection reset by peer while flushing the batch"
    )
    assert template.slot(first) == "w12" and template.slot(second) == "w7"
    line = template.render(["w12", "w7"])
    assert line == (
        "Tool Executor: ERROR worker {w12 | w7}: connection reset by peer while flushing the batch"
    )
    assert expand_line(line) == [first, second]


def test_a_word_a_path_or_a_command_is_never_cut() -> None:
    # The shared text ends and starts between words, and never inside a code span.
    paths = template_of(
        "Human: The config lives at /srv/a1/conf/p-1.yaml, not the copy under /tmp.",
        "Human: The config lives at /srv/b2/conf/p-7.yaml, not the copy under /tmp.",
    )
    assert paths == Template("Human: The config lives at ", ", not the copy under /tmp.")
    codes = template_of(
        "Human: We decided to move the caliskdrem80 queue to the managed broker.",
        "Human: We decided to move the calmelvok51 queue to the managed broker.",
    )
    assert codes == Template("Human: We decided to move the ", " queue to the managed broker.")
    command = template_of(
        "Agent: To rebuild the index, run `make reindex-a SHARD=4` from the repo root.",
        "Agent: To rebuild the index, run `make reindex-b SHARD=4` from the repo root.",
    )
    assert command == Template("Agent: To rebuild the index, run ", " from the repo root.")


def test_lines_that_differ_in_more_than_a_few_words_are_not_one() -> None:
    assert template_of("Human: We moved it.", "Human: We did it.") is None  # too little shared
    assert (
        template_of(
            "Agent: The build passed on the second try after pinning the parser.",
            "Agent: The deploy of the billing service to the eu-west cluster failed twice.",
        )
        is None
    )
    assert template_of("Human: the same line here", "Human: the same line here") is None
    # Another speaker: the differing words are not one span.
    assert (
        template_of(
            "Human: We decided to move the a1 queue to the managed broker.",
            "Agent: We decided to move the b2 queue to the managed broker.",
        )
        is None
    )


def test_text_without_one_group_reads_as_written() -> None:
    assert expand_line("- Human: use {a | b} or {c | d} here") == [
        "- Human: use {a | b} or {c | d} here"
    ]
    assert expand_line("- Agent: the JSON was {}") == ["- Agent: the JSON was {}"]
    assert expand_groups("Decisions:\n- Human: keep {x | y} now\nFacts:") == (
        "Decisions:\n- Human: keep x now\n- Human: keep y now\nFacts:"
    )


def test_a_template_widens_over_what_it_would_cut() -> None:
    first = "Human: Our contact on the vendor side is Ilse Brivim."
    second = "Human: Our contact on the vendor side is Ilse Zelquin."
    template = template_of(first, second)
    assert template == Template("Human: Our contact on the vendor side is Ilse ", ".")
    wider = template.widened(first, ["Ilse Brivim"])
    assert wider == Template("Human: Our contact on the vendor side is ", ".")
    assert wider.slot(second) == "Ilse Zelquin" and not wider.cuts(first, ["Ilse Brivim"])
    assert template.cuts(first, ["Ilse Brivim"])


def test_braces_and_bars_quoted_from_a_transcript_are_read_as_they_were() -> None:
    # Only a group a template could have written reads back as several lines: its
    # words without spaces inside the braces, a few each, outside code and quotes.
    for line in (
        "- Human: We settled on type Shape = { kind: circle | square } for the API.",
        "- Agent: The reply type is `{ok | error}` in the client, see `api.ts`.",
        '- Human: Set mode to "{fast | safe}" in the config.',
        "- Human: Pick {the first of the many options here | the second one} later.",
    ):
        assert expand_line(line) == [line]
        assert expand_groups(line) == line
    assert expand_line("- Agent: worker {w12 | w7} failed.") == [
        "- Agent: worker w12 failed.",
        "- Agent: worker w7 failed.",
    ]


def test_a_line_with_braces_of_its_own_is_written_to_read_back_as_itself() -> None:
    said = "- Agent: Use {dev | prod} profile for tenant t28."
    assert written_alone(said) == "- Agent: Use {dev|prod} profile for tenant t28."
    assert expand_line(written_alone(said)) == [written_alone(said)]
    for line in ("- Human: keep {x | y} and {a | b}", '- Human: "use {a | b} here"', "- a {} b"):
        assert written_alone(line) == line  # read back as itself already
