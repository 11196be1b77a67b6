"""A client of the daemon's recall socket (``memd mcp`` uses it).

The agent-side copy lives in ``memd_swarms`` (stdlib only, no import of memd:
it is installed in the agent's environment); both speak the protocol of
:mod:`memd.recall.socket_server`.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from memd.errors import MemdError, describe_error
from memd.recall.socket_server import PROTOCOL_VERSION

DEFAULT_TIMEOUT_S = 15.0


class RecallUnavailable(MemdError, RuntimeError):
    """The daemon's recall socket did not answer, or refused the request."""


def ask(path: Path, request: dict[str, Any], timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
    """One request, one reply. The socket is reached through its folder's fd,
    so a deep workspace path never exceeds the 108-byte address limit."""
    try:
        directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise RecallUnavailable(
            f"recall socket folder {path.parent}: {describe_error(exc, with_file=False)}"
        ) from None
    data = bytearray()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(f"/proc/self/fd/{directory}/{path.name}")
            sock.sendall(json.dumps(request).encode() + b"\n")
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        raise RecallUnavailable(
            f"memd's recall socket {path} did not answer ({describe_error(exc, with_file=False)}); "
            "is the memd daemon running?"
        ) from None
    finally:
        os.close(directory)
    try:
        return json.loads(bytes(data))
    except ValueError:
        raise RecallUnavailable(f"memd's recall socket {path} sent an unreadable reply") from None


def recall(path: Path, agent: str, query: str, limit: int = 5) -> list[dict[str, Any]]:
    """The agent's best matching raw entries, as ``memd recall --json`` prints them."""
    reply = ask(path, {"v": PROTOCOL_VERSION, "agent": agent, "query": query, "limit": limit})
    if not isinstance(reply, dict) or reply.get("ok") is not True:
        error = reply.get("error") if isinstance(reply, dict) else None
        raise RecallUnavailable(str(error or "the daemon refused the recall request"))
    results = reply.get("results")
    return results if isinstance(results, list) else []


__all__ = ["RecallUnavailable", "ask", "recall"]
