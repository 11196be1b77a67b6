from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import structlog
from support.daemon_proc import DaemonProcess, wait_until
from support.memfiles import AgentWorkspace, append_entry

from memd.errors import UnknownAgent
from memd.pointer import read_pointer
from memd.recall.client import ask
from memd.recall.index import RecallIndex
from memd.recall.socket_server import (
    LISTEN_BACKLOG,
    MAX_CLIENTS,
    MAX_PENDING_PER_UID,
    REFUSAL_LOG_BURST,
    PeerCredentials,
    RecallSocketInUse,
    RecallSocketServer,
    check_access,
    probe_socket,
    serving_peer,
    socket_path_for,
)
from memd.tokenizer import TokenCounter

# The agent-side client memd_swarms ships (stdlib only), run as the agent's uid.
SWARMS_CLIENT = (
    Path(__file__).resolve().parents[2] / "integrations/swarms/src/memd_swarms/_recall.py"
)
ASK = """
import json, sys
from pathlib import Path
import _recall
path, agent, query = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
print(json.dumps(_recall.ask(path, {"v": 1, "agent": agent, "query": query, "limit": 5})))
"""
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[AgentWorkspace, Path]]:
    ws = AgentWorkspace(tmp_path / ("a-rather-long-folder-name-to-pass-108-bytes" * 2) / "ws")
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the tangerine vault code is 4417")
    index = RecallIndex.open(tmp_path / "state", ws.root)
    server = RecallSocketServer(index, ws.root, socket_path_for("", ws.root))
    server.start()
    try:
        yield ws, server.path
    finally:
        server.stop()
        index.close()
    assert not server.path.exists()


