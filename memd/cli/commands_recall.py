"""``memd recall AGENT QUERY``: search an agent's raw history (archives + live file).

The query is plain text ("where is the kalomiren report?"), never FTS syntax.
Before searching, the agent's index is brought up to date with its files
(archives a crash left unindexed, the live MEMORY.md), so an answer always
covers the agent's whole history. ``--reindex [AGENT]`` rebuilds from scratch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from memd.cli.common import load
from memd.cli.options import ConfigOption, JsonOption, StateDirOption, WorkspaceOption
from memd.cli.recall_index import open_recall_index
from memd.core.names import validate_agent_name
from memd.core.recall import Highlighted, RecallQueryError, excerpt, since_epoch
from memd.errors import MemdError, UnknownAgent
from memd.recall.index import RecallHit
from memd.settings import LoadedConfig
from memd.workspace import AgentPaths, agent_paths, list_agents, require_workspace


def _print_hits(hits: list[RecallHit], question: str) -> None:
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True, emoji=False)
    if not hits:
        console.print(f"no entry matches {question!r}", markup=False)
        return
    for rank, hit in enumerate(hits, start=1):
        where = "live MEMORY.md" if hit.source == "MEMORY.md" else hit.source
        head = Text(f"{rank}. ", style="bold")
        head.append(f"{hit.role} — {hit.timestamp}", style="cyan")
        head.append(f"  ({where} @ byte {hit.offset})", style="dim")
        console.print(head)
        shown = excerpt(_highlighted(hit))
        body = Text("   " + shown.text)
        for start, end in shown.spans:
            body.stylize("bold yellow", start + 3, end + 3)
        console.print(body)
        console.print()


def _highlighted(hit: RecallHit) -> Highlighted:
    return Highlighted(hit.text, hit.matches)


def recall_command(
    agent: Annotated[
        str | None, typer.Argument(help="The agent whose history to search.", show_default=False)
    ] = None,
    query: Annotated[
        str | None,
        typer.Argument(
            help="A plain-text question, e.g. 'where is the report?'", show_default=False
        ),
    ] = None,
    limit: Annotated[int, typer.Option("-n", "--limit", help="Results to show (1..100).")] = 5,
    since: Annotated[
        str | None,
        typer.Option(
            "--since",
            help="Only entries at or after this ISO date/time (local).",
            show_default=False,
        ),
    ] = None,
    role: Annotated[
        str | None,
        typer.Option(
            "--role", help="Only entries of this role (e.g. Human, AI).", show_default=False
        ),
    ] = None,
    reindex: Annotated[
        bool,
        typer.Option("--reindex", help="Rebuild the index of AGENT (or of every agent) and exit."),
    ] = False,
    as_json: JsonOption = False,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Search an agent's raw history: every archive and the live MEMORY.md."""
    loaded = load(workspace, config)
    require_workspace(loaded.workspace)
    if reindex:
        if query is not None:
            raise RecallQueryError("--reindex takes at most an agent name, not a query")
        _reindex(loaded, state_dir, agent)
        return
    if agent is None or query is None:
        raise RecallQueryError("usage: memd recall AGENT QUERY (or memd recall --reindex [AGENT])")
    paths = agent_paths(loaded.workspace, agent)
    since_at = since_epoch(since) if since is not None else None
    with open_recall_index(loaded, state_dir) as index:
        index.sync_agent(paths)
        hits = index.search(agent, query, limit=limit, since_epoch=since_at, role=role)
        roles = index.roles_if_absent(agent, role) if role and not hits else None
    if roles is not None:
        # A mistyped role matched nothing, silently: said, with the agent's roles.
        having = f"its roles: {', '.join(roles)}" if roles else "it has no entries"
        print(
            f"memd: note: agent {agent!r} has no entry of role {role!r} ({having})",
            file=sys.stderr,
        )
    if as_json:
        json.dump([hit.as_json() for hit in hits], sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        _print_hits(hits, query)


def _reindex(loaded: LoadedConfig, state_dir: Path | None, agent: str | None) -> None:
    """Rebuild the index of ``agent`` (or of every agent) from what memd can read now.

    An agent whose folder is refused (a symlink out of the workspace, a
    MEMORY.md or archive folder leaving its folder: DESIGN.md §1) or gone keeps
    no rows: its last indexed text is not kept, and scrubbed from the index
    file, as a folder that is gone is. Named explicitly, its error is then
    raised; for every agent it is reported and the others are reindexed.
    """
    if agent is not None:
        validate_agent_name(agent)  # a bad name leaves the index alone
    names = [agent] if agent is not None else list_agents(loaded.workspace)
    targets: list[AgentPaths] = []
    unreadable: list[tuple[str, MemdError]] = []
    for name in names:
        try:
            targets.append(agent_paths(loaded.workspace, name))
        except MemdError as exc:
            unreadable.append((name, exc))
    with open_recall_index(loaded, state_dir) as index:
        indexed = set(index.agents())
        if agent is None:
            # Agents whose folders are gone keep no rows.
            for stale in sorted(indexed - set(names)):
                index.erase_agent(stale)
                print(f"{stale}: folder gone; its rows were erased")
        for name, problem in unreadable:
            if name in indexed:
                index.erase_agent(name)
                why = "folder gone" if isinstance(problem, UnknownAgent) else "folder refused"
                print(f"{name}: {why}; its rows were erased")
            if agent is None:
                # As the daemon does: the refused folder is reported, the others go on.
                print(f"memd: error: {problem}", file=sys.stderr)
        for paths in targets:
            try:
                report = index.reindex_agent(paths)
            except MemdError as exc:
                # Refused once pinned (a symlinked archive/ inside its folder): as
                # a folder refused above, it keeps no rows and the others go on.
                index.erase_agent(paths.agent)
                print(f"{paths.agent}: folder refused; its rows were erased")
                unreadable.append((paths.agent, exc))
                if agent is None:
                    print(f"memd: error: {exc}", file=sys.stderr)
                continue
            print(f"{paths.agent}: {report.describe()}")
    if unreadable:
        if agent is not None:
            raise unreadable[0][1]
        sys.exit(1)


__all__ = ["recall_command"]
