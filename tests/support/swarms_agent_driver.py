"""One real Swarms agent, run in the swarms virtualenv for the interop tests and the benchmark.

    python swarms_agent_driver.py '<json spec>'

The spec names the agent, its system prompt and model settings, whether to
``memd_swarms.attach`` it (``recall``: with the recall tool), and either ``turns`` (run that many tasks by itself,
``pause_s`` apart) or nothing (then each stdin line is one task; "ok <n>" is
printed after each run so a test can act between turns). The LLM is whatever
OPENAI_API_BASE points at. The last stdout line is a JSON report.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def lookup_fact(topic: str) -> str:
    """Look up the stored fact about a topic.

    Args:
        topic (str): What to look up.

    Returns:
        str: The fact.
    """
    return f"fact about {topic}: the launch window is Friday"


def build(spec: dict[str, Any]) -> Any:
    from swarms import Agent

    agent = Agent(
        agent_name=spec["agent"],
        model_name=spec.get("model", "openai/gpt-4o-mini"),
        system_prompt=spec.get("system_prompt", "You are a careful assistant."),
        persistent_memory=True,
        context_compression=False,
        context_length=spec.get("context_length"),
        max_loops=spec.get("max_loops", 1),
        tools=[lookup_fact] if spec.get("tools") else None,
        print_on=False,
    )
    if spec.get("attach", True):
        import memd_swarms

        memd_swarms.attach(agent, recall=bool(spec.get("recall")))
    return agent


def main() -> int:
    spec = json.loads(sys.argv[1])
    agent = build(spec)
    print("ready", flush=True)
    if "turns" in spec:
        for index in range(spec["turns"]):
            agent.run(spec["task"].format(i=index))
            time.sleep(spec.get("pause_s", 0))
    else:
        for count, line in enumerate(sys.stdin, 1):
            agent.run(line.rstrip("\n"))
            print(f"ok {count}", flush=True)
    wiring = getattr(agent, "_memd_swarms", None)
    report = {
        name: getattr(wiring, name, None)
        for name in (
            "rebuilds",
            "drain_waits",
            "drain_waited_s",
            "drain_reads",
            "holds",
            "held_s",
            "call_holds",
            "call_rebuilds",
            "threshold",
        )
    }
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
