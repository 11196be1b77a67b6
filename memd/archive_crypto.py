"""Archives encrypted at rest (``[privacy] encrypt_archives``): keys and the file format.

Three layers, each versioned:

* the **master key**: 32 random bytes in a file the operator keeps (made by
  ``memd archive keygen FILE``, mode 0600, never in the config). It only wraps
  data keys, so rotating it rewrites one small file per agent, no archive.
* one **data key per agent**, wrapped by the master key (AES-256-GCM, the
  agent's name as associated data) in ``.memd/archive.key`` beside the agent's
  journal and lock. It lives with the archives it opens, so a backup or a move
  of the workspace keeps them readable (with the master key), and it lives in
  the agent's own folder, so ``memd forget`` destroys it together with the
  agent: every archive of that agent is unreadable from then on, wherever a
  copy of its bytes (an unlinked block, a backup) survives. That is the
  crypto-shredding. The state dir was the other choice; it is rebuilt from
  scratch when its DB is corrupt, and losing a data key loses every archive.
* each **archive**, ``history_<ts>.md.enc``: a text magic line naming the
  format version, the data key's id, a fresh 96-bit nonce, then AES-256-GCM
  ciphertext and tag. The associated data binds the header, the agent and the
  archive's file name: a file moved to another agent or renamed over another
  archive does not decrypt.

Encryption happens in memory: the archive's plaintext is never written to
disk by memd (the transaction writes ciphertext to its temp file).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from memd.agentdir import AgentDir
from memd.errors import MemdError, describe_error
from memd.fsutil import create_file_at, read_to_end
from memd.workspace import AgentPaths

KEY_BYTES = 32
NONCE_BYTES = 12
KEY_ID_BYTES = 8

MASTER_KEY_MAGIC = "memd-master-key"
MASTER_KEY_VERSION = 1
DATA_KEY_FORMAT = "memd-archive-data-key"
DATA_KEY_VERSION = 1
DATA_KEY_NAME = "archive.key"
DATA_KEY_TEMP = "archive.key.tmp"
ARCHIVE_MAGIC = b"memd-encrypted-archive v"
ARCHIVE_VERSION = 1
ENCRYPTED_SUFFIX = ".md.enc"
PLAIN_SUFFIX = ".md"
_MAX_HEADER_LINE = 64
_MAX_KEY_FILE = 4096


class ArchiveKeyError(MemdError, ValueError):
    """A master key, data key or encrypted archive that cannot be used (one line, named)."""

    exit_code = 2


class _Aead:
    """AES-256-GCM from ``cryptography``, imported on first use: every CLI command
    imports this module (forget, status through recall), few of them encrypt."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)

    def encrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        return self._aead.encrypt(nonce, data, aad)

    def decrypt(self, nonce: bytes, data: bytes, aad: bytes) -> bytes | None:
        """The plaintext, or None when authentication fails (tampered, wrong key or name)."""
        from cryptography.exceptions import InvalidTag

        try:
            return self._aead.decrypt(nonce, data, aad)
        except InvalidTag:
            return None


def _key_id(label: bytes, key: bytes) -> str:
    # An identifier that says which key without saying anything about it.
    return hashlib.sha256(label + b"\0" + key).hexdigest()[: KEY_ID_BYTES * 2]


@dataclass(frozen=True, slots=True)
class MasterKey:
    key: bytes
    source: str  # the file it came from, for messages

    def __repr__(self) -> str:  # never print key bytes
        return f"MasterKey(id={self.key_id}, source={self.source!r})"

    @property
    def key_id(self) -> str:
        return _key_id(b"memd-master-key-id", self.key)


@dataclass(frozen=True, slots=True)
class DataKey:
    agent: str
    key: bytes

    def __repr__(self) -> str:
        return f"DataKey(agent={self.agent!r}, id={self.key_id})"

    @property
    def key_id(self) -> str:
        return _key_id(b"memd-data-key-id", self.key)


