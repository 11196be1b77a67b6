from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.daemon_proc import DaemonProcess
from support.memfiles import AgentWorkspace, append_entry

pytest.importorskip("mcp")

from mcp.client import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

# Runs `memd mcp` as another uid: everything is imported first, because this
# Python's own files may live where that uid cannot read (e.g. under /root).
AS_USER = """
import os, sys
import asyncio, json, anyio, anyio._backends._asyncio, anyio.streams.text
import mcp.server.mcpserver, mcp.server.stdio, mcp.types
import memd.cli.app, memd.recall.mcp_server, memd.recall.client
memd.cli.app.build_app()  # imports every command module (main() imports only its own)
uid = int(sys.argv[1])
if uid != os.getuid():
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
memd.cli.app.main(sys.argv[2:])
"""


async def call_recall(workspace: Path, agent: str, uid: int, query: str) -> Any:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-c", AS_USER, str(uid), "mcp", "--agent", agent, "-w", str(workspace)],
        env={"PATH": "/usr/bin:/bin", "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        cwd="/",
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = await session.list_tools()
        assert [tool.name for tool in tools.tools] == ["recall_memory"]
        return await session.call_tool("recall_memory", {"query": query, "limit": 3})


def text_of(result: Any) -> str:
    return "\n".join(part.text for part in result.content if hasattr(part, "text"))


def test_mcp_serves_recall_for_one_agent_with_the_daemons_permission_rule() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the MCP server as other uids")
    base = Path(tempfile.mkdtemp(prefix="memd-mcp-", dir="/tmp"))
    try:
        base.chmod(0o755)
        ws = AgentWorkspace(base / "ws")
        for agent, uid in {"alpha": 1000, "beta": 65534}.items():
            paths = ws.create_agent(agent)
            append_entry(paths.memory, "Human", f"{agent}: the cerulean ledger is in locker 12")
            os.chown(paths.memory, uid, uid)
        config = base / "memd.toml"
        config.write_text("[trigger]\ncontext_length = 100000\n")
        with DaemonProcess(ws.root, base / "state", config=config) as daemon:
            daemon.wait_ready()
            daemon.wait_for("recall socket listening")
            own = anyio.run(call_recall, ws.root, "alpha", 1000, "where is the cerulean ledger?")
            assert not own.is_error, text_of(own)
            assert "alpha: the cerulean ledger is in locker 12" in text_of(own)
            other = anyio.run(call_recall, ws.root, "beta", 1000, "cerulean ledger")
            assert other.is_error
            assert "uid 1000 may not read agent 'beta'" in text_of(other)
            assert "beta: the cerulean" not in text_of(other)
            assert daemon.stop() == 0
        # Without a daemon the tool says so instead of hanging or crashing.
        down = anyio.run(call_recall, ws.root, "alpha", 1000, "cerulean")
        assert down.is_error and "is the memd daemon running?" in text_of(down)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_mcp_refuses_a_bad_agent_name_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "memd", "mcp", "--agent", "../x", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def test_mcp_refuses_an_unknown_agent_at_start_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "agents" / "alpha").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-m", "memd", "mcp", "--agent", "nosuch", "-w", str(tmp_path)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Exit 3, as every command exits for an unknown agent (README "Commands").
    assert done.returncode == 3, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and "unknown agent 'nosuch'" in done.stderr, done.stderr
    assert done.stdout == ""
