"""The README's systemd layout on this host, with ids of its own (root only).

memd.sysusers.conf, memd.tmpfiles.conf and the README's per-agent snippet:
/srv/agents owned memd:agents 0750, agents/ root:agents 1770, each agent's
folder its own uid:gid 0770 with memd a member of the agent's group, the
state dir memd:memd 0700. The user database naming those users is a pair of
files bind-mounted over /etc/passwd and /etc/group in a private mount
namespace, so the host's own are never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

AGENTS_GID = 31000
ALICE = 31001  # uid and its user private group
MEMD = 31100


def unavailable() -> str | None:
    """None when this machine can build the layout, else why not."""
    if os.geteuid() != 0:
        return "needs root (real uids)"
    if shutil.which("unshare") is None:
        return "needs unshare (a private mount namespace)"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return "cannot create a mount namespace here"
    return None


@dataclass(frozen=True)
class SystemdLayout:
    workspace: Path
    state: Path
    etc: Path  # passwd and group naming memd as a member of alice's group


@contextmanager
def systemd_layout() -> Iterator[SystemdLayout]:
    base = Path(tempfile.mkdtemp(prefix="memd-systemd-layout-", dir="/tmp"))
    try:
        base.chmod(0o755)
        workspace = base / "srv-agents"
        (workspace / "agents").mkdir(parents=True)
        os.chown(workspace, MEMD, AGENTS_GID)
        workspace.chmod(0o750)
        os.chown(workspace / "agents", 0, AGENTS_GID)
        (workspace / "agents").chmod(0o1770)
        state = base / "var-lib-memd"  # StateDirectory=memd, StateDirectoryMode=0700
        state.mkdir()
        os.chown(state, MEMD, MEMD)
        state.chmod(0o700)
        etc = base / "etc"
        etc.mkdir()
        (etc / "passwd").write_text(
            Path("/etc/passwd").read_text()
            + f"l7memd:x:{MEMD}:{MEMD}::/nonexistent:/usr/sbin/nologin\n"
            + f"l7alice:x:{ALICE}:{ALICE}::/nonexistent:/usr/sbin/nologin\n"
        )
        (etc / "group").write_text(
            Path("/etc/group").read_text()
            + f"l7agents:x:{AGENTS_GID}:l7memd,l7alice\n"
            + f"l7alice:x:{ALICE}:l7memd\n"
            + f"l7memd:x:{MEMD}:\n"
        )
        yield SystemdLayout(workspace, state, etc)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def as_alice(*command: str) -> subprocess.CompletedProcess[str]:
    """``command`` as the agent alice: its uid and group, the agents' group, UMask=0007."""
    return subprocess.run(
        command,
        user=ALICE,
        group=ALICE,
        extra_groups=[AGENTS_GID],
        umask=0o007,
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        check=False,
    )


def memd_as_root(layout: SystemdLayout, *args: str) -> subprocess.CompletedProcess[str]:
    """`sudo memd ARGS` on a host whose user database has the layout's users."""
    script = 'mount --bind "$1" /etc/passwd && mount --bind "$2" /etc/group && shift 2 && exec "$@"'
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            str(layout.etc / "passwd"),
            str(layout.etc / "group"),
            sys.executable,
            "-m",
            "memd",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd="/",
        check=False,
    )
