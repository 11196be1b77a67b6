"""Bounds on one summarizer attempt: a wall-clock deadline and a reply-size cap.

httpx's ``timeout`` (what litellm passes on) bounds each read, not the whole
reply: a server that sends its headers and then one byte a second keeps an
attempt alive forever, holding the agent's lock and an LLM slot. Two layers:

* :class:`GuardedTransport`, the transport of the httpx client litellm's
  OpenAI-compatible providers use (``litellm.client_session``): it checks the
  attempt's deadline and the bytes received at every chunk of the reply and
  aborts the read (the connection is closed) when either is exceeded, and it
  records a refused or failed connection so it can be reported as such;
* :func:`run_attempt`, which runs the attempt in a worker thread and stops
  waiting for it at the deadline, whatever the provider's HTTP stack.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


@dataclass
class AttemptGuard:
    """What one attempt may use, and why it was cut off (if it was)."""

    deadline: float  # time.monotonic()
    max_reply_bytes: int
    tripped: str | None = None  # the reason the reply was cut off
    connect_error: str | None = None

    def check(self, received: int) -> None:
        if self.tripped is None:
            if received > self.max_reply_bytes:
                self.tripped = f"reply larger than {self.max_reply_bytes} bytes"
            elif time.monotonic() >= self.deadline:
                self.tripped = "deadline"
        if self.tripped is not None:
            raise httpx.ReadTimeout(f"summarizer reply cut off: {self.tripped}")


_current = threading.local()


def current_guard() -> AttemptGuard | None:
    guard = getattr(_current, "guard", None)
    return guard if isinstance(guard, AttemptGuard) else None


class _GuardedStream(httpx.SyncByteStream):
    def __init__(self, inner: httpx.SyncByteStream, guard: AttemptGuard) -> None:
        self._inner = inner
        self._guard = guard

    def __iter__(self) -> Iterator[bytes]:
        received = 0
        for chunk in self._inner:
            received += len(chunk)
            self._guard.check(received)
            yield chunk

    def close(self) -> None:
        self._inner.close()


class GuardedTransport(httpx.HTTPTransport):
    """An HTTP transport that enforces the calling thread's :class:`AttemptGuard`."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        guard = current_guard()
        try:
            response = super().handle_request(request)
        except httpx.ConnectError as exc:
            if guard is not None:
                guard.connect_error = _connect_reason(exc, request)
            raise
        if guard is None:
            return response
        guard.check(0)  # the headers themselves may have taken past the deadline
        assert isinstance(response.stream, httpx.SyncByteStream)
        response.stream = _GuardedStream(response.stream, guard)
        return response


def _connect_reason(exc: httpx.ConnectError, request: httpx.Request) -> str:
    text = str(exc).lower()
    if "refused" in text:
        why = "connection refused"
    elif "name or service" in text or "nodename" in text or "resolve" in text:
        why = "host name not found"
    elif "timed out" in text:
        why = "connection timed out"
    else:
        why = "connection failed"
    # Scheme, host and port only: a URL's path or query may carry a key.
    url = request.url
    return f"cannot connect to {url.scheme}://{url.host}:{url.port or ''} ({why})".replace(
        ":)", ")"
    )


def guarded_client() -> httpx.Client:
    return httpx.Client(transport=GuardedTransport(), follow_redirects=True)


class AttemptAbandoned(Exception):
    """The attempt passed its deadline and was left behind."""


# The transport (or httpx's own read timeout) normally ends a late attempt
# itself, with the better reason; the worker is abandoned only if it does not.
BACKSTOP_GRACE_S = 1.0


def run_attempt(call: Callable[[], T], guard: AttemptGuard, poll_s: float = 0.1) -> T:
    """Run ``call`` with ``guard`` in force; stop waiting soon after the guard's deadline.

    The worker is a daemon thread; when it is abandoned the guard is tripped,
    so a reply still trickling in is cut off at its next chunk.
    """
    outcome: dict[str, Any] = {}
    finished = threading.Event()

    def work() -> None:
        _current.guard = guard
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            _current.guard = None
            finished.set()

    worker = threading.Thread(target=work, name="memd-summarizer-attempt", daemon=True)
    worker.start()
    give_up_at = guard.deadline + BACKSTOP_GRACE_S
    while not finished.wait(max(0.0, min(poll_s, give_up_at - time.monotonic()))):
        if time.monotonic() >= give_up_at:
            guard.tripped = guard.tripped or "deadline"
            raise AttemptAbandoned("deadline")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


__all__ = [
    "AttemptAbandoned",
    "AttemptGuard",
    "GuardedTransport",
    "current_guard",
    "guarded_client",
    "run_attempt",
]
