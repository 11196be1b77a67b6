"""Run ``python -m memd run`` as a real subprocess and follow its JSON log lines."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

LogLine = dict[str, Any]

_AS_USER = """
import os, sys
import apscheduler.triggers.date, apscheduler.triggers.interval
import memd.cli.app, memd.compaction, memd.counting, memd.daemon, memd.scheduler
import memd.state, memd.summarizers, memd.tokenizer, memd.watcher, memd.core.builtin_summary
memd.tokenizer.load_encoding("cl100k_base")
import memd.core.secrets
memd.core.secrets.find_secrets("warm up")  # detect-secrets' rules, imported lazily
memd.cli.app.build_app()  # imports every command module (main() imports only its own)
uid, *groups = (int(n) for n in sys.argv[1].split(","))
os.setgroups(groups)
os.setgid(uid)
os.setuid(uid)
memd.cli.app.main(sys.argv[2:])
"""


class DaemonProcess:
    """``with DaemonProcess(ws, state) as d: d.wait_ready(); d.signal(SIGTERM); d.wait()``."""

    def __init__(
        self,
        workspace: Path,
        state_dir: Path,
        *,
        config: Path | None = None,
        extra_args: list[str] | None = None,
        env: Mapping[str, str] | None = None,
        log_level: str = "info",
        user: int | None = None,
        groups: tuple[int, ...] = (),
    ) -> None:
        """``user``: run as that uid (and its gid of the same number), with the
        supplementary ``groups`` (docker's group_add, systemd's sysusers ``m``)."""
        self.user = user
        args = [
            sys.executable,
            "-m",
            "memd",
            "run",
            "--workspace",
            str(workspace),
            "--state-dir",
            str(state_dir),
            "--log-format",
            "json",
            "--log-level",
            log_level,
        ]
        if config is not None:
            args += ["--config", str(config)]
        args += extra_args or []
        if user is not None:
            # Drop to ``user`` after the imports: this machine's Python may live
            # where that user cannot read (e.g. under /root).
            ids = ",".join(str(n) for n in (user, *groups))
            args = [sys.executable, "-c", _AS_USER, ids, *args[3:]]
        full_env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("MEMD_", "NOTIFY_", "WATCHDOG_"))
        }
        full_env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
        full_env.update(env or {})
        self.args = args
        self.env = full_env
        self.lines: list[LogLine] = []
        self.raw: list[str] = []
        self._cond = threading.Condition()
        self.proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> DaemonProcess:
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.raw.append(line)
                try:
                    parsed = json.loads(line)
                except ValueError:
                    parsed = {"event": "<non-json>", "text": line}
                if isinstance(parsed, dict):
                    self.lines.append(parsed)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> DaemonProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.kill()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_for(
        self, event: str, predicate: Callable[[LogLine], bool] | None = None, timeout: float = 20
    ) -> LogLine:
        """The first log line with this event (and predicate); AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    if line.get("event") == event and (predicate is None or predicate(line)):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                exited = self.proc is not None and self.proc.poll() is not None
                if left <= 0 or (exited and not self._reader_alive()):
                    raise AssertionError(
                        f"no {event!r} log line within {timeout}s; log:\n" + "".join(self.raw[-40:])
                    )
                self._cond.wait(min(left, 0.2))

    def _reader_alive(self) -> bool:
        return self._reader is not None and self._reader.is_alive()

    def events(self, event: str) -> list[LogLine]:
        with self._cond:
            return [line for line in self.lines if line.get("event") == event]

    def wait_ready(self, timeout: float = 30) -> LogLine:
        return self.wait_for("ready", timeout=timeout)

    def signal(self, signum: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        code = self.proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return code

    def stop(self, timeout: float = 30) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class NotifyListener:
    """A real AF_UNIX datagram socket to hand to the daemon as ``NOTIFY_SOCKET``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[str] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        self.sock.settimeout(0.2)
        while not self._closed:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._cond:
                self.messages.append(data.decode())
                self._cond.notify_all()

    def wait_for(self, field: str, timeout: float = 20, after: int = 0) -> int:
        """Index of the first message (from ``after``) with a line starting with ``field``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for index in range(after, len(self.messages)):
                    if any(line.startswith(field) for line in self.messages[index].split("\n")):
                        return index
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {field!r} notification; got {self.messages}")
                self._cond.wait(min(left, 0.2))

    def close(self) -> None:
        self._closed = True
        self.sock.close()

    def __enter__(self) -> NotifyListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 10, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()
