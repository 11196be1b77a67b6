"""Retention: what an agent still knows after 10 compactions in a row.

    python bench/bench_retention.py [--batches 10] [--scenario NAME …]

Each scenario appends 10 synthetic batches (bench/transcripts.py: Swarms format,
~30-37k tokens each, 39 planted facts of 13 kinds among long tool dumps) to one
agent's MEMORY.md and runs ``memd compact-now`` (in-process, the real CLI) after
each batch, with an agent context of 32,000 tokens (threshold 28,800).  Then it
counts the planted facts whose key is still in MEMORY.md, per kind.

Scenarios:
    builtin  the offline summarizer
    lossy    a litellm model on a local test server answering a plausible
             300-character summary that names no fact
    ok       the same server answering "ok"
    vague    the same server answering a plausible ~900-token summary that names
             no fact: long enough not to be refused, so what is retained is
             what the pinned section kept
    small    a "perfect" model (it copies every planted fact it sees in its
             prompt) with an 8,192-token window: measures coverage, the share
             of planted facts that reached at least one request, and whether
             any request (prompt + max_tokens) exceeded the window

A failed compaction must change nothing: the bench checks MEMORY.md's bytes and
the archive count after every refused run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from support.openai_server import OpenAITestServer
from transcripts import (
    DURABLE_KINDS,
    KINDS,
    PlantedFact,
    header,
    make_batches,
)

from memd.cli.app import main as memd_main
from memd.tokenizer import TokenCounter

AGENT = "bench-agent"
AGENT_CONTEXT = 32_000
THRESHOLD = 0.9
SMALL_WINDOW = 8_192

LOSSY_REPLY = (
    "Goals:\n- Keep the ingestion pipeline healthy and finish the migration.\n"
    "Decisions:\n- The team agreed on several configuration changes.\n"
    "Facts:\n- Several services, dashboards and owners were discussed.\n"
    "Open tasks:\n- Follow up on load tests.\nErrors:\n- Some workers had connection issues."
)

# Long enough to pass the degenerate-reply floor (0.5 % of the input, at most a
# quarter of the summary budget), and as empty of facts as LOSSY_REPLY.
VAGUE_REPLY = LOSSY_REPLY + "".join(
    f"\n- The team reviewed the {topic} and agreed the current approach is reasonable; "
    "several follow-ups were noted, owners will report back once the checks are done, "
    "and nothing needs an immediate decision from anyone else on the project right now."
    for topic in (
        "ingestion pipeline",
        "worker pool",
        "dashboards",
        "replica setup",
        "deploy process",
        "index rebuilds",
        "vendor contract",
        "load tests",
        "export formats",
        "retry policy",
        "queue depth",
        "bucket policies",
        "release plan",
        "alerting rules",
        "runbooks",
        "cost report",
        "capacity plan",
        "schema changes",
        "access reviews",
        "backups",
    )
)


@dataclass
class ScenarioResult:
    name: str
    retained: dict[str, int] = field(default_factory=dict)  # kind -> facts kept at the end
    planted: dict[str, int] = field(default_factory=dict)
    coverage: dict[str, int] = field(default_factory=dict)  # kind -> facts seen by the model
    committed: int = 0
    refused: int = 0
    refused_changed_something: int = 0
    requests: int = 0
    max_request_tokens: int = 0
    requests_over_window: int = 0
    final_tokens: int = 0
    notes: list[str] = field(default_factory=list)

    def share(self, kinds: tuple[str, ...], table: dict[str, int]) -> float:
        total = sum(self.planted.get(k, 0) for k in kinds)
        return 100.0 * sum(table.get(k, 0) for k in kinds) / total if total else 0.0


def _config_text(workspace: Path, summarizer: str, extra: str) -> str:
    return (
        f'workspace = "{workspace}"\n\n[trigger]\ncontext_length = {AGENT_CONTEXT}\n'
        f"threshold = {THRESHOLD}\n\n[summarizer]\n{summarizer}\n{extra}\n"
    )


def _run_cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            memd_main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, out.getvalue() + err.getvalue()


def _archives(folder: Path) -> int:
    archive = folder / "archive"
    return len(list(archive.iterdir())) if archive.is_dir() else 0


def run_scenario(
    name: str,
    summarizer_toml: str,
    facts_seen: Callable[[], set[str]] | None,
    batches_count: int,
    counter: TokenCounter,
    server: OpenAITestServer | None,
) -> ScenarioResult:
    result = ScenarioResult(name=name)
    batches = make_batches(batches_count)
    all_facts: list[PlantedFact] = [f for b in batches for f in b.facts]
    for fact in all_facts:
        result.planted[fact.kind] = result.planted.get(fact.kind, 0) + 1
    with tempfile.TemporaryDirectory() as tmp:
        workspace = Path(tmp) / "ws"
        folder = workspace / "agents" / AGENT
        folder.mkdir(parents=True)
        memory = folder / "MEMORY.md"
        memory.write_text(header(AGENT))
        config = Path(tmp) / "memd.toml"
        config.write_text(_config_text(workspace, summarizer_toml, ""))
        state = Path(tmp) / "state"
        for batch in batches:
            with memory.open("a", encoding="utf-8") as handle:
                handle.write(batch.text)
            before, archives_before = memory.read_bytes(), _archives(folder)
            code, output = _run_cli(
                "compact-now", AGENT, "--config", str(config), "--state-dir", str(state)
            )
            if code == 0:
                result.committed += 1
            else:
                result.refused += 1
                if memory.read_bytes() != before or _archives(folder) != archives_before:
                    result.refused_changed_something += 1
                reason = output.strip().splitlines()[-1] if output.strip() else "?"
                result.notes.append(f"batch {batch.index}: {reason[:160]}")
        final = memory.read_text(encoding="utf-8", errors="replace")
        result.final_tokens = counter.count_text(final)
        for fact in all_facts:
            if fact.key in final:
                result.retained[fact.kind] = result.retained.get(fact.kind, 0) + 1
    if server is not None:
        result.requests = len(server.requests)
        seen_text = []
        for request in server.requests:
            prompt = request.prompt_text
            seen_text.append(prompt)
            tokens = sum(
                counter.count_text(str(m.get("content", ""))) + 4 for m in request.messages
            )
            tokens += int(request.body.get("max_tokens") or 0)
            result.max_request_tokens = max(result.max_request_tokens, tokens)
            if tokens > SMALL_WINDOW:
                result.requests_over_window += 1
        if facts_seen is not None:
            joined = "\n".join(seen_text)
            for fact in all_facts:
                if fact.key in joined:
                    result.coverage[fact.kind] = result.coverage.get(fact.kind, 0) + 1
    return result


@contextlib.contextmanager
def _server(responder: Callable[[dict[str, Any]], str]) -> Iterator[OpenAITestServer]:
    with OpenAITestServer(responder=responder) as server:
        yield server


def _perfect_responder(
    facts: list[PlantedFact], counter: TokenCounter
) -> Callable[[dict[str, Any]], str]:
    """Copies every planted fact in the prompt, newest first, within the request's max_tokens."""

    def respond(body: dict[str, Any]) -> str:
        prompt = "\n".join(str(m.get("content", "")) for m in body.get("messages", []))
        budget = int(body.get("max_tokens") or 4000)
        found = [f"- {f.sentence}" for f in reversed(facts) if f.key in prompt]
        lines = ["Facts:"]
        used = counter.count_text("Facts:")
        for line in found:
            cost = counter.count_text(line) + 1
            if used + cost > budget:
                break
            lines.append(line)
            used += cost
        return "\n".join(lines) if len(lines) > 1 else "Facts:\n- none recorded yet"

    return respond


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument(
        "--scenario",
        action="append",
        choices=("builtin", "lossy", "ok", "vague", "small"),
        default=None,
    )
    parser.add_argument(
        "--legacy-config",
        action="store_true",
        help="omit [summarizer] keys older releases do not know (to measure a baseline)",
    )
    args = parser.parse_args()
    scenarios = args.scenario or ["builtin", "lossy", "ok", "vague", "small"]
    counter = TokenCounter("cl100k_base")
    all_facts = [f for b in make_batches(args.batches) for f in b.facts]
    results: list[ScenarioResult] = []
    remote = 'model = "openai/bench-model"\napi_key = "sk-bench"\n'
    for name in scenarios:
        if name == "builtin":
            results.append(
                run_scenario(name, 'model = "builtin"', None, args.batches, counter, None)
            )
            continue
        responder: Callable[[dict[str, Any]], str]
        if name == "lossy":
            responder = lambda _body: LOSSY_REPLY  # noqa: E731
        elif name == "ok":
            responder = lambda _body: "ok"  # noqa: E731
        elif name == "vague":
            responder = lambda _body: VAGUE_REPLY  # noqa: E731
        else:
            responder = _perfect_responder(all_facts, counter)
        with _server(responder) as server:
            toml = remote + f'api_base = "{server.api_base}"\n'
            if name == "small":
                toml = toml.replace("bench-model", "bench-small")
                if not args.legacy_config:
                    toml += f"context_length = {SMALL_WINDOW}\n"
            results.append(
                run_scenario(
                    name,
                    toml,
                    (lambda: set()) if name == "small" else None,
                    args.batches,
                    counter,
                    server,
                )
            )
    _print(results)
    return 0


