"""``memd compact-now``: compact agents now, serialized with any running daemon."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from memd.cli.common import (
    load,
    open_audit,
    open_state,
    read_private_text,
    redaction_key,
    state_dir_of,
    warn,
)
from memd.cli.options import ConfigOption, StateDirOption, WorkspaceOption
from memd.cli.recall_index import archive_indexer, prune_follow_up
from memd.core.plan import threshold_too_small
from memd.errors import (
    CommittedUnfinished,
    ConfigError,
    LockTimeout,
    MemdError,
    NothingToCompact,
    describe_error,
)
from memd.fsutil import as_invoking_user, as_owner_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from memd.audit import AuditLog
    from memd.compaction import CompactionOutcome
    from memd.core.config import AgentPolicy, MemdConfig
    from memd.core.summary import Summarizer, SummaryRequest, SummaryResult
    from memd.settings import LoadedConfig
    from memd.state import StateStore
    from memd.workspace import AgentPaths


class _SummarizingAsInvoker:
    """A summarizer whose summaries are made with the invoking user's ids when a
    root ``compact-now`` acts as the state dir's owner (below): the summary
    writes no file, and a litellm model imports its provider's modules lazily
    during the call, which as the owner fail where only root can read this
    Python (:func:`memd.fsutil.as_invoking_user`). Preloading them is not
    enough: which modules a call needs depends on the provider, the litellm
    version and the error met (measured: ~70 for ``openai/``, and still a few
    after a mocked call)."""

    def __init__(self, inner: Summarizer) -> None:
        self._inner = inner

    @property
    def model(self) -> str:
        return self._inner.model

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        with as_invoking_user():
            return self._inner.summarize(request)


def _descriptor_warning(agent: str) -> Callable[[str], None]:
    """How compact-now says an agent's memd-agent.json is refused (the daemon logs
    it): compacted with the config's window instead, the operator is told why."""

    def say(why: str) -> None:
        warn(f"agent {agent!r}: {why}: ignored, the config's window applies (memd doctor)")

    return say


