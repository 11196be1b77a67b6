"""A stdlib-only recall client (runs as another uid, from any Python).

    python3 recall_client.py SOCKET AGENT QUERY [LIMIT]

Prints the daemon's JSON reply line.
"""

import json
import os
import socket
import sys


def ask(path: str, request: dict) -> dict:
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(f"/proc/self/fd/{directory}/{os.path.basename(path)}")
            sock.sendall(json.dumps(request).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    finally:
        os.close(directory)
    return json.loads(data)


if __name__ == "__main__":
    limit = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    reply = ask(sys.argv[1], {"v": 1, "agent": sys.argv[2], "query": sys.argv[3], "limit": limit})
    print(json.dumps(reply))