def _print(results: list[ScenarioResult]) -> None:
    names = [r.name for r in results]
    print(
        f"after {sum(results[0].planted.values()) // 39} compactions: "
        "% of planted facts in MEMORY.md"
    )
    print("| kind | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for kind in KINDS:
        cells = []
        for r in results:
            planted = r.planted.get(kind, 0)
            cells.append(f"{100.0 * r.retained.get(kind, 0) / planted:.0f} %" if planted else "-")
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print(
        "| **durable** | "
        + " | ".join(f"{r.share(DURABLE_KINDS, r.retained):.1f} %" for r in results)
        + " |"
    )
    print(
        "| **all** | " + " | ".join(f"{r.share(KINDS, r.retained):.1f} %" for r in results) + " |"
    )
    print()
    for r in results:
        line = (
            f"{r.name}: {r.committed} committed, {r.refused} refused "
            f"({r.refused_changed_something} of them changed something); "
            f"final MEMORY.md {r.final_tokens:,} tokens"
        )
        if r.requests:
            line += (
                f"; {r.requests} requests, largest {r.max_request_tokens:,} tokens "
                f"(prompt + max_tokens), {r.requests_over_window} over {SMALL_WINDOW:,}"
            )
        if r.coverage:
            line += f"; coverage {r.share(KINDS, r.coverage):.1f} % of all planted facts"
        print(line)
        for note in r.notes[:3]:
            print(f"    {note}")


if __name__ == "__main__":
    sys.exit(main())
