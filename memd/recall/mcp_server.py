"""``memd mcp --agent NAME``: recall for one agent as an MCP server over stdio.

Any MCP-capable agent runtime starts this as a subprocess. It holds no index
of its own: each call goes to the daemon's recall socket, which applies the
one permission rule (the caller's uid owns the agent's MEMORY.md, or is root),
so running ``memd mcp --agent beta`` as alpha's uid gets every call refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memd.recall.client import RecallUnavailable, recall

MAX_LIMIT = 20
MAX_CHARS_PER_HIT = 2000


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


def serve(agent: str, socket_path: Path) -> None:
    """Run the stdio MCP server until the client closes it."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server: Any = MCPServer(
        name="memd-recall",
        instructions=(
            f"Recall over agent {agent!r}'s own history: the raw turns memd archived when it "
            "summarized the agent's memory, and the live MEMORY.md."
        ),
    )

    @server.tool(name="recall_memory")  # type: ignore[untyped-decorator]
    def recall_memory(query: str, limit: int = 5) -> str:
        """Search your own earlier conversation turns, including those your memory summary
        replaced. Ask in plain words; returns the best matching raw turns, best first."""
        count = max(1, min(MAX_LIMIT, limit))
        try:
            hits = recall(socket_path, agent, query, count)
        except RecallUnavailable as exc:
            # A ToolError's text reaches the model as the (error) result;
            # any other exception would be masked as a generic failure.
            raise ToolError(str(exc)) from None
        return format_hits(hits, query)

    server.run("stdio")


__all__ = ["format_hits", "serve"]
