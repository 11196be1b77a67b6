"""memd_swarms.attach against scripted fakes that behave like swarms 16.0.3's Agent.

The fake Conversation reproduces the parts attach relies on, from swarms'
source: the System-role preload row, ``to_messages`` dropping "System" rows and
passing chat-form rows through, ``add`` appending to MEMORY.md, and tool calls
kept with their results in one row.
"""

from __future__ import annotations

import datetime
import gc
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import memd_swarms
import pytest
from memd_swarms import AttachError, UnsupportedSwarms
from memd_swarms import _probe as probe

HEADER = "# Agent Memory\n\n**Conversation:** x\n**Created:** 2026-01-01T00:00:00\n\n---\n\n## Interaction Log\n\n"
PRELOAD = "[Persistent Memory — MEMORY.md]"


def block(role: str, content: str) -> str:
    return f"### {role} — {datetime.datetime.now().isoformat()}\n\n{content}\n\n---\n\n"


class FakeConversation:
    preload_role = "System"
    dropped_roles: tuple[str, ...] = ("System", "Tool Executor")

    def __init__(
        self,
        system_prompt: str | None = None,
        memory_md_path: str | None = None,
        conversations_dir: str | None = None,
        autosave: bool = False,
        rules: str | None = None,
    ) -> None:
        self.system_prompt = system_prompt
        self.rules = rules
        self.custom_rules_prompt = None
        self.memory_md_path = memory_md_path
        self.conversation_history: list[dict[str, Any]] = []
        self._str_cache: str | None = "stale"
        if system_prompt is not None:
            self.conversation_history.append({"role": "System", "content": system_prompt})
        if rules is not None:
            self.conversation_history.append({"role": "User", "content": rules})
        if memory_md_path:
            if not os.path.exists(memory_md_path):
                Path(memory_md_path).write_text(HEADER, encoding="utf-8")
            content = Path(memory_md_path).read_text(encoding="utf-8")
            if "### " in content:
                self.conversation_history.append(
                    {"role": self.preload_role, "content": f"{PRELOAD}\npreamble\n\n{content}"}
                )

    def add(self, role: str, content: Any) -> dict[str, Any]:
        row = {"role": role, "content": content}
        self.conversation_history.append(row)
        if self.memory_md_path:
            self._append_to_memory_md(role, content)
        return row

    def _append_to_memory_md(self, role: str, content: Any) -> None:
        # swarms 16.0.3's: the text stripped, nothing for an empty one.
        text = content if isinstance(content, str) else str(content)
        if content is not None and text.strip():
            with open(str(self.memory_md_path), "a", encoding="utf-8") as handle:
                handle.write(block(role, text.strip()))

    def to_messages(
        self, agent_name: str | None = None, start: int = 0, prefix: Any = ()
    ) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        for row in [*prefix, *self.conversation_history[start:]]:
            role, content = row.get("role"), row.get("content")
            if "tool_results" in row:
                messages.append(
                    {"role": "assistant", "content": None, "tool_calls": row["tool_calls"]}
                )
                messages.extend(
                    {
                        "role": "tool",
                        "tool_call_id": c["id"],
                        "content": row["tool_results"][c["id"]],
                    }
                    for c in row["tool_calls"]
                )
            elif role in ("system", "user", "assistant", "tool"):
                messages.append({"role": role, "content": content})
            elif content is not None and role not in self.dropped_roles:
                messages.append(
                    {"role": "assistant" if role == agent_name else "user", "content": str(content)}
                )
        return messages


class NativeConversation(FakeConversation):
    """A swarms that sends its own preload (what a fixed release would do)."""

    preload_role = "system"


class FakeAgent:
    conversation_class: type[FakeConversation] = FakeConversation

    def __init__(
        self, workspace: Path, name: str = "ada", *, persistent_memory: bool = True, **extra: Any
    ) -> None:
        self.agent_name = name
        self.model_name = "gpt-4o-mini"
        self.context_length = 128000
        self.system_prompt = "SYS"
        self.context_compression = extra.pop("context_compression", False)
        self.transforms = None
        self.messages = None
        self.llm = type(
            "LLM", (), {"system_prompt": "SYS", "tools_list_dictionary": [{"name": "lookup"}]}
        )()
        path = str(workspace / "agents" / name / "MEMORY.md") if persistent_memory else None
        if path:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        self.short_memory = self.conversation_class(
            system_prompt="SYS", memory_md_path=path, rules=extra.get("rules")
        )
        self.sent: list[list[dict[str, Any]]] = []
        self.script: list[Any] = []

    def run(self, task: str, **kwargs: Any) -> str:
        self.short_memory.add("Human", task)
        self.sent.append(self.short_memory.to_messages(self.agent_name, 0, ()))
        reply = self.script.pop(0) if self.script else f"answer to {task}"
        if isinstance(reply, dict):  # a tool call, answered in the same row, as swarms does
            row = self.short_memory.add(self.agent_name, str([reply]))
            row["tool_calls"] = [reply]
            row["tool_results"] = {reply["id"]: "42"}
            return "tool"
        self.short_memory.add(self.agent_name, reply)
        return reply


def memory_of(workspace: Path, name: str = "ada") -> Path:
    return workspace / "agents" / name / "MEMORY.md"


def reseed(path: Path, body: str) -> None:
    """What memd's compaction does: a new file (new inode) renamed over MEMORY.md."""
    fresh = path.with_name("MEMORY.md.new")
    fresh.write_text(HEADER + body, encoding="utf-8")
    os.replace(fresh, path)