# -- master key file ----------------------------------------------------------


def render_master_key(key: bytes) -> bytes:
    encoded = base64.b64encode(key).decode("ascii")
    return (
        f"{MASTER_KEY_MAGIC} v{MASTER_KEY_VERSION}\n{encoded}\n"
        "# memd master key: back this file up; losing it loses every encrypted archive.\n"
    ).encode("ascii")


def parse_master_key(data: bytes, source: str) -> MasterKey:
    try:
        lines = data.decode("ascii").splitlines()
    except UnicodeDecodeError:
        lines = []
    head = lines[0].strip() if lines else ""
    if not head.startswith(MASTER_KEY_MAGIC + " v"):
        raise ArchiveKeyError(
            f"key file {source}: not a memd master key (make one with `memd archive keygen FILE`)"
        )
    version_text = head.removeprefix(MASTER_KEY_MAGIC + " v")
    if not version_text.isdigit():
        raise ArchiveKeyError(f"key file {source}: unreadable format line {head!r}")
    version = int(version_text)
    if version > MASTER_KEY_VERSION:
        raise ArchiveKeyError(
            f"key file {source}: format v{version}, newer than this memd reads "
            f"(v{MASTER_KEY_VERSION}); use the newer memd"
        )
    try:
        key = base64.b64decode(lines[1].strip(), validate=True) if len(lines) > 1 else b""
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ArchiveKeyError(f"key file {source}: damaged (the key is not {KEY_BYTES} bytes)")
    return MasterKey(key=key, source=source)


