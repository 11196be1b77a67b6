"""The ``recall_memory`` tool: the agent asks memd's daemon for the raw turns behind its summary.

Talks to the daemon's recall socket (``<workspace>/.memd-recall.sock``, or
``$MEMD_RECALL_SOCKET``) with one JSON line each way; stdlib only, no import of
memd (it lives in the agent's environment, beside swarms' pins). The daemon
checks the caller's uid against the agent's MEMORY.md owner, so an agent can
read only its own history whatever it asks for.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

SOCKET_NAME = ".memd-recall.sock"
PROTOCOL_VERSION = 1
DEFAULT_TIMEOUT_S = 15.0
MAX_LIMIT = 20
# A tool result lands in the model's context: keep each hit readable, and the
# whole result well under what one tool turn should cost.
MAX_CHARS_PER_HIT = 2000

TOOL_NAME = "recall_memory"
TOOL_DESCRIPTION = (
    "Search your own earlier conversation turns, including the ones your memory summary "
    "replaced. Use it when the summary mentions something without the detail you need "
    "(a path, a name, a number, who said what). Ask in plain words; returns the best "
    "matching raw turns with their role and time."
)
PRELOAD_NOTICE = (
    "Your memory above is a summary: the raw turns it replaced are kept. Call the tool "
    f"`{TOOL_NAME}(query, limit=5)` to search them when you need a detail the summary "
    "does not give."
)


class RecallUnavailable(RuntimeError):
    """memd's recall socket could not answer (daemon not running, refused, bad reply)."""


def socket_path(workspace: Path | None = None) -> Path:
    """``$MEMD_RECALL_SOCKET``, else ``<workspace>/.memd-recall.sock``."""
    explicit = os.environ.get("MEMD_RECALL_SOCKET", "").strip()
    if explicit and explicit.lower() != "off":
        return Path(explicit).expanduser()
    if workspace is None:
        workspace = Path(os.environ.get("WORKSPACE_DIR") or "agent_workspace")
    return workspace / SOCKET_NAME