def test_socket_answers_with_the_json_schema(served: tuple[AgentWorkspace, Path]) -> None:
    _ws, path = served
    assert len(str(path)) > 108  # bound and reached through the folder's fd
    assert os.stat(path).st_mode & 0o777 == 0o666
    reply = ask(path, {"v": 1, "agent": "alpha", "query": "tangerine vault?"})
    assert reply["ok"] is True and reply["v"] == 1
    (hit,) = reply["results"]
    assert hit["text"] == "the tangerine vault code is 4417" and hit["live"] is True


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        ({"agent": "alpha"}, 'request needs a "query" string'),
        ({"query": "x"}, 'request needs an "agent" string'),
        ({"agent": "alpha", "query": "x", "limit": 0}, '"limit"'),
        ({"agent": "alpha", "query": "x", "limit": True}, '"limit"'),
        ({"agent": "alpha", "query": "x", "since": "soon"}, "--since 'soon'"),
        ({"agent": "../x", "query": "x"}, "agent"),
        ({"agent": "ghost", "query": "x"}, "unknown agent 'ghost'"),
        ({"agent": "alpha", "query": "?!"}, "no word"),
        ({"agent": "alpha", "op": "erase"}, '"op" must be "recall" or "status"'),
        ({"op": "status"}, '"agent" string'),
        ({"agent": "ghost", "op": "status"}, "memd does not watch agent 'ghost'"),
        # A server without a status source (a recall-only one) says so.
        ({"agent": "alpha", "op": "status"}, "memd does not watch agent 'alpha'"),
        # A lone surrogate (JSON's "\ud800") cannot name a folder: one line, no traceback.
        ({"agent": "a\ud800", "op": "status"}, "lone UTF-16 surrogate"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_requests_get_one_line_errors(
    served: tuple[AgentWorkspace, Path], request_: object, needle: str
) -> None:
    _ws, path = served
    reply = ask(path, request_)  # type: ignore[arg-type]
    assert reply["ok"] is False and needle in reply["error"], reply
    assert "\n" not in reply["error"]


def test_garbage_and_silent_clients_do_not_stop_the_server(
    served: tuple[AgentWorkspace, Path],
) -> None:
    _ws, path = served
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(f"/proc/self/fd/{directory}/{path.name}")
            sock.sendall(b"not json\n")
            assert b"not JSON" in sock.recv(4096)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(f"/proc/self/fd/{directory}/{path.name}")  # and hang up at once
    finally:
        os.close(directory)
    assert ask(path, {"agent": "alpha", "query": "tangerine"})["ok"] is True


def test_access_rule(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    os.chown(paths.memory, 1000, 1000)
    check_access(ws.root, "alpha", 1000)
    check_access(ws.root, "alpha", 0)
    with pytest.raises(PermissionError, match="uid 1001 may not read agent 'alpha'"):
        check_access(ws.root, "alpha", 1001)
    paths.memory.unlink()
    with pytest.raises(PermissionError, match="uid 1000 may not read agent 'alpha'"):
        check_access(ws.root, "alpha", 1000)
    with pytest.raises(UnknownAgent, match="unknown agent 'ghost'"):
        check_access(ws.root, "ghost", 1000)


def test_access_after_a_non_root_memd_reseeded_memory(tmp_path: Path) -> None:
    # Under the shipped unit memd re-seeds MEMORY.md as its own file; the
    # agent's folder stays the agent's, and so does its recall.
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    os.chown(paths.dir, 1000, 1000)
    os.chown(paths.memory, 4321, 1000)
    check_access(ws.root, "alpha", 1000)
    check_access(ws.root, "alpha", 4321)
    with pytest.raises(PermissionError, match="uid 1001 may not read"):
        check_access(ws.root, "alpha", 1001)


def run_as(uid: int, socket_path: Path, agent: str, query: str) -> dict:
    # The client and the system Python live where that uid can read them;
    # nothing of this checkout (possibly under /root) is on its path.
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", ASK, str(socket_path), agent, query],
        cwd=socket_path.parent.parent / "bin",
        user=uid,
        group=uid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(socket_path.parent.parent / "bin")},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_daemons_socket_lets_each_uid_read_only_its_own_agent(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run clients as other uids")
    base = Path(tempfile.mkdtemp(prefix="memd-recall-", dir="/tmp"))
    try:
        base.chmod(0o755)
        (base / "bin").mkdir(mode=0o755)
        shutil.copy(SWARMS_CLIENT, base / "bin" / "_recall.py")
        ws = AgentWorkspace(base / "ws")
        owners = {"alpha": 1000, "beta": 65534}
        for agent, uid in owners.items():
            paths = ws.create_agent(agent)
            append_entry(paths.memory, "Human", f"{agent} hides the periwinkle key")
            os.chown(paths.memory, uid, uid)
        config = base / "memd.toml"
        config.write_text("[trigger]\ncontext_length = 100000\n")
        with DaemonProcess(ws.root, base / "state", config=config) as daemon:
            daemon.wait_ready()
            listening = daemon.wait_for("recall socket listening")
            path = Path(listening["path"])
            assert path == ws.root.resolve() / ".memd-recall.sock"
            own = run_as(1000, path, "alpha", "where is the periwinkle key?")
            assert own["ok"] and own["results"][0]["text"] == "alpha hides the periwinkle key"
            other = run_as(1000, path, "beta", "periwinkle")
            assert other == {
                "v": 1,
                "ok": False,
                "error": "uid 1000 may not read agent 'beta''s memory (it owns neither the agent's folder nor its MEMORY.md)",
            }
            assert run_as(65534, path, "beta", "periwinkle")["ok"]
            assert not run_as(65534, path, "alpha", "periwinkle")["ok"]
            outsider = run_as(4242, path, "alpha", "periwinkle")  # a uid with no agent
            assert not outsider["ok"] and "uid 4242" in outsider["error"]
            refused = daemon.wait_for("recall refused")
            assert refused["uid"] == 1000 and refused["agent"] == "beta"
            assert daemon.stop() == 0
        assert not path.exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_daemons_socket_says_where_an_agents_memory_stands(tmp_path: Path) -> None:
    """memd_swarms holds an agent's next request back while memd's count of its file
    is over the threshold: the daemon's answer is its own count, of which file and
    up to which byte, the agent's threshold and its job's state."""
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the tangerine vault code is 4417")
    config = tmp_path / "memd.toml"
    config.write_text("[trigger]\ncontext_length = 100000\nthreshold = 0.5\n")
    with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
        daemon.wait_ready()
        path = Path(daemon.wait_for("recall socket listening")["path"])
        reply = ask(path, {"v": 1, "agent": "alpha", "op": "status"})
        info = os.stat(paths.memory)
        text = paths.memory.read_text(encoding="utf-8")
        assert reply == {
            "v": 1,
            "ok": True,
            "status": {
                "tokens": TokenCounter("cl100k_base").count_text(text),
                "threshold_tokens": 50000,
                "state": "idle",
                "cooldown_left_s": None,
                "dev": info.st_dev,
                "ino": info.st_ino,
                "size": info.st_size,
            },
        }
        unknown = ask(path, {"v": 1, "agent": "ghost", "op": "status"})
        assert unknown == {"v": 1, "ok": False, "error": "memd does not watch agent 'ghost'"}
        assert daemon.stop() == 0


def test_a_live_socket_is_left_alone_and_a_stale_one_replaced(tmp_path: Path) -> None:
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the tangerine vault code is 4417")
    index = RecallIndex.open(tmp_path / "state", ws.root)
    path = socket_path_for("", ws.root)
    first = RecallSocketServer(index, ws.root, path)
    first.start()
    try:
        assert serving_peer(path) == PeerCredentials(os.getpid(), os.getuid(), os.getgid())
        second = RecallSocketServer(index, ws.root, path)
        with pytest.raises(
            RecallSocketInUse, match=rf"{path} is served by .* \(pid {os.getpid()}\)"
        ):
            second.start()
        second.stop()  # never served: it removes nothing
        assert ask(path, {"v": 1, "agent": "alpha", "query": "tangerine"})["ok"]
    finally:
        first.stop()
    # A crashed daemon's socket: the file stays, nothing listens (ECONNREFUSED).
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()
    assert path.exists() and serving_peer(path) is None
    third = RecallSocketServer(index, ws.root, path)
    third.start()
    try:
        assert ask(path, {"v": 1, "agent": "alpha", "query": "tangerine"})["ok"]
    finally:
        third.stop()
        index.close()


def one_agent_workspace(tmp_path: Path) -> tuple[AgentWorkspace, Path, Path]:
    """A workspace with one agent (``alpha``, a turn about "kalomiren" to recall), a
    config for daemons run on it, and where its recall socket lives."""
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the kalomiren report")
    config = tmp_path / "memd.toml"
    config.write_text("[trigger]\ncontext_length = 100000\n")
    return ws, config, ws.root / ".memd-recall.sock"


def test_a_second_daemon_leaves_the_first_ones_socket_and_pointer(tmp_path: Path) -> None:
    """review16e F2: the second `memd run` replaced the live socket, deleted it when it
    stopped, and left .memd-state naming its dead pid; the first served no one."""
    ws, config, path = one_agent_workspace(tmp_path)
    with DaemonProcess(ws.root, tmp_path / "state", config=config) as first:
        first.wait_ready()
        first.wait_for("recall socket listening")
        assert ask(path, {"v": 1, "agent": "alpha", "query": "kalomiren"})["ok"]
        with DaemonProcess(ws.root, tmp_path / "state2", config=config) as second:
            second.wait_ready()
            refused = second.wait_for("recall socket not served")
            assert f"(pid {first.pid})" in refused["error"], refused
            kept = second.wait_for(
                "another memd daemon serves this workspace; its state pointer is left as it is"
            )
            assert kept["pid"] == first.pid
            assert second.stop() == 0
        assert first.proc is not None and first.proc.poll() is None
        assert path.exists(), "the running daemon's recall socket is gone"
        assert ask(path, {"v": 1, "agent": "alpha", "query": "kalomiren"})["ok"]
        pointer = read_pointer(ws.root)
        assert pointer is not None and pointer.pid == first.pid
        assert pointer.state_dir == (tmp_path / "state").absolute()
        assert first.stop() == 0


def _fill_backlog(path: Path) -> list[socket.socket]:
    """Connect until the listener's accept queue is full (its owner is stopped)."""
    held: list[socket.socket] = []
    for _ in range(LISTEN_BACKLOG + 200):
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        try:
            client.connect(str(path))
        except BlockingIOError:
            client.close()
            return held
        held.append(client)
    raise AssertionError("the backlog never filled")


def test_a_stopped_daemons_full_backlog_is_not_taken_for_a_stale_socket(
    tmp_path: Path,
) -> None:
    """review16g F2: a live listener whose accept queue is full answers a probe with
    EAGAIN, which was taken for a stale socket: the second daemon replaced the live
    one's socket and deleted it when it stopped."""
    ws, config, path = one_agent_workspace(tmp_path)
    with DaemonProcess(ws.root, tmp_path / "state", config=config) as first:
        first.wait_ready()
        first.wait_for("recall socket listening")
        inode = path.stat().st_ino
        first.signal(signal.SIGSTOP)  # docker pause, a debugger, Ctrl-Z
        held = _fill_backlog(path)  # agents' recall calls queue up
        try:
            with DaemonProcess(ws.root, tmp_path / "state2", config=config) as second:
                second.wait_ready(timeout=60)
                replaced = path.exists() and path.stat().st_ino != inode
                first.signal(signal.SIGCONT)
                assert second.stop() == 0
        finally:
            first.signal(signal.SIGCONT)
            for client in held:
                client.close()
        problems = []
        if replaced:
            problems.append("the second daemon replaced the live daemon's socket")
        if not path.exists():
            problems.append("the live daemon's recall socket is gone")
        assert not problems, problems
        assert ask(path, {"v": 1, "agent": "alpha", "query": "kalomiren"})["ok"]
        assert first.stop() == 0


def test_a_symlink_or_a_file_at_the_socket_path_is_never_followed_nor_replaced(
    tmp_path: Path,
) -> None:
    """review16g F2/F3: the probe connect()ed through a symlink at the path (to
    whatever it named), and a non-socket there was replaced. memd only ever makes a
    socket there: anything else is someone's and is left alone, said in one line."""
    ws = AgentWorkspace(tmp_path / "ws")
    ws.create_agent("alpha")
    index = RecallIndex.open(tmp_path / "state", ws.root)
    path = socket_path_for("", ws.root)
    elsewhere = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    elsewhere.bind(str(tmp_path / "other-service.sock"))
    elsewhere.listen(1)
    try:
        path.symlink_to(tmp_path / "other-service.sock")
        found = probe_socket(path)
        assert not found.free and found.peer is None
        assert "is a symlink" in found.reason
        with pytest.raises(RecallSocketInUse, match="is a symlink, which memd never makes"):
            RecallSocketServer(index, ws.root, path).start()
        assert path.is_symlink()
        path.unlink()
        path.write_text("not a socket")
        with pytest.raises(RecallSocketInUse, match="is not a socket, which memd never makes"):
            RecallSocketServer(index, ws.root, path).start()
        assert path.read_text() == "not a socket"
    finally:
        elsewhere.close()
        index.close()


def test_the_surviving_daemon_takes_recall_and_the_pointer_over(tmp_path: Path) -> None:
    """review16g F1, a rolling restart (start the new daemon, then stop the old one):
    the survivor never served recall (it tried once, at start) and .memd-state kept
    naming the dead first daemon, so `memd health -w` failed while one ran. Now its
    periodic job takes both over once the first is gone, and says so once."""
    ws, config, path = one_agent_workspace(tmp_path)
    first = DaemonProcess(ws.root, tmp_path / "state", config=config).start()
    try:
        first.wait_ready()
        first.wait_for("recall socket listening")
        with DaemonProcess(ws.root, tmp_path / "state2", config=config) as second:
            second.wait_ready()
            second.wait_for("recall socket not served")
            assert first.stop() == 0
            second.wait_for("recall socket taken over: no other daemon serves it now")
            taken = second.wait_for("state pointer taken over: the daemon it named is gone")
            assert taken["was_pid"] == first.pid
            assert ask(path, {"v": 1, "agent": "alpha", "query": "kalomiren"})["ok"]
            pointer = read_pointer(ws.root)
            assert pointer is not None and pointer.pid == second.pid
            assert pointer.state_dir == (tmp_path / "state2").absolute()
            health = subprocess.run(
                [sys.executable, "-m", "memd", "health", "--workspace", str(ws.root)],
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert health.returncode == 0, health.stdout + health.stderr
            # Said once: the later periodic checks find both ours.
            assert (
                len(second.events("recall socket taken over: no other daemon serves it now")) == 1
            )
            assert len(second.events("state pointer taken over: the daemon it named is gone")) == 1
            assert second.stop() == 0
        assert not path.exists()
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.kill()


LISTENER = """
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(os.environ["SOCK"])
s.listen(4)
print("up", flush=True)
while True:
    c, _ = s.accept()
    c.close()
"""


def test_a_listener_that_is_not_a_daemon_does_not_keep_the_pointer(tmp_path: Path) -> None:
    """review16g F3: any process listening at .memd-recall.sock was taken for another
    memd daemon, so the only daemon on the workspace wrote no .memd-state (the
    pointer's pid was checked for being a memd, the listener's was not). Its socket
    is still left alone, and the log says what it is."""
    ws, config, path = one_agent_workspace(tmp_path)
    other = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", LISTENER],
        env={"SOCK": str(path), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline() == "up\n"
        assert b"memd" not in Path(f"/proc/{other.pid}/cmdline").read_bytes()
        with DaemonProcess(ws.root, tmp_path / "state", config=config) as daemon:
            daemon.wait_ready()
            refused = daemon.wait_for("recall socket not served")
            assert f"pid {other.pid}, which is not a memd daemon" in refused["error"], refused
            pointer = read_pointer(ws.root)
            assert pointer is not None and pointer.pid == daemon.pid, daemon.events(
                "another memd daemon serves this workspace; its state pointer is left as it is"
            )
            assert daemon.stop() == 0
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


# --- review s7recall: slots, deadlines, credentials before reading, odd text ---


def _connect(path: Path) -> socket.socket:
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(f"/proc/self/fd/{directory}/{path.name}")
    finally:
        os.close(directory)
    return sock


def test_clients_trickling_their_request_cannot_lock_the_others_out(tmp_path: Path) -> None:
    """review s7recall F1: a client sending a byte now and then beat the per-recv
    timeout, and 16 of them held every slot: everyone else was told "too many
    recall clients". Each request now has a deadline in all, and a connection
    finding the slots taken waits for one: the real query is answered."""
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the tangerine vault code is 4417")
    index = RecallIndex.open(tmp_path / "state", ws.root)
    server = RecallSocketServer(
        index, ws.root, socket_path_for("", ws.root), request_deadline_s=1.0
    )
    server.start()
    tricklers = [_connect(server.path) for _ in range(MAX_CLIENTS + 4)]
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.1):
            for sock in tricklers:
                with contextlib.suppress(OSError):
                    sock.send(b"{", socket.MSG_DONTWAIT)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        reply = ask(server.path, {"v": 1, "agent": "alpha", "query": "tangerine"}, timeout_s=60)
        assert reply["ok"] is True, reply
        assert reply["results"][0]["text"] == "the tangerine vault code is 4417"
        # What a trickler was told when its time was up, before the hang-up.
        tricklers[0].settimeout(30)
        told = json.loads(tricklers[0].makefile("rb").readline())
        assert told["ok"] is False and "not received in full within 1 s" in told["error"]
    finally:
        stop.set()
        thread.join()
        for sock in tricklers:
            sock.close()
        server.stop()
        index.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
@pytest.mark.parametrize("hog", ["idle", "trickling"])
def test_one_uids_waiting_connections_keep_no_one_waiting(hog: str) -> None:
    """s9hang item 1: a client that connected and sent nothing held a worker slot
    until the request deadline, and the accept loop waited for a slot, so 80
    idle connections of one uid kept every other request (its own uid's, another
    uid's, memd_swarms' status ask) unanswered. Request lines are now read without
    a slot, and a uid's waiting connections are bounded (the one idle the longest
    is closed): with the deadline at 120 s, so that nothing the hog holds is
    freed by it, both askers get their answer."""
    base = Path(tempfile.mkdtemp(prefix="memd-recall-", dir="/tmp"))
    hogs: list[socket.socket] = []
    stop = threading.Event()
    trickler = None
    try:
        base.chmod(0o755)
        ws = AgentWorkspace(base / "ws")
        alpha = ws.create_agent("alpha")
        append_entry(alpha.memory, "Human", "the tangerine vault code is 4417")
        os.chown(alpha.memory, 1000, 1000)
        beta = ws.create_agent("beta")  # root's, like the hog
        append_entry(beta.memory, "Human", "the periwinkle gate code is 9931")
        with RecallIndex.open(base / "state", ws.root) as index:
            server = RecallSocketServer(
                index, ws.root, socket_path_for("", ws.root), request_deadline_s=120.0
            )
            server.start()
            try:
                # As many as the old server could be sent without a connect blocking
                # (16 slots, one waiting for a slot, the 64-long accept queue).
                hogs = [_connect(server.path) for _ in range(2 * MAX_PENDING_PER_UID + 8)]
                if hog == "trickling":

                    def trickle() -> None:
                        while not stop.wait(0.1):
                            for sock in hogs:
                                with contextlib.suppress(OSError):
                                    sock.send(b"{", socket.MSG_DONTWAIT)

                    trickler = threading.Thread(target=trickle, daemon=True)
                    trickler.start()
                # The hog's own uid (root), generous deadline: an answer, not a time.
                reply = ask(server.path, {"v": 1, "agent": "beta", "query": "periwinkle"}, 60)
                assert reply["ok"] is True, reply
                assert reply["results"][0]["text"] == "the periwinkle gate code is 9931"
                # Another uid.
                request = json.dumps({"v": 1, "agent": "alpha", "query": "tangerine"})
                other = run_raw_client(1000, server.path, request)
                assert isinstance(other, dict) and other["ok"] is True, other
                assert other["results"][0]["text"] == "the tangerine vault code is 4417"
                if hog == "idle":
                    # The hog's connection idle the longest was told why it is closed.
                    hogs[0].settimeout(60)
                    told = json.loads(hogs[0].makefile("rb").readline())
                    assert told["ok"] is False
                    assert (
                        f"uid 0 has over {MAX_PENDING_PER_UID} connections waiting"
                        in (told["error"])
                    )
            finally:
                stop.set()
                if trickler is not None:
                    trickler.join()
                for sock in hogs:
                    sock.close()
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# Connections reconnecting as soon as they are closed, from one process.
_RECONNECTING_HOG = """
import socket, sys, threading
def hog():
    while True:
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(60)
                sock.connect(sys.argv[1])
                sock.recv(100)
        except OSError:
            pass
for _ in range(int(sys.argv[2])):
    threading.Thread(target=hog, daemon=True).start()
print("started", flush=True)
threading.Event().wait()
"""


@pytest.mark.slow
def test_one_uid_reconnecting_its_closed_connections_keeps_no_one_out(tmp_path: Path) -> None:
    """s9hang item 1: 300 connections of one uid, each reconnecting once the server
    closes it (as the bound on a uid's waiting connections does), kept the kernel's
    accept queue (64) full, so a legit client's connect failed at once (EAGAIN),
    5 times out of 5. The queue is deeper than such a hog can fill now."""
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the tangerine vault code is 4417")
    with RecallIndex.open(tmp_path / "state", ws.root) as index:
        server = RecallSocketServer(index, ws.root, socket_path_for("", ws.root))
        server.start()
        hog = subprocess.Popen(
            [sys.executable, "-c", _RECONNECTING_HOG, str(server.path), "300"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert hog.stdout is not None and hog.stdout.readline() == "started\n"
            for _ in range(3):
                request = {"v": 1, "agent": "alpha", "query": "tangerine"}
                reply = ask(server.path, request, timeout_s=60)
                assert reply["ok"] is True, reply
                assert reply["results"][0]["text"] == "the tangerine vault code is 4417"
        finally:
            hog.kill()
            hog.wait()
            server.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_a_free_slot_goes_to_the_uid_holding_the_fewest() -> None:
    """s9hang item 1: one uid whose complete requests are slow (here a status
    source that answers beta only when the test says so) holds every worker slot
    and has more requests waiting; when a slot frees, another uid's request gets
    it before the rest of the first uid's, which came earlier."""
    base = Path(tempfile.mkdtemp(prefix="memd-recall-", dir="/tmp"))
    release = threading.Semaphore(0)
    answered: list[object] = []
    hogs: list[socket.socket] = []

    def status(agent: str) -> dict[str, Any]:
        if agent == "beta":
            release.acquire()
        return {"agent": agent}

    try:
        base.chmod(0o755)
        ws = AgentWorkspace(base / "ws")
        alpha = ws.create_agent("alpha")
        os.chown(alpha.memory, 1000, 1000)
        ws.create_agent("beta")  # root's, like the hog
        with RecallIndex.open(base / "state", ws.root) as index:
            server = RecallSocketServer(
                index,
                ws.root,
                socket_path_for("", ws.root),
                request_deadline_s=120.0,
                status=status,
            )
            server.start()
            try:
                for _ in range(MAX_CLIENTS + 4):
                    hogs.append(_connect(server.path))
                    hogs[-1].sendall(b'{"v": 1, "agent": "beta", "op": "status"}\n')
                request = json.dumps({"v": 1, "agent": "alpha", "op": "status"})
                asker = threading.Thread(
                    target=lambda: answered.append(run_raw_client(1000, server.path, request))
                )
                asker.start()

                def waiting(uid: int) -> int:
                    with contextlib.suppress(RuntimeError):  # changed while read
                        pending = list(server._pending.values())
                        return sum(1 for p in pending if p.peer.uid == uid and p.line)
                    return -1

                # Every slot is root's, 4 of its requests wait, then uid 1000's.
                assert wait_until(lambda: waiting(0) == 4 and waiting(1000) == 1, timeout=60)
                release.release()  # one of root's requests ends
                asker.join(timeout=90)
                assert answered == [{"v": 1, "ok": True, "status": {"agent": "alpha"}}]
                # Root's next one takes the slot uid 1000's gives back.
                assert wait_until(lambda: waiting(0) == 3, timeout=60)
            finally:
                for _ in range(2 * MAX_CLIENTS):
                    release.release()
                for sock in hogs:
                    sock.close()
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


# A stdlib-only client run as another uid: it sends argv[2] as its request line, if
# given (else nothing), and prints the line it is answered.
RAW_CLIENT = """
import socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(60)
sock.connect(sys.argv[1])
if len(sys.argv) > 2:
    sock.sendall(sys.argv[2].encode() + b"\\n")
data = b""
while not data.endswith(b"\\n"):
    chunk = sock.recv(4096)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode())
"""


def test_a_uid_owning_no_agent_is_refused_before_it_sends_a_byte(tmp_path: Path) -> None:
    """review s7recall F1: the peer's uid is judged right after accept: a uid that
    owns no agent in the workspace takes no slot and is answered without sending
    anything (before, it held a slot until its request timed out, unanswered)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a client as another uid")
    base = Path(tempfile.mkdtemp(prefix="memd-recall-", dir="/tmp"))
    try:
        base.chmod(0o755)
        ws = AgentWorkspace(base / "ws")
        paths = ws.create_agent("alpha")
        os.chown(paths.memory, 1000, 1000)
        with RecallIndex.open(base / "state", ws.root) as index:
            server = RecallSocketServer(index, ws.root, socket_path_for("", ws.root))
            server.start()
            try:
                reply = run_raw_client(4242, server.path)  # sends nothing
                assert reply == {
                    "v": 1,
                    "ok": False,
                    "error": f"uid 4242 may not read any agent's memory in {ws.root} "
                    "(it owns no agent's folder nor MEMORY.md)",
                }
                # The agent's own uid still gets its answer (MEMORY.md is its own).
                request = json.dumps({"v": 1, "agent": "alpha", "query": "anything"})
                assert run_raw_client(1000, server.path, request) == {
                    "v": 1,
                    "ok": True,
                    "results": [],
                }
            finally:
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_raw_client(uid: int, path: Path, *request: str) -> object:
    done = subprocess.run(
        [SYSTEM_PYTHON, "-c", RAW_CLIENT, str(path), *request],
        user=uid,
        group=uid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout or "null")


@pytest.mark.parametrize(
    ("request_", "needle"),
    [
        ({"agent": "\ud800", "query": "x"}, '"agent" holds a lone UTF-16 surrogate'),
        ({"agent": "alpha", "query": "x", "role": "\ud800"}, '"role" holds a lone'),
        ({"agent": "alpha", "query": "x\udfff"}, '"query" holds a lone'),
        ({"agent": "alpha", "query": "x", "since": "\ud800"}, '"since" holds a lone'),
        ({"agent": "alpha", "query": "x", "since": "0001-01-01"}, "--since '0001-01-01' is out"),
        ({"agent": "alpha", "query": "x", "since": "0001-01-01T00:00"}, "is out of range"),
    ],
)
def test_odd_text_and_dates_out_of_range_get_one_line_errors(
    served: tuple[AgentWorkspace, Path], request_: dict, needle: str
) -> None:
    """review s7recall F4: these got no answer and a traceback in the log."""
    _ws, path = served
    reply = ask(path, request_)
    assert reply["ok"] is False and needle in reply["error"], reply
    assert "\n" not in reply["error"]
    assert ask(path, {"agent": "alpha", "query": "tangerine"})["ok"] is True


class _ClockedServer(NamedTuple):
    ws: AgentWorkspace
    server: RecallSocketServer
    now: list[float]  # the server's made-up clock (the refusal log's minutes)
    logs: list[dict[str, Any]]

    def refused(self) -> list[dict[str, Any]]:
        return [entry for entry in self.logs if entry["event"] == "recall refused"]


@contextlib.contextmanager
def _clocked_server(owners: dict[str, int]) -> Iterator[_ClockedServer]:
    """A server in a /tmp folder other uids can reach, with agents whose MEMORY.md
    belongs to the uids given, a made-up clock and its log captured (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run clients as other uids")
    base = Path(tempfile.mkdtemp(prefix="memd-recall-", dir="/tmp"))
    try:
        base.chmod(0o755)
        ws = AgentWorkspace(base / "ws")
        for agent, uid in owners.items():
            os.chown(ws.create_agent(agent).memory, uid, uid)
        now = [1000.0]
        with RecallIndex.open(base / "state", ws.root) as index:
            server = RecallSocketServer(
                index, ws.root, socket_path_for("", ws.root), clock=lambda: now[0]
            )
            server.start()
            try:
                with structlog.testing.capture_logs() as logs:
                    yield _ClockedServer(ws, server, now, logs)
            finally:
                server.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_stranger_connecting_in_a_loop_is_logged_once_a_minute() -> None:
    """A uid that owns no agent, connecting again and again, gets its refusal each
    time but one log line a minute (before: a warning per connection, a flood any
    local user could cause); the next line counts the refusals in between."""
    with _clocked_server({"alpha": 1000}) as served:
        for _ in range(5):
            reply = run_raw_client(4242, served.server.path)
            assert isinstance(reply, dict) and reply["ok"] is False
        served.now[0] += 61
        run_raw_client(4242, served.server.path)
    refused = served.refused()
    assert [entry.get("refused_since_last") for entry in refused] == [None, 4], refused
    assert all(entry["uid"] == 4242 for entry in refused)


def test_an_agent_reading_another_agents_memory_is_logged_after_an_early_refusal() -> None:
    """review r8cli F4: refusals were throttled per uid alone, so an agent refused once
    for nothing (it asked before its folder was handed to it) then asking for another
    agent's memory within the minute was in no log line: each agent asked for is its own."""
    with _clocked_server({"alpha": 0, "beta": 65534}) as served:
        path = served.server.path
        request = json.dumps({"v": 1, "agent": "beta", "query": "key"})
        early = run_raw_client(1000, path, request)
        assert isinstance(early, dict) and "owns no agent" in early["error"]
        alpha = served.ws.paths("alpha")
        os.chown(alpha.dir, 1000, 1000)
        os.chown(alpha.memory, 1000, 1000)
        assert wait_until(
            lambda: "may not read agent 'beta'" in str(run_raw_client(1000, path, request)),
            timeout=10,
        )  # once the server's owners rescan (real time) knows uid 1000
    refused = served.refused()
    assert [(entry["uid"], entry.get("agent")) for entry in refused] == [
        (1000, None),
        (1000, "beta"),
    ], refused
    assert refused[1]["op"] == "recall"


_MANY_UIDS = """
import os, socket, sys
path, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for uid in range(first, first + count):
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([]); os.setgid(uid); os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.recv(65536)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
"""


def test_strangers_connecting_as_many_uids_cannot_flood_the_log() -> None:
    """review r8cli F5: a user with a subuid range (rootless podman) connecting as 300
    uids wrote 300 warnings: the lines are capped per minute in all, and the next line
    logged says how many were left out."""
    with _clocked_server({"alpha": 1000}) as served:
        for first in (100000, 200000):
            argv = [SYSTEM_PYTHON, "-c", _MANY_UIDS, str(served.server.path), str(first), "150"]
            subprocess.run(argv, check=True, timeout=120)
            served.now[0] += 61  # the next minute
    refused = served.refused()
    assert len(refused) == 2 * REFUSAL_LOG_BURST, len(refused)
    assert refused[REFUSAL_LOG_BURST]["refusals_not_logged"] == 150 - REFUSAL_LOG_BURST


def _agents_folder_as_shipped(ws: AgentWorkspace) -> Path:
    """agents/ 1770 root:agents (memd.tmpfiles.conf), under a 0755 workspace."""
    from support.two_agents import AGENTS_GID

    ws.root.mkdir(parents=True, mode=0o755, exist_ok=True)
    ws.root.chmod(0o755)
    agents = ws.root / "agents"
    agents.mkdir(exist_ok=True)
    os.chown(agents, 0, AGENTS_GID)
    agents.chmod(0o1770)
    return agents


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")
def test_recall_socket_folder_swapped_after_the_check_gives_no_other_agents_text() -> None:
    """An agent owning a real folder (what admits it) swaps it for a symlink to
    another agent's folder after the socket's check, before the index reads it
    (renameat2 RENAME_EXCHANGE in a loop wins that race within seconds against a
    real daemon: /work/team/r9leak_race.py, review r9leak F1). Here the swap is
    made at that very moment. memd judged the asker on the folder it pinned and
    reads that folder only: none of the other agent's text comes back."""
    from support.two_agents import ALICE, BOB, ask_as, ask_script, run_as, shared_root

    with shared_root() as root:
        ws = AgentWorkspace(root / "ws")
        agents = _agents_folder_as_shipped(ws)
        alice = ws.create_agent("alice")
        append_entry(alice.memory, "Human", "alice's periwinkle vault code is 4417-XK")
        for path in (alice.dir, alice.memory):
            os.chown(path, ALICE, ALICE)
        alice.dir.chmod(0o770)
        alice.memory.chmod(0o660)
        mine = agents / "x"  # bob's own agent folder, a real one he owns
        mine.mkdir(mode=0o770)
        os.chown(mine, BOB, BOB)
        script = ask_script(root)
        assert run_as(BOB, "/bin/cat", str(alice.memory)).returncode != 0

        index = RecallIndex.open(root / "state", ws.root)
        server = RecallSocketServer(index, ws.root, socket_path_for("", ws.root))
        real_sync = index.sync_agent
        swapped: list[str] = []

        def sync_after_bobs_swap(paths, **kwargs):  # type: ignore[no-untyped-def]
            if paths.agent == "x" and not swapped:
                os.rename(mine, agents / "x-real")
                os.symlink(alice.dir, mine)
                swapped.append("x")
            return real_sync(paths, **kwargs)

        index.sync_agent = sync_after_bobs_swap  # type: ignore[method-assign]
        server.start()
        try:
            reply = ask_as(BOB, script, server.path, "x", "periwinkle vault code")
            # And asked again with the symlink in place: refused before anything is read.
            again = ask_as(BOB, script, server.path, "x", "periwinkle vault code")
        finally:
            server.stop()
            index.close()
    assert swapped == ["x"]
    assert reply["ok"] is True, reply
    assert not any("4417-XK" in hit["text"] for hit in reply["results"]), reply
    assert again["ok"] is False, again
    assert "4417-XK" not in json.dumps(again)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")
def test_recall_refusal_names_nothing_inside_another_agents_folder() -> None:
    """bob links his MEMORY.md to ../alice/latest, a link in alice's folder he can
    neither list nor read. memd resolves it as itself and refuses; the refusal
    bob gets names no file of alice's (review r9leak F5)."""
    from support.two_agents import ALICE, BOB, ask_as, ask_script, run_as, shared_root

    with shared_root() as root:
        ws = AgentWorkspace(root / "ws")
        _agents_folder_as_shipped(ws)
        alice = ws.create_agent("alice")
        hidden = "history_2026-12-01_10-00-00.md"
        (alice.dir / "archive").mkdir()
        (alice.dir / "archive" / hidden).write_text("alice's archive\n")
        (alice.dir / "latest").symlink_to(f"archive/{hidden}")
        os.chown(alice.dir, ALICE, ALICE)
        alice.dir.chmod(0o770)
        bob = ws.create_agent("bob")
        os.chown(bob.dir, BOB, BOB)
        bob.dir.chmod(0o770)
        bob.memory.unlink()
        script = ask_script(root)
        linked = run_as(BOB, "/bin/ln", "-s", "../alice/latest", str(bob.memory))
        assert linked.returncode == 0, linked.stderr
        assert run_as(BOB, "/bin/ls", str(alice.dir)).returncode != 0
        assert run_as(BOB, "/bin/readlink", str(alice.dir / "latest")).returncode != 0

        index = RecallIndex.open(root / "state", ws.root)
        server = RecallSocketServer(index, ws.root, socket_path_for("", ws.root))
        server.start()
        try:
            reply = ask_as(BOB, script, server.path, "bob", "archive")
        finally:
            server.stop()
            index.close()
    assert not reply["ok"]
    assert hidden not in reply["error"], reply
    assert "alice" not in reply["error"], reply
    assert "agent 'bob'" in reply["error"], reply


def test_idle_connections_past_the_cap_for_all_uids_keep_no_one_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections that send nothing are bounded in all, not only per uid: past
    MAX_PENDING (here lowered under the per-uid cap, so one uid reaches it) the
    connection idle the longest is told so and closed, and a request is answered
    at once, with the request deadline far off (nothing is freed by it)."""
    import memd.recall.socket_server as socket_server

    monkeypatch.setattr(socket_server, "MAX_PENDING", 8)
    ws = AgentWorkspace(tmp_path / "ws")
    paths = ws.create_agent("alpha")
    append_entry(paths.memory, "Human", "the tangerine vault code is 4417")
    idle: list[socket.socket] = []
    with RecallIndex.open(tmp_path / "state", ws.root) as index:
        server = RecallSocketServer(
            index, ws.root, socket_path_for("", ws.root), request_deadline_s=120.0
        )
        server.start()
        try:
            idle = [_connect(server.path) for _ in range(3 * 8)]
            reply = ask(server.path, {"v": 1, "agent": "alpha", "query": "tangerine"}, 60)
            assert reply["ok"] is True, reply
            assert reply["results"][0]["text"] == "the tangerine vault code is 4417"
            idle[0].settimeout(60)
            told = json.loads(idle[0].makefile("rb").readline())
            assert told["ok"] is False and "over 8 connections waiting in all" in told["error"]
        finally:
            for sock in idle:
                sock.close()
            server.stop()
