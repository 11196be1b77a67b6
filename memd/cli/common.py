"""What every command shares: loading the config, the state DB, time formatting.

Command modules import from here (and their Typer options from
:mod:`memd.cli.options`) and never from each other (nor from ``app``). Nothing
here imports Typer: ``memd status`` runs without it (:mod:`memd.cli.status_argv`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memd.errors import ConfigError
from memd.fsutil import as_owner_of
from memd.pointer import PointerRefused, read_pointer
from memd.settings import (
    LoadedConfig,
    apply_settings,
    load_settings,
    locate_state_dir,
    require_state_dir,
)
from memd.state import StateStore

if TYPE_CHECKING:
    from memd.audit import AuditLog


def warn(message: str) -> None:
    print(f"memd: warning: {message}", file=sys.stderr)


def load(
    workspace: Path | None,
    config: Path | None,
    *,
    follow_pointer: bool = True,
    strict: bool = False,
) -> LoadedConfig:
    """The config, and the running daemon's settings for this workspace.

    A daemon leaves a pointer in its workspace (:mod:`memd.pointer`): its state
    dir, its config file and the settings it applied (``memd run --demo``'s, and
    the ``MEMD_*`` settings of its environment, a systemd ``EnvironmentFile=``).
    Unless a config was named here (``--config``, ``MEMD_CONFIG``), this command
    uses the same config and settings, so its thresholds, summarizer and
    redaction are the daemon's; a ``MEMD_*`` variable set for this command wins.
    A problem with the daemon's config is a warning (this command goes on with
    its own), or with ``strict`` the error (``memd reload`` checks the config
    the daemon will read: it must not signal it a file it refuses).
    """
    loaded = load_settings(config_file=config, workspace=workspace)
    if not follow_pointer:
        return loaded
    try:
        pointer = read_pointer(loaded.workspace)
    except PointerRefused as exc:
        # A workspace this user cannot enter at all is the command's own
        # one-line error (or doctor's `fail workspace`): saying the pointer in
        # it is unreadable too adds a line and nothing new.
        # So is a workspace that is no folder (a file named by mistake).
        if loaded.workspace.is_dir() and os.access(loaded.workspace, os.X_OK):
            warn(f"ignoring {exc}")
        return loaded
    if pointer is None:
        return loaded
    missing = [var for var in pointer.withheld if var not in loaded.env_overrides]
    if missing and not loaded.config_explicit:
        warn(
            f"the daemon's environment sets {', '.join(missing)}, which its state pointer "
            "does not carry (a secret); set it for this command too, or its settings "
            "(redaction, summary) are not the daemon's"
        )
    if not loaded.config_explicit:
        try:
            daemons = _without(pointer.settings, loaded.env_overrides)
            if pointer.config is not None and pointer.config != loaded.source:
                loaded = load_settings(config_file=pointer.config, workspace=loaded.workspace)
            if daemons:
                settings = apply_settings(loaded.config, daemons, str(pointer.path))
                loaded = dataclasses.replace(loaded, config=settings)
        except ConfigError as exc:
            if strict:
                raise
            warn(f"the daemon's settings named by {pointer.path} are not used: {exc}")
    return dataclasses.replace(loaded, pointer=pointer)


def _without(
    settings: Mapping[str, Mapping[str, Any]], variables: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """``settings`` less the keys ``variables`` (``MEMD_*`` names) set."""
    from memd.settings import setting_env_vars

    known = setting_env_vars()
    own = {known[var] for var in variables if var in known}
    kept: dict[str, dict[str, Any]] = {}
    for section, values in settings.items():
        for key, value in values.items():
            if (section, key) not in own:
                kept.setdefault(section, {})[key] = value
    return kept


def state_dir_of(loaded: LoadedConfig, flag: Path | None) -> Path:
    """The state dir a command uses; one that is a file is refused (exit 2)."""
    return require_state_dir(*locate_state_dir(flag, loaded))


def open_state(loaded: LoadedConfig, state_dir: Path | None) -> StateStore:
    """The workspace's state DB; its warnings (a rebuilt DB...) go to stderr.

    ``store.found_by`` says where the state dir came from (see
    :func:`memd.settings.locate_state_dir`), for commands that print it.
    """
    directory, found_by = locate_state_dir(state_dir, loaded)
    require_state_dir(directory, found_by)
    with as_owner_of(directory):
        store = StateStore.open(directory, loaded.workspace)
    store.found_by = found_by
    for warning in store.warnings:
        warn(warning)
    return store


def open_audit(loaded: LoadedConfig, state_dir: Path | None) -> AuditLog:
    """The workspace's audit log, appended by this CLI (the same file the daemon appends)."""
    directory = state_dir_of(loaded, state_dir)
    # Imported here: it loads structlog and the privacy model, ~0.2 s that
    # `memd status` (which never audits) should not pay.
    from memd.audit import AuditLog

    return AuditLog.for_workspace(directory, loaded.workspace, "cli")


def redaction_key(loaded: LoadedConfig, state_dir: Path | None) -> bytes | None:
    """The workspace's redaction key, the daemon's (README "Privacy"); made when missing.

    None, with a warning, when it cannot be used: text is still redacted, with
    a key of this run only (placeholders then differ from the daemon's).
    """
    from memd.errors import ConfigError
    from memd.redaction_key import key_path, load_or_create_key

    directory = state_dir_of(loaded, state_dir)
    try:
        with as_owner_of(directory):
            return load_or_create_key(key_path(directory, loaded.workspace))
    except ConfigError as exc:
        print(f"memd: warning: {exc}; redacting with a key for this run only", file=sys.stderr)
        return None


def iso_utc(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).isoformat(timespec="seconds")


def local_time(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "never"
    stamp = datetime.datetime.fromtimestamp(epoch, datetime.UTC).astimezone()
    stamp_text = stamp.strftime("%Y-%m-%d %H:%M:%S")
    return f"{stamp_text} ({ago(now - epoch)})"


def ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def size_text(size: int) -> str:
    """A byte count for people: ``512 B``, ``7.4 KiB``, ``1.2 GiB`` (powers of 1024)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def read_private_text(path: Path, what: str, option: str) -> str:
    """The UTF-8 text of ``path`` (stdin for ``-``), given in place of an option's
    value: memory text kept off the command line, which ``ps`` shows every user of
    the machine. A bad file is one line naming it (typer's usage error)."""
    import typer

    where = "stdin" if str(path) == "-" else f"{what} file {str(path)!r}"
    try:
        raw = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise typer.BadParameter(
            f"{where} is not UTF-8 text (byte {exc.start})", param_hint=option
        ) from None
    except OSError as exc:
        raise typer.BadParameter(
            f"cannot read {where}: {exc.strerror or exc}", param_hint=option
        ) from None
