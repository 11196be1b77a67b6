"""systemd's sd_notify protocol over ``$NOTIFY_SOCKET``, with no dependency.

One datagram per message, ``KEY=VALUE`` lines. ``$NOTIFY_SOCKET`` may name a
filesystem socket or an abstract one (leading ``@``, sent as a NUL byte).
Outside systemd (no ``$NOTIFY_SOCKET``) every call is a cheap no-op, and a
send that fails is reported as False rather than raised: losing a status line
must never take the daemon down.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping


def _address(raw: str) -> str | None:
    if not raw:
        return None
    if raw.startswith("@"):
        return "\0" + raw[1:]
    if raw.startswith("/"):
        return raw
    return None  # vsock and other families are not supported


class SystemdNotifier:
    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._address = _address(env.get("NOTIFY_SOCKET", ""))
        self._watchdog_s = watchdog_interval_s(env)
        self._sock: socket.socket | None = None

    @property
    def watchdog_ping_interval_s(self) -> float | None:
        """Half of ``$WATCHDOG_USEC`` (systemd's advice), or None when unset."""
        return self._watchdog_s

    def notify(self, *fields: str) -> bool:
        if self._address is None or not fields:
            return False
        message = "\n".join(fields).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        fields = ["READY=1"]
        if status:
            fields.append(f"STATUS={status}")
        return self.notify(*fields)

    def reloading(self) -> bool:
        # Type=notify-reload requires MONOTONIC_USEC with RELOADING=1.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval_s(environ: Mapping[str, str]) -> float | None:
    """Ping interval from ``$WATCHDOG_USEC`` (halved), if it is meant for us."""
    raw = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(raw)
    except ValueError:
        return None
    return usec / 2 / 1_000_000 if usec > 0 else None


__all__ = ["SystemdNotifier", "watchdog_interval_s"]
