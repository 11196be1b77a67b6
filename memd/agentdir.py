"""An agent's folder pinned as directory fds: containment per agent (DESIGN.md §1).

Paths under an agent folder are the agent's to change at any moment: it can
rename a folder away and put a symlink in its place between two of memd's
system calls. So the transaction resolves everything once, under its lock,
into open directory fds, and from then on only uses ``*at`` calls on them with
``O_NOFOLLOW`` on the last component:

* the agent folder (a symlink is followed only if it resolves inside the
  workspace and neither into nor around another agent's folder);
* ``.memd/`` (a real directory owned by memd; never a symlink);
* the folder holding MEMORY.md's inode (a symlinked MEMORY.md is resolved once
  and must stay inside the same agent's folder) and the file's name there;
* ``archive/`` (a real directory; never a symlink, even one inside the agent's folder).

Where a directory fd really points is read back from ``/proc/self/fd`` after
it is opened, so a symlink swapped in between resolving and opening is caught.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field

from memd.errors import WorkspaceError, describe_error
from memd.workspace import (
    AGENTS_DIR,
    ARCHIVE_DIR,
    MEMORY_FILE,
    PRIVATE_DIR,
    AgentPaths,
    agents_folder_real,
    check_agent_folder,
    is_within,
)

PRIVATE_DIR_MODE = 0o700
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def fd_path(fd: int) -> str:
    """Where the kernel says an open directory fd is now (`` (deleted)`` if removed)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError as exc:
        reason = describe_error(exc, with_file=False)
        raise WorkspaceError(
            f"cannot tell where an open folder is (/proc/self/fd unreadable: {reason})"
        ) from None