def generate_master_key(path: Path) -> MasterKey:
    """Write a new master key to ``path`` (mode 0600); never overwrites a file."""
    key = secrets.token_bytes(KEY_BYTES)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise ArchiveKeyError(
            f"key file {path} already exists; refusing to overwrite it (it may be the only "
            "key to existing archives)"
        ) from None
    except OSError as exc:
        raise ArchiveKeyError(
            f"key file {path}: cannot create: {describe_error(exc, with_file=False)}"
        ) from None
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        os.write(fd, render_master_key(key))
        os.fsync(fd)
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise ArchiveKeyError(
            f"key file {path}: cannot write: {describe_error(exc, with_file=False)}"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return MasterKey(key=key, source=str(path))


def read_master_key(path: Path) -> MasterKey:
    """The master key in ``path``; one-line errors that name the file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ArchiveKeyError(
            f"key file {path} (privacy.key_file) does not exist; make one with "
            "`memd archive keygen FILE`"
        ) from None
    except OSError as exc:
        raise ArchiveKeyError(
            f"key file {path} (privacy.key_file): {describe_error(exc, with_file=False)}"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArchiveKeyError(f"key file {path} (privacy.key_file) is not a regular file")
        data = os.read(fd, _MAX_KEY_FILE)
    finally:
        os.close(fd)
    return parse_master_key(data, str(path))


def key_file_problem(path: Path, euid: int | None = None) -> tuple[str, str] | None:
    """What makes a key file untrustworthy (doctor, and the daemon at start), with its
    fix: readable or writable beyond its owner, owned by another user than memd's
    (``euid``; root may own it), or a symlink that leaves the file's own folder.

    Whoever can write the file, or the link, can swap in a key they hold: every
    archive sealed from then on is theirs to read.  A link inside the folder is
    how secret mounts look (Kubernetes: ``key -> ..data/key``) and is fine.
    """
    uid = os.geteuid() if euid is None else euid
    try:
        link = os.lstat(path)
        st = os.stat(path)
    except OSError:
        return None  # read_master_key names a missing or unreadable file
    if stat.S_ISLNK(link.st_mode):
        target = path.resolve()
        if not target.is_relative_to(path.parent.resolve()):
            return (
                f"key file {path} is a symlink to {target}, outside its folder",
                f"point privacy.key_file at {target} itself, or move the key into {path.parent}",
            )
    if st.st_uid not in (uid, 0):
        return (
            f"key file {path} is owned by uid {st.st_uid}, not by memd's user (uid {uid})",
            f"chown {uid} {path} (memd's user), or root",
        )
    if st.st_mode & 0o077:
        return (
            f"key file {path} has mode {stat.S_IMODE(st.st_mode):04o}; make it 0600",
            f"chmod 600 {path}",
        )
    return None


# -- data keys ----------------------------------------------------------------


def _wrap_aad(agent: str) -> bytes:
    return f"{DATA_KEY_FORMAT}\0v{DATA_KEY_VERSION}\0{agent}".encode("utf-8", "surrogateescape")


def wrap_data_key(data_key: DataKey, master: MasterKey) -> bytes:
    """The data key file's bytes: ``data_key`` sealed under ``master``."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    wrapped = _Aead(master.key).encrypt(nonce, data_key.key, _wrap_aad(data_key.agent))
    record = {
        "format": DATA_KEY_FORMAT,
        "version": DATA_KEY_VERSION,
        "agent": data_key.agent,
        "key_id": data_key.key_id,
        "master_key_id": master.key_id,
        "nonce": base64.b64encode(nonce).decode("ascii"),
        "wrapped": base64.b64encode(wrapped).decode("ascii"),
    }
    return (json.dumps(record, sort_keys=True) + "\n").encode("ascii")


def unwrap_data_key(data: bytes, agent: str, master: MasterKey, source: str) -> DataKey:
    try:
        record = json.loads(data)
        if not isinstance(record, dict) or record.get("format") != DATA_KEY_FORMAT:
            raise ValueError("not a data key")
        version = int(record["version"])
    except (ValueError, KeyError, TypeError, RecursionError):
        # RecursionError: a key file of "[" (the agent owns .memd/) raised past
        # compact-now's one-line errors as a traceback.
        raise ArchiveKeyError(f"agent {agent!r}: data key {source} is damaged") from None
    if version > DATA_KEY_VERSION:
        raise ArchiveKeyError(
            f"agent {agent!r}: data key {source} has format v{version}, newer than this memd "
            f"reads (v{DATA_KEY_VERSION}); use the newer memd"
        )
    if record.get("agent") != agent:
        raise ArchiveKeyError(
            f"agent {agent!r}: data key {source} belongs to agent {record.get('agent')!r}"
        )
    wrapped_under = record.get("master_key_id")
    if wrapped_under != master.key_id:
        raise ArchiveKeyError(
            f"agent {agent!r}: data key {source} is wrapped under master key id "
            f"{wrapped_under}, not {master.key_id} (key file {master.source}); "
            "use the key it was made with, or finish `memd archive rekey`"
        )
    try:
        nonce = base64.b64decode(record["nonce"], validate=True)
        wrapped = base64.b64decode(record["wrapped"], validate=True)
        key = _Aead(master.key).decrypt(nonce, wrapped, _wrap_aad(agent))
    except (KeyError, TypeError, ValueError, binascii.Error):
        key = None
    if key is None:
        raise ArchiveKeyError(
            f"agent {agent!r}: data key {source} does not open with key file {master.source} "
            "(damaged or tampered with)"
        ) from None
    return DataKey(agent=agent, key=key)


def new_data_key(agent: str) -> DataKey:
    return DataKey(agent=agent, key=secrets.token_bytes(KEY_BYTES))


def read_data_key(private_fd: int, agent: str, master: MasterKey, source: str) -> DataKey | None:
    """The agent's data key from its ``.memd/`` (pinned fd); None when it has none."""
    try:
        fd = os.open(
            DATA_KEY_NAME,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
            dir_fd=private_fd,
        )
    except FileNotFoundError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArchiveKeyError(f"agent {agent!r}: data key {source} is not a regular file")
        data = os.read(fd, _MAX_KEY_FILE)
    finally:
        os.close(fd)
    return unwrap_data_key(data, agent, master, source)


def write_data_key(private_fd: int, data_key: DataKey, master: MasterKey) -> None:
    """Install the agent's wrapped data key atomically (temp + fsync + rename + fsync dir).

    A crash leaves either the old file or the new one whole (rekey relies on it).
    """
    fd = create_file_at(private_fd, DATA_KEY_TEMP, [wrap_data_key(data_key, master)])
    os.close(fd)
    os.replace(DATA_KEY_TEMP, DATA_KEY_NAME, src_dir_fd=private_fd, dst_dir_fd=private_fd)
    os.fsync(private_fd)


def destroy_data_key(private_fd: int) -> bool:
    """Overwrite the agent's data key file in place, then unlink it: crypto-shredding.

    The overwrite is best effort (a copy-on-write or journaling filesystem may
    keep the old block); the key is wrapped by the master key anyway, so only
    someone holding the master key and the old block could recover it.
    Returns whether there was a key.
    """
    found = False
    for name in (DATA_KEY_NAME, DATA_KEY_TEMP):
        try:
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=private_fd)
        except FileNotFoundError:
            continue
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                size = os.fstat(fd).st_size
                os.pwrite(fd, secrets.token_bytes(size), 0)
                os.fsync(fd)
            finally:
                os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=private_fd)
            found = True
    if found:
        os.fsync(private_fd)
    return found