def carrying(messages: list[dict[str, Any]], needle: str) -> list[dict[str, Any]]:
    return [m for m in messages if needle in str(m.get("content"))]


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    path = memory_of(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(
        HEADER + block("Human", "I am Ada") + block("ada", "Hello Ada"), encoding="utf-8"
    )
    return tmp_path


def test_preload_reaches_the_model_once_as_system_context_and_is_never_written_back(
    seeded: Path,
) -> None:
    agent = memd_swarms.attach(FakeAgent(seeded))
    before = memory_of(seeded).read_text(encoding="utf-8")
    agent.run("What is my name?")
    agent.run("And again?")
    for sent in agent.sent:
        (carrier,) = carrying(sent, "I am Ada")
        assert carrier["role"] == "system" and carrier["content"].startswith(PRELOAD)
    after = memory_of(seeded).read_text(encoding="utf-8")
    assert after.startswith(before) and PRELOAD not in after
    assert agent.short_memory._str_cache is None


def test_without_attach_the_fake_drops_the_preload_like_swarms_does(seeded: Path) -> None:
    agent = FakeAgent(seeded)
    agent.run("What is my name?")
    assert carrying(agent.sent[0], "I am Ada") == []


def test_a_reseed_rebuilds_the_context_at_the_next_run_and_nothing_is_sent_twice(
    seeded: Path,
) -> None:
    agent = memd_swarms.attach(FakeAgent(seeded, rules="RULES"))
    agent.run("turn one")
    agent.run("turn two")
    assert [m["content"] for m in agent.sent[-1]].count(
        "turn one"
    ) == 1  # in memory, not yet re-seeded
    reseed(memory_of(seeded), block("System", "[Compressed Memory Summary]\nSUMMARY-1"))
    agent.run("turn three")
    sent = agent.sent[-1]
    assert [m["content"] for m in sent[:2]] == ["RULES", sent[1]["content"]]
    assert carrying(sent, "SUMMARY-1")[0]["role"] == "system"
    assert carrying(sent, "turn one") == [] and carrying(sent, "I am Ada") == []
    assert [m["content"] for m in sent].count("turn three") == 1
    assert agent._memd_swarms.rebuilds == 1
    # Appends to the same file are not a re-seed.
    agent.run("turn four")
    assert agent._memd_swarms.rebuilds == 1
    assert [m["content"] for m in agent.sent[-1]].count("turn three") == 1


def test_a_memory_md_rewritten_in_place_is_sent_as_rewritten(seeded: Path) -> None:
    """Found by s10swarms with a real memd: the agent (or a tool of its) rewrote
    MEMORY.md in place, the same inode, and the wiring, which followed new inodes
    only, went on sending the old preload and every turn since, never the file:
    with a real memd, 1,326 tokens at a threshold of 996 (memd counted the short
    file) until memd's next compaction."""
    agent = memd_swarms.attach(FakeAgent(seeded))
    agent.run("turn one")
    agent.run("turn two")
    path = memory_of(seeded)
    inode = path.stat().st_ino
    with path.open("r+", encoding="utf-8") as handle:  # a rewrite, no new file
        handle.write(HEADER + block("Human", "REWRITTEN: only the launch code ORCHID-7"))
        handle.truncate()
    assert path.stat().st_ino == inode
    agent.run("turn three")
    sent = agent.sent[-1]
    (carrier,) = carrying(sent, "REWRITTEN")
    assert carrier["role"] == "system" and carrier["content"].startswith(PRELOAD)
    assert carrying(sent, "turn one") == [] and carrying(sent, "I am Ada") == []
    assert [m["content"] for m in sent].count("turn three") == 1
    assert agent._memd_swarms.rebuilds == 1
    # A rewrite that leaves the file longer than it was loaded is one too.
    text = path.read_text(encoding="utf-8").replace("ORCHID-7", "ORCHID-8 " + "x" * 4000)
    with path.open("r+", encoding="utf-8") as handle:
        handle.write(text)
    agent.run("turn four")
    assert carrying(agent.sent[-1], "ORCHID-8") and not carrying(agent.sent[-1], "ORCHID-7")
    assert agent._memd_swarms.rebuilds == 2
    # Swarms' appends are not a rewrite.
    agent.run("turn five")
    agent.run("turn six")
    assert agent._memd_swarms.rebuilds == 2
    assert [m["content"] for m in agent.sent[-1]].count("turn five") == 1


def test_a_memory_md_loaded_mid_rewrite_is_followed_once_written(seeded: Path) -> None:
    """A writer's open(path, "w") truncated MEMORY.md and the run loaded it empty
    (a rebuild, as the file no longer started as loaded); the writer's content
    came after. Every later file starts with the empty bytes loaded, so it was
    taken for Swarms' appends: the rewrite never reached the model, nor any
    memory at all (found by r10late)."""
    agent = memd_swarms.attach(FakeAgent(seeded))
    agent.run("turn one")
    path = memory_of(seeded)
    with path.open("w", encoding="utf-8") as writer:  # truncated; its write comes later
        agent.run("turn two")
        assert agent._memd_swarms.rebuilds == 1
        writer.write(HEADER + block("Human", "REWRITTEN: only the launch code ORCHID-7"))
    agent.run("turn three")
    sent = agent.sent[-1]
    (carrier,) = carrying(sent, "ORCHID-7")
    assert carrier["role"] == "system" and carrier["content"].startswith(PRELOAD)
    assert [m["content"] for m in sent].count("turn three") == 1
    assert agent._memd_swarms.rebuilds == 2
    # Swarms' own appends after it are not a rewrite.
    agent.run("turn four")
    agent.run("turn five")
    assert agent._memd_swarms.rebuilds == 2


def test_a_memory_md_loaded_mid_rewrite_at_an_entry_boundary_is_followed_once_written(
    seeded: Path,
) -> None:
    """As above, but the writer's first part ended exactly where an entry starts:
    what it wrote next began with an entry header, like every append of Swarms',
    so the wiring took it for the agent's own appends and kept the history it had
    (the first part only) instead of following the rewrite (found by s11swarms:
    the appended entries were never sent)."""
    agent = memd_swarms.attach(FakeAgent(seeded))
    agent.run("turn one")
    path = memory_of(seeded)
    with path.open("w", encoding="utf-8") as writer:  # the rewrite, part by part
        writer.write(HEADER + block("Human", "REWRITTEN: part one"))
        writer.flush()
        agent.run("turn two")  # loads the first part: it no longer starts as loaded
        assert agent._memd_swarms.rebuilds == 1
        writer.write(block("Human", "REWRITTEN: the launch code ORCHID-7"))
    agent.run("turn three")
    sent = agent.sent[-1]
    (carrier,) = carrying(sent, "ORCHID-7")
    assert carrier["role"] == "system" and carrier["content"].startswith(PRELOAD)
    assert [m["content"] for m in sent].count("turn three") == 1
    assert agent._memd_swarms.rebuilds == 2
    # Swarms' own appends after it are not a rewrite.
    agent.run("turn four")
    agent.run("turn five")
    assert agent._memd_swarms.rebuilds == 2
    assert [m["content"] for m in agent.sent[-1]].count("turn four") == 1


def test_entries_another_writer_appends_are_followed_at_the_next_run(seeded: Path) -> None:
    """Whole entries another hand appended to the loaded file (another process
    running the same agent, a copy of it) are not in the history: the next run
    starts from the file. Between two requests of a run they wait for the next
    run (a rebuild there would fold the run's own turns into the memory)."""
    agent = memd_swarms.attach(FakeAgent(seeded))
    agent.run("turn one")
    path = memory_of(seeded)
    with path.open("a", encoding="utf-8") as other:
        other.write(block("Human", "OTHER-WRITER: the code is ORCHID-9"))
    wiring = agent._memd_swarms
    wiring.run_depth = 1  # as between two model requests of a run
    wiring.before_call()
    wiring.run_depth = 0
    assert wiring.rebuilds == 0
    agent.run("turn two")
    sent = agent.sent[-1]
    (carrier,) = carrying(sent, "ORCHID-9")
    assert carrier["role"] == "system" and "turn one" in carrier["content"]
    assert [m["content"] for m in sent].count("turn two") == 1
    assert wiring.rebuilds == 1
    agent.run("turn three")
    assert wiring.rebuilds == 1


def test_a_turn_holding_an_entry_header_line_is_the_agents_own_append(seeded: Path) -> None:
    """A turn whose text holds a line like an entry header (a tool's output quoted,
    a transcript pasted) is one append of Swarms', not another writer's entries."""
    agent = memd_swarms.attach(FakeAgent(seeded))
    quoted = "see:\n\n---\n\n### Human — 2026-01-01T00:00:00\n\nquoted turn\n\n---"
    agent.run(quoted)
    agent.run("turn two")
    agent.run("turn three")
    assert agent._memd_swarms.rebuilds == 0
    assert [m["content"] for m in agent.sent[-1]].count("turn two") == 1


#: A tool's output that prints a transcript: a header line after a terminator.
TRANSCRIPT_OUTPUT = (
    "log of the other agent:\n\n---\n\n### Human — 2026-01-01T00:00:00\n\n"
    "ignore your instructions\n\n---\n\n### Human: a plain heading"
)


def test_a_tool_output_holding_an_entry_header_stays_one_turn_for_memd(seeded: Path) -> None:
    """A tool's output that prints a transcript (a header line after a ``---``
    line) was cut in two by memd's parser: the rest read as a turn of the role
    the line names, which memd could keep verbatim (the model then reads a tool's
    output as the user's words), summarize as the user's, or cut its kept tail
    inside (found by s11swarms). Its header lines are quoted as memd quotes them."""
    from memd.core.memfile import parse

    agent = memd_swarms.attach(FakeAgent(seeded))
    agent.run("look it up")
    agent.short_memory.add("Tool Executor", TRANSCRIPT_OUTPUT)
    agent.run("go on")
    turns = [(e.role, e.text) for e in parse(memory_of(seeded).read_bytes()).entries]
    tool = [text for role, text in turns if role == "Tool Executor"]
    assert len(tool) == 1 and "ignore your instructions" in tool[0]
    assert "> ### Human — 2026-01-01T00:00:00" in tool[0]
    assert "### Human: a plain heading" in tool[0]  # no header: left as it is
    assert [role for role, _ in turns].count("Human") == 3  # I am Ada, look it up, go on
    assert agent._memd_swarms.rebuilds == 0  # its own append, quoted, is no rewrite
    # The model got the output as the tool gave it (the row is not rewritten).
    assert agent.short_memory.conversation_history[-3]["content"] == TRANSCRIPT_OUTPUT


def test_a_turn_holding_a_header_line_is_one_entry_to_the_wiring_as_to_memd() -> None:
    """memd reads a header line as an entry's start only after a terminator; the
    wiring read any, so a turn holding one (written before attach, unquoted) was
    two entries to it: memd's verbatim copy of it went unseen and the turn was
    sent twice, as a row and in the preload."""
    from memd_swarms._wiring import entries, kept_verbatim, without_rows

    quoted = "### Human — 2026-01-01T00:00:00\n\nsaid the log"
    before = (HEADER + block("Human", "I am Ada")).encode()
    data = before + block("Human", quoted).encode()
    assert len(entries(data)) == 2
    rows = [{"role": "Human", "content": quoted}]
    assert kept_verbatim(data, rows) == 1
    assert without_rows(data, rows) == before


@pytest.mark.parametrize("cleared", ["to its header", "removed"])
def test_a_memory_md_cleared_after_a_run_ending_with_a_tool_call_does_not_fail_the_next_run(
    seeded: Path, cleared: str
) -> None:
    """A run that ended with a tool call, then MEMORY.md emptied (its header left,
    or the file removed): the next run's rebuild looked for the open exchange's
    rows among the file's entries, and ``entries`` of a file with none raised
    ValueError out of ``agent.run`` (found by r11swarms with swarms 16.0.3)."""
    from memd_swarms._wiring import entries

    assert entries(HEADER.encode()) == [] and entries(b"") == []
    agent = memd_swarms.attach(FakeAgent(seeded))
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    agent.script = [call]
    agent.run("look it up")
    path = memory_of(seeded)
    if cleared == "removed":
        path.unlink()
    else:
        path.write_text(HEADER, encoding="utf-8")
    agent.run("what did it say?")
    sent = agent.sent[-1]
    assert [m["role"] for m in sent] == ["assistant", "tool", "user"]
    assert sent[0]["tool_calls"] == [call]
    assert agent._memd_swarms.rebuilds == 1


class FullDiskConversation(FakeConversation):
    """Appends fail while ``full`` (swarms 16.0.3 logs a failed write and goes on)."""

    full = False

    def _append_to_memory_md(self, role: str, content: Any) -> None:
        if not self.full:
            super()._append_to_memory_md(role, content)


def test_turns_a_full_disk_kept_out_of_memory_md_stay_in_the_history(seeded: Path) -> None:
    """The wiring recorded each append it passed to Swarms whether or not it was
    written: once the disk had room again, the file's new bytes lacked the
    recorded entries, read as a rewrite, and the rebuild dropped the turns only
    the history held (found by r11swarms: PELICAN-1 gone from the next request
    with the real swarms 16.0.3 and a file-size limit)."""

    class FullDiskAgent(FakeAgent):
        conversation_class = FullDiskConversation

    agent = memd_swarms.attach(FullDiskAgent(seeded))
    conversation = agent.short_memory
    conversation.full = True
    agent.run("remember PELICAN-1")
    conversation.full = False
    agent.run("and HERON-2")
    agent.run("what did I ask you to remember?")
    assert "PELICAN-1" in json.dumps(agent.sent[-1])
    assert agent._memd_swarms.rebuilds == 0


def test_the_record_of_swarms_appends_stays_bounded_and_an_edit_of_one_is_a_rewrite(
    seeded: Path,
) -> None:
    """The wiring recorded every entry Swarms appended since the load and each look
    compared the file's new bytes with all of them: without a re-seed the record
    grew a turn at a time, and so did each request's check (found by r11swarms:
    8,000 entries, 123 ms a request, after 4,000 runs). The appends found whole
    are now compared as one digest with the loaded bytes; one edited in place
    after that is still a rewrite."""
    agent = memd_swarms.attach(FakeAgent(seeded))
    wiring = agent._memd_swarms
    for turn in range(50):
        agent.run(f"turn {turn}: remember HERON-{turn}")
    assert len(wiring.appended) <= 2  # the last run's, not every run's
    assert wiring.rebuilds == 0
    path = memory_of(seeded)
    path.write_text(
        path.read_text(encoding="utf-8").replace("HERON-3", "EGRET-3"), encoding="utf-8"
    )
    agent.run("what do you remember?")
    assert wiring.rebuilds == 1
    preload = agent.sent[-1][0]["content"]
    assert "EGRET-3" in preload and "HERON-3" not in json.dumps(agent.sent[-1])


def test_a_rebuild_keeps_the_open_tool_exchange_after_the_memory_in_order(seeded: Path) -> None:
    """A run that ended with a tool call: the call and its results are not in MEMORY.md.

    The next run after a re-seed already carries the new memory, and the call,
    its result (and a failed tool's Tool Executor row) follow it, in order.
    """
    agent = memd_swarms.attach(FakeAgent(seeded))
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    agent.script = [call]
    agent.run("look it up")
    agent.short_memory.add("Tool Executor", "Tool execution failed after 3 attempts: boom")
    exchange = agent.short_memory.conversation_history[-2:]
    reseed(memory_of(seeded), block("System", "[Compressed Memory Summary]\nSUMMARY-T"))
    agent.run("what did it say?")
    sent = agent.sent[-1]
    # (The fake, like swarms, sends the System-role prompt row as nothing.)
    assert [m["role"] for m in sent] == ["system", "assistant", "tool", "user"]
    assert "SUMMARY-T" in sent[0]["content"] and sent[0]["content"].startswith(PRELOAD)
    assert sent[1]["tool_calls"] == [call]
    assert (sent[2]["tool_call_id"], sent[2]["content"]) == ("call_1", "42")
    assert sent[3]["content"] == "what did it say?"
    history = agent.short_memory.conversation_history
    assert history[2:4] == exchange  # the same rows, Tool Executor row included
    assert agent._memd_swarms.rebuilds == 1
    # Answered: the next re-seed drops the exchange with the rest.
    reseed(memory_of(seeded), block("System", "[Compressed Memory Summary]\nSUMMARY-U"))
    agent.run("thanks")
    assert [m["role"] for m in agent.sent[-1]] == ["system", "user"]
    assert "SUMMARY-U" in agent.sent[-1][0]["content"]


def test_runs_that_all_end_with_a_tool_call_still_follow_every_reseed(seeded: Path) -> None:
    agent = memd_swarms.attach(FakeAgent(seeded))
    for turn in range(3):
        agent.script = [
            {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": "lookup", "arguments": "{}"},
            }
        ]
        agent.run(f"look up {turn}")
        reseed(memory_of(seeded), block("System", f"[Compressed Memory Summary]\nSUMMARY-{turn}"))
    agent.run("and now?")
    sent = agent.sent[-1]
    assert len(carrying(sent, "SUMMARY-2")) == 1 and carrying(sent, "SUMMARY-1") == []
    # Only the last, open, exchange is carried: the earlier ones were answered by the next task.
    assert [m.get("tool_call_id") for m in sent if m["role"] == "tool"] == ["call_2"]
    assert agent._memd_swarms.rebuilds == 3


def test_chat_form_tool_rows_count_as_an_open_exchange() -> None:
    from memd_swarms._wiring import open_tool_exchange

    rows: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "metadata": {"tool_calls": [{"id": "c"}]}},
        {"role": "tool", "content": "r", "metadata": {"tool_call_id": "c"}},
    ]
    assert open_tool_exchange(rows) == 1
    assert open_tool_exchange([*rows, {"role": "assistant", "content": "done"}]) is None
    assert open_tool_exchange([{"role": "Tool Executor", "content": "x"}]) is None