@dataclass(slots=True)
class AgentDir:
    """Open fds on one agent's folders; close with :meth:`close` (or ``with``)."""

    paths: AgentPaths
    dir_fd: int
    real_dir: str
    private_fd: int = -1
    memory_dir_fd: int = -1
    memory_name: str = MEMORY_FILE
    _archive_fd: int = -1
    _owned: list[int] = field(default_factory=list)

    # -- opening ------------------------------------------------------------
    @classmethod
    def open(cls, paths: AgentPaths, *, create_private: bool = True) -> AgentDir:
        """Pin the agent folder and ``.memd/`` (created when missing)."""
        try:
            pinned = cls._pin_folder(paths)
        except FileNotFoundError:
            raise WorkspaceError(f"agent {paths.agent!r}: no folder {paths.dir}") from None
        try:
            pinned.private_fd = pinned._open_private(create_private)
        except BaseException:
            pinned.close()
            raise
        return pinned

    @classmethod
    def open_to_read(cls, paths: AgentPaths) -> AgentDir:
        """Pin the agent folder to read it (recall): no ``.memd/`` made or opened.

        The folder is opened once, and what is read afterwards is read through
        that fd, so renaming the folder away and putting a symlink to another
        agent's in its place changes nothing already pinned.
        Raises FileNotFoundError when there is no folder."""
        return cls._pin_folder(paths)

    @classmethod
    def _pin_folder(cls, paths: AgentPaths) -> AgentDir:
        """Open the agent folder once and check where the fd landed.

        A folder the fd finds at ``agents/NAME`` itself is the agent's own, whatever
        links others made to it: any agent could make agents/x -> victim (agents/ is
        writable by the agents' group), and the victim's compactions were refused
        until its breaker opened; those links are refused on their own (x's folder
        resolves into victim's). The usual case costs an ``open`` and a
        ``readlink``, no listing of the other agents. Anywhere else (a symlinked
        agent folder) it must not resolve into or around another agent's.
        Raises FileNotFoundError when there is no folder."""
        try:
            dir_fd = os.open(paths.dir, _DIR_FLAGS)
        except NotADirectoryError:
            raise WorkspaceError(f"agent {paths.agent!r}: {paths.dir} is not a folder") from None
        pinned = cls(paths=paths, dir_fd=dir_fd, real_dir="")
        pinned._owned.append(dir_fd)
        try:
            pinned.real_dir = fd_path(dir_fd)
            # paths.workspace is resolved: the same path means no link on the way.
            own = os.path.join(paths.workspace, AGENTS_DIR, paths.agent)
            if pinned.real_dir != own:
                agents_real = agents_folder_real(paths.workspace)
                check_agent_folder(pinned.real_dir, str(paths.workspace), agents_real, paths.agent)
        except BaseException:
            pinned.close()
            raise
        return pinned

    def _open_private(self, create: bool) -> int:
        flags = _DIR_FLAGS | os.O_NOFOLLOW
        try:
            fd = os.open(PRIVATE_DIR, flags, dir_fd=self.dir_fd)
        except FileNotFoundError:
            if not create:
                return -1
            with contextlib.suppress(FileExistsError):
                os.mkdir(PRIVATE_DIR, PRIVATE_DIR_MODE, dir_fd=self.dir_fd)
                os.fsync(self.dir_fd)
            fd = self._open_private_strict(flags)
        except (NotADirectoryError, OSError) as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise self._refuse(
                f"{PRIVATE_DIR} is not a real folder (a symlink or a file)"
            ) from None
        self._owned.append(fd)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise PermissionError(
                errno.EPERM,
                f"owned by uid {st.st_uid}, not memd's uid {os.geteuid()}",
                str(self.paths.private_dir),
            )
        if st.st_mode & 0o077:
            with contextlib.suppress(PermissionError):
                os.fchmod(fd, PRIVATE_DIR_MODE)
        return fd

    def _open_private_strict(self, flags: int) -> int:
        try:
            return os.open(PRIVATE_DIR, flags, dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._refuse(f"{PRIVATE_DIR} is not a real folder") from None
            raise

    def _refuse(self, reason: str) -> WorkspaceError:
        return WorkspaceError(f"agent {self.paths.agent!r}: {reason}")

    def _check_inside_agent(self, real: str, what: str) -> None:
        if not is_within(real, self.real_dir):
            raise self._refuse(f"{what} resolves outside the agent's own folder ({real})")

    def pin_memory(self) -> None:
        """Resolve MEMORY.md once: the folder fd holding its inode, and its name there."""
        if self.memory_dir_fd >= 0:
            return
        try:
            st = os.stat(MEMORY_FILE, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is None or not stat.S_ISLNK(st.st_mode):
            self.memory_dir_fd, self.memory_name = self.dir_fd, MEMORY_FILE
            return
        target = os.readlink(MEMORY_FILE, dir_fd=self.dir_fd)
        resolved = os.path.realpath(os.path.join(self.real_dir, target))
        if resolved == self.real_dir or not is_within(resolved, self.real_dir):
            raise self._refuse(f"MEMORY.md resolves outside the agent's own folder ({resolved})")
        parent, name = os.path.split(resolved)
        fd = os.open(parent, _DIR_FLAGS)
        self._owned.append(fd)
        self._check_inside_agent(fd_path(fd), "MEMORY.md's folder")
        self.memory_dir_fd, self.memory_name = fd, name

    def archive_fd(self, *, create: bool) -> tuple[int, bool]:
        """The archive folder's fd (-1 when missing and not created), and whether it was created."""
        if self._archive_fd >= 0:
            return self._archive_fd, False
        created = False
        # Never through a symlink, as .memd/: one the agent made inside its own
        # folder (archive -> notes/, -> .memd/) received archives where they are
        # not the archive folder's (a folder the agent may write, memd's own).
        flags = _DIR_FLAGS | os.O_NOFOLLOW
        try:
            fd = os.open(ARCHIVE_DIR, flags, dir_fd=self.dir_fd)
        except FileNotFoundError:
            if not create:
                return -1, False
            os.mkdir(ARCHIVE_DIR, PRIVATE_DIR_MODE, dir_fd=self.dir_fd)
            os.fsync(self.dir_fd)
            created = True
            fd = os.open(ARCHIVE_DIR, flags, dir_fd=self.dir_fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            if self._archive_is_link():
                link = None
                with contextlib.suppress(OSError):  # gone meanwhile: said as a symlink
                    link = os.readlink(ARCHIVE_DIR, dir_fd=self.dir_fd)
                if link is not None:
                    # Out of the agent's folder: said so, as agent_paths says it.
                    real = os.path.realpath(os.path.join(self.real_dir, link))
                    self._check_inside_agent(real, "archive folder")
                raise self._refuse(
                    f"archive folder {self.paths.archive_dir} is a symlink, not a real "
                    "folder; nothing is archived through it"
                ) from None
            raise NotADirectoryError(
                errno.ENOTDIR, "not a directory", str(self.paths.archive_dir)
            ) from None
        self._owned.append(fd)
        self._check_inside_agent(fd_path(fd), "archive folder")
        self._archive_fd = fd
        return fd, created

    def _archive_is_link(self) -> bool:
        with contextlib.suppress(OSError):
            entry = os.stat(ARCHIVE_DIR, dir_fd=self.dir_fd, follow_symlinks=False)
            return stat.S_ISLNK(entry.st_mode)
        return False

    def is_archive_dir_itself(self, fd: int) -> bool:
        """Whether ``fd`` (from :meth:`archive_fd`) is the folder named archive/ in
        the agent's folder, not one a symlink of that name leads to."""
        try:
            entry = os.stat(ARCHIVE_DIR, dir_fd=self.dir_fd, follow_symlinks=False)
        except OSError:
            return False
        st = os.fstat(fd)
        return stat.S_ISDIR(entry.st_mode) and (entry.st_dev, entry.st_ino) == (
            st.st_dev,
            st.st_ino,
        )

    def remove_created_archive_dir(self) -> None:
        """Undo :meth:`archive_fd`'s mkdir (only when empty)."""
        with contextlib.suppress(OSError):
            os.rmdir(ARCHIVE_DIR, dir_fd=self.dir_fd)

    # -- files ----------------------------------------------------------------
    def open_memory(self, flags: int) -> int:
        """Open MEMORY.md's pinned inode name; never follows a symlink, never blocks."""
        self.pin_memory()
        try:
            return os.open(
                self.memory_name,
                flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=self.memory_dir_fd,
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._refuse("MEMORY.md changed into a symlink during compaction") from None
            raise

    def stat_memory(self) -> os.stat_result | None:
        self.pin_memory()
        try:
            return os.stat(self.memory_name, dir_fd=self.memory_dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def private_exists(self, name: str) -> bool:
        try:
            os.stat(name, dir_fd=self.private_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def unlink_private(self, name: str) -> bool:
        try:
            os.unlink(name, dir_fd=self.private_fd)
        except FileNotFoundError:
            return False
        return True

    def open_private(self, name: str, flags: int, mode: int = 0o600) -> int:
        return os.open(
            name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=self.private_fd
        )

    def close(self) -> None:
        while self._owned:
            with contextlib.suppress(OSError):
                os.close(self._owned.pop())
        self.dir_fd = self.private_fd = self.memory_dir_fd = self._archive_fd = -1

    def __enter__(self) -> AgentDir:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


__all__ = ["AgentDir", "fd_path"]
