"""The agents' read-only door to recall: a local unix socket served by the daemon.

An agent (``memd_swarms``' ``recall_memory`` tool, ``memd mcp``) connects,
sends one JSON line and reads one JSON line back:

    → {"v": 1, "agent": "alpha", "query": "where is the report?", "limit": 5,
       "since": "2026-11-30", "role": "Human"}          (since, role optional)
    ← {"v": 1, "ok": true, "results": [{...}, ...]}      (the --json schema)
    ← {"v": 1, "ok": false, "error": "one line"}

An agent may also ask where its memory stands (``memd_swarms`` does, before a
run, to hold its requests to memd's threshold while a compaction is coming):

    → {"v": 1, "agent": "alpha", "op": "status"}
    ← {"v": 1, "ok": true, "status": {"tokens": 2148, "threshold_tokens": 1991,
       "state": "pending", "cooldown_left_s": null, "dev": 64768, "ino": 131,
       "size": 9012}}

``tokens`` is memd's count of the file (dev, ino) up to byte ``size`` (null
when not counted yet), ``state`` the agent's job as ``memd status --json``
says it; ``cooldown_left_s`` how long a cooldown after which memd compacts
the file again still lasts (null otherwise, and from a daemon before it). A
daemon older than this answers the request with an error (no "query"), which
a client reads as "no status".

Who may ask is decided by the kernel, not by anything the client says: the
peer's uid (``SO_PEERCRED``) must be root or own the agent's MEMORY.md (each
agent runs under its own uid in the systemd layout). Any other uid is refused.
The socket file is world-connectable (0666) on purpose: the check above is
the access control, so one socket serves every agent uid.

A worker slot is scarce (``MAX_CLIENTS``), so a connection takes one only
with its request line complete: the accept thread reads every request line
itself, over non-blocking connections (a selector), so a client that connects
and sends nothing, or trickles a byte at a time, holds no slot and keeps no one
else waiting. What it can hold is bounded too: the peer's uid is read right
after accept, before a byte is read, and a uid that owns no agent folder nor
MEMORY.md in the workspace is refused there; a client has
``REQUEST_DEADLINE_S`` in all to send its request line; a uid has at most
``MAX_PENDING_PER_UID`` connections waiting (to send their line, or for a
slot) and all uids ``MAX_PENDING`` (past either, the uid's connection idle the
longest is told so and closed); and while every slot is taken, the next slot
goes to the uid holding the fewest (oldest request first), so one uid's
requests cannot keep another's waiting behind them. A complete request that
finds no slot within the deadline is told to retry.

The socket only searches; nothing a client sends can write or delete.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import selectors
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memd.agentdir import AgentDir
from memd.core.names import validate_agent_name
from memd.core.recall import since_epoch
from memd.errors import MemdError, WorkspaceError, describe_error
from memd.logs import get_logger
from memd.recall.index import MAX_LIMIT, RecallIndex
from memd.workspace import AGENTS_DIR, MEMORY_FILE, agent_paths, list_agents

PROTOCOL_VERSION = 1
SOCKET_NAME = ".memd-recall.sock"
MAX_REQUEST_BYTES = 64 * 1024
# All a client has to send its request line, from when it is accepted; its
# reply must be taken within this too, and a complete request waits at most
# this long for a worker slot. A real client sends at once.
REQUEST_DEADLINE_S = 5.0
# Requests worked on at once (one thread each).
MAX_CLIENTS = 16
# Connections accepted but not yet given a slot (still sending their line, or
# waiting for a slot): per uid, and in all. Past either, that uid's connection
# idle the longest is told so and closed (never another uid's for the per-uid
# bound; the uid holding the most for the bound in all).
MAX_PENDING_PER_UID = 32
MAX_PENDING = 256
# Connections waiting in the kernel's queue to be accepted (the kernel caps it
# at net.core.somaxconn). A full queue fails a client's connect at once (EAGAIN):
# at 64, a uid reconnecting 300 connections as fast as they were closed kept it full.
LISTEN_BACKLOG = 1024
# Connections accepted in one go before the others' lines are read.
ACCEPT_BATCH = 64
# An unknown uid re-reads the agents' owners at most this often (a new agent's
# uid is known within this; a stranger connecting in a loop costs one scan a second).
OWNERS_RESCAN_S = 1.0
# Connections answered without a slot and kept until they hang up (the oldest closed first).
MAX_TURNED_AWAY = 64
# A refused uid is logged at most once in this many seconds per agent it asked
# for, and at most REFUSAL_LOG_BURST refusals in all per interval (the rest counted).
REFUSAL_LOG_EVERY_S = 60.0
REFUSAL_LOG_BURST = 20
MAX_REFUSAL_KEYS = 4096
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid

_log = get_logger("memd.recall")


class RecallRefused(MemdError, PermissionError):
    """The caller may not read this agent's history."""