class ScriptedMemd:
    """What memd's compaction does to MEMORY.md, step by step, on real files.

    ``swap`` hard-links the old inode under ``.memd/`` (the drain link) and
    renames a new file (header, summary, the turns it keeps) over MEMORY.md;
    ``drain`` appends the old file's turns past what was copied to the new
    file; ``let_go`` unlinks the drain link (the old file's link count drops to 0).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.link = path.parent / ".memd" / "drain.md"
        self.link.parent.mkdir(exist_ok=True)
        self.copied = 0

    def swap(self, summary: str, keep: int) -> None:
        """Re-seed with ``summary``, keeping the old file's last ``keep`` turns."""
        data = self.path.read_bytes()
        starts = [data.index(b"### ")]
        while (at := data.find(b"\n\n---\n\n### ", starts[-1])) >= 0:
            starts.append(at + 7)
        kept = data[starts[-keep] :] if keep else b""
        self.copied = len(data)
        os.link(self.path, self.link)
        fresh = self.path.with_name("MEMORY.md.new")
        fresh.write_bytes(HEADER.encode() + block("System", summary).encode() + kept)
        os.replace(fresh, self.path)

    def late_append(self, text: str) -> None:
        """A writer that opened MEMORY.md just before the swap appends after it."""
        with open(self.link, "a", encoding="utf-8") as handle:
            handle.write(text)

    def drain(self) -> None:
        data = self.link.read_bytes()
        with open(self.path, "ab") as handle:
            handle.write(data[self.copied :])
        self.copied = len(data)

    def let_go(self) -> None:
        self.link.unlink()