def _data_key_source(pinned: AgentDir) -> str:
    return str(pinned.paths.private_dir / DATA_KEY_NAME)


def agent_data_key(pinned: AgentDir, master: MasterKey, *, create: bool) -> DataKey | None:
    """The agent's data key (made on first use when ``create``). Caller holds the agent's lock.

    A new key is linked into place, never renamed over one: a key another
    process installed first wins, and no archive is ever sealed under a key
    that is then lost.
    """
    agent = pinned.paths.agent
    source = _data_key_source(pinned)
    found = read_data_key(pinned.private_fd, agent, master, source)
    if found is not None or not create:
        return found
    made = new_data_key(agent)
    fd = create_file_at(pinned.private_fd, DATA_KEY_TEMP, [wrap_data_key(made, master)])
    os.close(fd)
    try:
        os.link(
            DATA_KEY_TEMP,
            DATA_KEY_NAME,
            src_dir_fd=pinned.private_fd,
            dst_dir_fd=pinned.private_fd,
            follow_symlinks=False,
        )
    except FileExistsError:
        made_by_other = read_data_key(pinned.private_fd, agent, master, source)
        assert made_by_other is not None
        made = made_by_other
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(DATA_KEY_TEMP, dir_fd=pinned.private_fd)
    os.fsync(pinned.private_fd)
    return made


def rewrap_agent_key(pinned: AgentDir, old: MasterKey, new: MasterKey) -> str:
    """Re-wrap the agent's data key under ``new`` (rekey). Caller holds the agent's lock.

    Re-runnable after a crash: a key already under ``new`` is left alone.
    Returns "rewrapped", "already" or "none" (the agent has no data key).
    """
    agent = pinned.paths.agent
    source = _data_key_source(pinned)
    if pinned.private_fd < 0:
        return "none"
    try:
        under_new = read_data_key(pinned.private_fd, agent, new, source)
    except ArchiveKeyError:
        pass  # wrapped under another master key (the old one, we hope)
    else:
        return "none" if under_new is None else "already"
    under_old = read_data_key(pinned.private_fd, agent, old, source)
    if under_old is None:
        return "none"
    write_data_key(pinned.private_fd, under_old, new)
    return "rewrapped"