#: Where an agent's memory stands (the "status" request), or None for an agent
#: the daemon does not watch.
StatusSource = Callable[[str], "dict[str, Any] | None"]


class RecallSocketInUse(MemdError, OSError):
    """Another live process (a second daemon's first) serves the socket path."""


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int


def socket_path_for(setting: str, workspace: Path) -> Path | None:
    """``[recall] socket``: "" = ``<workspace>/.memd-recall.sock``, "off" = no socket."""
    if setting.strip().lower() == "off":
        return None
    return Path(setting).expanduser() if setting.strip() else workspace / SOCKET_NAME


def peer_credentials(conn: socket.socket) -> PeerCredentials:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return PeerCredentials(pid, uid, gid)


@dataclass(frozen=True, slots=True)
class SocketProbe:
    """What is at a recall socket path (:func:`probe_socket`)."""

    # Nothing serves there: no file, or a socket nothing listens on (a crashed
    # daemon's); the path may be bound again.
    free: bool
    # The listener that answered (pid 0: it is in another pid namespace).
    peer: PeerCredentials | None = None
    # Why the path is not free when no one answered, for the one log line.
    reason: str = ""


# connect() errors that mean nothing listens at the path. Anything else (EAGAIN:
# a live listener whose accept queue is full, a timeout, EACCES) means something
# is there that we cannot judge, so it is never replaced.
_STALE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.ENOENT, errno.ENOTSOCK, errno.ENOTDIR})