def compact_now(
    agents: Annotated[list[str] | None, typer.Argument(help="Agent names.")] = None,
    all_agents: Annotated[
        bool, typer.Option("--all", help="Every agent in the workspace.")
    ] = False,
    summary: Annotated[
        str | None,
        typer.Option(
            "--summary",
            help="Use this text as the summary (no LLM call). A command line is shown "
            "to every user by ps: for private text use --summary-file.",
        ),
    ] = None,
    summary_file: Annotated[
        Path | None,
        typer.Option(
            "--summary-file",
            help="Use this UTF-8 file's text as the summary (no LLM call); - reads stdin.",
            dir_okay=False,
        ),
    ] = None,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            min=0,
            help="Seconds to wait for a running compaction of the same agent "
            "(default: compaction.lock_wait_s).",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Print the plan (turns, pinned facts, budgets, chunks and calls); "
            "call no model, change nothing.",
        ),
    ] = False,
    summarize: Annotated[
        bool,
        typer.Option(
            "--summarize",
            help="With --dry-run: also run the summarizer and print the block it would "
            "write, still changing nothing.",
        ),
    ] = False,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Compact AGENT… (or --all) now; waits for a compaction already running."""
    # rich's progress machinery costs ~0.15 s to import: only load it here,
    # so `memd status` and friends stay quick to start.
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent
    from memd.core.config import resolve_policy
    from memd.core.secrets import find_secrets
    from memd.descriptor import declared_window
    from memd.modelinfo import context_length_for_model
    from memd.summarizers import make_summarizer, needs_litellm
    from memd.tokenizer import TokenCounter
    from memd.workspace import agent_paths, require_workspace, resolve_agents

    names = agents or []
    if all_agents and names:
        raise typer.BadParameter("give agent names or --all, not both")
    if not all_agents and not names:
        raise typer.BadParameter("name at least one agent, or use --all")
    if summary is not None and summary_file is not None:
        raise typer.BadParameter("give --summary or --summary-file, not both")
    if summary_file is not None:
        summary = read_private_text(summary_file, "summary", "--summary-file")
        if not summary.strip():
            raise typer.BadParameter("the summary file is empty", param_hint="--summary-file")
    if summary is not None and not summary.strip():
        raise typer.BadParameter("--summary must not be empty")
    if summarize and not dry_run:
        raise typer.BadParameter("--summarize only goes with --dry-run")

    loaded = load(workspace, config)
    cfg = loaded.config
    ws = require_workspace(loaded.workspace)
    targets = resolve_agents(ws, names, all_agents)
    # context_compression = false means "count, never compact": --all skips
    # such agents; naming one explicitly is refused rather than overridden.
    # The same window as the daemon's: each agent's memd-agent.json, when it wrote one.
    counter = TokenCounter(cfg.tokenizer.encoding)
    policies: dict[str, AgentPolicy] = {}
    refused = 0
    for name in targets:
        try:
            folder = agent_paths(ws, name).dir
        except MemdError as exc:
            if not all_agents:
                raise
            # As the daemon, status and prune do: --all reports a folder it refuses
            # (a symlink out of the workspace, §1) and compacts the others.
            print(f"memd: error: {exc}", file=sys.stderr)
            refused += 1
            continue
        window = declared_window(folder, counter.count_text, _descriptor_warning(name))
        policy = policies[name] = resolve_policy(cfg, name, context_length_for_model, window)
        too_small = threshold_too_small(policy)
        if too_small:
            warn(f"agent {name!r}: {too_small} (memd doctor)")
    targets = list(policies)
    disabled = [name for name, policy in policies.items() if not policy.compress]
    if disabled and not all_agents:
        raise ConfigError(
            f"agent {disabled[0]!r} has context_compression = false in the config: "
            "memd counts it but never compacts it"
        )
    summarizer: Summarizer = (
        ProvidedSummary(summary)
        if summary is not None
        else make_summarizer(cfg.summarizer, counter.count_text)
    )
    key = redaction_key(loaded, state_dir) if summarize or not dry_run else None
    if dry_run:
        _dry_run(
            ws, targets, disabled, summarizer, cfg, policies, counter.count_text, summarize, key
        )
        if refused:
            sys.exit(1)
        return
    summarizer = _SummarizingAsInvoker(summarizer)
    ledger = _open_ledger(loaded, state_dir)
    index_archive = archive_indexer(loaded, state_dir)
    audit = open_audit(loaded, state_dir)
    after_prune = prune_follow_up(loaded, state_dir, None, "compaction")
    directory = state_dir_of(loaded, state_dir)
    # Loaded now, as this user: a root CLI compacts as the state dir's owner
    # (below), who may not be able to read this Python's files (a root
    # `pip install --user`), and the compaction imports the tokenizer and the
    # secret detector lazily (the reply is always scanned). The summary itself
    # is made as this user (_SummarizingAsInvoker): what litellm imports during
    # a call cannot all be known ahead.
    counter.warm()
    find_secrets("warm up")
    if cfg.privacy.encrypt_archives:
        import cryptography.exceptions
        import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401
    if summary is None and needs_litellm(cfg.summarizer):
        from memd.llm import warm_up

        warm_up()  # a failure is said by the first summary, as the daemon's is
    # One line per agent, however narrow the terminal: greppable, as doctor's.
    out = Console(emoji=False, soft_wrap=True)
    err = Console(stderr=True, emoji=False, soft_wrap=True)  # one line each, however long
    failures = refused
    busy = 0
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not all_agents or not err.is_terminal,
    )
    with progress:
        task = progress.add_task("compacting", total=len(targets))
        for name in targets:
            progress.update(task, description=f"compacting {name}")
            if name in disabled:
                out.print(f"{name}: skipped (context_compression = false)")
                progress.advance(task)
                continue
            paths = agent_paths(ws, name)
            policy = policies[name]
            started = time.time()
            try:
                # Inside the try: one agent's budgets that do not fit its window
                # (its memd-agent.json) fail that agent, not the whole --all run.
                options = dataclasses.replace(
                    CompactionOptions.from_config(cfg, policy, agent=name, redaction_key=key),
                    require_shrink=False,
                    audit=audit,  # an erasure a crash left, finished first
                )
                if wait is not None:
                    options = dataclasses.replace(options, lock_wait_s=wait)
                # A root CLI acts on the agent's files as memd (the state dir's owner)
                # does, as `forget` and `prune` do: the .memd/ it finds is memd's, and it
                # leaves no root-owned .memd/, lock, journal or archive that would lock
                # the daemon's user out of this agent. (The follow-ups below open the
                # index, ledger and audit log as that owner themselves.)
                with as_owner_of(directory):
                    outcome = compact_agent(
                        paths,
                        summarizer,
                        options,
                        count_bytes=counter.count_bytes,
                        manual=summary is not None,
                    )
            except NothingToCompact as exc:
                out.print(f"{name}: {str(exc).split(': ', 1)[-1]}", markup=False, highlight=False)
            except CommittedUnfinished as exc:
                # Committed, then a step after the swap failed (the folder's fsync,
                # moving a late writer's turns): retried once at once, as the
                # daemon's finish job would (a transient EIO often clears).
                finished, message = _finish_at_once(paths, cfg, directory, exc)
                if finished:
                    # Committed and finished: a compaction like any other (its
                    # figures went with the transaction's error, so none are kept).
                    _record(ledger, name, started, None, error=None)
                    err.print(
                        f"memd: warning: {message}", markup=False, highlight=False, soft_wrap=True
                    )
                    out.print(
                        f"{name}: compacted; a step after its commit failed, a second try "
                        f"finished it ({finished})",
                        markup=False,
                        highlight=False,
                        soft_wrap=True,
                    )
                else:
                    failures += 1
                    _record(ledger, name, started, None, error=message)
                    if not all_agents and len(targets) == 1:
                        raise CommittedUnfinished(message) from exc
                    err.print(
                        f"memd: error: {message}", markup=False, highlight=False, soft_wrap=True
                    )
            except MemdError as exc:
                if all_agents and isinstance(exc, LockTimeout):
                    # --all asks for the fleet to be compacted: an agent another
                    # process is compacting right now (the daemon, most often) is
                    # being done, not failed; said as the other skips are, no exit 1.
                    out.print(f"{name}: skipped (busy: {exc})", markup=False, highlight=False)
                    progress.advance(task)
                    continue
                if isinstance(exc, LockTimeout):
                    # A lock held elsewhere (the daemon compacting, forget, prune) is
                    # no failed compaction: nothing was tried. Recorded, it would
                    # show as the agent's last error in `memd status` and `history`;
                    # named, it is exit 4 (busy), as for one agent, unless another failed.
                    busy += 1
                else:
                    failures += 1
                    _record(ledger, name, started, None, error=str(exc))
                if not all_agents and len(targets) == 1:
                    raise
                err.print(f"memd: error: {exc}", markup=False, highlight=False)
            else:
                # Handed on once the agent's lock is let go (each reports its own failure).
                with contextlib.suppress(Exception):
                    index_archive(paths, outcome.archive)
                if outcome.pruned is not None and outcome.pruned.deleted:
                    with contextlib.suppress(Exception):
                        after_prune(paths, outcome.pruned)
                _record(ledger, name, started, outcome, error=None)
                _audit(audit, name, outcome, cfg)
                pins = f"; {outcome.pinned} pinned fact(s)" if outcome.pinned else ""
                if outcome.evicted:
                    pins += f" ({outcome.evicted} aged out to the archives)"
                if outcome.carried:
                    pins += f"; {outcome.carried} line(s) the summary left out kept verbatim"
                partial = (
                    "; partial: newer turns stay raw for the next compaction"
                    if outcome.partial
                    else ""
                )
                pruned = outcome.pruned
                if pruned is not None and pruned.deleted:
                    partial += f"; pruned {len(pruned.deleted)} old archive(s) (retention)"
                if outcome.prune_error:
                    err.print(
                        f"memd: warning: agent {name!r}: retention after the compaction failed: "
                        f"{outcome.prune_error}",
                        markup=False,
                        highlight=False,
                    )
                if outcome.redacted or outcome.reply_redacted:
                    partial += f"; {outcome.redacted + outcome.reply_redacted} secret(s) redacted"
                out.print(
                    f"{name}: compacted {outcome.tokens_before:,} → {outcome.tokens_after:,} "
                    f"tokens; archive {outcome.archive.name} ({outcome.duration_s:.1f}s)"
                    f"{pins}{partial}",
                    markup=False,
                    highlight=False,
                )
            progress.advance(task)
    if failures:
        sys.exit(1)
    if busy:
        sys.exit(LockTimeout.exit_code)


# How long the retry of a committed but unfinished compaction waits for the agent's
# lock: a running daemon that saw the new MEMORY.md may be finishing it already.
FINISH_LOCK_WAIT_S = 2.0


def _finish_at_once(
    paths: AgentPaths, cfg: MemdConfig, directory: Path, error: CommittedUnfinished
) -> tuple[str | None, str]:
    """Run the journal's roll-forward (the recovery a restart runs) once, right after
    a compaction that committed but did not finish. Returns what finished it (None:
    not finished) and the line that says what happened."""
    from memd.compaction import archive_key_file, recover_agent

    try:
        with as_owner_of(directory):
            done = recover_agent(
                paths,
                wait_s=FINISH_LOCK_WAIT_S,
                quiet_s=cfg.compaction.drain_quiet_s,
                max_s=cfg.compaction.drain_max_s,
                key_file=archive_key_file(cfg),
                busy_raises=True,
            )
    except LockTimeout:
        return None, (
            f"{error}; another process holds the agent's lock (a running daemon "
            "finishing it, which it does as soon as it sees the new MEMORY.md)"
        )
    except (MemdError, OSError) as again:
        return None, (
            f"{error}; retried at once: {describe_error(again)}; the late turns stay "
            "in .memd/drain.md until a running daemon finishes it (with backoff), "
            "or the agent's next compaction or `memd run`'s start does"
        )
    return done or "another process finished it first", f"{error}; retried at once: finished"


def _open_ledger(loaded: LoadedConfig, state_dir: Path | None) -> StateStore | None:
    # The ledger is what `memd history` and `memd status` read; failing to open
    # it must not stop a manual compaction.
    try:
        return open_state(loaded, state_dir)
    except Exception:
        return None


def _record(
    ledger: StateStore | None,
    agent: str,
    started: float,
    outcome: CompactionOutcome | None,
    error: str | None,
) -> None:
    if ledger is None:
        return
    from memd.state import LedgerEntry

    entry = LedgerEntry.of(
        agent,
        "compact-now",
        started_at=started,
        duration_s=outcome.duration_s if outcome else time.time() - started,
        outcome=outcome,
        error=error,
    )
    with contextlib.suppress(Exception):  # the compaction itself already happened
        ledger.record_compaction(entry)


def _audit(audit: AuditLog, agent: str, outcome: CompactionOutcome, cfg: MemdConfig) -> None:
    from memd.audit import record_compaction

    # The compaction is committed: a failure here is logged by the audit log itself.
    record_compaction(
        audit,
        agent,
        outcome,
        trigger="manual",
        api_base=cfg.summarizer.api_base,
        local_hosts=cfg.privacy.local_hosts,
    )


def _dry_run(
    ws: Path,
    targets: list[str],
    disabled: list[str],
    summarizer: Summarizer,
    cfg: MemdConfig,
    policies: dict[str, AgentPolicy],
    count_text: Callable[[str], int],
    summarize: bool,
    key: bytes | None,
) -> None:
    from memd.compaction import CompactionOptions
    from memd.compaction_preview import preview
    from memd.workspace import agent_paths

    failures = 0
    for name in targets:
        if name in disabled:
            print(f"{name}: skipped (context_compression = false)")
            continue
        try:
            options = CompactionOptions.from_config(
                cfg, policies[name], agent=name, redaction_key=key
            )
            lines = preview(
                agent_paths(ws, name), summarizer, options, count_text, summarize=summarize
            )
        except NothingToCompact as exc:
            print(f"{name}: {str(exc).split(': ', 1)[-1]}")
            continue
        except MemdError as exc:
            if len(targets) == 1:
                raise
            failures += 1
            print(f"memd: error: {exc}", file=sys.stderr)
            continue
        print("\n".join(lines))
    if failures:
        sys.exit(1)
