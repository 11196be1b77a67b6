"""Operator commands: ``memd health``, ``memd history``, ``memd doctor``, ``memd config check``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from memd.cli.common import ago, iso_utc, load, local_time, open_state
from memd.cli.options import (
    ConfigOption,
    JsonOption,
    StateDirOption,
    WorkspaceOption,
    path_value,
)
from memd.cli.status_query import heartbeat_max_age
from memd.errors import ConfigError, MemdError, UnknownAgent
from memd.settings import LoadedConfig, locate_state_dir, resolve_state_dir
from memd.state import LedgerEntry
from memd.workspace import agent_paths, require_workspace

if TYPE_CHECKING:
    from memd.pointer import StatePointer


class Unhealthy(MemdError, RuntimeError):
    """No running, healthy daemon on the workspace (``memd health`` exits 1)."""

    exit_code = 1


class DoctorFailed(MemdError, RuntimeError):
    exit_code = 1


# ---------------------------------------------------------------------- health


def health(
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
    max_age: Annotated[
        float | None,
        typer.Option(
            "--max-age",
            min=0,
            help="Seconds a heartbeat stays fresh (default: 3 × daemon.state_flush_s).",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Exit 0 when a daemon runs on the workspace and is healthy, else 1 with the reason."""
    loaded = load(workspace, config)
    from memd.workspace import require_workspace

    # A mistyped workspace is said (exit 2), and leaves no empty state DB behind.
    require_workspace(loaded.workspace)
    limit = heartbeat_max_age(loaded.config) if max_age is None else max_age
    now = time.time()
    with open_state(loaded, state_dir) as store:
        beat = store.read_heartbeat()
        # Say where the answer comes from: a different state dir (another
        # --config) is the usual reason for "offline" while a daemon runs.
        state_db = str(store.path or "(in memory)")
        found_by = store.found_by
        where = f"state {state_db}, from {found_by}"
    reason = None
    if beat is None:
        reason = f"no daemon has run on workspace {loaded.workspace} (no heartbeat in {where})"
    elif beat.stopped:
        stamp = local_time(beat.ts, now)
        reason = f"daemon pid {beat.pid} stopped at {stamp} (a clean stop; {where})"
    elif not beat.pid_alive():
        # Before the heartbeat's age: a daemon killed (SIGKILL, OOM) is gone, which
        # says more than that it stopped beating.
        reason = (
            f"daemon pid {beat.pid} is not running (gone; its last heartbeat "
            f"{ago(now - beat.ts)}; {where})"
        )
    elif not beat.is_fresh(now, limit):
        reason = f"daemon heartbeat is stale: last {ago(now - beat.ts)} (limit {limit:g}s; {where})"
    elif not beat.healthy:
        reason = f"daemon pid {beat.pid} reports unhealthy: {beat.detail or 'no detail'}"
    if as_json:
        payload = {
            "healthy": reason is None,
            "reason": reason,
            "workspace": str(loaded.workspace),
            "pid": beat.pid if beat else None,
            "heartbeat_at": iso_utc(beat.ts) if beat else None,
            "heartbeat_age_s": round(now - beat.ts, 3) if beat else None,
            "started_at": iso_utc(beat.started_at) if beat else None,
            "agents": beat.agents if beat else None,
            "detail": beat.detail if beat else None,
            "stopped_at": iso_utc(beat.ts) if beat and beat.stopped else None,
            "state_db": state_db,
            "state_found_by": found_by,
        }
        print(json.dumps(payload, indent=2))
    if reason is not None:
        raise Unhealthy(reason)
    assert beat is not None
    if not as_json:
        print(
            f"healthy: daemon pid {beat.pid}, {beat.agents} agents, "
            f"heartbeat {ago(now - beat.ts)}"
            + (f" ({beat.detail})" if beat.detail else "")
            + f"; {where}"
        )


# --------------------------------------------------------------------- history


def _entry_json(entry: LedgerEntry) -> dict[str, Any]:
    return {
        "agent": entry.agent,
        "started_at": iso_utc(entry.started_at),
        "duration_s": round(entry.duration_s, 3),
        "trigger": entry.trigger,
        "ok": entry.ok,
        "archive": entry.archive,
        "tokens_before": entry.tokens_before,
        "tokens_after": entry.tokens_after,
        "model": entry.model,
        "cost_usd": entry.cost_usd,
        "error": entry.error,
        # Since schema 3 (null in older rows): what the compaction produced apart
        # from what writers appended meanwhile; the builtin fallback; pins.
        "tokens_produced": entry.tokens_produced,
        "tokens_appended": entry.tokens_appended,
        "fallback": entry.fallback,
        "pinned": entry.pinned,
        "evicted": entry.evicted,
        "calls": entry.calls,
    }