def probe_socket(path: Path) -> SocketProbe:
    """Whether ``path`` may be (re)bound, and who answers there if someone does.

    The file is opened with ``O_PATH | O_NOFOLLOW`` and connected to through that
    fd, so the probe never follows a symlink to some other service's socket, and
    what is connected to is what was checked. A symlink or any other non-socket
    is not free: memd only ever makes a socket there, so such a file is someone
    else's and is left alone. Both opens go through the folder's fd, like
    :meth:`RecallSocketServer.start`, so a deep path never hits the 108-byte
    limit of a socket address."""
    try:
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return SocketProbe(free=True)  # the bind that follows says why it cannot
    try:
        try:
            target = os.open(path.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
        except FileNotFoundError:
            return SocketProbe(free=True)
        except OSError as exc:
            return SocketProbe(free=False, reason=f"{path} cannot be checked: {exc.strerror}")
        try:
            mode = os.fstat(target).st_mode
            if not stat.S_ISSOCK(mode):
                kind = "a symlink" if stat.S_ISLNK(mode) else "not a socket"
                return SocketProbe(
                    free=False,
                    reason=f"{path} is {kind}, which memd never makes there, so it is "
                    "left alone (remove it and memd serves recall there)",
                )
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(2.0)
                try:
                    probe.connect(f"/proc/self/fd/{target}")
                except OSError as exc:
                    if exc.errno in _STALE_ERRNOS:
                        return SocketProbe(free=True)  # a crashed daemon's socket
                    why = exc.strerror or "no answer within 2 s"
                    return SocketProbe(
                        free=False,
                        reason=f"{path} is a live socket that takes no connection now "
                        f"({why}: a busy or stopped daemon, or not ours), so it is left alone",
                    )
                # Linux gives a connected client the listener's credentials.
                return SocketProbe(free=False, peer=peer_credentials(probe))
        finally:
            os.close(target)
    finally:
        os.close(directory)


def _listener(pid: int) -> str:
    """Who a socket's listener is, for the log line."""
    from memd.state import is_memd_daemon  # the state DB module: only when it is needed

    if pid == 0:
        return "a process in another pid namespace (a container's memd?)"
    if pid == os.getpid():
        return f"this memd process already (pid {pid})"
    verdict = is_memd_daemon(pid)
    if verdict is False:
        return f"pid {pid}, which is not a memd daemon"
    return f"another memd daemon (pid {pid})"


def serving_peer(path: Path) -> PeerCredentials | None:
    """Who answers at ``path``: the listener's credentials, or None."""
    return probe_socket(path).peer


def open_admitted(workspace: Path, agent: str, uid: int) -> AgentDir | None:
    """The agent's folder, pinned, once ``uid`` is found to be root or to own the
    folder or its MEMORY.md; :class:`RecallRefused` otherwise. None: root asked
    about an agent with no folder (a status request may still be answered).

    The folder counts because a memd that is not root re-seeds MEMORY.md as
    its own file (the agent keeps appending through its group), while the
    agent's folder, which memd never replaces, stays the agent's.

    The owners are read with ``fstat`` on the pinned folder (and MEMORY.md
    found through it), and the caller reads the agent's files through that same
    pin (``sync_agent(folder=...)``): an agent that swaps its own folder for a
    symlink to another agent's after this check reads nothing of that agent's.
    The caller closes what is returned.
    """
    paths = agent_paths(workspace, agent, must_exist=uid != 0)
    try:
        folder = AgentDir.open_to_read(paths)
    except FileNotFoundError:
        if uid == 0:
            return None
        raise RecallRefused(f"no agent {agent!r} in {workspace}") from None
    try:
        if uid != 0:
            owners = {os.fstat(folder.dir_fd).st_uid}
            memory = folder.stat_memory()
            if memory is not None:
                owners.add(memory.st_uid)
            if uid not in owners:
                raise RecallRefused(
                    f"uid {uid} may not read agent {agent!r}'s memory "
                    "(it owns neither the agent's folder nor its MEMORY.md)"
                )
    except BaseException:
        folder.close()
        raise
    return folder


def check_access(workspace: Path, agent: str, uid: int) -> None:
    """Refuse unless ``uid`` is root or owns the agent's folder or its MEMORY.md
    (:func:`open_admitted`, its pin closed at once)."""
    folder = open_admitted(workspace, agent, uid)
    if folder is not None:
        folder.close()


def _refused_text(agent: str, exc: BaseException) -> str:
    """What a client is told of a failure: a folder refused for a symlink is said
    without the paths (memd resolves them as itself: they would name files and
    link targets in folders the asker may not list); the log has them."""
    if isinstance(exc, WorkspaceError):
        _log.warning("recall refused: agent folder", agent=agent, error=str(exc))
        return (
            f"agent {agent!r}: refused: its folder, MEMORY.md or archive folder is a "
            "symlink leading outside the agent's own folder (memd's log says where)"
        )
    return str(exc)


def _error(message: str) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "ok": False, "error": message}


def agent_owner_uids(workspace: Path) -> set[int]:
    """The uids that own an agent's folder or its MEMORY.md: the only ones besides
    root that :func:`check_access` can let read anything (a superset: it is
    the coarse check made at accept, before the request names an agent)."""
    owners: set[int] = set()
    agents = workspace / AGENTS_DIR
    for name in list_agents(workspace):
        for path in (agents / name, agents / name / MEMORY_FILE):
            with contextlib.suppress(OSError):
                owners.add(os.stat(path).st_uid)
    return owners