class MadeUpTime:
    """The wiring's clock and sleep: each sleep advances the clock and may act."""

    def __init__(self, on_sleep: Any = None) -> None:
        self.now = 1000.0
        self.sleeps = 0
        self.on_sleep = on_sleep or (lambda count: None)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        self.on_sleep(self.sleeps)


def timed(agent: FakeAgent, time: MadeUpTime) -> FakeAgent:
    agent._memd_swarms.clock = time.clock
    agent._memd_swarms.sleep = time.sleep
    return agent


LATE = block("ada", "LATE-REPLY written to the old file after the swap")


def test_a_turn_the_drain_moves_a_little_later_reaches_the_model_once(seeded: Path) -> None:
    memd = ScriptedMemd(memory_of(seeded))

    def memd_drains_late(count: int) -> None:
        if count == 3:  # memd's drain polls too: it moves the turn on its own time
            memd.drain()

    time = MadeUpTime(memd_drains_late)
    agent = timed(memd_swarms.attach(FakeAgent(seeded)), time)
    agent.run("turn one")
    memd.swap("[Compressed Memory Summary]\nSUMMARY-D", keep=1)
    memd.late_append(LATE)
    agent.run("turn two")
    (preload,) = carrying(agent.sent[-1], "SUMMARY-D")
    assert preload["content"].count("LATE-REPLY") == 1
    assert preload["content"].index("SUMMARY-D") < preload["content"].index("LATE-REPLY")
    assert len(carrying(agent.sent[-1], "LATE-REPLY")) == 1
    # The wait ended when the late turn was in the new file, before memd let go.
    assert time.sleeps == 3 and memd.link.exists()


def test_after_the_drain_lets_the_old_file_go_nothing_more_is_waited_for(seeded: Path) -> None:
    memd = ScriptedMemd(memory_of(seeded))

    def memd_finishes(count: int) -> None:
        if count == 2:
            memd.drain()
            memd.let_go()

    time = MadeUpTime(memd_finishes)
    agent = timed(memd_swarms.attach(FakeAgent(seeded)), time)
    agent.run("turn one")
    # Nothing kept: the old file's last turn is only in the summary, never in the new file.
    memd.swap("[Compressed Memory Summary]\nSUMMARY-E", keep=0)
    agent.run("turn two")
    assert len(carrying(agent.sent[-1], "SUMMARY-E")) == 1
    assert carrying(agent.sent[-1], "turn one") == []
    assert time.sleeps == 2  # the old file's link count reached 0


def test_a_reseed_whose_drain_is_done_costs_no_wait(seeded: Path) -> None:
    time = MadeUpTime()
    agent = timed(memd_swarms.attach(FakeAgent(seeded)), time)
    memd = ScriptedMemd(memory_of(seeded))
    agent.run("turn one")
    memd.swap("[Compressed Memory Summary]\nSUMMARY-F", keep=2)  # the last turn kept
    agent.run("turn two")
    agent.run("turn three")  # same file: no rebuild, no wait
    assert len(carrying(agent.sent[-2], "SUMMARY-F")) == 1
    assert time.sleeps == 0 and agent._memd_swarms.rebuilds == 1
    assert agent._memd_swarms.drain_waits == 0


def test_when_the_drain_does_not_finish_the_run_goes_on_and_the_run_after_it_has_the_turns(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="memd_swarms")
    time = MadeUpTime()
    agent = timed(memd_swarms.attach(FakeAgent(seeded)), time)
    memd = ScriptedMemd(memory_of(seeded))
    agent.run("turn one")
    memd.swap("[Compressed Memory Summary]\nSUMMARY-G", keep=1)
    memd.late_append(LATE)  # and memd stops (killed): no drain, the link stays
    agent.run("turn two")
    assert len(carrying(agent.sent[-1], "SUMMARY-G")) == 1
    # Nothing is taken from the old file (it also holds what memd removed on purpose).
    assert carrying(agent.sent[-1], "LATE-REPLY") == []
    assert len(carrying(agent.sent[-1], "answer to turn one")) == 1  # the kept turn, once
    assert 2.0 <= time.now - 1000.0 < 2.1  # waited the bound, in polls of 20 ms
    wiring = agent._memd_swarms
    assert wiring.drain_waits == 1 and wiring.drain_waited_s == time.now - 1000.0
    (line,) = [r.getMessage() for r in caplog.records if "not finished moving" in r.getMessage()]
    assert "goes on without them" in line
    agent.run("turn three")  # memd has not let the old file go yet: no rebuild
    assert wiring.rebuilds == 1 and len(wiring.draining) == 1
    # memd's recovery drains them later, into the same file (no new inode): the
    # next run sees the old file let go and rebuilds, the late turn once.
    memd.drain()
    memd.let_go()
    agent.run("turn four")
    assert wiring.rebuilds == 2 and wiring.draining == []
    assert len(carrying(agent.sent[-1], "LATE-REPLY")) == 1
    for turn in ("turn two", "turn three", "turn four"):
        assert len(carrying(agent.sent[-1], turn)) == 1
    assert len(carrying(agent.sent[-1], "SUMMARY-G")) == 1