def history(
    agent: Annotated[str, typer.Argument(help="The agent.", show_default=False)],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Newest N entries.")] = 50,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """The agent's compaction ledger, newest first (time, archive, tokens, model, cost, error)."""
    loaded = load(workspace, config)
    require_workspace(loaded.workspace)
    paths = agent_paths(loaded.workspace, agent, must_exist=False)
    with open_state(loaded, state_dir) as store:
        entries = store.history(agent, limit=limit)
    if not entries and not paths.dir.is_dir():
        raise UnknownAgent(f"unknown agent {agent!r}: no folder {paths.dir} and no history")
    if as_json:
        print(json.dumps([_entry_json(e) for e in entries], indent=2))
        return
    if not entries:
        print(f"agent {agent!r}: no compactions recorded")
        return
    _history_table(agent, entries)


def _history_table(agent: str, entries: list[LedgerEntry]) -> None:
    import sys

    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    now = time.time()
    table = Table(title=f"memd history: {agent}", title_justify="left")
    columns = ("started", "took", "trigger", "tokens", "pins", "archive", "model", "cost", "result")
    for column in columns:
        table.add_column(column, no_wrap=column != "result", overflow="fold")
    for entry in entries:
        model = entry.model or ""
        if entry.fallback:
            model = f"{model} (fallback)"
        table.add_row(
            local_time(entry.started_at, now),
            f"{entry.duration_s:.1f}s",
            entry.trigger,
            ledger_tokens(entry),
            ledger_pins(entry),
            Path(entry.archive).name if entry.archive else "",
            escape(model),
            f"${entry.cost_usd:.4f}" if entry.cost_usd is not None else "",
            "ok" if entry.ok else f"[red]{escape(entry.error or '')}[/]",
        )
    # emoji=False: rich would import its 3,600-entry emoji table (~0.1 s) to scan for :codes:.
    Console(width=None if sys.stdout.isatty() else 200, emoji=False).print(table)


def ledger_tokens(entry: LedgerEntry) -> str:
    """``before → produced`` and, apart, what writers appended meanwhile: a compaction
    that ran while agents wrote must not read as if it grew the file."""
    if entry.tokens_produced is not None:
        text = f"{entry.tokens_before or 0:,} → {entry.tokens_produced:,}"
        if entry.tokens_appended:
            text += f" (+{entry.tokens_appended:,} appended meanwhile)"
        return text
    if entry.tokens_after:  # a row from before schema 3
        return f"{entry.tokens_before or 0:,} → {entry.tokens_after:,}"
    return ""


def ledger_pins(entry: LedgerEntry) -> str:
    if entry.pinned is None:
        return ""
    return f"{entry.pinned:,}" + (f" ({entry.evicted:,} evicted)" if entry.evicted else "")


# ---------------------------------------------------------------------- doctor


def doctor(
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
    as_json: JsonOption = False,
    offline: Annotated[
        bool,
        typer.Option("--offline", help="Skip the summarizer's real 1-token request."),
    ] = False,
) -> None:
    """Check this host: inotify limits, workspace access, locks, filesystem, tokenizer, LLM."""
    from memd.doctor import run_checks, worst

    loaded = load(workspace, config)
    # Unchecked: a state dir that is a file is doctor's `fail state dir`, beside
    # every other check (other commands refuse it in one line).
    directory = locate_state_dir(state_dir, loaded)[0]
    # The daemon's settings are checked when the command took them (no --config).
    followed = None if loaded.config_explicit else loaded.pointer
    checks = run_checks(
        loaded.config,
        loaded.workspace,
        directory,
        offline=offline,
        pointer=followed,
        own_overrides=loaded.env_overrides,
    )
    overall = worst(checks)
    if as_json:
        print(json.dumps({"result": overall, "checks": [c.to_json() for c in checks]}, indent=2))
    else:
        from rich.console import Console
        from rich.markup import escape

        # One line per check, however narrow the terminal: greppable in CI logs.
        console = Console(highlight=False, soft_wrap=True, emoji=False)
        colour = {"ok": "green", "warn": "yellow", "fail": "red"}
        for check in checks:
            label = f"[{colour[check.status]}]{check.status:<4}[/]"
            console.print(f"{label} {check.name}: {escape(check.message)}")
            if check.fix and check.status != "ok":
                console.print(f"     fix: {escape(check.fix)}")
    failed = [c.name for c in checks if c.status == "fail"]
    if failed:
        raise DoctorFailed(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}")


# ---------------------------------------------------------------- config check

config_app = typer.Typer(
    name="config",
    help="Inspect the configuration.",
    no_args_is_help=True,
    add_completion=False,
)

MASK = "********"


def effective_config(loaded: LoadedConfig) -> dict[str, Any]:
    """The validated config as plain data, secrets masked."""
    data: dict[str, Any] = loaded.config.model_dump(mode="json")
    secret = loaded.config.summarizer.api_key.get_secret_value()
    data["summarizer"]["api_key"] = MASK if secret else ""
    return data


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if value is None:
        return '""'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a valid TOML string


def render_toml(data: dict[str, Any]) -> str:
    lines: list[str] = []
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    for key, value in scalars.items():
        lines.append(f"{key} = {_toml_value(value)}")
    for section, table in data.items():
        if not isinstance(table, dict) or section == "agents":
            continue
        lines.append("")
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in table.items())
    for pattern, override in (data.get("agents") or {}).items():
        lines.append("")
        lines.append(f"[agents.{json.dumps(pattern)}]")
        lines.extend(
            f"{key} = {_toml_value(value)}" for key, value in override.items() if value is not None
        )
    return "\n".join(lines) + "\n"


