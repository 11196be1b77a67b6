"""The workspace's redaction key: one file in memd's state dir, shared by the daemon and the CLI.

``<state_dir>/<workspace digest>.redaction-key`` (beside the state DB), mode
0600, versioned text::

    memd-redaction-key v1
    <64 hex digits>

Created atomically and race-free: the key is written to a private temp file,
fsynced, then hard-linked to the final name (``link`` fails when the name
exists, so of two processes creating it at once one wins and both read the
winner's key), so the placeholders of the daemon and of ``memd compact-now``
are always the same. Losing the file only changes future placeholders.
"""

from __future__ import annotations

import os
import secrets
import stat
from functools import cache
from pathlib import Path
from typing import Final

from memd.errors import ConfigError, describe_error
from memd.fsutil import ensure_private_dir

KEY_FORMAT: Final = 1
KEY_BYTES: Final = 32
_HEADER: Final = "memd-redaction-key v"
_MAX_FILE_BYTES: Final = 4096


def key_path(state_dir: Path, workspace: Path) -> Path:
    from memd.state import state_db_path

    state_db = state_db_path(state_dir, workspace)
    return state_db.with_name(state_db.stem + ".redaction-key")


def _parse(path: Path, data: bytes) -> bytes:
    text = data.decode("ascii", "replace")
    lines = text.split("\n")
    first = lines[0].strip()
    if not first.startswith(_HEADER) or not first[len(_HEADER) :].isdigit():
        raise ConfigError(f"redaction key {path} is not a memd redaction key file")
    version = int(first[len(_HEADER) :])
    if version > KEY_FORMAT:
        raise ConfigError(
            f"redaction key {path} has format {version}, newer than this memd reads ({KEY_FORMAT})"
        )
    try:
        key = bytes.fromhex(lines[1].strip()) if len(lines) > 1 else b""
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise ConfigError(f"redaction key {path} is damaged (no {KEY_BYTES}-byte key in it)")
    return key


def read_key(path: Path) -> bytes:
    """The key, from a regular file owned by us (or root) that nobody else can read.

    FileNotFoundError when there is none; ConfigError when it is unusable.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"redaction key {path} is not a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise ConfigError(
                f"redaction key {path} is owned by uid {st.st_uid}, not by memd's user"
            )
        if st.st_mode & 0o077:
            raise ConfigError(
                f"redaction key {path} has mode {stat.S_IMODE(st.st_mode):04o}; "
                f"it must be 0600 (chmod 600 {path})"
            )
        data = os.read(fd, _MAX_FILE_BYTES)
    finally:
        os.close(fd)
    return _parse(path, data)


def _create(path: Path) -> None:
    directory = path.parent
    ensure_private_dir(directory)  # refused when another uid owns it or may write in it
    temp = directory / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    body = f"{_HEADER}{KEY_FORMAT}\n{secrets.token_bytes(KEY_BYTES).hex()}\n".encode()
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(temp, path)
    except FileExistsError:
        pass  # another process made it first: theirs is the key
    finally:
        temp.unlink(missing_ok=True)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def load_or_create_key(path: Path) -> bytes:
    """The key in ``path``, made first when missing. Raises ConfigError with the reason."""
    try:
        try:
            return read_key(path)
        except FileNotFoundError:
            _create(path)
            return read_key(path)
    except OSError as exc:
        raise ConfigError(f"redaction key {path}: {describe_error(exc, with_file=False)}") from None


@cache
def process_key() -> bytes:
    """A key for this process only, when no state dir is at hand (tests, embedding):
    redaction still happens, placeholders are stable only within the process."""
    return secrets.token_bytes(KEY_BYTES)


__all__ = ["KEY_FORMAT", "key_path", "load_or_create_key", "process_key", "read_key"]