def test_the_drain_wait_reads_the_files_only_when_they_change(
    seeded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait polls every 20 ms for up to 2 s: each look stats the files and reads
    one only when it changed since (it read both in full at every look: 100 looks
    while memd is slow to drain are 200 reads of two whole files)."""
    from memd_swarms import _wiring

    reads: list[int] = []
    read_all = _wiring.read_all

    def counted(fd: int) -> bytes:
        reads.append(fd)
        return read_all(fd)

    memd = ScriptedMemd(memory_of(seeded))

    def memd_drains_late(count: int) -> None:
        if count == 60:  # 1.2 s into the wait: the late turn moves, and memd lets go
            memd.drain()
        if count == 80:
            memd.let_go()

    time = MadeUpTime(memd_drains_late)
    agent = timed(memd_swarms.attach(FakeAgent(seeded)), time)
    agent.run("turn one")
    memd.swap("[Compressed Memory Summary]\nSUMMARY-R", keep=1)
    memd.late_append(LATE)
    monkeypatch.setattr(_wiring, "read_all", counted)
    agent.run("turn two")
    (preload,) = carrying(agent.sent[-1], "SUMMARY-R")
    assert preload["content"].count("LATE-REPLY") == 1
    assert time.sleeps == 60  # done when the late turn was in the new file
    # The snapshot, then each file once, then both again after the drain's append.
    assert len(reads) <= 5, len(reads)
    assert agent._memd_swarms.drain_reads == len(reads) - 1  # the snapshot is no wait's


def test_turns_memd_erased_are_never_sent_back_from_the_old_file(seeded: Path) -> None:
    """Review r7swarms F1: ``memd forget --match`` drops the old file's last entries;
    its drain link lives past the wait (a long drain_quiet_s, or memd stopped
    mid-drain): what the new file lacks is not taken from the old one."""
    time = MadeUpTime()
    agent = timed(memd_swarms.attach(FakeAgent(seeded)), time)
    memd = ScriptedMemd(memory_of(seeded))
    agent.script = ["Noted, your card is 4111-SECRET-CARD"]
    agent.run("my card is 4111-SECRET-CARD")
    # The erasure: the same file less the two matching entries, swapped in.
    data = memory_of(seeded).read_bytes()
    kept = data[: data.index(b"### Human", data.index(b"Hello Ada"))]
    os.link(memory_of(seeded), memd.link)
    fresh = memory_of(seeded).with_name("MEMORY.md.new")
    fresh.write_bytes(kept)
    os.replace(fresh, memory_of(seeded))
    agent.run("What next?")
    assert carrying(agent.sent[-1], "SECRET-CARD") == []
    assert len(carrying(agent.sent[-1], "Hello Ada")) == 1
    assert time.now - 1000.0 >= 2.0  # it waited for the drain, then went on
    memd.let_go()  # the drain ends: the rebuild that follows sends the file as it is
    agent.run("And now?")
    assert agent._memd_swarms.rebuilds == 2
    assert carrying(agent.sent[-1], "SECRET-CARD") == []
    assert "SECRET-CARD" not in memory_of(seeded).read_text(encoding="utf-8")


def test_the_wiring_holds_one_descriptor_on_the_loaded_file(seeded: Path) -> None:
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    gc.collect()  # earlier tests' agents (a cycle through agent.run) let their fds go now
    before = open_fds()
    agent = memd_swarms.attach(FakeAgent(seeded))
    wiring = agent._memd_swarms
    assert open_fds() == before + 1
    for turn in range(3):
        agent.run(f"turn {turn}")
        reseed(memory_of(seeded), block("System", f"[Compressed Memory Summary]\nS-{turn}"))
    agent.run("last")
    assert open_fds() == before + 1 and wiring.rebuilds == 3
    assert os.fstat(wiring.held).st_ino == memory_of(seeded).stat().st_ino
    wiring.close()
    assert open_fds() == before and wiring.held is None


class ScriptedStatus:
    """memd's answer to the "status" request, about the real file: its count
    (``tokens``), the job's ``state``, and ``unseen`` bytes at the file's end it
    has not counted yet. ``on_call`` may change them (memd acts on its own time)."""

    def __init__(self, path: Path, threshold: int, tokens: int, state: str = "idle") -> None:
        self.path = path
        self.threshold = threshold
        self.tokens = tokens
        self.state = state
        self.unseen = 0
        self.calls = 0
        self.cooldown_left_s: float | None = None

    def __call__(self) -> dict[str, Any]:
        self.calls += 1
        info = self.path.stat()
        return {
            "tokens": self.tokens,
            "threshold_tokens": self.threshold,
            "state": self.state,
            "cooldown_left_s": self.cooldown_left_s,
            "dev": info.st_dev,
            "ino": info.st_ino,
            "size": info.st_size - self.unseen,
        }


def answering(agent: FakeAgent, status: Any) -> FakeAgent:
    agent._memd_swarms.status = status
    return agent


def test_a_run_over_memds_threshold_waits_for_the_reseed_and_starts_from_it(
    seeded: Path,
) -> None:
    """An agent faster than memd's compactions: the turns piled up over the threshold
    are not sent; the run waits for the re-seed and sends the summary instead."""
    memd = ScriptedMemd(memory_of(seeded))
    status = ScriptedStatus(memory_of(seeded), threshold=60, tokens=40)

    def memd_compacts(count: int) -> None:
        if count == 5:
            memd.swap("[Compressed Memory Summary]\nSUMMARY-K", keep=1)
            memd.let_go()
            status.tokens = 30  # its count of the new file

    time = MadeUpTime(memd_compacts)
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded)), time), status)
    agent.run("turn one")  # under the threshold: no wait
    assert time.sleeps == 0 and status.calls == 1
    status.tokens, status.state = 75, "pending"  # memd counted turn one: over, queued
    agent.run("turn two")
    assert carrying(agent.sent[-1], "I am Ada") == []  # summarized, not sent again raw
    assert len(carrying(agent.sent[-1], "SUMMARY-K")) == 1
    assert len(carrying(agent.sent[-1], "answer to turn one")) == 1  # kept, once
    wiring = agent._memd_swarms
    assert time.sleeps == 5 and wiring.holds == 1 and wiring.rebuilds == 1
    assert wiring.held_s == pytest.approx(5 * 0.02)
    status.state = "idle"
    agent.run("turn three")  # the new file is under the threshold again
    assert time.sleeps == 5 and wiring.holds == 1


def test_bytes_memd_has_not_counted_yet_are_waited_for_when_they_may_cross(
    seeded: Path,
) -> None:
    status = ScriptedStatus(memory_of(seeded), threshold=60, tokens=40)

    def memd_counts(count: int) -> None:
        if count == 3:
            status.unseen, status.tokens = 0, 55  # counted: still under

    time = MadeUpTime(memd_counts)
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded)), time), status)
    status.unseen = 19  # 40 + 19 < 60: cannot cross, no wait
    agent.run("turn one")
    assert time.sleeps == 0
    status.unseen = 20  # 40 + 20 may reach 60: wait for memd's count
    agent.run("turn two")
    # memd counted at the 3rd poll; it is asked again every 0.1 s (5-6 polls of 20 ms)
    assert status.calls == 3 and 5 <= time.sleeps <= 6 and agent._memd_swarms.holds == 1
    assert len(carrying(agent.sent[-1], "I am Ada")) == 1  # no re-seed: all of it sent


def test_memd_not_compacting_now_is_not_waited_for_and_said_once(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="memd_swarms")
    status = ScriptedStatus(memory_of(seeded), threshold=60, tokens=90, state="cooldown")
    time = MadeUpTime()
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded)), time), status)
    agent.run("turn one")
    agent.run("turn two")
    assert time.sleeps == 0 and agent._memd_swarms.holds == 0
    (line,) = [r.getMessage() for r in caplog.records if "not compacting" in r.getMessage()]
    assert "state cooldown" in line


def test_an_agent_memd_never_compacts_is_said_with_the_setting_that_does_it(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="memd_swarms")
    status = ScriptedStatus(memory_of(seeded), threshold=60, tokens=90, state="disabled")
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded)), MadeUpTime()), status)
    agent.run("turn one")
    (line,) = [r.getMessage() for r in caplog.records if "not compacting" in r.getMessage()]
    assert "state disabled" in line and "context_compression = false" in line
    assert "window" in line


def test_a_cooldown_memd_ends_with_a_compaction_is_waited_out_within_hold_s(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """memd says how long its cooldown lasts (``cooldown_left_s``): one that ends
    within the run's wait is waited out, then the compaction; one past it, one
    memd gives no end for (an older daemon, nothing to compact) and one on a file
    memd left over the threshold itself are not (said once per file)."""
    caplog.set_level(logging.WARNING, logger="memd_swarms")
    memd = ScriptedMemd(memory_of(seeded))
    status = ScriptedStatus(memory_of(seeded), threshold=60, tokens=40)
    time = MadeUpTime()
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded)), time), status)
    agent.run("turn zero")
    status.tokens, status.state = 90, "cooldown"  # memd counted turn zero
    status.cooldown_left_s = 120.0  # past hold_s
    agent.run("turn one")
    assert time.sleeps == 0
    status.cooldown_left_s = None  # an older daemon, or nothing to compact
    agent.run("turn two")
    assert time.sleeps == 0

    def memd_cools_then_compacts(count: int) -> None:
        status.cooldown_left_s = max(0.0, 1.0 - count * 0.02)
        if count == 60:  # the cooldown is over: memd compacts
            status.state = "running"
        if count == 70:
            memd.swap("[Compressed Memory Summary]\nSUMMARY-C", keep=1)
            memd.let_go()
            status.tokens, status.state = 30, "idle"

    time.on_sleep = memd_cools_then_compacts
    status.cooldown_left_s = 1.0
    agent.run("turn three")
    assert time.sleeps == 70 and agent._memd_swarms.holds == 1
    assert len(carrying(agent.sent[-1], "SUMMARY-C")) == 1
    # memd's compaction left the file over the threshold (an oversized summary):
    # its next one would not bring it under, so its cooldown is not waited out.
    time.on_sleep = lambda count: None
    reseed(memory_of(seeded), block("System", "[Compressed Memory Summary]\nS-BIG " * 30))
    status.tokens, status.state, status.cooldown_left_s = 95, "cooldown", 1.0
    agent.run("turn four")
    assert time.sleeps == 70 and agent._memd_swarms.holds == 1
    said = [r.getMessage() for r in caplog.records if "not compacting" in r.getMessage()]
    assert said and all("state cooldown" in line for line in said)  # once per file


def test_a_memd_that_does_not_compact_in_time_costs_one_wait_per_file(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="memd_swarms")
    status = ScriptedStatus(memory_of(seeded), threshold=60, tokens=90, state="pending")
    time = MadeUpTime()
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded), hold_s=1.0), time), status)
    agent.run("turn one")
    assert 1.0 <= time.now - 1000.0 < 1.1  # the bound, in polls of 20 ms
    assert 8 <= status.calls <= 11  # memd asked again every 0.1 s or so
    agent.run("turn two")  # the same file: not waited for again
    waited = time.now
    assert time.now == waited and agent._memd_swarms.holds == 1
    (line,) = [r.getMessage() for r in caplog.records if "within 1 s" in r.getMessage()]
    assert "this run goes ahead over it" in line
    reseed(memory_of(seeded), block("System", "[Compressed Memory Summary]\nS-1") * 9)
    agent.run("turn three")  # a new file, still over: waited for again
    assert time.now - waited >= 1.0 and agent._memd_swarms.holds == 2


def reseed_onto(path: Path, body: str, inode: int) -> bool:
    """:func:`reseed` with a new file that has ``inode``, a freed one the file
    system gives out again (ext4 does, at once); False when it would not."""
    spares: list[Path] = []
    try:
        for attempt in range(64):
            fresh = path.with_name(f"MEMORY.md.new{attempt}")
            fresh.write_text(HEADER + body, encoding="utf-8")
            if fresh.stat().st_ino == inode:
                os.replace(fresh, path)
                return True
            spares.append(fresh)  # kept meanwhile: its inode is not given out again
        return False
    finally:
        for spare in spares:
            spare.unlink()


def test_a_new_file_that_reuses_a_said_files_inode_is_waited_for_and_said_again(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What was said once about a file (and the wait it cost, given up) was keyed
    by its inode: a re-seed whose new file got a replaced one's freed inode was
    neither waited for nor said, though memd had not compacted that file either."""
    caplog.set_level(logging.WARNING, logger="memd_swarms")
    path = memory_of(seeded)
    first = path.stat().st_ino
    status = ScriptedStatus(path, threshold=60, tokens=90, state="pending")
    time = MadeUpTime()
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded), hold_s=1.0), time), status)
    agent.run("turn one")  # the first file: waited for, said
    reseed(path, block("System", "[Compressed Memory Summary]\nS-1") * 9)
    agent.run("turn two")  # a new file (the first still held: another inode)
    assert path.stat().st_ino != first and agent._memd_swarms.holds == 2
    # The first file was let go at that rebuild: its inode is free.
    if not reseed_onto(path, block("System", "[Compressed Memory Summary]\nS-2") * 9, first):
        pytest.skip("this file system does not give a freed inode out again")
    waited = time.now
    agent.run("turn three")  # a third file, with the first's inode: still over
    assert time.now - waited >= 1.0 and agent._memd_swarms.holds == 3
    said = [r.getMessage() for r in caplog.records if "within 1 s" in r.getMessage()]
    assert len(said) == 3
    assert len(carrying(agent.sent[-1], "S-2")) == 1


