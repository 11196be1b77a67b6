"""DESIGN §1's ownership rule with real uids, in the shipped systemd layout.

Each agent runs as its own user with its own group; memd joins each agent's
group (never the other way round); the workspace's agents/ folder is sticky
and not setgid, so an agent's folder keeps its own group. Then an agent
appends its MEMORY.md and reads, but cannot delete, its archives, and another
agent reads nothing of it. memd is run both as root and as an unprivileged
member of the agent's group (the unit's case), in a forked child: nothing it
runs needs the checkout to be reachable by those uids.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.memfiles import swarms_block as entry

from memd.compaction import CompactionOptions, compact_agent
from memd.core.secrets import find_secrets
from memd.core.summary import SummaryRequest, SummaryResult
from memd.workspace import agent_paths

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other uids")

AGENTS_GID = 31000
ALICE = 31001  # uid and gid (a user private group)
BOB = 31002
MEMD = 31100
FAST = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2)


class Recap:
    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(text="The user asked about the build.", model="test")


@pytest.fixture()
def workspace() -> Iterator[Path]:
    # Not under tmp_path (0700 root): the agents' uids must reach it.
    root = Path(tempfile.mkdtemp(prefix="memd-isolation-"))
    try:
        root.chmod(0o755)
        agents = root / "agents"
        agents.mkdir()
        os.chown(agents, 0, AGENTS_GID)
        agents.chmod(0o1770)  # what memd.tmpfiles.conf makes
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def as_user(uid: int, groups: list[int], *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        user=uid,
        group=uid,
        extra_groups=groups,
        umask=0o007,  # the agents' units run with UMask=0007
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
    )


def append_as(uid: int, path: Path, text: str) -> subprocess.CompletedProcess[str]:
    return as_user(uid, [AGENTS_GID], "/bin/sh", "-c", 'printf %s "$0" >> "$1"', text, str(path))


def compact_as_memd_member(root: Path, name: str, options: CompactionOptions = FAST) -> None:
    """memd as the unit runs it: its own uid, in the agent's group, umask 0077."""
    # The child's uid may not read this checkout's packages (a Python under
    # /root): what compaction imports lazily (detect-secrets' plugins, for the
    # reply scan) is imported here first, or the test fails when run alone.
    find_secrets("warm up the lazy imports")
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child exits before coverage sees it
        code = 1
        try:
            os.setgroups([AGENTS_GID, ALICE])
            os.setgid(MEMD)
            os.setuid(MEMD)
            os.umask(0o077)
            compact_agent(agent_paths(root, name), Recap(), options)
            code = 0
        except BaseException:
            traceback.print_exc()  # the parent's assertion alone would not say why
            raise
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("memd_as", ["root", "member"])
def test_agent_reads_not_deletes_its_archives_and_others_read_nothing(
    workspace: Path, memd_as: str
) -> None:
    folder = workspace / "agents" / "alice"
    made = as_user(ALICE, [AGENTS_GID], "/bin/mkdir", str(folder))
    assert made.returncode == 0, made.stderr
    memory = folder / "MEMORY.md"
    chatter = " ".join(["we talked about the build at some length"] * 10)
    for n in range(6):
        assert append_as(ALICE, memory, entry("user", f"turn {n}: {chatter}")).returncode == 0
    assert stat.S_IMODE(folder.stat().st_mode) == 0o770
    assert folder.stat().st_gid == ALICE  # not the workspace's group

    if memd_as == "root":
        compact_agent(agent_paths(workspace, "alice"), Recap(), FAST)
    else:
        compact_as_memd_member(workspace, "alice")

    (archive,) = (folder / "archive").iterdir()
    # alice: appends, reads her archive, cannot delete or change it
    after = append_as(ALICE, memory, entry("user", "after the compaction"))
    assert after.returncode == 0, after.stderr
    assert "after the compaction" in memory.read_text()
    read = as_user(ALICE, [AGENTS_GID], "/bin/cat", str(archive))
    assert read.returncode == 0 and "turn 0: we talked" in read.stdout
    assert as_user(ALICE, [AGENTS_GID], "/bin/rm", "-f", str(archive)).returncode != 0
    assert archive.exists()
    written = as_user(ALICE, [AGENTS_GID], "/bin/sh", "-c", 'printf x >> "$0"', str(archive))
    assert written.returncode != 0
    # bob, another agent in the workspace group: nothing of alice's
    for path in (memory, archive):
        assert as_user(BOB, [AGENTS_GID], "/bin/cat", str(path)).returncode != 0
    assert as_user(BOB, [AGENTS_GID], "/bin/ls", str(folder)).returncode != 0
    assert as_user(BOB, [AGENTS_GID], "/bin/rm", "-rf", str(folder)).returncode != 0
    assert memory.exists()


def test_encrypted_archives_the_agent_reads_only_as_ciphertext_and_never_the_key(
    workspace: Path,
) -> None:
    """With encryption at rest, alice can still read (not delete) her archive file,
    but it is ciphertext; the data key is in memd's .memd/, which she cannot enter."""
    from memd.archive_crypto import DATA_KEY_NAME, generate_master_key

    key_file = workspace / "master.key"
    generate_master_key(key_file)
    os.chown(key_file, MEMD, MEMD)  # memd's user reads its key; nobody else
    folder = workspace / "agents" / "alice"
    assert as_user(ALICE, [AGENTS_GID], "/bin/mkdir", str(folder)).returncode == 0
    memory = folder / "MEMORY.md"
    chatter = " ".join(["we talked about the kalomiren build at some length"] * 10)
    for n in range(6):
        assert append_as(ALICE, memory, entry("user", f"turn {n}: {chatter}")).returncode == 0

    options = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, drain_max_s=2, key_file=key_file)
    compact_as_memd_member(workspace, "alice", options)

    (archive,) = (folder / "archive").iterdir()
    assert archive.name.endswith(".md.enc")
    read = subprocess.run(
        ["/bin/cat", str(archive)],
        user=ALICE,
        group=ALICE,
        extra_groups=[AGENTS_GID],
        capture_output=True,
        timeout=30,
        cwd="/",
    )
    assert read.returncode == 0 and read.stdout.startswith(b"memd-encrypted-archive v1\n")
    assert b"kalomiren" not in read.stdout
    assert as_user(ALICE, [AGENTS_GID], "/bin/rm", "-f", str(archive)).returncode != 0
    for secret in (folder / ".memd" / DATA_KEY_NAME, key_file):
        assert secret.exists()
        assert as_user(ALICE, [AGENTS_GID], "/bin/cat", str(secret)).returncode != 0
        assert as_user(BOB, [AGENTS_GID], "/bin/cat", str(secret)).returncode != 0
    assert as_user(BOB, [AGENTS_GID], "/bin/cat", str(archive)).returncode != 0
