"""A small OpenAI-compatible chat-completions server for tests, scriptable per request.

Runs ``http.server`` in a thread on 127.0.0.1 (port 0).  Each request pops the
next behaviour from a script (default: a normal reply) and is recorded, so a
test can assert what litellm actually sent over the wire.

Behaviours (strings):
    "ok"             200, a summary echoing the request (message count, last line)
    "ok:<text>"      200 with exactly <text> as the content
    "http:<code>"    that HTTP status with an OpenAI-style error body (500, 401, 429, 400…)
    "http:<code>:<s>" the same with a ``Retry-After: <s>`` header
    "sleep:<secs>"   wait that long, then reply "ok" (for client timeouts)
    "null"           200, content null
    "empty"          200, content ""
    "blank"          200, content of whitespace only
    "length"         200, finish_reason "length" (a truncated answer)
    "no_choices"     200, choices []
    "malformed"      200, a body that is not JSON
    "drop"           close the connection without answering
    "trickle:<secs>" headers for a normal reply, then its body one byte every <secs>
    "huge:<bytes>"   200, a reply whose content is that many bytes
    "tool:<name>:<json>" 200, one tool call of <name> with those arguments (id call_<n>)
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

SUMMARY_PREFIX = "Goals:\n- test summary"


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    received_at: float = field(default_factory=time.monotonic)

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def prompt_text(self) -> str:
        return "\n".join(str(m.get("content", "")) for m in self.messages)


class OpenAITestServer:
    """``with OpenAITestServer() as server:`` … ``server.api_base`` … ``server.requests``."""

    def __init__(self, responder: Callable[[dict[str, Any]], str] | None = None) -> None:
        # ``responder`` computes the reply content for unscripted requests
        # (benchmarks: a lossy model, a "perfect" one); default: echo_summary.
        self._responder = responder or echo_summary
        self._script: deque[str] = deque()
        self._lock = threading.Lock()
        self.requests: list[RecordedRequest] = []
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> OpenAITestServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping in "sleep:<secs>"
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> OpenAITestServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- scripting -----------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def api_base(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def script(self, *behaviours: str) -> None:
        """Queue behaviours for the next requests; afterwards every request gets "ok"."""
        with self._lock:
            self._script.extend(behaviours)

    def _next_behaviour(self) -> str:
        with self._lock:
            return self._script.popleft() if self._script else "ok"

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    # -- HTTP ----------------------------------------------------------------
    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep pytest output clean

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {"_unparsed": raw.decode("utf-8", "replace")}
                server._record(
                    RecordedRequest(
                        path=self.path,
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=body,
                    )
                )
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    self._send_json(404, {"error": {"message": "not found", "type": "invalid"}})
                    return
                server._respond(self, server._next_behaviour(), body)

            def _send_json(
                self, status: int, payload: Any, headers: dict[str, str] | None = None
            ) -> None:
                self._send_raw(status, json.dumps(payload).encode(), headers)

            def _send_raw(
                self, status: int, data: bytes, headers: dict[str, str] | None = None
            ) -> None:
                try:
                    self.send_response(status)
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    # The client gave up first (a timeout test): nothing to tell it.
                    self.close_connection = True

        return Handler

    def _respond(self, handler: Any, behaviour: str, body: dict[str, Any]) -> None:
        kind, _, argument = behaviour.partition(":")
        if kind == "sleep":
            self._stopping.wait(float(argument))
            kind, argument = "ok", ""
        if kind == "http":
            code, _, retry_after = argument.partition(":")
            status = int(code)
            handler._send_json(
                status,
                {
                    "error": {
                        "message": f"scripted failure {status}",
                        "type": "server_error" if status >= 500 else "invalid_request_error",
                        "code": str(status),
                    }
                },
                {"Retry-After": retry_after} if retry_after else None,
            )
        elif kind == "trickle":
            data = json.dumps(completion(body, self._responder(body))).encode()
            try:
                handler.send_response(200)
                handler.send_header("Content-Type", "application/json")
                handler.send_header("Content-Length", str(len(data)))
                handler.end_headers()
                for index in range(len(data)):
                    handler.wfile.write(data[index : index + 1])
                    handler.wfile.flush()
                    if self._stopping.wait(float(argument)):
                        break
            except OSError:
                handler.close_connection = True  # the client cut it off
        elif kind == "huge":
            handler._send_json(200, completion(body, "x" * int(argument)))
        elif kind == "malformed":
            handler._send_raw(200, b"{this is not json")
        elif kind == "drop":
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
        elif kind == "ok":
            handler._send_json(200, completion(body, argument or self._responder(body)))
        elif kind == "tool":
            name, _, arguments = argument.partition(":")
            payload = completion(body, None, "tool_calls")
            payload["choices"][0]["message"]["tool_calls"] = [
                {
                    "id": f"call_{len(self.requests)}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments or "{}"},
                }
            ]
            handler._send_json(200, payload)
        elif kind == "null":
            handler._send_json(200, completion(body, None))
        elif kind == "empty":
            handler._send_json(200, completion(body, ""))
        elif kind == "blank":
            handler._send_json(200, completion(body, "  \n\t "))
        elif kind == "length":
            handler._send_json(200, completion(body, "Goals:\n- cut off mid", "length"))
        elif kind == "no_choices":
            payload = completion(body, "x")
            payload["choices"] = []
            handler._send_json(200, payload)
        else:
            raise ValueError(f"unknown behaviour {behaviour!r}")


def echo_summary(body: dict[str, Any]) -> str:
    """A reply that proves the server saw the prompt: message count and last line,
    and a few words of the turns it was sent (a summary names some of what it
    summarizes, or memd refuses it: memd.core.reply_check). Words, not a line: a
    test counting a turn's text in a request finds it in the summary no more."""
    messages = body.get("messages", [])
    last = str(messages[-1].get("content", "")) if messages else ""
    last_line = last.strip().splitlines()[-1] if last.strip() else ""
    turns = last.split("New conversation turns to merge into it", 1)[-1]
    seen: list[str] = []
    for word in re.findall(r"[A-Za-z]{4,}", turns):
        if word.lower() not in seen:
            seen.append(word.lower())
        if len(seen) == 8:
            break
    return (
        f"{SUMMARY_PREFIX} of {len(messages)} messages\nFacts:\n- last line: {last_line}\n"
        f"- words seen: {', '.join(seen)}"
    )


def completion(
    body: dict[str, Any], content: str | None, finish_reason: str = "stop"
) -> dict[str, Any]:
    prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
    completion_tokens = len((content or "").split())
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "test-model"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_chars // 4,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_chars // 4 + completion_tokens,
        },
    }


@pytest.fixture
def openai_server() -> Iterator[OpenAITestServer]:
    """A fresh scripted server per test (starting one takes a millisecond)."""
    with OpenAITestServer() as server:
        yield server