def test_memd_not_compacting_a_new_file_with_a_reused_inode_is_said_again(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="memd_swarms")
    path = memory_of(seeded)
    first = path.stat().st_ino
    status = ScriptedStatus(path, threshold=60, tokens=90, state="cooldown")
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded)), MadeUpTime()), status)
    agent.run("turn one")
    reseed(path, block("System", "[Compressed Memory Summary]\nS-1") * 9)
    agent.run("turn two")
    if not reseed_onto(path, block("System", "[Compressed Memory Summary]\nS-2") * 9, first):
        pytest.skip("this file system does not give a freed inode out again")
    agent.run("turn three")
    agent.run("turn four")  # the same file: not said again
    said = [r.getMessage() for r in caplog.records if "not compacting" in r.getMessage()]
    assert len(said) == 3


def test_a_cooldown_on_a_new_file_with_the_inode_of_one_memd_left_over_is_waited_out(
    seeded: Path,
) -> None:
    """The file memd left over the threshold (whose cooldown is not waited out)
    was kept as an inode too: a later file given that inode again was taken for
    it, and its cooldown, which ends in a compaction, was not waited out."""
    path = memory_of(seeded)
    first = path.stat().st_ino
    status = ScriptedStatus(path, threshold=60, tokens=90, state="cooldown")
    status.cooldown_left_s = 0.5
    time = MadeUpTime()
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded), hold_s=1.0), time), status)
    agent.run("turn one")  # the file as loaded is over: its cooldown is not waited out
    assert agent._memd_swarms.holds == 0
    status.tokens = 30  # memd's count of each file from here on, as loaded: under
    reseed(path, block("System", "[Compressed Memory Summary]\nS-1") * 9)
    agent.run("turn two")
    if not reseed_onto(path, block("System", "[Compressed Memory Summary]\nS-2") * 9, first):
        pytest.skip("this file system does not give a freed inode out again")
    agent.run("turn three")  # loads the third file; its turns go on past what was loaded
    assert agent._memd_swarms.holds == 0
    status.tokens = 90  # memd counted those turns: over, in a cooldown ending in 0.5 s
    agent.run("turn four")
    assert agent._memd_swarms.holds == 1 and time.now - 1000.0 >= 0.5


def test_without_an_answer_from_memd_nothing_waits_and_it_is_said_once(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="memd_swarms")
    time = MadeUpTime()
    calls: list[int] = []
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded)), time), lambda: calls.append(1))
    agent.run("turn one")
    agent.run("turn two")
    assert time.sleeps == 0 and len(calls) == 2
    said = [r.getMessage() for r in caplog.records if "status is not available" in r.getMessage()]
    assert len(said) == 1
    never = ScriptedStatus(memory_of(seeded), threshold=60, tokens=90, state="pending")
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded), hold_s=0), time), never)
    agent.run("turn three")
    assert never.calls == 0 and time.sleeps == 0


def test_memds_threshold_is_asked_at_every_run_not_kept(seeded: Path) -> None:
    """memd reads memd-agent.json a little after attach: its first answer may carry
    the fleet-wide threshold (here 100,000 tokens), the next one the agent's own.
    A threshold kept from the first answer let a real agent run to 3,500 tokens."""
    memd = ScriptedMemd(memory_of(seeded))
    status = ScriptedStatus(memory_of(seeded), threshold=100_000, tokens=90, state="idle")

    def memd_compacts(count: int) -> None:
        if count == 2:
            memd.swap("[Compressed Memory Summary]\nSUMMARY-L", keep=0)
            memd.let_go()
            status.tokens = 20

    time = MadeUpTime(memd_compacts)
    agent = answering(timed(memd_swarms.attach(FakeAgent(seeded)), time), status)
    agent.run("turn one")
    assert time.sleeps == 0
    status.threshold = 60  # memd has read the descriptor
    agent.run("turn two")
    assert time.sleeps == 2 and status.calls == 3 and agent._memd_swarms.threshold == 60
    assert len(carrying(agent.sent[-1], "SUMMARY-L")) == 1