def ask(path: Path, request: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """One request, one reply; the socket is reached through its folder's fd
    (``/proc/self/fd/N/name``) so a deep workspace path is never too long."""
    try:
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise RecallUnavailable(f"recall socket folder {path.parent}: {exc.strerror}") from None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(f"/proc/self/fd/{directory}/{path.name}")
            sock.sendall(json.dumps(request).encode() + b"\n")
            data = bytearray()
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise RecallUnavailable(
            f"memd's recall socket {path} did not answer ({reason}); is the memd daemon running?"
        ) from None
    finally:
        os.close(directory)
    try:
        return json.loads(bytes(data))
    except ValueError:
        raise RecallUnavailable(f"memd's recall socket {path} sent an unreadable reply") from None


def recall(
    agent: str, query: str, limit: int = 5, *, path: Path | None = None
) -> list[dict[str, Any]]:
    """The agent's raw turns best matching ``query`` (memd's ``--json`` schema)."""
    reply = ask(
        path or socket_path(),
        {"v": PROTOCOL_VERSION, "agent": agent, "query": query, "limit": limit},
    )
    if not isinstance(reply, dict) or reply.get("ok") is not True:
        error = reply.get("error") if isinstance(reply, dict) else None
        raise RecallUnavailable(str(error or "memd refused the recall request"))
    results = reply.get("results")
    return results if isinstance(results, list) else []


def status(agent: str, *, path: Path | None = None, timeout_s: float = 2.0) -> dict[str, Any]:
    """Where the agent's memory stands for memd (the socket's "status" request): its
    count (``tokens``) of the file (``dev``, ``ino``) up to byte ``size``, the
    agent's ``threshold_tokens``, its job's ``state`` and how long a cooldown
    memd ends with a compaction still lasts (``cooldown_left_s``, null
    otherwise; absent from a daemon before it). RecallUnavailable when
    the daemon cannot say (not running, no socket, a daemon without the request)."""
    reply = ask(
        path or socket_path(),
        {"v": PROTOCOL_VERSION, "agent": agent, "op": "status"},
        timeout_s,
    )
    answer = reply.get("status") if isinstance(reply, dict) else None
    if not isinstance(reply, dict) or reply.get("ok") is not True or not isinstance(answer, dict):
        error = reply.get("error") if isinstance(reply, dict) else None
        raise RecallUnavailable(str(error or "memd sent no status"))
    return answer


def format_hits(hits: list[dict[str, Any]], query: str) -> str:
    if not hits:
        return f"No earlier turn matches {query!r}."
    lines = [f"{len(hits)} earlier turn(s) matching {query!r}, best first:"]
    for rank, hit in enumerate(hits, start=1):
        text = str(hit.get("text", ""))
        if len(text) > MAX_CHARS_PER_HIT:
            text = text[:MAX_CHARS_PER_HIT] + " …(cut)"
        where = "current memory" if hit.get("live") else f"archive {hit.get('source')}"
        lines.append(f"\n[{rank}] {hit.get('role')} at {hit.get('timestamp')} ({where}):\n{text}")
    return "\n".join(lines)


def make_recall_tool(agent: str, path: Path | None = None) -> Callable[[str, int], str]:
    """A ``recall_memory(query, limit=5)`` function bound to one memd agent."""

    def recall_memory(query: str, limit: int = 5) -> str:
        """Search your own earlier conversation turns, including those your memory summary replaced.

        Args:
            query (str): What to find, in plain words (e.g. "where is the kalomiren report?").
            limit (int): How many turns to return, 1 to 20 (default 5).

        Returns:
            str: The best matching raw turns with their role and time, best first.
        """
        try:
            count = max(1, min(MAX_LIMIT, int(limit)))
        except (TypeError, ValueError):
            count = 5
        try:
            hits = recall(agent, str(query), count, path=path)
        except RecallUnavailable as exc:
            # The model sees this as the tool's result and can carry on.
            return f"recall_memory failed: {exc}"
        return format_hits(hits, str(query))

    recall_memory.__name__ = TOOL_NAME
    return recall_memory


def add_recall_tool(agent: Any, memory_path: str) -> bool:
    """Give a constructed ``swarms.Agent`` the ``recall_memory`` tool for its memd agent.

    The memd agent is the folder MEMORY.md lives in; the workspace is two levels
    up (``<workspace>/agents/<agent>/MEMORY.md``). Swarms reads the tool list at
    construction, so the tool goes everywhere it copied it to: ``agent.tools``
    (its executor looks tools up by name), ``tools_list_dictionary`` and the
    already-built LLM client's schema list. Returns False when it was there.
    """
    folder = Path(memory_path).parent
    memd_agent = folder.name
    path = socket_path(folder.parent.parent)
    tools = getattr(agent, "tools", None)
    if tools is None:
        tools = []
        agent.tools = tools
    if any(getattr(tool, "__name__", "") == TOOL_NAME for tool in tools):
        return False
    tool = make_recall_tool(memd_agent, path)
    tools.append(tool)
    executor = getattr(agent, "tool_struct", None)
    if executor is not None:
        executor.tools = tools
        function_map = getattr(executor, "function_map", None)
        if isinstance(function_map, dict):
            function_map[TOOL_NAME] = tool
    schemas = getattr(agent, "tools_list_dictionary", None)
    if schemas is None:
        schemas = []
        agent.tools_list_dictionary = schemas
    schemas.append(tool_schema())
    llm = getattr(agent, "llm", None)
    if llm is not None and hasattr(llm, "tools_list_dictionary"):
        # The client was built before the tool existed; it reads this list per call.
        llm.tools_list_dictionary = list(schemas)
    return True


def tool_schema() -> dict[str, Any]:
    """The OpenAI function schema of ``recall_memory``."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": TOOL_DESCRIPTION,
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "What to find, in plain words.",
                    },
                    "limit": {
                        "type": "integer",
                        "description": f"How many turns to return (1 to {MAX_LIMIT}).",
                        "default": 5,
                    },
                },
                "required": ["query"],
            },
        },
    }


__all__ = [
    "PRELOAD_NOTICE",
    "TOOL_NAME",
    "RecallUnavailable",
    "add_recall_tool",
    "format_hits",
    "make_recall_tool",
    "recall",
    "socket_path",
    "status",
    "tool_schema",
]