def _daemon_pointer(loaded: LoadedConfig) -> StatePointer | None:
    """The workspace's running daemon's pointer: its config file and the settings
    it applies over it (its environment's, e.g. systemd's EnvironmentFile=), what
    every other command there uses when no config is named."""
    from memd.pointer import PointerRefused, read_pointer

    try:
        return read_pointer(loaded.workspace)
    except (PointerRefused, OSError):
        return None


@config_app.command("check")
def config_check(
    file: Annotated[
        Path | None,
        typer.Argument(
            help="Config file to check (default: --config, MEMD_CONFIG, /etc/memd/memd.toml).",
            show_default=False,
            parser=path_value,  # memd says a bad path in one line, not a usage box
            metavar="FILE",
        ),
    ] = None,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Validate a config file and print the effective config (env overrides applied)."""
    chosen = file if file is not None else config
    try:
        loaded = load(workspace, chosen, follow_pointer=False)
        pointer = None if loaded.config_explicit else _daemon_pointer(loaded)
        if pointer is not None and pointer.config is not None and pointer.config != loaded.source:
            # No file named: the one the running daemon applies is the one that
            # matters (started with --config or MEMD_CONFIG in its environment),
            # as every other command on its workspace takes it.
            chosen = pointer.config
            loaded = load(loaded.workspace, chosen, follow_pointer=False)
    except ConfigError as exc:
        # Every error at once (not only the first), in both forms.
        if as_json:
            failed: dict[str, Any] = {
                "valid": False,
                "source": str(chosen) if chosen is not None else None,
                "errors": list(exc.problems),
                # The keys every --json command's failure carries (README "Commands").
                "error": str(exc),
                "exit_code": exc.exit_code,
            }
            print(json.dumps(failed, indent=2))
        # On stderr in both forms, as every command says its errors.
        for problem in exc.problems:
            print(f"memd: error: {problem}", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    if workspace is not None:
        # Named on the command line: a mistyped one is said, as every other
        # command says it (a config is checked without any workspace otherwise).
        from memd.workspace import require_workspace

        require_workspace(loaded.workspace)
    # Windows from an agent's model (litellm's map) are known only now.
    from memd.modelinfo import context_length_for_model
    from memd.settings import model_window_problems

    problems = model_window_problems(loaded.config, context_length_for_model)
    if problems:
        if as_json:
            invalid = {
                "valid": False,
                "source": str(loaded.source),
                "errors": problems,
                "error": problems[0],
                "exit_code": 2,
            }
            print(json.dumps(invalid))
        for problem in problems:
            print(f"memd: error: {problem}", file=sys.stderr)
        raise typer.Exit(2)
    data = effective_config(loaded)
    source = str(loaded.source) if loaded.source else "(no file: defaults)"
    if pointer is not None and pointer.config is not None and loaded.source == pointer.config:
        source += f" (the running daemon's, named by its pointer {pointer.path})"
    daemons = pointer if pointer is not None and pointer.settings else None
    if as_json:
        payload: dict[str, Any] = {
            "valid": True,
            "source": source,
            "env_overrides": list(loaded.env_overrides),
            "config": data,
        }
        if daemons is not None:
            payload["daemon_pointer"] = str(daemons.path)
            payload["daemon_settings"] = dict(daemons.settings)
        print(json.dumps(payload, indent=2))
        return
    print(f"# valid: {source}")
    if loaded.env_overrides:
        print(f"# overridden by environment: {', '.join(loaded.env_overrides)}")
    if daemons is not None:
        shown = ", ".join(
            f"{section}.{key} = {_toml_value(value)}"
            for section, values in daemons.settings.items()
            for key, value in values.items()
        )
        print(
            f"# the running daemon also applies (its pointer {daemons.path}): {shown}; "
            "commands on its workspace use them"
        )
    state_dir = resolve_state_dir(None, loaded.config.state_dir, os.environ)
    print(f"# state dir: {state_dir}")
    print(render_toml(data), end="")


__all__ = [
    "DoctorFailed",
    "Unhealthy",
    "config_app",
    "config_check",
    "doctor",
    "effective_config",
    "health",
    "history",
    "ledger_pins",
    "ledger_tokens",
    "render_toml",
]