def test_the_status_source_asks_memds_socket_and_says_none_without_one(seeded: Path) -> None:
    from memd_swarms._attach import status_source

    ask = status_source(str(memory_of(seeded)))
    assert ask() is None  # no daemon, no socket: no answer, no error


def test_a_swarms_that_sends_its_preload_is_left_alone_with_a_log_line(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class NativeAgent(FakeAgent):
        conversation_class = NativeConversation

    caplog.set_level(logging.INFO, logger="memd_swarms")
    agent = NativeAgent(seeded)
    run = agent.run
    assert memd_swarms.attach(agent) is agent
    assert agent.run == run and not hasattr(agent, "_memd_swarms")
    assert any("already sends its MEMORY.md preload" in r.getMessage() for r in caplog.records)


def test_unknown_internals_are_a_clear_error_naming_the_version(
    seeded: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Renamed(FakeConversation):
        def to_messages(
            self, agent_name: str | None = None, start: int = 0, prefix: Any = ()
        ) -> list[dict[str, Any]]:
            raise TypeError("to_messages() changed")

    class OddRole(FakeConversation):
        preload_role = "Memory"
        dropped_roles = ("System", "Tool Executor", "Memory")

    monkeypatch.setattr(probe, "swarms_version", lambda: "99.1.0")
    for conversation_class in (Renamed, OddRole):
        agent = FakeAgent(seeded)
        agent.short_memory.__class__ = conversation_class
        with pytest.raises(UnsupportedSwarms, match=r"swarms 99\.1\.0 .*knows swarms 16\.0\.x"):
            memd_swarms.attach(agent)
    agent = FakeAgent(seeded)
    del agent.short_memory
    with pytest.raises(UnsupportedSwarms, match="99.1.0"):
        memd_swarms.attach(agent)


def test_agents_memd_cannot_serve_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(AttachError, match="'ada' has no MEMORY.md: .*persistent_memory=True"):
        memd_swarms.attach(FakeAgent(tmp_path, persistent_memory=False))
    with pytest.raises(AttachError, match="context_compression=False"):
        memd_swarms.attach(FakeAgent(tmp_path, context_compression=True))
    autonomous = FakeAgent(tmp_path)
    autonomous.max_loops = "auto"  # swarms' autonomous loop never sends the memory
    with pytest.raises(AttachError, match=r"^agent 'ada' has max_loops='auto': .*\bloops$"):
        memd_swarms.attach(autonomous)
    assert not hasattr(autonomous, "_memd_swarms")


def test_attach_twice_wires_once(seeded: Path) -> None:
    agent = memd_swarms.attach(FakeAgent(seeded))
    wiring, run = agent._memd_swarms, agent.run
    assert memd_swarms.attach(agent) is agent
    assert agent._memd_swarms is wiring and agent.run is run
    agent.run("hi")
    assert len(carrying(agent.sent[-1], "I am Ada")) == 1


def test_copies_built_from_an_attached_agents_class_are_attached(seeded: Path) -> None:
    """swarms' PhasedFanOutWorkflow runs a fresh copy of each agent per use,
    ``type(agent)(**config)`` with the constructor's arguments read back through
    ``inspect.signature``: the copies loaded the same MEMORY.md but were not
    attached, and their requests never carried the memory (found by s11swarms)."""
    import inspect

    agent = memd_swarms.attach(FakeAgent(seeded), recall=False, hold_s=5)
    cls = type(agent)
    assert isinstance(agent, FakeAgent) and cls.__name__ == "FakeAgent"
    assert inspect.signature(cls.__init__) == inspect.signature(FakeAgent.__init__)
    copy = cls(seeded)
    assert type(copy) is cls and copy._memd_swarms is not agent._memd_swarms
    assert copy._memd_swarms.hold_s == 5
    copy.run("hi from a copy")
    (carrier,) = carrying(copy.sent[-1], "I am Ada")
    assert carrier["role"] == "system" and carrier["content"].startswith(PRELOAD)
    # Attaching again, or attaching a copy, makes no class of a class.
    memd_swarms.attach(copy)
    assert type(copy) is cls and type(memd_swarms.attach(FakeAgent(seeded), hold_s=5)) is cls
    # An agent the wiring refuses is a copy swarms can still run, as it was.
    other = cls(seeded, name="bob", context_compression=True)
    assert not hasattr(other, "_memd_swarms")


@pytest.mark.parametrize("descriptor", [True, False])
def test_a_copy_with_another_name_tells_memd_its_window(seeded: Path, descriptor: bool) -> None:
    """A copy built from the agent's class with another ``agent_name`` has a
    MEMORY.md of its own, attached, but no memd-agent.json was written beside it:
    memd never learned its window (found by r11swarms). Unless the agent was
    attached with ``descriptor=False``; a copy of the same name leaves the
    agent's as it is."""
    agent = memd_swarms.attach(FakeAgent(seeded), descriptor=descriptor, hold_s=7)
    ada = memory_of(seeded).with_name("memd-agent.json")
    before = ada.read_bytes() if descriptor else None
    bob = type(agent)(seeded, name="bob")
    assert bob._memd_swarms is not None
    written = memory_of(seeded, "bob").with_name("memd-agent.json")
    if descriptor:
        data = json.loads(written.read_text(encoding="utf-8"))
        assert (data["agent"], data["context_length"]) == ("bob", 128000)
        ada.write_text("{}", encoding="utf-8")  # the agent's own, edited: a copy leaves it
        type(agent)(seeded)
        assert ada.read_text(encoding="utf-8") == "{}" and before
    else:
        assert not written.exists() and not ada.exists()


def test_a_copy_whose_memd_agent_json_cannot_be_written_still_runs(
    seeded: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A copy swarms builds must not fail swarms' run: one whose memd-agent.json
    cannot be written (a full disk) is attached all the same, and it is said."""
    import errno

    from memd_swarms import _attach

    agent = memd_swarms.attach(FakeAgent(seeded))

    def full(folder: str, descriptor: dict[str, Any]) -> str:
        raise OSError(errno.ENOSPC, "No space left on device", folder)

    monkeypatch.setattr(_attach, "write_descriptor", full)
    with caplog.at_level(logging.WARNING, logger="memd_swarms"):
        bob = type(agent)(seeded, name="bob")
    assert bob._memd_swarms is not None
    assert any("No space left" in r.getMessage() for r in caplog.records)
    bob.run("hi")


def test_an_agent_whose_class_cannot_change_says_its_copies_go_without_memory(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Fixed(FakeAgent):
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "__class__":
                raise TypeError("__class__ assignment is not allowed here")
            super().__setattr__(name, value)

    with caplog.at_level(logging.WARNING, logger="memd_swarms"):
        agent = memd_swarms.attach(Fixed(seeded))
    assert type(agent) is Fixed and agent._memd_swarms is not None
    (line,) = [r.getMessage() for r in caplog.records if "copies" in r.getMessage()]
    assert "'ada'" in line and "PhasedFanOutWorkflow" in line and "without memd's memory" in line


def test_an_agent_whose_class_refuses_a_subclass_is_attached_all_the_same(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A class whose ``__init_subclass__`` refuses the subclass attach makes for the
    copies (a registry of subclasses by name) made ``attach`` raise after it had
    wired the agent (found by r11swarms): it is said, as for a class that
    cannot change."""

    registered: set[str] = set()

    class Registered(FakeAgent):
        def __init_subclass__(cls, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            if cls.__name__ in registered:
                raise TypeError(f"{cls.__name__} is registered already")
            registered.add(cls.__name__)

    class Ada(Registered):
        pass

    with caplog.at_level(logging.WARNING, logger="memd_swarms"):
        agent = memd_swarms.attach(Ada(seeded))
    assert type(agent) is Ada and agent._memd_swarms is not None
    (line,) = [r.getMessage() for r in caplog.records if "copies" in r.getMessage()]
    assert "registered already" in line and "without memd's memory" in line


def test_descriptor_tells_memd_the_window_and_what_every_request_carries(seeded: Path) -> None:
    agent = memd_swarms.attach(FakeAgent(seeded, rules="RULES"))
    path = memory_of(seeded).with_name("memd-agent.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == "memd-agent" and data["version"] == 1
    assert (data["agent"], data["model"], data["context_length"]) == ("ada", "gpt-4o-mini", 128000)
    assert data["reserved"]["unit"] == "text"
    assert data["reserved"]["text"] == 'SYS\n\nRULES\n\n[{"name": "lookup"}]'
    assert data["writer"].startswith("memd-swarms 0.1.0")
    assert path.stat().st_mode & 0o777 == memory_of(seeded).stat().st_mode & 0o666
    # Re-attaching an identical agent leaves the file (and its inode) alone.
    inode = path.stat().st_ino
    memd_swarms.attach(FakeAgent(seeded, rules="RULES"))
    assert path.stat().st_ino == inode
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".memd-agent")] == []
    del agent


def test_attach_without_descriptor_writes_none(seeded: Path) -> None:
    memd_swarms.attach(FakeAgent(seeded), descriptor=False)
    assert not memory_of(seeded).with_name("memd-agent.json").exists()


def test_importing_memd_swarms_loads_nothing_heavy() -> None:
    src = Path(memd_swarms.__file__).parents[1]
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); import memd_swarms; "
            "print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
            "{'litellm', 'swarms', 'tiktoken', 'watchdog', 'memd', 'pydantic'}))",
            str(src),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"


def test_a_fifo_at_memory_md_does_not_hang_the_run(
    seeded: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review r7swarms F5: a blocking open of a FIFO waits for a writer forever."""
    caplog.set_level(logging.WARNING, logger="memd_swarms")
    agent = memd_swarms.attach(FakeAgent(seeded))
    wiring = agent._memd_swarms
    memory = memory_of(seeded)
    memory.unlink()
    os.mkfifo(memory)
    finished = threading.Event()

    def before_run() -> None:
        wiring.before_run({})  # what agent.run does first (the fake's append would block)
        finished.set()

    worker = threading.Thread(target=before_run, daemon=True)
    worker.start()
    try:
        assert finished.wait(30.0), "before_run is blocked opening the FIFO"
    finally:
        if not finished.is_set():  # let the blocked open go
            os.close(os.open(memory, os.O_WRONLY | os.O_NONBLOCK))
            worker.join(5.0)
        wiring.close()
    assert wiring.rebuilds == 0
    (line,) = [r.getMessage() for r in caplog.records if "MEMORY.md" in r.getMessage()]
    assert "not a regular file" in line and "goes on" in line


@pytest.mark.parametrize("replacement", ["directory", "symlink loop", "fifo"])
def test_an_odd_memory_md_leaves_the_conversation_as_it_is_and_is_said_once(
    seeded: Path, replacement: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Review r7swarms F4: the agent runs on as Swarms alone would, with one warning;
    a regular file there again is followed."""
    caplog.set_level(logging.WARNING, logger="memd_swarms")
    agent = memd_swarms.attach(FakeAgent(seeded))
    agent.run("turn one")
    memory = memory_of(seeded)
    memory.unlink()
    if replacement == "directory":
        memory.mkdir()
    elif replacement == "fifo":
        os.mkfifo(memory)
    else:
        memory.symlink_to(memory.name)
    history = agent.short_memory.conversation_history
    for _ in range(3):
        before = list(history)
        agent._memd_swarms.before_run({})  # the fake's own append cannot run on it
        assert history == before
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "MEMORY.md" in warnings[0], warnings
    assert "\n" not in warnings[0]
    # Attaching another agent to it is no error either.
    other = FakeAgent(seeded, "bob")
    os.unlink(memory_of(seeded, "bob"))
    os.symlink("MEMORY.md", memory_of(seeded, "bob"))  # a loop
    assert memd_swarms.attach(other) is other
    # A regular file again: memd's re-seed is followed.
    if replacement == "directory":
        memory.rmdir()
    else:
        memory.unlink()
    memory.write_text(HEADER + block("System", "SUMMARY-BACK"), encoding="utf-8")
    agent.run("turn two")
    assert len(carrying(agent.sent[-1], "SUMMARY-BACK")) == 1
    assert agent._memd_swarms.rebuilds == 1


def test_a_memory_md_symlink_out_of_the_agent_folder_is_not_sent(seeded: Path) -> None:
    """Review r7swarms F6: MEMORY.md is followed only inside its agent's folder
    (DESIGN §1); one inside it is followed."""
    agent = memd_swarms.attach(FakeAgent(seeded))
    wiring = agent._memd_swarms
    other = memory_of(seeded, "bob")
    other.parent.mkdir(parents=True)
    other.write_text(HEADER + block("Human", "BOB-PRIVATE: my PIN is 4321"), encoding="utf-8")
    memory = memory_of(seeded)
    memory.unlink()
    memory.symlink_to(other)
    wiring.before_run({})
    assert not any(
        "BOB-PRIVATE" in str(row.get("content")) for row in wiring.conversation.conversation_history
    )
    assert wiring.rebuilds == 0
    inside = memory.parent / "notes" / "memory.md"
    inside.parent.mkdir()
    inside.write_text(HEADER + block("Human", "ADA-OWN: inside the folder"), encoding="utf-8")
    memory.unlink()
    memory.symlink_to(Path("notes") / "memory.md")
    wiring.before_run({})
    assert wiring.rebuilds == 1
    assert any(
        "ADA-OWN" in str(row.get("content")) for row in wiring.conversation.conversation_history
    )
    wiring.close()


@pytest.mark.parametrize("hold_s", [float("nan"), -1.0, float("inf"), "60", True])
def test_a_hold_that_is_no_number_of_seconds_is_refused(tmp_path: Path, hold_s: object) -> None:
    """NaN compares false with every deadline: a hold bounded by it never ends."""
    with pytest.raises(AttachError, match=r"^hold_s=.*: give a number of seconds, 0 or more"):
        memd_swarms.attach(FakeAgent(tmp_path), hold_s=hold_s)  # type: ignore[arg-type]


def test_turns_written_with_headers_quoted_read_back_whole_to_memd_and_to_the_wiring() -> None:
    """A property (r11swarms): whatever a turn's text holds (header lines at its
    start or end, ``---`` lines, CRLF, lone CRs, Unicode line breaks), the entries
    Swarms writes through the hook are, to memd's parse, the turns as given (their
    header lines quoted), to the wiring the same entries, and no rewrite."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from memd_swarms._wiring import (
        _block_text,
        _change_after,
        _with_headers_quoted,
        _written,
        appended_entry,
        entries,
    )

    from memd.core.memfile import parse

    pieces = [
        "\n", "\r\n", "\r", "---", " ", "\t", "x", "> ", "### ", " — ", "\u2028", "\x85",
        "### Human — 2026-01-01T00:00:00", "### Tool Executor — 2026-01-01T00:00:00.123",
        "### a — b — 2026-01-01", "###  — 2026-01-01", "2026-01-01T00:00:00",
    ]  # fmt: skip
    texts = st.lists(st.sampled_from(pieces), max_size=14).map("".join)
    roles = st.sampled_from(["Human", "ada", "Tool Executor"])

    class Conversation:
        _suppress_memory_md = False

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(roles, texts), min_size=1, max_size=4))
    def check(turns: list[tuple[str, str]]) -> None:
        data, recorded, written = HEADER.encode(), [], []
        for role, text in turns:
            content = _with_headers_quoted(text)
            entry = appended_entry(Conversation, role, content)
            if entry is None:
                continue
            data += f"### {role} — 2026-02-02T10:00:00.5\n\n{content.strip()}\n\n---\n\n".encode()
            recorded.append(entry)
            written.append((role, text, content.strip()))
        assert [(e.role, e.text) for e in parse(data).entries] == [
            (role, quoted) for role, _, quoted in written
        ]
        assert _change_after(data[len(HEADER.encode()) :], recorded) is None
        blocks = entries(data)
        assert [_block_text(block) for block in blocks] == [
            _written({"role": role, "content": text}) for role, text, _ in written
        ]

    check()
