"""``memd reload``: make the running daemon reload its config, and say whether it
took it (systemd's ``ExecReload=``, ``docker exec … memd reload``).

A bare SIGHUP cannot fail: the daemon refuses a bad config, keeps the one it
runs with and says so in its log, while ``kill -HUP`` (and ``systemctl
reload`` with it) exits 0. This command checks the config first, as the daemon
will read it (its config file and the settings of its environment, through its
pointer in the workspace: :func:`memd.cli.common.load`); a config with a
problem is not sent at all (exit 2, each problem on its own line). Whether
the tokenizer encoding's file can be found is the daemon's to say (it looks
with its own ``TIKTOKEN_CACHE_DIR``, and refuses a reload it cannot load the
encoding of): this command's own look-up only adds to that answer. Then the
signal, and the wait for the daemon's answer: the ``config_reload`` record it
appends to the workspace's audit log after every reload, applied or refused.
The answer to *this* signal is the first record of that daemon whose reload
began (``started_ns``, CLOCK_MONOTONIC, taken before the daemon reads the file)
after the signal was sent: a reload already under way when the command started
may have read the file before its edit, and two ``memd reload`` at once each
wait for a reload that began after their own signal (SIGHUPs sent while a
reload runs make one more, never none). The daemon also keeps its last
reload, the same fields, in the state DB (:class:`memd.state.ReloadOutcome`),
with why its audit record could not be written: a log it cannot write
(unwritable, full) no longer leaves a reload it made unconfirmed, and is named
in a warning. Exit 0 when it was applied, 2 when the daemon refused it, 1 when
no daemon runs or none answered within ``--timeout`` (the one line says what
each place lacked, or why it could not be read).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated

import typer

from memd.cli.common import load, open_state, state_dir_of
from memd.cli.options import ConfigOption, StateDirOption, WorkspaceOption
from memd.core.audit import AuditEvent, AuditRecord, FieldValue
from memd.errors import ConfigError, MemdError, describe_error
from memd.fsutil import as_owner_of
from memd.settings import LoadedConfig
from memd.state import ReloadOutcome, StateError, StateStore, is_memd_daemon, pid_alive
from memd.workspace import require_workspace

# How often the audit log is read while waiting (the daemon's main loop takes a
# SIGHUP within its 0.2 s tick).
POLL_S = 0.1


class ReloadRefused(MemdError, RuntimeError):
    """The config has a problem (or the daemon refused it): it keeps the previous one."""

    exit_code = 2


class ReloadFailed(MemdError, RuntimeError):
    """No daemon to reload, or none answered."""

    exit_code = 1


def reload_command(
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
    pid: Annotated[
        int | None,
        typer.Option(
            "--pid",
            min=1,
            help="The daemon's pid (systemd: $MAINPID; default: the one whose heartbeat "
            "is in the workspace's state DB).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option("--timeout", min=0, help="Seconds to wait for the daemon's answer."),
    ] = 60.0,
) -> None:
    """Reload the running daemon's config: exit 0 once it applied it, 2 when it has
    a problem (the daemon keeps the previous one), 1 when no daemon answered."""
    try:
        loaded = load(workspace, config, strict=True)
    except ConfigError as exc:
        raise _refused(exc.problems) from None
    local_problem = _encoding_problem(loaded.config.tokenizer.encoding)
    require_workspace(loaded.workspace)  # a mistyped one: its own line, no state DB made
    directory = state_dir_of(loaded, state_dir)
    if pid is None:
        pid = _daemon_pid(loaded, state_dir)
    elif is_memd_daemon(pid) is False:
        raise ReloadFailed(f"pid {pid} is not a running memd daemon (memd run)")
    from memd.audit import audit_path

    follow = _Answers(audit_path(directory, loaded.workspace), _open_store(directory, loaded))
    if not follow.readable():
        raise ReloadFailed(
            f"cannot follow the reload of daemon pid {pid} (not signalled): {follow.unread()}"
        )
    since_ns = time.monotonic_ns()
    try:
        os.kill(pid, signal.SIGHUP)
    except OSError as exc:
        follow.close()
        raise ReloadFailed(
            f"cannot signal daemon pid {pid}: {describe_error(exc)} "
            "(run memd reload as the daemon's user or root)"
        ) from None
    try:
        record = wait_for_answer(follow, pid, since_ns, timeout, alive=pid_alive)
    finally:
        follow.close()
    if record is None:
        if not pid_alive(pid):
            raise ReloadFailed(f"daemon pid {pid} stopped before it answered the reload")
        raise ReloadFailed(
            f"daemon pid {pid} did not answer the reload within {timeout:g}s "
            f"({follow.unread()}; its log says why)"
        )
    audit_error = record.fields.get("audit_error")
    if isinstance(audit_error, str):
        print(
            f"memd: warning: daemon pid {pid} could not write the reload to its audit log "
            f"{follow.log}: {audit_error}",
            file=sys.stderr,
        )
    if record.fields.get("ok") is not True:
        errors = record.fields.get("errors")
        count = f"{errors} problem{'s' if errors != 1 else ''}" if isinstance(errors, int) else ""
        raise ReloadRefused(
            f"daemon pid {pid} refused the configuration"
            + (f" ({count})" if count else "")
            + " and keeps the previous one; its log says why"
            + (f" (here: {local_problem})" if local_problem else "")
        )
    changed = record.fields.get("changed")
    sections = ", ".join(changed) if isinstance(changed, tuple) and changed else "nothing"
    source = loaded.pointer.config if loaded.pointer is not None else loaded.source
    print(
        f"reloaded: daemon pid {pid} applied "
        f"{source if source is not None else 'its settings'} (changed: {sections})"
    )


def _encoding_problem(encoding: str) -> str | None:
    """Why this command cannot find the encoding's BPE file, or None.

    Not a reason to withhold the signal: the daemon looks with its own
    environment (its ``TIKTOKEN_CACHE_DIR``, which a shell's may not be), and a
    daemon that cannot load the encoding refuses the reload whole, which is its
    answer (exit 2). What this command found is added to that answer."""
    from memd.errors import TokenizerError
    from memd.tokenizer import locate_encoding

    try:
        locate_encoding(encoding)
    except TokenizerError as exc:
        own = os.environ.get("TIKTOKEN_CACHE_DIR")
        where = f"TIKTOKEN_CACHE_DIR={own}" if own else "TIKTOKEN_CACHE_DIR unset"
        return f"{exc}, as this command looks ({where}; the daemon looks with its own)"
    return None


def wait_for_answer(
    answers: Callable[[], Iterable[AuditRecord]],
    pid: int,
    since_ns: int,
    timeout: float,
    *,
    alive: Callable[[int], bool],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> AuditRecord | None:
    """The daemon ``pid``'s first reload record whose reload began at or after
    ``since_ns`` (the signal's send), from the batches ``answers`` returns; None
    once ``timeout`` passed or the daemon is gone."""
    deadline = clock() + timeout
    while True:
        for record in answers():
            if is_answer(record, pid, since_ns):
                return record
        if not alive(pid) or clock() >= deadline:
            return None
        sleep(POLL_S)


def is_answer(record: AuditRecord, pid: int, since_ns: int) -> bool:
    """Whether ``record`` is daemon ``pid``'s reload that began at or after
    ``since_ns``: a record without ``started_ns`` (an older memd's) never is."""
    started = record.fields.get("started_ns")
    return (
        record.event == AuditEvent.CONFIG_RELOAD.value
        and record.actor == "daemon"
        and record.pid == pid
        and isinstance(started, int)
        and not isinstance(started, bool)
        and started >= since_ns
    )


class _Answers:
    """What the daemon answered, from both places it writes it: the audit log's
    records appended since the command started, and the state DB's last reload
    (written even when the log cannot be). Each read that fails is kept, to say
    in one line what could not be read and why when no answer comes."""

    def __init__(self, log: Path, store: StateStore | str) -> None:
        self.log = log
        self._store = store if isinstance(store, StateStore) else None
        self._problems: dict[str, str] = {}
        if isinstance(store, str):
            self._problems["state"] = store
        self._offset = 0
        try:
            self._offset = log.stat().st_size
        except FileNotFoundError:
            pass  # the daemon makes it with its first record
        except OSError as exc:
            self._problems["log"] = f"audit log {log}: {describe_error(exc, with_file=False)}"

    def readable(self) -> bool:
        """Whether either place can be read at all."""
        return "log" not in self._problems or "state" not in self._problems

    def __call__(self) -> list[AuditRecord]:
        from memd.audit import read_audit_from

        found: list[AuditRecord] = []
        try:
            contents, self._offset = read_audit_from(self.log, self._offset)
            found += contents.records
            self._problems.pop("log", None)
        except (MemdError, OSError) as exc:
            self._problems["log"] = _named(f"audit log {self.log}", exc)
        if self._store is not None:
            try:
                outcome = self._store.read_last_reload()
                self._problems.pop("state", None)
            except StateError as exc:
                self._problems["state"] = str(exc)
            else:
                if outcome is not None:
                    found.append(_as_record(outcome))
        return found

    def unread(self) -> str:
        """Each place, and what it lacks: its error, or no answer in it."""
        log = self._problems.get("log", f"no reload record in {self.log}")
        if self._store is not None:
            where = f"state DB {self._store.path or ':memory:'}"
            state = self._problems.get("state", f"{where} has no record of this reload")
        else:
            state = self._problems["state"]
        return f"{log}; {state}"

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def _open_store(directory: Path, loaded: LoadedConfig) -> StateStore | str:
    """The state DB (as its owner, as every command opens it), or why it cannot be read."""
    try:
        with as_owner_of(directory):
            store = StateStore.open(directory, loaded.workspace)
    except MemdError as exc:
        return str(exc)
    if store.path is None:  # unusable: an empty one in memory stands in
        store.close()
        return store.warnings[-1].split("; using", 1)[0]
    return store


def _as_record(outcome: ReloadOutcome) -> AuditRecord:
    """The state DB's last reload as the audit record it stands for."""
    fields: dict[str, FieldValue] = {
        "trigger": "sighup",
        "ok": outcome.ok,
        "started_ns": outcome.started_ns,
        "changed": outcome.changed,
    }
    if outcome.errors is not None:
        fields["errors"] = outcome.errors
    if outcome.audit_error is not None:
        fields["audit_error"] = outcome.audit_error
    return AuditRecord(
        event=AuditEvent.CONFIG_RELOAD.value,
        ts=0.0,
        actor="daemon",
        pid=outcome.pid,
        uid=-1,
        fields=fields,
    )


def _named(what: str, exc: BaseException) -> str:
    """``what: why``, for an error whose message may already name ``what``."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else None
    text = text or describe_error(exc, with_file=False)
    return text if text.startswith(f"{what}: ") else f"{what}: {text}"


def _daemon_pid(loaded: LoadedConfig, state_dir: Path | None) -> int:
    """The pid in the workspace's heartbeat, when it is a running memd daemon."""
    with open_state(loaded, state_dir) as store:
        beat = store.read_heartbeat()
        where = f"state {store.path or '(in memory)'}, from {store.found_by}"
    if beat is None or beat.stopped or is_memd_daemon(beat.pid) is False:
        said = "no daemon has run" if beat is None else f"daemon pid {beat.pid} is not running"
        raise ReloadFailed(f"{said} on workspace {loaded.workspace} ({where}): nothing to reload")
    return beat.pid


def _refused(problems: Iterable[str]) -> ReloadRefused:
    """Every problem on stderr but the last, which the error says (one line each)."""
    listed = list(problems)
    for problem in listed[:-1]:
        print(f"memd: error: {problem}", file=sys.stderr)
    last = listed[-1] if listed else "the configuration has a problem"
    return ReloadRefused(f"{last} (not reloaded: the daemon keeps the configuration it runs with)")


__all__ = ["ReloadFailed", "ReloadRefused", "is_answer", "reload_command", "wait_for_answer"]
