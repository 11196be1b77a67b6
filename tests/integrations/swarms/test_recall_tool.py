"""attach(agent, recall=True) with the real swarms package, a real ``memd run``
(its recall socket) and a recording LLM server that makes the model call the tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon_proc import DaemonProcess
from support.openai_server import OpenAITestServer, RecordedRequest
from support.swarms import SwarmsAgent, swarms_python

pytestmark = [
    pytest.mark.swarms,
    pytest.mark.skipif(swarms_python() is None, reason="swarms is not installed"),
]

FACT = "The kalomiren report is in the blue cabinet, drawer three."


def memd(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "memd", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MEMD_COMPACTION_DRAIN_QUIET_S": "0.1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def tool_messages(request: RecordedRequest) -> list[dict[str, object]]:
    return [m for m in request.messages if m.get("role") == "tool"]


def test_the_model_calls_recall_memory_and_gets_the_archived_turn(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    config = tmp_path / "memd.toml"
    config.write_text("[trigger]\ncontext_length = 200000\n", encoding="utf-8")
    state = tmp_path / "state"
    spec = {"agent": "ada", "system_prompt": "You are a test agent.", "recall": True}
    with (
        OpenAITestServer() as server,
        DaemonProcess(workspace, state, config=config) as daemon,
    ):
        daemon.wait_ready()
        daemon.wait_for("recall socket listening")
        with SwarmsAgent(workspace, server.api_base, spec) as agent:
            agent.run(f"Please note: {FACT}")
            agent.finish()
        # The fact leaves MEMORY.md: only the archive (and the index) keep it.
        memd(
            "compact-now",
            "ada",
            "--workspace",
            str(workspace),
            "--state-dir",
            str(state),
            "--summary",
            "We talked about where some reports are kept.",
        )
        memory = (workspace / "agents" / "ada" / "MEMORY.md").read_text(encoding="utf-8")
        assert "kalomiren" not in memory
        before = len(server.requests)
        with SwarmsAgent(workspace, server.api_base, spec) as agent:
            server.script('tool:recall_memory:{"query": "where is the kalomiren report?"}')
            agent.run("Where is the kalomiren report?")
            agent.run("And?")  # max_loops=1: the tool result goes out with the next run
            agent.finish()
        assert daemon.stop() == 0

    asked, answered = server.requests[before], server.requests[-1]
    # The model was offered the tool and told about it in the preload.
    names = [tool["function"]["name"] for tool in asked.body.get("tools", [])]
    assert "recall_memory" in names
    preload = next(m for m in asked.messages if "[Persistent Memory" in str(m.get("content")))
    assert "recall_memory(query, limit=5)" in str(preload["content"])
    # The tool result, fetched from the daemon's socket, reached the model.
    (result,) = tool_messages(answered)
    assert FACT in str(result["content"])
    assert "archive history_" in str(result["content"])
    call_ids = [call["id"] for m in answered.messages for call in (m.get("tool_calls") or [])]
    assert result["tool_call_id"] in call_ids
    print(json.dumps({"tool_result": result["content"]})[:400])
