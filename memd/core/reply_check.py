"""Whether a model's reply is a summary of what it was sent (pure): the checks
beside the length floor (:func:`memd.core.summary_plan.degenerate_floor`).

A reply long enough can still summarize nothing (review r9summary):

- **it carries none of the material** (F3): a refusal ("I'm sorry, but I can't
  help with summarizing this conversation …"), or the section template with
  ``- none`` under every label. A summary, however short or vague, names some
  of what it summarizes: its words. The measure is the distinct words of the
  reply that are also words of the material sent (the summary so far and the
  turns), not words of memd's prompt (section labels, "summary", "none") nor
  common English. Fewer than :data:`MIN_CARRIED_WORDS` (fewer still when the
  material itself has few words), and the reply is refused. A refusal that
  names a word or two of the topic ("… summarizing this migration plan") is
  still caught by its shape: it opens with a refusal and has no section label.
- **it echoes the prompt** (F4): a broken proxy or chat template that answers
  with the request's messages. Memd's instructions to the model would become
  the agent's memory. Lines of the prompt that the reply repeats, and that the
  material does not hold itself (an agent working on memd may quote them), count;
  :data:`MAX_ECHOED_LINES` or more and the reply is refused.

Both apply only where the material is big enough for the length floor to bind
(:data:`MIN_JUDGED_TOKENS`): a short input may have a short, plain summary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from memd.core.prompts import SUMMARY_SECTIONS

MIN_JUDGED_TOKENS: Final = 512
MIN_CARRIED_WORDS: Final = 3
MAX_ECHOED_LINES: Final = 2
# A prompt line counts as echoed only if it is this long (a label is not).
_MIN_ECHO_LINE_CHARS: Final = 32

# Words: runs of letters/digits, joined by the marks identifiers use
# (paths, versions, hosts, ticket ids). Short words say little.
_WORD_RE: Final = re.compile(r"\w(?:[\w./:@#-]*\w)?")
_MIN_WORD_CHARS: Final = 4
# Han, kana, Hangul syllables and CJK compatibility ideographs.
_UNSPACED_RE: Final = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
)
# Common English of four letters or more: it names nothing of the material.
_COMMON_WORDS: Final = """
    about above after again against also although always among another anything
    appear appears around back because been before being below between both cannot
    could does doing done down during each either else enough even ever every
    from further have having help here however instead into itself just know like
    make made many more most much must need never none nothing once only other
    otherwise over please rather really same seem shall should since some something
    still such sure than thank thanks that their them then there these they thing
    things this those though through under unless until upon very want well were
    what whatever when where whether which while will with within without would
    your yours sorry unable happy able
"""
_COMMON: Final = frozenset(_COMMON_WORDS.split())
_REFUSAL_OPENING_RE: Final = re.compile(
    r"^\W*(?:i['’]?m sorry|i am sorry|sorry|i can['’]?t|i cannot|i can not|i won['’]?t|i will not|"
    r"i['’]?m unable|i am unable|i['’]?m not able|i am not able|as an ai)\b",
    re.IGNORECASE,
)
_LABEL_RE: Final = re.compile(
    r"(?im)^[ \t>*#]*(?:" + "|".join(re.escape(name) for name in SUMMARY_SECTIONS) + r")\**:"
)


def words(text: str) -> set[str]:
    """The distinct telling words of ``text``, lower-cased.

    Scripts written without spaces (Chinese, Japanese) have no words to split
    on: a run of them is one ``\\w`` match, a whole sentence, which a summary
    never repeats whole. Their pairs of characters count as words instead (a
    sound Chinese summary of Chinese turns was refused as naming none)."""
    found: set[str] = set()
    for run in _UNSPACED_RE.findall(text):
        found.update(run[i : i + 2] for i in range(len(run) - 1))
    for word in _WORD_RE.findall(_UNSPACED_RE.sub(" ", text.lower())):
        if len(word) >= _MIN_WORD_CHARS and word not in _COMMON:
            found.add(word)
    return found


def _prompt_lines(prompt: Iterable[str]) -> list[str]:
    lines: list[str] = []
    for text in prompt:
        for raw in text.split("\n"):
            line = raw.strip()
            if len(line) >= _MIN_ECHO_LINE_CHARS:
                lines.append(line)
    return lines


def reply_fault(
    reply: str, material: str, prompt: Iterable[str], *, material_tokens: int
) -> str | None:
    """Why ``reply`` is no summary of ``material`` (what the model was sent to
    summarize: the summary so far and the turns), or None when it may be one.

    ``prompt`` is memd's own text in the request (the system prompt and the user
    message's framing lines): its words are no material, its lines no summary.
    """
    if material_tokens < MIN_JUDGED_TOKENS:
        return None
    prompt = list(prompt)
    echoed = [line for line in _prompt_lines(prompt) if line in reply and line not in material]
    if len(echoed) >= MAX_ECHOED_LINES:
        return f"it repeats memd's prompt ({len(echoed)} of its lines), not a summary"
    own = set().union(*(words(text) for text in prompt)) if prompt else set()
    offered = words(material) - own
    carried = (words(reply) - own) & offered
    needed = min(MIN_CARRIED_WORDS, max(1, len(offered) // 20))
    if len(carried) < needed:
        return (
            f"it names {len(carried)} of the {len(offered)} words it was sent to summarize "
            "(a refusal, or sections left empty), not a summary"
        )
    opening = next((line for line in reply.split("\n") if line.strip()), "")
    if _REFUSAL_OPENING_RE.match(opening) and not _LABEL_RE.search(reply):
        return "it opens with a refusal and has none of the summary's sections"
    return None
