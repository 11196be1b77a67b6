"""The pointer a daemon leaves in its workspace: where its state is, and how it is set.

``memd status``, ``memd health`` and the other commands on a workspace find
the daemon's state dir (and config file, and the settings of ``memd run
--demo``) from it, without repeating the daemon's ``--config`` or
``--state-dir``. The file is ``$WORKSPACE/.memd-state``, versioned JSON::

    {"format": "memd-state-pointer", "version": 1,
     "state_dir": "/var/lib/memd", "config": "/etc/memd/memd.toml",
     "settings": {"trigger": {"context_length": 4000}}, "pid": 1234,
     "key_vars": ["OPENAI_API_KEY"], "withheld": ["MEMD_PRIVACY_PATTERNS"],
     "written_at": "2026-12-02T04:00:00+00:00"}

``settings`` are those the daemon applied over its config file: ``memd run
--demo``'s, and the ``MEMD_*`` settings of its environment (a systemd
``EnvironmentFile=``, ``docker run --env-file``), which a command beside it
never sees otherwise; never a secret (``summarizer.api_key``, the privacy
patterns, summary instructions and an ``api_base`` with credentials stay out:
every agent reads the pointer). ``key_vars`` names the API-key variables the
daemon's environment holds (the names only), so ``memd doctor`` can tell a key
the daemon has from none; ``withheld`` names the ``MEMD_*`` variables the
daemon's environment set and the pointer does not carry, so a command beside it
says when it lacks one (its redaction would not be the daemon's). All three
came after version 1's first release and are optional: a reader takes a
pointer without them as having none, and an older reader ignores them.

The workspace is writable by agents, so the pointer counts only when it is a
regular file (never followed through a symlink) owned by this process's uid
or root and not writable by group or others (DESIGN §1); anything else is
refused with a one-line reason. Root also takes the pointer of the
workspace's owner (memd's user: ``/srv/agents`` is memd's under systemd, the
image's ``/workspace`` too) when the workspace is writable by that owner
alone: no one else could have put it there, and ``sudo memd health`` beside
the service must not say no daemon runs. It stays after the daemon stops, so ``memd
health`` can still say when it stopped.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import secrets
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.errors import MemdError, describe_error

POINTER_NAME = ".memd-state"
POINTER_FORMAT = "memd-state-pointer"
POINTER_VERSION = 1
_MAX_BYTES = 64 << 10


class PointerRefused(MemdError, ValueError):
    """A pointer file that is there but must not be trusted or cannot be read."""


@dataclass(frozen=True, slots=True)
class StatePointer:
    path: Path
    state_dir: Path
    config: Path | None = None
    # Settings the daemon applied over its config (``memd run --demo``).
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    pid: int | None = None
    # Names of the API-key variables in the daemon's environment (never a value).
    key_vars: tuple[str, ...] = ()
    # Names of the MEMD_* variables the daemon's environment set, kept out (secrets).
    withheld: tuple[str, ...] = ()


def pointer_path(workspace: Path) -> Path:
    return workspace / POINTER_NAME


def write_pointer(
    workspace: Path,
    state_dir: Path,
    *,
    config: Path | None,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
    pid: int | None = None,
    key_vars: tuple[str, ...] = (),
    withheld: tuple[str, ...] = (),
) -> Path:
    """Leave (replace) the pointer, atomically; 0644, owned by whoever runs the daemon.

    The temp file is created exclusively and never through a symlink an agent
    may have planted; the rename replaces a planted link itself, not its target.
    """
    payload = {
        "format": POINTER_FORMAT,
        "version": POINTER_VERSION,
        "state_dir": str(state_dir.absolute()),
        "config": str(config.absolute()) if config is not None else None,
        "settings": dict(settings or {}),
        "pid": os.getpid() if pid is None else pid,
        "key_vars": list(key_vars),
        "withheld": list(withheld),
        "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    data = (json.dumps(payload, indent=2) + "\n").encode()
    target = pointer_path(workspace)
    temp = workspace / f"{POINTER_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o644)
    try:
        try:
            os.fchmod(fd, 0o644)  # whatever the umask: readable by operators, written by us
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return target


def read_pointer(workspace: Path, *, euid: int | None = None) -> StatePointer | None:
    """The workspace's pointer when there is one we may trust; None when there is
    none; :class:`PointerRefused` (one line) when one is there but refused."""
    path = pointer_path(workspace)
    uid = os.geteuid() if euid is None else euid
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.islink(path):
            raise PointerRefused(f"{path} is a symlink; not followed") from None
        raise PointerRefused(
            f"{path}: cannot read it ({describe_error(exc, with_file=False)})"
        ) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PointerRefused(f"{path} is not a regular file")
        if info.st_uid not in (uid, 0) and not (
            uid == 0 and _owns_workspace_alone(workspace, info.st_uid)
        ):
            raise PointerRefused(
                f"{path} is owned by uid {info.st_uid}, not by this user ({uid}) or root; "
                "not trusted (pass --state-dir, or run as the daemon's user)"
            )
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise PointerRefused(
                f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o});"
                " not trusted"
            )
        if info.st_size > _MAX_BYTES:
            raise PointerRefused(f"{path} is too large ({info.st_size} bytes) for a pointer")
        raw = os.read(fd, _MAX_BYTES + 1)
    finally:
        os.close(fd)
    return _parse(path, raw)


def _owns_workspace_alone(workspace: Path, uid: int) -> bool:
    """``uid`` owns the workspace folder, which neither group nor others may write."""
    try:
        info = os.stat(workspace)
    except OSError:
        return False
    return info.st_uid == uid and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _parse(path: Path, raw: bytes) -> StatePointer:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise PointerRefused(f"{path} is not valid JSON") from None
    if not isinstance(data, dict) or data.get("format") != POINTER_FORMAT:
        raise PointerRefused(f"{path} is not a memd state pointer")
    version = data.get("version")
    if not isinstance(version, int) or version < 1:
        raise PointerRefused(f"{path}: bad version {version!r}")
    if version > POINTER_VERSION:
        raise PointerRefused(
            f"{path} has format version {version}, newer than this memd reads "
            f"({POINTER_VERSION}); upgrade memd or pass --state-dir"
        )
    state_dir = data.get("state_dir")
    if not isinstance(state_dir, str) or not os.path.isabs(state_dir):
        raise PointerRefused(f"{path}: state_dir must be an absolute path")
    config = data.get("config")
    if config is not None and (not isinstance(config, str) or not os.path.isabs(config)):
        raise PointerRefused(f"{path}: config must be an absolute path or null")
    settings = data.get("settings") or {}
    if not isinstance(settings, dict) or not all(
        isinstance(section, str) and isinstance(values, dict)
        for section, values in settings.items()
    ):
        raise PointerRefused(f"{path}: settings must map sections to tables")
    pid = data.get("pid")
    key_vars = data.get("key_vars") or []
    if not isinstance(key_vars, list) or not all(isinstance(var, str) for var in key_vars):
        raise PointerRefused(f"{path}: key_vars must be a list of variable names")
    withheld = data.get("withheld") or []
    if not isinstance(withheld, list) or not all(isinstance(var, str) for var in withheld):
        raise PointerRefused(f"{path}: withheld must be a list of variable names")
    return StatePointer(
        path=path,
        state_dir=Path(state_dir),
        config=Path(config) if config else None,
        settings=settings,
        pid=pid if isinstance(pid, int) else None,
        key_vars=tuple(key_vars),
        withheld=tuple(withheld),
    )


__all__ = [
    "POINTER_FORMAT",
    "POINTER_NAME",
    "POINTER_VERSION",
    "PointerRefused",
    "StatePointer",
    "pointer_path",
    "read_pointer",
    "write_pointer",
]