def _lone_surrogate(**fields: object) -> str | None:
    """The first field whose string holds a lone surrogate (JSON's ``"\\ud800"``):
    no file name, log line or SQLite text can carry it."""
    for name, value in fields.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return name
    return None


_TOO_LONG = f"request too long or not one line (max {MAX_REQUEST_BYTES} bytes)"


@dataclass(slots=True)
class _Pending:
    """A connection accepted and not yet given a slot (accept thread only)."""

    conn: socket.socket
    peer: PeerCredentials
    # When it is told its time is up: to send its line, then to get a slot.
    deadline: float
    # When it last sent anything (or was accepted): the one idle the longest goes first.
    last_read_at: float
    data: bytearray = field(default_factory=bytearray)
    # Its request line once complete (it then waits for a slot, unread further).
    line: bytes | None = None


class RecallSocketServer:
    """Accepts connections on ``path`` in a thread, which also reads their request
    lines (non-blocking); one short worker thread per complete request."""

    def __init__(
        self,
        index: RecallIndex,
        workspace: Path,
        path: Path,
        *,
        request_deadline_s: float = REQUEST_DEADLINE_S,
        status: StatusSource | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.index = index
        self.workspace = workspace
        self.path = path
        self.request_deadline_s = request_deadline_s
        self.status = status
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # Worker slots in use, in all and per uid (the accept thread takes them,
        # workers give them back and wake it through _wake; under _slots_lock).
        self._slots_lock = threading.Lock()
        self._busy = 0
        self._busy_by_uid: dict[int, int] = {}
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        # Connections accepted and not yet given a slot, by fd, and how many per
        # uid (accept thread only).
        self._pending: dict[int, _Pending] = {}
        self._pending_by_uid: dict[int, int] = {}
        self._selector: selectors.BaseSelector  # made by start()
        self._inode: int | None = None
        # agent_owner_uids(), and when it was read (monotonic; accept thread only).
        self._owners: set[int] = set()
        self._owners_read_at: float | None = None
        # Connections answered without a slot, until they hang up (accept thread only).
        self._turned_away: list[tuple[socket.socket, float]] = []
        # Per (uid, agent asked for): when its last refusal was logged, and the
        # refusals since; the lines logged in the current interval, and the refusals
        # over that burst not logged yet (any thread, under the lock).
        self._clock = clock
        self._refusal_lock = threading.Lock()
        self._refusals_logged: dict[tuple[int, str | None], tuple[float | None, int]] = {}
        self._refusal_window_at = float("-inf")
        self._refusal_window_lines = 0
        self._refusals_unlogged = 0

    def start(self) -> None:
        """Serve at ``path``; :class:`RecallSocketInUse` when a live process
        (another daemon on the workspace, DESIGN §4) already answers there: its
        socket is left alone, and our stop() would otherwise have removed it."""
        found = probe_socket(self.path)
        if found.peer is not None:
            # Left alone whoever it is: a listener we cannot judge (another pid
            # namespace, another program) is not ours to take over.
            raise RecallSocketInUse(
                f"{self.path} is served by {_listener(found.peer.pid)}; "
                "this one runs without a recall socket"
            )
        if not found.free:
            raise RecallSocketInUse(found.reason)
        # Bind under a temporary name, then rename over the final one: a
        # stale socket from a crashed daemon is replaced, never half-served.
        # Both go through the folder's fd (/proc/self/fd/N/...), so a deep
        # workspace path never hits the 108-byte limit of a socket address.
        directory = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        temp = f"{self.path.name}.{os.getpid()}.tmp"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=directory)
            sock.bind(f"/proc/self/fd/{directory}/{temp}")
            # Connectable by every uid: SO_PEERCRED decides, per agent.
            os.chmod(temp, 0o666, dir_fd=directory)  # noqa: S103
            sock.listen(LISTEN_BACKLOG)
            os.replace(temp, self.path.name, src_dir_fd=directory, dst_dir_fd=directory)
            self._inode = os.stat(self.path).st_ino
        except BaseException:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp, dir_fd=directory)
            raise
        finally:
            os.close(directory)
        sock.setblocking(False)
        self._sock = sock
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._thread = threading.Thread(target=self._serve, name="memd-recall-socket", daemon=True)
        self._thread.start()
        _log.info("recall socket listening", path=str(self.path))

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            # Only our own socket: another daemon may have replaced it since.
            with contextlib.suppress(OSError):
                if os.stat(self.path).st_ino == self._inode:
                    self.path.unlink()

    def _serve(self) -> None:
        try:
            self._accept_loop()
        finally:
            for conn, _until in self._turned_away:
                conn.close()
            for pending in self._pending.values():
                pending.conn.close()
            self._pending.clear()
            for wake in (self._wake_r, self._wake_w):
                if wake is not None:
                    wake.close()

    def _accept_loop(self) -> None:
        """Accept connections and read their request lines, all in this thread,
        over non-blocking sockets; a request line complete gets a worker slot."""
        assert self._sock is not None and self._wake_r is not None
        with self._selector as selector:
            selector.register(self._sock, selectors.EVENT_READ, None)
            selector.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
            while not self._stopping.is_set():
                for key, _events in selector.select(self._select_timeout()):
                    if key.data is None:
                        self._accept_some()
                    elif key.data is self._wake_r:
                        _drained(self._wake_r)
                    else:
                        self._read_request(key.data)
                now = time.monotonic()
                self._expire(now)
                self._dispatch()
                self._drain_turned_away()

    def _select_timeout(self) -> float:
        """Until the next request's deadline, at most half a second (the
        turned-away connections are drained and stop() is seen that often)."""
        if not self._pending:
            return 0.5
        soonest = min(pending.deadline for pending in self._pending.values())
        return max(0.0, min(0.5, soonest - time.monotonic()))

    def _accept_some(self) -> None:
        assert self._sock is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if not self._stopping.is_set():
                    _log.warning("recall socket accept failed", error=str(exc))
                    # Out of fds (EMFILE): the listener stays readable; no busy loop.
                    self._stopping.wait(0.1)
                return
            conn.settimeout(self.request_deadline_s)  # for the replies sent from here
            try:
                peer = peer_credentials(conn)
            except OSError:
                conn.close()
                continue
            refusal = self._refusal(peer)
            if refusal is not None:
                self._log_refusal(peer)
                self._turn_away(conn, refusal)
                continue
            self._admit_pending(conn, peer)

    def _admit_pending(self, conn: socket.socket, peer: PeerCredentials) -> None:
        """Wait for ``conn``'s request line without a slot, within the bounds on
        pending connections (the uid's, then all uids')."""
        now = time.monotonic()
        conn.setblocking(False)
        pending = _Pending(conn, peer, now + self.request_deadline_s, now)
        fd = conn.fileno()
        self._pending[fd] = pending
        uid = peer.uid
        self._pending_by_uid[uid] = self._pending_by_uid.get(uid, 0) + 1
        self._selector.register(conn, selectors.EVENT_READ, pending)
        self._read_request(pending)  # a real client's line is often there already
        if self._pending_by_uid.get(uid, 0) > MAX_PENDING_PER_UID:
            self._evict(uid, f"uid {uid} has over {MAX_PENDING_PER_UID} connections waiting")
        if len(self._pending) > MAX_PENDING:
            most = max(self._pending_by_uid, key=lambda each: self._pending_by_uid[each])
            self._evict(most, f"over {MAX_PENDING} connections waiting in all")

    def _evict(self, uid: int, why: str) -> None:
        """Close ``uid``'s pending connection idle the longest: one still sending its
        line (the one that sent nothing for the longest), else the oldest waiting for
        a slot."""
        mine = [pending for pending in self._pending.values() if pending.peer.uid == uid]
        if not mine:
            return
        victim = min(mine, key=lambda pending: (pending.line is not None, pending.last_read_at))
        self._forget(victim)
        self._turn_away(victim.conn, f"{why}; the one idle the longest is closed: retry shortly")

    def _forget(self, pending: _Pending) -> None:
        """No longer pending (a slot, an error, a hang-up follows)."""
        if self._pending.pop(pending.conn.fileno(), None) is None:
            return
        uid = pending.peer.uid
        left = self._pending_by_uid[uid] - 1
        if left:
            self._pending_by_uid[uid] = left
        else:
            del self._pending_by_uid[uid]
        if pending.line is None:
            self._selector.unregister(pending.conn)

    def _read_request(self, pending: _Pending) -> None:
        """Take what ``pending`` sent, without waiting; once its line is complete it
        waits for a slot, unread further."""
        if pending.line is not None:
            return
        try:
            while True:
                chunk = pending.conn.recv(4096)
                if not chunk:
                    break  # the client hung up: what it sent is its request
                pending.data += chunk
                pending.last_read_at = time.monotonic()
                if len(pending.data) > MAX_REQUEST_BYTES:
                    self._forget(pending)
                    self._turn_away(pending.conn, _TOO_LONG)
                    return
                if b"\n" in chunk:
                    break
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._forget(pending)
            pending.conn.close()
            return
        line, _sep, _rest = bytes(pending.data).partition(b"\n")
        if not pending.data:  # hung up having sent nothing
            self._forget(pending)
            pending.conn.close()
            return
        if not line.strip():
            self._forget(pending)
            self._turn_away(pending.conn, _TOO_LONG)
            return
        self._selector.unregister(pending.conn)
        pending.line = line
        pending.data = bytearray()
        # It waits for a slot at most the deadline, from now.
        pending.deadline = time.monotonic() + self.request_deadline_s

    def _expire(self, now: float) -> None:
        for pending in [each for each in self._pending.values() if now >= each.deadline]:
            self._forget(pending)
            if pending.line is None:
                message = f"request not received in full within {self.request_deadline_s:g} s"
            else:
                message = "too many recall clients at once; retry shortly"
            self._turn_away(pending.conn, message)

    def _dispatch(self) -> None:
        """Give free slots to complete requests: to the uid holding the fewest
        slots, its oldest request first."""
        while True:
            ready = [pending for pending in self._pending.values() if pending.line is not None]
            if not ready:
                return
            with self._slots_lock:
                if self._busy >= MAX_CLIENTS:
                    return
                chosen = min(
                    ready,
                    key=lambda pending: (
                        self._busy_by_uid.get(pending.peer.uid, 0),
                        pending.deadline,
                    ),
                )
                uid = chosen.peer.uid
                self._busy += 1
                self._busy_by_uid[uid] = self._busy_by_uid.get(uid, 0) + 1
            self._forget(chosen)
            assert chosen.line is not None
            threading.Thread(
                target=self._handle,
                args=(chosen.conn, chosen.peer, chosen.line),
                name="memd-recall-client",
                daemon=True,
            ).start()

    def _give_back(self, uid: int) -> None:
        with self._slots_lock:
            self._busy -= 1
            left = self._busy_by_uid[uid] - 1
            if left:
                self._busy_by_uid[uid] = left
            else:
                del self._busy_by_uid[uid]
        self._wake()

    def _wake(self) -> None:
        """Have the accept thread look again now (a slot was given back, or stop)."""
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")

    def _turn_away(self, conn: socket.socket, message: str) -> None:
        """Answer ``message`` without a slot and without reading the request. The
        connection is kept open a moment (a close with its request unread would
        fail the client's send before it reads the answer) and drained, unread,
        by this thread between accepts, until the client hangs up or the deadline."""
        self._reply(conn, _error(message))
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_WR)
        conn.setblocking(False)
        self._turned_away.append((conn, time.monotonic() + self.request_deadline_s))
        if len(self._turned_away) > MAX_TURNED_AWAY:
            oldest, _until = self._turned_away.pop(0)
            oldest.close()

    def _drain_turned_away(self) -> None:
        now = time.monotonic()
        kept = []
        for conn, until in self._turned_away:
            if _drained(conn) or now >= until:
                conn.close()
            else:
                kept.append((conn, until))
        self._turned_away = kept

    def _refusal(self, peer: PeerCredentials) -> str | None:
        """Why ``peer`` may not ask at all (None: it may ask; :func:`check_access`
        then decides per agent): checked before a byte of its request is read."""
        if peer.uid == 0 or peer.uid in self._owners:
            return None
        now = time.monotonic()
        if self._owners_read_at is None or now - self._owners_read_at >= OWNERS_RESCAN_S:
            self._owners_read_at = now
            try:
                self._owners = agent_owner_uids(self.workspace)
            except (MemdError, OSError) as exc:
                _log.warning("recall socket cannot list the agents", error=describe_error(exc))
            if peer.uid in self._owners:
                return None
        return (
            f"uid {peer.uid} may not read any agent's memory in {self.workspace} "
            "(it owns no agent's folder nor MEMORY.md)"
        )

    def _handle(self, conn: socket.socket, peer: PeerCredentials, line: bytes) -> None:
        try:
            conn.settimeout(self.request_deadline_s)  # the reply must be taken within it
            answer = self._answer(line, peer)
            self._reply(conn, answer)
        except Exception as exc:  # one client's failure never reaches the others
            _log.warning(
                "recall request failed", uid=peer.uid, pid=peer.pid, error=describe_error(exc)
            )
            self._reply(conn, _error(f"recall failed: {type(exc).__name__}"))
        finally:
            conn.close()
            self._give_back(peer.uid)

    def _answer(self, line: bytes, peer: PeerCredentials) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except ValueError:
            return _error("request is not JSON")
        if not isinstance(request, dict):
            return _error("request must be a JSON object")
        op = request.get("op", "recall")
        if op not in ("recall", "status"):
            return _error('"op" must be "recall" or "status"')
        agent = request.get("agent")
        if not isinstance(agent, str):
            return _error('request needs an "agent" string')
        admitted = self._admit(agent, peer, op)
        if isinstance(admitted, dict):
            return admitted
        if op == "status":
            if admitted is not None:
                admitted.close()
            return self._status(agent)
        if admitted is None:
            return _error(f"unknown agent {agent!r}: no folder in {self.workspace}")
        with admitted:
            return self._recall(agent, request, admitted)

    def _admit(
        self, agent: str, peer: PeerCredentials, op: str
    ) -> AgentDir | dict[str, Any] | None:
        """The one check every request passes before its op runs: a name memd
        accepts, and a peer that may read that agent (the agent's folder, pinned,
        which the op reads through; else the error to answer). Kept in one place
        so no op can skip a part of it."""
        if _lone_surrogate(agent=agent) is not None:
            return _error('"agent" holds a lone UTF-16 surrogate: not text memd can search')
        try:
            validate_agent_name(agent)
            return open_admitted(self.workspace, agent, peer.uid)
        except RecallRefused as exc:
            self._log_refusal(peer, agent, op)
            return _error(str(exc))
        except (MemdError, OSError) as exc:
            return _error(_refused_text(agent, exc))

    def _recall(self, agent: str, request: dict[str, Any], folder: AgentDir) -> dict[str, Any]:
        query = request.get("query")
        limit = request.get("limit", 5)
        since = request.get("since")
        role = request.get("role")
        if not isinstance(query, str):
            return _error('request needs a "query" string')
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            return _error(f'"limit" must be an integer in 1..{MAX_LIMIT}')
        if since is not None and not isinstance(since, str):
            return _error('"since" must be an ISO date string')
        if role is not None and not isinstance(role, str):
            return _error('"role" must be a string')
        bad = _lone_surrogate(query=query, since=since, role=role)
        if bad is not None:
            return _error(f'"{bad}" holds a lone UTF-16 surrogate: not text memd can search')
        try:
            since_at = since_epoch(since) if since else None
            self.index.sync_agent(folder.paths, folder=folder)
            hits = self.index.search(agent, query, limit=limit, since_epoch=since_at, role=role)
        except (MemdError, OSError) as exc:
            return _error(_refused_text(agent, exc))
        _log.debug("recall served", agent=agent, results=len(hits))
        return {"v": PROTOCOL_VERSION, "ok": True, "results": [hit.as_json() for hit in hits]}

    def _status(self, agent: str) -> dict[str, Any]:
        """Where the agent's memory stands (the caller was admitted for it)."""
        status = None if self.status is None else self.status(agent)
        if status is None:
            return _error(f"memd does not watch agent {agent!r}")
        return {"v": PROTOCOL_VERSION, "ok": True, "status": status}

    def _log_refusal(self, peer: PeerCredentials, agent: str | None = None, op: str = "") -> None:
        """Log a refusal, bounded: one line per uid and agent asked for per
        ``REFUSAL_LOG_EVERY_S`` (a stranger connecting in a loop must not flood the
        log, yet an agent refused once for nothing (it asked before its folder was
        handed to it) and then trying another agent's memory is still said), and at
        most ``REFUSAL_LOG_BURST`` lines per that interval in all (many uids: a
        rootless container's subuid range). What is left out is counted and told
        with the next line logged."""
        now = self._clock()
        key = (peer.uid, agent)
        with self._refusal_lock:
            last_at, skipped = self._refusals_logged.get(key, (None, 0))
            if last_at is not None and now - last_at < REFUSAL_LOG_EVERY_S:
                self._refusals_logged[key] = (last_at, skipped + 1)
                return
            if now - self._refusal_window_at >= REFUSAL_LOG_EVERY_S:
                self._refusal_window_at, self._refusal_window_lines = now, 0
            if self._refusal_window_lines >= REFUSAL_LOG_BURST:
                self._refusals_unlogged += 1
                return
            self._refusal_window_lines += 1
            if len(self._refusals_logged) >= MAX_REFUSAL_KEYS:
                self._refusals_logged.clear()  # bounded memory; worst case one extra line each
            self._refusals_logged[key] = (now, 0)
            unlogged, self._refusals_unlogged = self._refusals_unlogged, 0
        fields: dict[str, Any] = {"uid": peer.uid, "pid": peer.pid}
        if agent is not None:
            fields.update(agent=agent, op=op)
        if skipped:
            fields["refused_since_last"] = skipped
        if unlogged:
            fields["refusals_not_logged"] = unlogged  # over the burst, any uid
        _log.warning("recall refused", **fields)

    @staticmethod
    def _reply(conn: socket.socket, payload: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(payload, ensure_ascii=False).encode() + b"\n")


def _drained(conn: socket.socket) -> bool:
    """Read what a turned-away client sent (never looked at): True once it hung up."""
    try:
        for _chunk in range(16):  # a client that keeps sending waits for the next pass
            if not conn.recv(4096):
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    return False


__all__ = [
    "PROTOCOL_VERSION",
    "SOCKET_NAME",
    "PeerCredentials",
    "RecallRefused",
    "RecallSocketInUse",
    "RecallSocketServer",
    "SocketProbe",
    "StatusSource",
    "agent_owner_uids",
    "check_access",
    "open_admitted",
    "peer_credentials",
    "probe_socket",
    "serving_peer",
    "socket_path_for",
]
