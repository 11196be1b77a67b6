from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

from memd.notify import SystemdNotifier, watchdog_interval_s


def _receiver(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    return sock


def test_messages_arrive_as_datagrams_on_a_path_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify.sock")
    with _receiver(path) as sock:
        n = SystemdNotifier({"NOTIFY_SOCKET": path})
        assert n.ready("3 agents")
        assert sock.recv(4096) == b"READY=1\nSTATUS=3 agents"
        assert n.reloading()
        lines = sock.recv(4096).decode().split("\n")
        assert lines[0] == "RELOADING=1" and lines[1].startswith("MONOTONIC_USEC=")
        assert int(lines[1].split("=")[1]) > 0
        assert n.watchdog() and sock.recv(4096) == b"WATCHDOG=1"
        assert n.stopping() and sock.recv(4096) == b"STOPPING=1"
        n.close()


def test_abstract_socket_with_at_sign() -> None:
    name = f"memd-test-{uuid.uuid4().hex}"
    with _receiver("\0" + name) as sock:
        n = SystemdNotifier({"NOTIFY_SOCKET": "@" + name})
        assert n.status("hello")
        assert sock.recv(4096) == b"STATUS=hello"


def test_no_socket_is_a_noop_and_a_dead_socket_is_not_fatal(tmp_path: Path) -> None:
    assert not SystemdNotifier({}).ready()
    assert not SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "missing.sock")}).ready()


def test_watchdog_interval_is_half_and_respects_pid() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "4000000"}) == 2.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}) is None
    ours = {"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid())}
    assert watchdog_interval_s(ours) == 0.5
    assert watchdog_interval_s({"WATCHDOG_USEC": "junk"}) is None
    assert SystemdNotifier(ours).watchdog_ping_interval_s == 0.5
