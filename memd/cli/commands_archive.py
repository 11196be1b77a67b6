"""``memd archive keygen | cat | rekey``: the master key, reading archives, key rotation.

Archives encrypted at rest (``[privacy] encrypt_archives``) open only with the
master key named by ``[privacy] key_file`` (or ``MEMD_PRIVACY_KEY_FILE``, or
``--key-file`` here). Rotation re-wraps every agent's data key under a new
master key, one agent at a time under its compaction lock; archives are not
rewritten. It is re-runnable: a crash part-way leaves each agent's key file
whole under one key or the other, and the next run skips the agents done.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from memd.agentdir import AgentDir
from memd.archive_crypto import (
    ArchiveKeyError,
    MasterKey,
    generate_master_key,
    read_archive,
    read_master_key,
    rewrap_agent_key,
)
from memd.audit import AuditLog
from memd.cli.common import load, open_audit
from memd.cli.options import ConfigOption, StateDirOption, WorkspaceOption, path_value
from memd.compaction import recover_agent
from memd.core.audit import AuditEvent
from memd.errors import MemdError, describe_error
from memd.fsutil import AgentLock
from memd.settings import LoadedConfig
from memd.workspace import agent_paths, list_agents, require_workspace

archive_app = typer.Typer(
    help="Encrypted archives: make a master key, read an archive, rotate the key.",
    no_args_is_help=True,
)

KeyFileOption = Annotated[
    Path | None,
    typer.Option(
        "--key-file",
        help="Master key file (default: privacy.key_file / MEMD_PRIVACY_KEY_FILE).",
        show_default=False,
        parser=path_value,  # memd says a bad path in one line, not a usage box
        metavar="PATH",
    ),
]


def _configured_key_file(loaded: LoadedConfig, flag: Path | None) -> Path | None:
    if flag is not None:
        return flag
    configured = loaded.config.privacy.key_file
    return Path(configured).expanduser() if configured else None


@archive_app.command("keygen")
def keygen(
    file: Annotated[
        Path,
        typer.Argument(
            help="Where to write the new key (must not exist).", parser=path_value, metavar="FILE"
        ),
    ],
) -> None:
    """Write a new master key to FILE (mode 0600; never overwrites). Back it up."""
    key = generate_master_key(file)
    print(f"wrote master key {file} (id {key.key_id}, mode 0600)")
    print(
        "back this file up apart from the workspace: losing it loses every archive "
        "encrypted under it",
        file=sys.stderr,
    )


@archive_app.command("cat")
def cat(
    agent: Annotated[str, typer.Argument(help="The agent.", show_default=False)],
    name: Annotated[
        str, typer.Argument(help="Archive file name (history_<ts>.md.enc).", show_default=False)
    ],
    key_file: KeyFileOption = None,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
) -> None:
    """Print one archive's plain text (decrypting a .md.enc one) for an operator."""
    loaded = load(workspace, config)
    require_workspace(loaded.workspace)
    paths = agent_paths(loaded.workspace, agent)
    path = _configured_key_file(loaded, key_file)
    master = read_master_key(path) if path is not None and name.endswith(".enc") else None
    try:
        data = read_archive(paths, name, master)
    except OSError as exc:
        if isinstance(exc, MemdError):
            raise
        # e.g. .memd/ owned by another uid (run it as memd's user): one line, no traceback.
        raise ArchiveKeyError(f"agent {agent!r}: archive {name}: {describe_error(exc)}") from None
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


@archive_app.command("rekey")
def rekey(
    new_key: Annotated[
        Path,
        typer.Option(
            "--new-key",
            help="The new master key (made by `memd archive keygen`).",
            show_default=False,
            parser=path_value,  # memd says a bad path in one line, not a usage box
            metavar="PATH",
        ),
    ],
    old_key: Annotated[
        Path | None,
        typer.Option(
            "--old-key",
            help="The current master key (default: privacy.key_file / MEMD_PRIVACY_KEY_FILE).",
            show_default=False,
            parser=path_value,  # memd says a bad path in one line, not a usage box
            metavar="PATH",
        ),
    ] = None,
    wait: Annotated[
        float | None,
        typer.Option(
            "--wait",
            min=0,
            help="Seconds to wait for each agent's compaction in flight "
            "(default: compaction.lock_wait_s).",
            show_default=False,
        ),
    ] = None,
    workspace: WorkspaceOption = None,
    config: ConfigOption = None,
    state_dir: StateDirOption = None,
) -> None:
    """Re-wrap every agent's data key under a new master key (archives are not rewritten).

    Afterwards point privacy.key_file at the new key (or move it over the old
    file) and keep the old one until you have checked `memd archive cat`.
    """
    loaded = load(workspace, config)
    require_workspace(loaded.workspace)
    old_path = _configured_key_file(loaded, old_key)
    if old_path is None:
        raise ArchiveKeyError("rekey needs the current key: --old-key FILE or privacy.key_file")
    old = read_master_key(old_path)
    new = read_master_key(new_key)
    if old.key_id == new.key_id:
        raise ArchiveKeyError(f"--new-key {new_key} is the same key as {old_path}")
    wait_s = loaded.config.compaction.lock_wait_s if wait is None else wait
    counts = {"rewrapped": 0, "already": 0, "none": 0}
    failed = 0
    audit = open_audit(loaded, state_dir)
    for name in list_agents(loaded.workspace):
        try:
            outcome = _rekey_agent(loaded, name, old, new, wait_s, audit)
        except (MemdError, OSError) as exc:
            failed += 1
            print(f"memd: error: agent {name!r}: {describe_error(exc)}", file=sys.stderr)
            continue
        counts[outcome] += 1
        if outcome == "rewrapped":
            audit.record(AuditEvent.REKEY, name, old_key_id=old.key_id, new_key_id=new.key_id)
    print(
        f"rekeyed {counts['rewrapped']} agent(s) to key id {new.key_id}; "
        f"{counts['already']} already under it, {counts['none']} without encrypted archives"
        + (f"; {failed} failed (run again)" if failed else "")
    )
    if failed:
        raise typer.Exit(1)


def _rekey_agent(
    loaded: LoadedConfig, name: str, old: MasterKey, new: MasterKey, wait_s: float, audit: AuditLog
) -> str:
    paths = agent_paths(loaded.workspace, name)
    if not paths.private_dir.is_dir():
        return "none"
    # A job a crash left half done (an erase-by-pattern staged a new data key
    # wrapped under the old master key) is finished first: re-wrapping the
    # current key and then letting recovery install the staged one would put
    # the agent back under the old master key.
    compaction = loaded.config.compaction
    recover_agent(
        paths,
        wait_s=wait_s,
        quiet_s=compaction.drain_quiet_s,
        max_s=compaction.drain_max_s,
        key_file=Path(old.source),
        audit=audit,
    )
    with AgentDir.open(paths, create_private=False) as pinned:
        if pinned.private_fd < 0:
            return "none"
        with AgentLock(paths.lock, name, dir_fd=pinned.private_fd).held(wait_s):
            return rewrap_agent_key(pinned, old, new)


__all__ = ["archive_app", "cat", "keygen", "rekey"]
