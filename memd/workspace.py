"""Workspace layout: where an agent's files live, and refusing paths that escape.

``$WORKSPACE/agents/{agent}/MEMORY.md``, ``archive/``, ``.memd/`` (DESIGN.md §1).
Containment is per agent: a symlinked agent folder is followed only into the
workspace and not into another agent's folder; MEMORY.md, ``archive/`` and
``.memd/`` only within the agent's own folder.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from memd.core.descriptor import DESCRIPTOR_NAME
from memd.core.names import is_valid_agent_name, validate_agent_name
from memd.core.retention import is_archive_name
from memd.errors import UnknownAgent, WorkspaceError, describe_error

AGENTS_DIR = "agents"
MEMORY_FILE = "MEMORY.md"
ARCHIVE_DIR = "archive"
PRIVATE_DIR = ".memd"
# In PRIVATE_DIR: the compaction journal (kept, updated in place) and the
# transaction's temporaries (compaction and erasure; recovery removes them).
JOURNAL_NAME = "journal"
# The journal of memd's first builds (before 6e10b57): one plain JSON object,
# replaced whole through LEGACY_JOURNAL_NAME + ".tmp" (format 1). Recovery reads
# one left behind by such a build and moves it into JOURNAL_NAME.
LEGACY_JOURNAL_NAME = "journal.json"
DRAIN_NAME = "drain.md"
NEW_MEMORY_TEMP = "MEMORY.md.new"
ARCHIVE_TEMP = "archive.tmp"
# What the fast path looks for in an agent folder (memd-agent.json only to
# know whether there is one: it is opened with O_NOFOLLOW when read).
_SPECIAL = frozenset((MEMORY_FILE, ARCHIVE_DIR, PRIVATE_DIR, DESCRIPTOR_NAME))


class AgentPaths:
    """Where one agent's files live.

    ``dir`` may be given as a ``str`` and ``memory``, ``archive_dir`` and
    ``private_dir`` are made on first use: a daemon starting with 30,000 agents
    builds no ``Path`` per agent on its start-up pass (pathlib's joins were most
    of a restart's time); :meth:`dir_fspath` and :meth:`memory_fspath` need none.
    """

    __slots__ = (
        "_archive_dir",
        "_dir",
        "_dir_str",
        "_memory",
        "_memory_str",
        "_private_dir",
        "agent",
        "workspace",
    )

    def __init__(
        self,
        workspace: Path,
        agent: str,
        dir: Path | str,
        memory: Path | None = None,
        archive_dir: Path | None = None,
        private_dir: Path | None = None,
    ) -> None:
        self.workspace = workspace
        self.agent = agent
        self._dir: Path | None = None
        self._dir_str: str | None = None
        if isinstance(dir, str):
            self._dir_str = dir
        else:
            self._dir = dir
        self._memory = memory
        self._archive_dir = archive_dir
        self._private_dir = private_dir
        self._memory_str: str | None = None

    @property
    def dir(self) -> Path:
        folder = self._dir
        if folder is None:
            folder = self._dir = Path(self.dir_fspath())
        return folder

    def dir_fspath(self) -> str:
        """``str(self.dir)`` without making the ``Path``."""
        text = self._dir_str
        if text is None:
            text = self._dir_str = os.fspath(self.dir)
        return text

    @property
    def memory(self) -> Path:
        if self._memory is None:
            self._memory = self.dir / MEMORY_FILE
        return self._memory

    @property
    def archive_dir(self) -> Path:
        if self._archive_dir is None:
            self._archive_dir = self.dir / ARCHIVE_DIR
        return self._archive_dir

    @property
    def private_dir(self) -> Path:
        if self._private_dir is None:
            self._private_dir = self.dir / PRIVATE_DIR
        return self._private_dir

    def memory_fspath(self) -> str:
        """``str(self.memory)`` without making the ``Path`` (a stat per agent at
        start-up)."""
        text = self._memory_str
        if text is None:
            memory = self._memory
            text = f"{self.dir_fspath()}/{MEMORY_FILE}" if memory is None else os.fspath(memory)
            self._memory_str = text
        return text

    def _key(self) -> tuple[Path, str, Path, Path, Path, Path]:
        return (
            self.workspace,
            self.agent,
            self.dir,
            self.memory,
            self.archive_dir,
            self.private_dir,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AgentPaths):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"AgentPaths(workspace={self.workspace!r}, agent={self.agent!r}, dir={self.dir!r})"

    @property
    def lock(self) -> Path:
        # Never renamed or replaced: flock() on a renamed file would let two
        # processes hold "the" lock on different inodes.
        return self.private_dir / "lock"

    @property
    def journal(self) -> Path:
        # Created once and kept, like the lock: updated in place (A/B slots).
        return self.private_dir / JOURNAL_NAME


def require_workspace(workspace: Path) -> Path:
    try:
        # stat, not exists(): exists() hides only "no such file"; a name too long
        # for the OS or a folder this user may not enter must still be one line.
        found = workspace.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise WorkspaceError(f"workspace {workspace} does not exist") from None
    except OSError as exc:
        raise WorkspaceError(
            f"workspace {workspace}: {describe_error(exc, with_file=False)}"
        ) from None
    if not stat.S_ISDIR(found.st_mode):
        raise WorkspaceError(f"workspace {workspace} is not a directory")
    # Said here, as bad input (exit 2), rather than as the bare "Permission denied"
    # of the first listing deep inside a command (exit 1, naming agents/ only).
    # memd lists agents/, never the workspace itself: the workspace needs only
    # search (x), as a 0711 home folder gives (read too would refuse that layout).
    uid = os.geteuid()
    if not os.access(workspace, os.X_OK, effective_ids=True):
        raise WorkspaceError(
            f"workspace {workspace}: memd (uid {uid}) may not enter it; give it search (x) "
            "permission, e.g. through the agents' group"
        )
    agents = workspace / AGENTS_DIR
    if agents.is_dir() and not os.access(agents, os.R_OK | os.X_OK, effective_ids=True):
        raise WorkspaceError(
            f"workspace {workspace}: memd (uid {uid}) may not read agents/; "
            "give it read and search (r-x) permission, e.g. through the agents' group"
        )
    return workspace


# agents/ as memd.tmpfiles.conf makes it: sticky, and writable by the agents' group.
SHARED_AGENTS_DIR_MODE = 0o1770
# agents/ in a workspace of memd's own group: memd (and its agents, sharing its
# uid) alone write there; the umask may close it further, never open it.
PLAIN_AGENTS_DIR_MODE = 0o755


def make_agents_folder(workspace: Path) -> str | None:
    """Create the workspace's ``agents/`` when it is missing; None, or why it is
    not open to the agents' group.

    When the workspace belongs to a group other than memd's own (the agents'
    group: ``/srv/agents`` is ``memd:agents`` under systemd, the image's
    ``/workspace`` is the ``AGENTS_GID`` build argument's), agents/ is made
    like the shipped tmpfiles snippet makes it: that group's and sticky, 1770,
    so each agent, under its own uid, makes its own folder there and cannot
    remove or rename another's. Not setgid: an agent's folder keeps the agent's
    own group, which memd shares and no other agent does (DESIGN §1). A
    workspace of memd's own group (memd and its agents share a uid) gets a
    plain folder, as before: 0755 at most whatever the umask (under umask 000 a
    bare mkdir made it 0777, not sticky: any uid could rename an agent's folder
    away and put its own in its place), so only memd makes folders there.
    """
    folder = workspace / AGENTS_DIR
    try:
        folder.mkdir(mode=PLAIN_AGENTS_DIR_MODE)
    except FileExistsError:
        return None
    group = os.stat(workspace).st_gid
    if group == os.getegid():
        return None
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        try:
            os.fchown(fd, -1, group)
        except PermissionError:
            return (
                f"{folder} is not open to the workspace's group (gid {group}): memd is "
                "not a member of it, so agents of other uids cannot make their folders "
                "there (add memd to that group: docker group_add, systemd sysusers)"
            )
        os.fchmod(fd, SHARED_AGENTS_DIR_MODE)
    finally:
        os.close(fd)
    return None


def is_within(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it (both absolute, normalized)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _other_agent_folders(agents_real: str, agent: str) -> list[str]:
    """Real locations of every other agent folder under ``agents/`` (symlinks resolved)."""
    try:
        names = _scan_folder(agents_real).agents
    except OSError:
        return []
    return [os.path.realpath(os.path.join(agents_real, name)) for name in names if name != agent]


def check_agent_folder(real: str, workspace: str, agents_real: str, agent: str) -> None:
    """Refuse an agent folder that is not its own: outside, or over another's folder."""
    what = f"agent {agent!r} folder"
    if not is_within(real, workspace):
        raise WorkspaceError(f"{what} resolves outside the workspace ({real})")
    if is_within(agents_real, real):
        raise WorkspaceError(f"{what} resolves to a folder holding other agents ({real})")
    for other in _other_agent_folders(agents_real, agent):
        if is_within(real, other) or is_within(other, real):
            raise WorkspaceError(f"{what} resolves into another agent's folder ({real})")


def agents_folder_real(workspace: Path) -> str:
    agents = workspace / AGENTS_DIR
    real = os.path.realpath(agents)
    if not is_within(real, str(workspace)):
        raise WorkspaceError(f"agents folder {agents} resolves outside the workspace ({real})")
    return real


def _own_path(path: Path, agent_real: Path, agent: str, what: str) -> None:
    """A symlinked MEMORY.md, archive/ or .memd/ must stay in the agent's own folder."""
    if not path.is_symlink():
        return
    target = os.path.realpath(path)
    if target == str(agent_real) or not is_within(target, str(agent_real)):
        raise WorkspaceError(
            f"agent {agent!r} {what} {path} resolves outside the agent's own folder ({target})"
        )


def resolve_own(paths: AgentPaths, path: Path, what: str) -> Path:
    """``path`` (one of the agent's), or its symlink's target when that stays in the
    agent's own folder; refused otherwise (containment per agent, DESIGN.md §1).

    A path that is not a symlink (the usual case) costs one ``lstat``: the agent
    folder's ``realpath`` (an ``lstat`` per component) is only needed to check
    a link's target.
    """
    if not path.is_symlink():
        return path
    agent_real = Path(os.path.realpath(paths.dir))
    _own_path(path, agent_real, paths.agent, what)
    return Path(os.path.realpath(path))


def check_memory_link(paths: AgentPaths) -> None:
    """Refuse a MEMORY.md symlinked out of its agent's own folder (checked per count)."""
    resolve_own(paths, paths.memory, "MEMORY.md")


_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO must not hang the reader


def open_memory(paths: AgentPaths) -> int:
    """MEMORY.md opened for reading, refused when it is a symlink out of the agent's
    own folder (:func:`check_memory_link`, the check each count makes).

    A plain file, the usual case, costs one ``open``: with ``O_NOFOLLOW`` it
    succeeds only on a name that is not a symlink, so the file is an entry of the
    agent's folder itself, contained by construction (no ``realpath`` per count).
    A symlink is resolved and checked, and its target opened with ``O_NOFOLLOW``
    too (a target swapped for a link meanwhile is refused, not followed).
    Non-blocking, close-on-exec; raises what ``open`` raises (FileNotFoundError
    for a missing file) and WorkspaceError for a link that leaves the folder.
    """
    try:
        return os.open(paths.memory_fspath(), _READ_FLAGS | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    target = resolve_own(paths, paths.memory, "MEMORY.md")
    return os.open(target, _READ_FLAGS | os.O_NOFOLLOW)


def agent_paths(workspace: Path, agent: str, *, must_exist: bool = True) -> AgentPaths:
    """Paths for ``agent``, after refusing bad names and symlinks that leave its folder.

    Containment is per agent (DESIGN.md §1): the agent folder may be a symlink
    only into the workspace and not into (or around) another agent's folder;
    MEMORY.md, ``archive/`` and ``.memd/`` only within the agent's own folder.
    The transaction checks all of it again on pinned fds (``memd.agentdir``).
    """
    validate_agent_name(agent)
    root = workspace.resolve()
    agents_real = agents_folder_real(root)
    agent_dir = root / AGENTS_DIR / agent
    agent_real = Path(os.path.realpath(agent_dir))
    if agent_dir.is_symlink():
        check_agent_folder(str(agent_real), str(root), agents_real, agent)
    if must_exist and not agent_dir.is_dir():
        raise UnknownAgent(f"unknown agent {agent!r}: no folder {agent_dir}")
    memory = agent_dir / MEMORY_FILE
    _own_path(memory, agent_real, agent, "MEMORY.md")
    archive = agent_dir / ARCHIVE_DIR
    _own_path(archive, agent_real, agent, "archive folder")
    private = agent_dir / PRIVATE_DIR
    _own_path(private, agent_real, agent, "state folder")
    return AgentPaths(
        workspace=root,
        agent=agent,
        dir=agent_dir,
        memory=memory,
        archive_dir=archive,
        private_dir=private,
    )


class AgentScan(NamedTuple):
    """What one listing of ``agents/`` found."""

    agents: dict[str, bool]  # agent folder name (valid names only) -> is it a symlink
    invalid_folders: list[str]  # folders (not symlinks) whose names cannot be agent names


def scan_agents(workspace: Path) -> AgentScan:
    """The agent folders under ``agents/``, and the folders refused for their name
    (returned, for the caller to say so: the daemon says it once).

    One ``scandir`` keeps what it already knows, so a 10,000-agent workspace
    costs one directory read, not 10,000 lstats.
    """
    try:
        return _scan_folder(workspace / AGENTS_DIR)
    except (FileNotFoundError, NotADirectoryError):
        return AgentScan({}, [])


def _scan_folder(agents: str | Path) -> AgentScan:
    """One ``scandir`` of the agents folder; raises what ``scandir`` raises."""
    found: dict[str, bool] = {}
    invalid: list[str] = []
    with os.scandir(agents) as listing:
        for item in listing:
            try:
                if not is_valid_agent_name(item.name):
                    if item.is_dir(follow_symlinks=False):
                        invalid.append(item.name)
                elif item.is_dir(follow_symlinks=True):
                    found[item.name] = item.is_symlink()
            except OSError:
                continue
    return AgentScan(found, invalid)


def list_agents(workspace: Path) -> list[str]:
    """Agent folder names under ``agents/`` (valid names only), sorted."""
    return sorted(scan_agents(workspace).agents)


# A folder whose ctime is this recent may still change within the same clock
# tick without its ctime moving ("racy" timestamps): its facts are not kept.
_RACY_NS = 2_000_000_000
_HAS_PRIVATE = 1
_HAS_DESCRIPTOR = 2


class FolderFacts(NamedTuple):
    """An agent folder as a listing saw it: its identity and ctime (any entry
    added, removed, renamed or replaced by a symlink moves the folder's ctime,
    which no one but root can set back), and which of memd's entries it held.
    Stored with the agent's record, so a restart stats the folder instead of
    listing it again while the ctime has not moved. A tuple: a restart makes
    one per agent."""

    ino: int
    ctime_ns: int
    entries: int  # _HAS_PRIVATE | _HAS_DESCRIPTOR

    @property
    def has_private(self) -> bool:
        return bool(self.entries & _HAS_PRIVATE)

    @property
    def has_descriptor(self) -> bool:
        return bool(self.entries & _HAS_DESCRIPTOR)


class ScannedAgent(NamedTuple):
    paths: AgentPaths
    has_private: bool  # a ``.memd/`` dir: maybe a crashed job
    has_descriptor: bool | None  # memd-agent.json there (None: not listed, unknown)
    folder: FolderFacts | None  # what the listing saw (None: slow path, or racy)


def agent_paths_scanned(
    workspace: Path,
    agent: str,
    *,
    root: Path,
    is_link: bool | None = None,
    agents_dir_plain: bool = False,
    agents_root: Path | None = None,
    name_valid: bool = False,
    known: FolderFacts | None = None,
    folder: str | None = None,
) -> ScannedAgent:
    """:func:`agent_paths` with a fast path. ``root`` is ``workspace`` resolved.

    ``agent_paths`` resolves every path to refuse symlinks that escape the
    workspace: ~20 syscalls per agent, seconds for 10,000 agents at start-up.
    When ``agents/`` itself is a plain folder (``agents_dir_plain``) and the
    agent folder is not a link, one ``scandir`` of it tells which entries are
    symlinks; only then is the full check needed. With ``known`` (the facts of
    the last listing, from the state DB) one stat of the folder does instead
    while its ctime has not moved: no directory read per agent at a restart.
    ``agents_root`` (``root / "agents"``), ``name_valid`` (the scan checked the
    name) and ``folder`` (the agent folder as a ``str``, ``agents_root/agent``)
    save work per agent.
    """
    if folder is None:
        folder = os.fspath((agents_root or root / AGENTS_DIR) / agent)
    if is_link is None:
        is_link = os.path.islink(folder)
    if not agents_dir_plain or is_link or not (name_valid or is_valid_agent_name(agent)):
        return _slow(workspace, agent)
    try:
        # Before the listing: a change during it moves the ctime past this one.
        info = os.stat(folder)
        if known is not None and (info.st_ino, info.st_ctime_ns) == (known.ino, known.ctime_ns):
            paths = AgentPaths(workspace=root, agent=agent, dir=folder)
            return ScannedAgent(paths, known.has_private, known.has_descriptor, known)
        with os.scandir(folder) as listing:
            special = {item.name: item.is_symlink() for item in listing if item.name in _SPECIAL}
    except NotADirectoryError:
        raise UnknownAgent(f"unknown agent {agent!r}: {folder} is not a folder") from None
    except FileNotFoundError:
        raise UnknownAgent(f"unknown agent {agent!r}: no folder {folder}") from None
    if any(special.values()):
        return _slow(workspace, agent)
    has_private, has_descriptor = PRIVATE_DIR in special, DESCRIPTOR_NAME in special
    facts = None
    if time.time_ns() - info.st_ctime_ns > _RACY_NS:
        entries = (_HAS_PRIVATE if has_private else 0) | (_HAS_DESCRIPTOR if has_descriptor else 0)
        facts = FolderFacts(info.st_ino, info.st_ctime_ns, entries)
    paths = AgentPaths(workspace=root, agent=agent, dir=folder)
    return ScannedAgent(paths, has_private, has_descriptor, facts)


def _slow(workspace: Path, agent: str) -> ScannedAgent:
    paths = agent_paths(workspace, agent)
    return ScannedAgent(paths, paths.private_dir.is_dir(), None, None)


def archives_of(paths: AgentPaths) -> list[Path]:
    """The agent's archive files, plain (``.md``) and encrypted (``.md.enc``), oldest
    first (by name, which sorts by time)."""
    try:
        found = [
            Path(entry.path)
            for entry in os.scandir(paths.archive_dir)
            if is_archive_name(entry.name)
        ]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(found, key=_archive_sort_key)


@dataclass(frozen=True, slots=True)
class ArchiveStats:
    """An agent's ``archive/``: how many archives, their bytes, and the folder's
    mtime when counted (archives are never modified in place, so an unchanged
    folder mtime means unchanged figures)."""

    count: int
    total_bytes: int
    mtime_ns: int
    encrypted: int = 0  # of ``count``: encrypted at rest (``.md.enc``)


NO_ARCHIVES = ArchiveStats(0, 0, 0)


def archive_folder_mtime(paths: AgentPaths) -> int | None:
    """The ``archive/`` folder's mtime (ns), None when there is none."""
    try:
        return os.stat(paths.archive_dir).st_mtime_ns
    except (FileNotFoundError, NotADirectoryError):
        return None


def archive_stats(paths: AgentPaths, known: ArchiveStats | None = None) -> ArchiveStats:
    """Count the agent's archives and their bytes; ``known`` is reused (no listing)
    when the folder's mtime has not moved since it was taken. Never opens a file."""
    mtime = archive_folder_mtime(paths)
    if mtime is None:
        return NO_ARCHIVES
    if known is not None and known.mtime_ns == mtime:
        return known
    count = total = encrypted = 0
    try:
        with os.scandir(paths.archive_dir) as listing:
            for entry in listing:
                if not is_archive_name(entry.name):
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                count += 1
                total += info.st_size
                encrypted += entry.name.endswith(".enc")
    except (FileNotFoundError, NotADirectoryError):
        return NO_ARCHIVES
    return ArchiveStats(count, total, mtime, encrypted)


def _archive_sort_key(path: Path) -> tuple[str, int]:
    # history_2026-01-01_10-00-00_3.md sorts after history_2026-01-01_10-00-00.md
    stem = path.name.removesuffix(".enc").removesuffix(".md")
    parts = stem.removeprefix("history_").split("_")
    if len(parts) == 3 and parts[2].isdigit():
        return ("_".join(parts[:2]), int(parts[2]))
    return ("_".join(parts), 0)


def resolve_agents(workspace: Path, names: list[str], all_agents: bool) -> list[str]:
    if all_agents:
        return list_agents(workspace)
    for name in names:
        agent_paths(workspace, name)
    return names


__all__ = [
    "AGENTS_DIR",
    "ARCHIVE_DIR",
    "ARCHIVE_TEMP",
    "DRAIN_NAME",
    "JOURNAL_NAME",
    "LEGACY_JOURNAL_NAME",
    "MEMORY_FILE",
    "NEW_MEMORY_TEMP",
    "NO_ARCHIVES",
    "PRIVATE_DIR",
    "AgentPaths",
    "AgentScan",
    "ArchiveStats",
    "FolderFacts",
    "ScannedAgent",
    "UnknownAgent",
    "agent_paths",
    "agent_paths_scanned",
    "agents_folder_real",
    "archive_folder_mtime",
    "archive_stats",
    "archives_of",
    "check_agent_folder",
    "check_memory_link",
    "is_archive_name",
    "is_within",
    "list_agents",
    "open_memory",
    "require_workspace",
    "resolve_agents",
    "resolve_own",
    "scan_agents",
]
