"""``memd prune [AGENT] [--dry-run]``: apply the retention policy now.

Each agent's limits come from ``[retention]`` and its ``[agents."glob"]``
tables. The deletion runs under the agent's compaction lock (waiting for a
compaction in flight, like ``forget``), after finishing a crashed compaction;
it is logged on stdout by archive name and size, audited, and the recall
index drops the deleted archives' rows. ``--dry-run`` lists what would go and
changes nothing (no lock, no audit record).
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memd.cli.common import load, open_audit, size_text, state_dir_of
from memd.cli.options import ConfigOption, JsonOption, StateDirOption, WorkspaceOption
from memd.cli.recall_index import prune_follow_up
from memd.core.config import resolve_retention
from memd.errors import MemdError, describe_error
from memd.fsutil import as_owner_of

if TYPE_CHECKING:
    from memd.retention import PruneResult


def prune_command(
    agent: Annotated[
        str | None,
        typer.Argument(help="Only this agent (default: every agent).", show_default=False),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be deleted; change nothing.")
    ] = False,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            min=0,
            help="Seconds to wait for a compaction in flight (default: compaction.lock_wait_s).",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Delete the archives the retention policy no longer keeps (the config's retention section)."""
    from memd.compaction import CompactionOptions, prune_agent
    from memd.workspace import agent_paths, require_workspace, resolve_agents

    loaded = load(workspace, config)
    cfg = loaded.config
    ws = require_workspace(loaded.workspace)
    # "" is a name (refused as empty), not "every agent": only None means every one.
    targets = resolve_agents(ws, [] if agent is None else [agent], all_agents=agent is None)
    audit = open_audit(loaded, state_dir)
    after_prune = prune_follow_up(loaded, state_dir, audit, "cli")
    lock_wait = cfg.compaction.lock_wait_s if wait is None else wait
    options = CompactionOptions.from_config(cfg)
    directory = state_dir_of(loaded, state_dir)

    reports: list[dict[str, Any]] = []
    failures = 0
    for name in targets:
        limits = resolve_retention(cfg, name)
        if not limits.active:
            reports.append({"agent": name, "limits": None, "deleted": [], "bytes": 0})
            if not as_json:
                print(f"{name}: no retention limit set; nothing to do")
            continue
        try:
            # A root CLI acts on the agent's files as memd (the state dir's owner)
            # does: the .memd/ it finds is memd's, and it leaves no root-owned file.
            paths = agent_paths(ws, name)
            with as_owner_of(directory):
                pruned = prune_agent(
                    paths,
                    limits,
                    dry_run=dry_run,
                    lock_wait_s=lock_wait,
                    quiet_s=options.drain_quiet_s,
                    max_s=options.drain_max_s,
                    key_file=options.key_file,
                    audit=audit,
                )
                if pruned.deleted:
                    # Audited and dropped from recall once the agent's lock is let go;
                    # each step reports its own failure, the archives are gone regardless.
                    with contextlib.suppress(Exception):
                        after_prune(paths, pruned)
        except (MemdError, OSError) as exc:
            failures += 1
            message = describe_error(exc)
            if agent is not None:
                raise MemdError(f"agent {name!r}: prune failed: {message}") from None
            print(f"memd: error: agent {name!r}: prune failed: {message}", file=sys.stderr)
            continue
        reports.append(_report(pruned))
        if not as_json:
            _print(pruned)
    if as_json:
        print(json.dumps({"dry_run": dry_run, "agents": reports}, indent=2))
    if failures:
        sys.exit(1)


def _report(pruned: PruneResult) -> dict[str, Any]:
    names = [info.name for info in pruned.plan.delete] if pruned.dry_run else pruned.deleted
    return {
        "agent": pruned.agent,
        "limits": pruned.limits.describe(),
        "deleted": list(names),
        "bytes": pruned.plan.bytes if pruned.dry_run else pruned.deleted_bytes,
        "reasons": {name: list(why) for name, why in pruned.plan.reasons.items()},
        "kept": pruned.kept,
    }


def _print(pruned: PruneResult) -> None:
    plan = pruned.plan
    verb = "would delete" if pruned.dry_run else "deleted"
    names = [info.name for info in plan.delete] if pruned.dry_run else list(pruned.deleted)
    size = plan.bytes if pruned.dry_run else pruned.deleted_bytes
    if not names:
        print(f"{pruned.agent}: nothing to prune ({pruned.limits.describe()}; {pruned.kept} kept)")
        return
    print(
        f"{pruned.agent}: {verb} {len(names)} archive(s), {size_text(size)} "
        f"({pruned.limits.describe()}; {pruned.kept} kept)"
    )
    for name in names:
        why = ", ".join(plan.reasons.get(name, ()))
        print(f"  {name}  ({why})")


__all__ = ["prune_command"]
