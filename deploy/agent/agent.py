"""Placeholder Swarms agent for the compose example: memd does its compression.

Each task given on the command line (or each line read from stdin) is one run
of the agent. With ``persistent_memory=True`` Swarms appends every turn to
``$WORKSPACE_DIR/agents/{agent_name}/MEMORY.md`` and reloads it next time;
``context_compression=False`` turns off Swarms' own in-process compression,
so the only writer that ever rewrites MEMORY.md is memd (atomically, without
losing the turns appended while it summarizes). ``memd_swarms.attach`` makes
the preloaded memory reach the model and keeps a long-running agent's context
in step with memd's compactions (README, "Wiring a Swarms agent").
"""

from __future__ import annotations

import os
import sys

import memd_swarms
from swarms import Agent


def build_agent() -> Agent:
    agent = Agent(
        agent_name=os.environ.get("AGENT_NAME", "research-agent"),
        model_name=os.environ.get("AGENT_MODEL", "gpt-4o-mini"),
        system_prompt=os.environ.get(
            "AGENT_SYSTEM_PROMPT", "You are a careful research assistant."
        ),
        max_loops=1,
        persistent_memory=True,  # MEMORY.md under $WORKSPACE_DIR/agents/{agent_name}/
        context_compression=False,  # memd compacts MEMORY.md; never both
    )
    return memd_swarms.attach(agent)


def main(argv: list[str]) -> int:
    if not os.environ.get("WORKSPACE_DIR"):
        print("WORKSPACE_DIR must point at the volume shared with memd", file=sys.stderr)
        return 2
    agent = build_agent()
    tasks = argv or (line.strip() for line in sys.stdin)
    for task in tasks:
        if task:
            print(agent.run(task), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