def check_archive_name(agent: str, name: str) -> None:
    """An archive's file name as an operator gives it: no path, no traversal."""
    valid = (
        name.startswith("history_")
        and (name.endswith(ENCRYPTED_SUFFIX) or name.endswith(PLAIN_SUFFIX))
        and "/" not in name
        and "\0" not in name
        and ".." not in name
    )
    if not valid:
        raise ArchiveKeyError(
            f"agent {agent!r}: {name!r} is not an archive name (history_<ts>.md or .md.enc)"
        )


def read_archive(paths: AgentPaths, name: str, master: MasterKey | None) -> bytes:
    """An archive's plaintext (``memd archive cat``): decrypted when it is ``.md.enc``.

    Read through the pinned agent folder (never a symlink); errors are one line.
    """
    agent = paths.agent
    check_archive_name(agent, name)
    with AgentDir.open(paths, create_private=False) as pinned:
        archive_fd, _created = pinned.archive_fd(create=False)
        if archive_fd < 0:
            raise ArchiveKeyError(f"agent {agent!r}: has no archive folder")
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=archive_fd
            )
        except FileNotFoundError:
            raise ArchiveKeyError(f"agent {agent!r}: no archive {name}") from None
        except OSError as exc:
            raise ArchiveKeyError(
                f"agent {agent!r}: archive {name}: {describe_error(exc, with_file=False)}"
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ArchiveKeyError(f"agent {agent!r}: archive {name} is not a regular file")
            blob = read_to_end(fd)
        finally:
            os.close(fd)
        if not is_encrypted_name(name):
            return blob
        if master is None:
            raise ArchiveKeyError(
                f"agent {agent!r}: archive {name} is encrypted; set privacy.key_file "
                "(or MEMD_PRIVACY_KEY_FILE, or --key-file)"
            )
        data_key = None
        if pinned.private_fd >= 0:
            data_key = read_data_key(pinned.private_fd, agent, master, _data_key_source(pinned))
        if data_key is None:
            raise ArchiveKeyError(
                f"agent {agent!r}: archive {name} cannot be decrypted: the agent has no data "
                "key (destroyed by `memd forget`)"
            )
        return open_archive(data_key, name, blob)


def sealed_archive_problem(paths: AgentPaths, master: MasterKey) -> tuple[int, str | None]:
    """(encrypted archives, what keeps some from opening) for ``memd doctor``.

    Reads only each archive's header (the data key id), never decrypts: a
    missing data key, one wrapped under another master key, or archives sealed
    under a key the agent no longer has are all said here, before anyone
    needs the archives.
    """
    agent = paths.agent
    with AgentDir.open(paths, create_private=False) as pinned:
        archive_fd, _created = pinned.archive_fd(create=False)
        if archive_fd < 0:
            return 0, None
        with os.scandir(archive_fd) as listing:
            names = sorted(
                entry.name
                for entry in listing
                if entry.name.startswith("history_") and is_encrypted_name(entry.name)
            )
        if not names:
            return 0, None
        try:
            data_key = (
                read_data_key(pinned.private_fd, agent, master, _data_key_source(pinned))
                if pinned.private_fd >= 0
                else None
            )
        except ArchiveKeyError as exc:
            return len(names), str(exc)
        if data_key is None:
            return len(names), (
                f"agent {agent!r}: {len(names)} encrypted archive(s) but no data key "
                f"({DATA_KEY_NAME} in .memd/): they cannot be decrypted"
            )
        foreign = 0
        for name in names:
            try:
                fd = os.open(
                    name,
                    os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                    dir_fd=archive_fd,
                )
            except OSError:
                foreign += 1
                continue
            try:
                head = os.pread(fd, _MAX_HEADER_LINE + KEY_ID_BYTES + NONCE_BYTES + 16, 0)
            finally:
                os.close(fd)
            try:
                if read_archive_header(head, agent, name).key_id != data_key.key_id:
                    foreign += 1
            except ArchiveKeyError:
                foreign += 1
    if foreign:
        return len(names), (
            f"agent {agent!r}: {foreign} of {len(names)} encrypted archive(s) were not sealed "
            "under the agent's data key (or are damaged): they cannot be decrypted"
        )
    return len(names), None


# -- archives -----------------------------------------------------------------


def is_encrypted_name(name: str) -> bool:
    return name.endswith(ENCRYPTED_SUFFIX)


def _archive_aad(header: bytes, agent: str, name: str) -> bytes:
    return header + b"\0" + agent.encode("utf-8", "surrogateescape") + b"\0" + name.encode()


def seal_archive(data_key: DataKey, name: str, plaintext: bytes) -> bytes:
    """The bytes of the encrypted archive ``name`` of ``data_key.agent``."""
    nonce = secrets.token_bytes(NONCE_BYTES)
    header = (
        ARCHIVE_MAGIC
        + str(ARCHIVE_VERSION).encode()
        + b"\n"
        + bytes.fromhex(data_key.key_id)
        + nonce
    )
    sealed = _Aead(data_key.key).encrypt(
        nonce, plaintext, _archive_aad(header, data_key.agent, name)
    )
    return header + sealed


@dataclass(frozen=True, slots=True)
class ArchiveHeader:
    version: int
    key_id: str
    nonce: bytes
    size: int  # header bytes


def read_archive_header(blob: bytes, agent: str, name: str) -> ArchiveHeader:
    where = f"agent {agent!r}: archive {name}"
    if not blob.startswith(ARCHIVE_MAGIC):
        raise ArchiveKeyError(f"{where} is not a memd encrypted archive")
    end = blob.find(b"\n", 0, _MAX_HEADER_LINE)
    version_text = blob[len(ARCHIVE_MAGIC) : end] if end > 0 else b""
    if not version_text.isdigit():
        raise ArchiveKeyError(f"{where}: unreadable format line")
    version = int(version_text)
    if version > ARCHIVE_VERSION:
        raise ArchiveKeyError(
            f"{where} has format v{version}, newer than this memd reads (v{ARCHIVE_VERSION}); "
            "use the newer memd"
        )
    start = end + 1
    size = start + KEY_ID_BYTES + NONCE_BYTES
    if len(blob) < size + 16:
        raise ArchiveKeyError(f"{where} is truncated")
    return ArchiveHeader(
        version=version,
        key_id=blob[start : start + KEY_ID_BYTES].hex(),
        nonce=blob[start + KEY_ID_BYTES : size],
        size=size,
    )


def open_archive(data_key: DataKey, name: str, blob: bytes) -> bytes:
    """The plaintext of the encrypted archive ``name``; tampering is an error, never output."""
    agent = data_key.agent
    header = read_archive_header(blob, agent, name)
    if header.key_id != data_key.key_id:
        raise ArchiveKeyError(
            f"agent {agent!r}: archive {name} was encrypted with data key {header.key_id}, "
            f"not the agent's ({data_key.key_id}); its key was destroyed (forget) or replaced"
        )
    plaintext = _Aead(data_key.key).decrypt(
        header.nonce, blob[header.size :], _archive_aad(blob[: header.size], agent, name)
    )
    if plaintext is None:
        raise ArchiveKeyError(
            f"agent {agent!r}: archive {name} failed authentication (tampered with, "
            "damaged, or renamed)"
        )
    return plaintext


__all__ = [
    "DATA_KEY_NAME",
    "ENCRYPTED_SUFFIX",
    "MASTER_KEY_MAGIC",
    "ArchiveKeyError",
    "DataKey",
    "MasterKey",
    "agent_data_key",
    "check_archive_name",
    "destroy_data_key",
    "generate_master_key",
    "is_encrypted_name",
    "key_file_problem",
    "new_data_key",
    "open_archive",
    "read_archive",
    "read_archive_header",
    "read_data_key",
    "read_master_key",
    "rewrap_agent_key",
    "seal_archive",
    "sealed_archive_problem",
    "write_data_key",
]
