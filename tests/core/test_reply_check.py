"""memd.core.reply_check: a reply long enough that still summarizes nothing (review r9summary)."""

from __future__ import annotations

from memd.core.prompts import rolling_user_prompt, system_prompt
from memd.core.reply_check import reply_fault

PROMPT = (system_prompt(1_500), rolling_user_prompt("", [], 1, 1))
MATERIAL = "\n\n".join(
    f"> Human: The release v2.14.3 ships on 2026-12-18 after ticket OPS-4411 closes. "
    f"Alice prefers bullet points. turn {i}: we talked about the migration plan and its "
    f"risks, step {i}."
    for i in range(30)
)
REFUSAL = (
    "I'm sorry, but I can't help with summarizing this conversation. It appears to contain "
    "internal infrastructure details and personal preferences of individuals, and reproducing "
    "them could violate privacy and security policies. If you have a different request, such "
    "as general advice on how to write good summaries, I'd be happy to help with that instead."
)
TEMPLATE = "\n".join(
    f"{s}:\n- none"
    for s in ("Goal", "Decisions", "Facts", "Preferences", "Open tasks", "Errors and fixes")
)


def fault(reply: str, material: str = MATERIAL, tokens: int = 2_000) -> str | None:
    return reply_fault(reply, material, PROMPT, material_tokens=tokens)


def test_a_refusal_and_the_empty_template_are_no_summary() -> None:
    assert fault(REFUSAL) is not None and "names 0" in str(fault(REFUSAL))
    assert fault(TEMPLATE) is not None
    # A refusal naming a word or two of the topic is known by its shape.
    topical = "I'm sorry, but I cannot summarize this migration plan or its risks for you."
    assert "refusal" in str(fault(topical))


def test_a_short_or_vague_summary_is_one() -> None:
    short = "Goal:\n- ship v2.14.3 on 2026-12-18 once OPS-4411 closes\nFacts:\n- Alice: bullets"
    assert fault(short) is None
    vague = "The team talked about the migration plan and its risks, step by step."
    assert fault(vague) is None
    # A real summary may open with an apology when it has its sections.
    assert fault("Sorry for the long log.\nGoal:\n- the migration plan, its risks") is None


CHINESE = "\n\n".join(
    f"> Human: 我们决定把数据库迁移到新的服务器上，下周三之前完成。请记得备份所有的表格。第{i}步。\n"
    "> AI: 好的，我会在迁移之前备份所有表格，并且检查磁盘空间是否足够。"
    for i in range(30)
)


def test_a_summary_in_a_script_without_spaces_names_the_material() -> None:
    # Chinese has no spaces: a whole sentence was one "word", never repeated by a
    # summary, and a sound summary was refused as naming none.
    summary = "Goal:\n- 把数据库迁移到新服务器，下周三前完成\nOpen tasks:\n- 备份所有表格"
    assert fault(summary, CHINESE) is None
    assert fault(TEMPLATE, CHINESE) is not None
    assert fault("抱歉，我无法帮助完成这个请求。", CHINESE) is not None


def test_a_reply_repeating_the_prompt_is_no_summary() -> None:
    echo = PROMPT[0] + "\n\n" + rolling_user_prompt("", [MATERIAL], 1, 1)
    assert "prompt" in str(fault(echo))
    # Lines of the prompt the material holds itself (an agent working on memd) are
    # no echo: a summary may quote them.
    quoted = "> Human: memd's prompt reads:\n" + PROMPT[0]
    assert fault(PROMPT[0] + "\nGoal:\n- the migration plan", MATERIAL + quoted) is None


def test_a_short_input_may_have_any_short_summary() -> None:
    assert fault(TEMPLATE, "> Human: hi", tokens=10) is None
    assert fault(REFUSAL, "> Human: hi", tokens=10) is None


def test_a_refusal_with_a_typographic_apostrophe_is_one() -> None:
    topical = "I\u2019m sorry, but I can\u2019t summarize this migration plan or its risks."
    assert "refusal" in str(fault(topical))
