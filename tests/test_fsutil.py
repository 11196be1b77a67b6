"""Durable-write and lock primitives."""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from memd.errors import LockTimeout
from memd.fsutil import AgentLock, SlotJournal, create_file_at, describe_holder, read_range


def test_slot_journal_keeps_the_latest_record(tmp_path: Path) -> None:
    journal = SlotJournal(tmp_path / "journal")
    assert journal.read() is None
    for step in range(5):
        journal.write({"phase": "p", "step": step})
    assert SlotJournal(tmp_path / "journal").read() == {"phase": "p", "step": 4}
    assert stat.S_IMODE((tmp_path / "journal").stat().st_mode) == 0o600


def test_slot_journal_survives_a_torn_write(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    journal = SlotJournal(path)
    journal.write({"step": 1})  # slot 1 (seq 0 → slot 0, seq 1 → slot 1)
    journal.write({"step": 2})
    # Tear the slot holding the latest record: the previous one must win.
    latest_slot = 1
    with path.open("r+b") as handle:
        handle.seek(latest_slot * SlotJournal.SLOT_SIZE + 20)
        handle.write(b"\x00garbage\x00")
    assert SlotJournal(path).read() == {"step": 1}
    # And the next write goes on from there.
    reopened = SlotJournal(path)
    reopened.write({"step": 3})
    assert SlotJournal(path).read() == {"step": 3}


def test_slot_journal_reads_a_slot_nested_too_deeply_as_damaged(tmp_path: Path) -> None:
    # json's decoder recurses per nesting level: one slot of "[" raised
    # RecursionError past recovery (the daemon did not start, for any agent).
    path = tmp_path / "journal"
    SlotJournal(path).write({"step": 1})
    with path.open("r+b") as handle:
        handle.seek(SlotJournal.SLOT_SIZE)
        handle.write(b"[" * SlotJournal.SLOT_SIZE)
    assert SlotJournal(path).read() == {"step": 1}
    path.write_bytes(b"[" * SlotJournal.SLOT_SIZE * 2)
    assert SlotJournal(path).read() is None


def test_slot_journal_rejects_oversized_records(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="too large"):
        SlotJournal(tmp_path / "j").write({"x": "y" * 5000})


def test_create_file_at_replaces_stale_temp_and_never_follows_a_link(tmp_path: Path) -> None:
    target = tmp_path / "f"
    target.write_text("stale")
    outside = tmp_path / "outside"
    outside.write_text("keep")
    (tmp_path / "g").symlink_to(outside)
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = create_file_at(dir_fd, "f", [b"a", b"b"], mode=0o640)
        os.write(fd, b"c")  # the returned fd appends to the new inode
        assert os.fstat(fd).st_size == 3
        os.close(fd)
        os.close(create_file_at(dir_fd, "g", [b"new"]))
    finally:
        os.close(dir_fd)
    assert target.read_bytes() == b"abc"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert outside.read_text() == "keep" and not (tmp_path / "g").is_symlink()


HOLD = """
import fcntl, sys, time
fd = open(sys.argv[1], "a")
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.readline()
"""


def test_agent_lock_is_exclusive_across_processes(tmp_path: Path) -> None:
    lock_path = tmp_path / "lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    assert holder.stdout.readline().strip() == "held"
    lock = AgentLock(lock_path, "alpha")
    with pytest.raises(LockTimeout, match="agent 'alpha'"):
        lock.acquire(0.2)
    holder.stdin.write("\n")
    holder.stdin.flush()
    holder.wait(timeout=10)
    with lock.held(2.0):
        assert lock_path.exists()
    inode = lock_path.stat().st_ino
    with lock.held(0):
        pass
    assert lock_path.stat().st_ino == inode  # never replaced
    assert os.path.exists(lock_path)


def test_write_all_reports_how_much_landed_when_it_fails() -> None:
    import errno

    from memd.fsutil import ShortWrite, write_all

    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        with pytest.raises(ShortWrite) as info:
            write_all(fd, b"x" * 10)
    finally:
        os.close(fd)
    assert isinstance(info.value, OSError) and info.value.errno == errno.ENOSPC
    assert info.value.written == 0


def test_filesystem_of_reads_the_longest_mount(tmp_path: Path) -> None:
    from memd.fsutil import filesystem_of

    mounts = tmp_path / "mounts"
    target = tmp_path / "srv" / "agents"
    target.mkdir(parents=True)
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        f"server:/export {tmp_path / 'srv'} nfs4 rw 0 0\n"
        "tmpfs /run tmpfs rw 0 0\n"
    )
    assert filesystem_of(target, mounts) == "nfs4"
    assert filesystem_of(tmp_path, mounts) == "ext4"
    assert filesystem_of(target, tmp_path / "no-such-file") is None


def test_read_range_reads_a_range_whole_or_short_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "f"
    data = os.urandom(3 << 20)  # several read chunks
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_range(fd, 10, 20) == data[10:20]
        assert read_range(fd, 5, len(data)) == data[5:]
        assert read_range(fd, len(data) - 4, len(data) + 100) == data[-4:]  # short at EOF
        assert read_range(fd, len(data) + 1, len(data) + 9) == b""
        assert read_range(fd, 7, 7) == b""
    finally:
        os.close(fd)


_IDS_INSIDE_SWITCHES = """
import json, os, sys
from pathlib import Path
from memd.fsutil import as_invoking_user, as_owner_of
seen = {"outside": (os.geteuid(), os.getegid())}
with as_invoking_user():
    seen["invoker, no switch"] = (os.geteuid(), os.getegid())
with as_owner_of(Path(sys.argv[1])):
    seen["owner"] = (os.geteuid(), os.getegid())
    try:
        with as_invoking_user():
            seen["invoker"] = (os.geteuid(), os.getegid())
            raise KeyError("a failed summary")
    except KeyError:
        pass
    seen["owner again"] = (os.geteuid(), os.getegid())
    seen["owner's groups"] = sorted(os.getgroups())
seen["after"] = (os.geteuid(), os.getegid())
seen["groups after"] = sorted(os.getgroups())
print(json.dumps(seen))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_as_invoking_user_is_root_inside_a_switch_and_gives_the_owner_back(
    tmp_path: Path,
) -> None:
    owned = tmp_path / "state"
    owned.mkdir()
    os.chown(owned, 65534, 65534)
    result = subprocess.run(
        [sys.executable, "-c", _IDS_INSIDE_SWITCHES, str(owned)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    seen = {name: tuple(ids) for name, ids in json.loads(result.stdout).items()}
    # The owner's supplementary groups (its user database's), root's put back after:
    # root's kept would open what only the owner's groups should (review r7ops, F2).
    owner_groups = tuple(sorted(os.getgrouplist(pwd.getpwuid(65534).pw_name, 65534)))
    assert seen.pop("owner's groups") == owner_groups
    assert seen.pop("groups after") == tuple(sorted(os.getgroups()))
    assert seen == {
        "outside": (0, 0),
        "invoker, no switch": (0, 0),
        "owner": (65534, 65534),
        "invoker": (0, 0),
        "owner again": (65534, 65534),
        "after": (0, 0),
    }


def test_a_lock_timeout_names_the_process_that_holds_the_lock(tmp_path: Path) -> None:
    """An operator whose `compact-now` times out needs to know who holds the agent:
    a second daemon, a `compact-now` stuck on a slow model. The holder says so in
    the lock file; the timeout reads it."""
    lock_path = tmp_path / "lock"
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from memd.fsutil import AgentLock\n"
        "path = Path(sys.argv[1])\n"
        "sys.argv = ['/usr/bin/memd', 'compact-now', 'alpha']\n"
        "AgentLock(path, 'alpha').acquire(1.0)\n"
        "print('held', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(lock_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockTimeout) as caught:
            AgentLock(lock_path, "alpha").acquire(0.1)
        message = str(caught.value)
        assert message.startswith(
            f"agent 'alpha': another compaction holds its lock (memd compact-now, pid {holder.pid} "
            f"on host {socket.gethostname()} since 20"
        ), message
        assert message.endswith("Z; waited 0.1s)") and "\n" not in message
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=10)
    # Released, the lock is taken by the next one, which now names itself.
    lock = AgentLock(lock_path, "alpha")
    with lock.held(2.0):
        assert describe_holder(lock_path.read_bytes()) is not None
        assert f"pid {os.getpid()}" in (describe_holder(lock_path.read_bytes()) or "")


@pytest.mark.parametrize(
    "record",
    [
        b"",
        b"memd-lock-holder 2\npid=1\ncommand=x\n",
        b"memd-lock-holder 1\npid=x\ncommand=y\n",
        b"\xff\xfe",
        b"memd-lock-holder 1\n",
    ],
    ids=["empty-older-memd", "unknown-format", "bad-pid", "binary", "no-fields"],
)
def test_a_lock_held_by_an_older_memd_or_a_garbled_record_names_no_one(
    tmp_path: Path, record: bytes
) -> None:
    # memd before the holder record left the file empty: the message is as before.
    lock_path = tmp_path / "lock"
    lock_path.write_bytes(record)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with pytest.raises(LockTimeout) as caught:
            AgentLock(lock_path, "alpha").acquire(0.0)
    assert str(caught.value) == "agent 'alpha': another compaction holds its lock (waited 0s)"


_TAKE_AND_LET_GO = """
import os, signal, sys
from pathlib import Path
from memd.fsutil import AgentLock
lock = AgentLock(Path(sys.argv[1]), "alpha")
lock.acquire(0)
if sys.argv[2] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)  # dies holding it: its record stays
lock.release()
"""
# A holder that takes the flock and writes nothing: a memd older than the holder
# record (a rolling upgrade, a second host on the same share), or one whose write failed.
_HOLD_WITHOUT_A_RECORD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("ending", ["released", "killed"])
def test_a_lock_timeout_never_names_a_holder_that_has_let_go(tmp_path: Path, ending: str) -> None:
    """review r8cli F2: a released lock left its holder's record, so a lock then held by
    a memd that writes none was blamed on the gone pid (an operator told to stop a
    stuck holder would signal whatever has that pid now). Released, the record is
    emptied; killed holding it, the record names a process this host runs no more."""
    path = tmp_path / "lock"
    gone = subprocess.Popen([sys.executable, "-c", _TAKE_AND_LET_GO, str(path), ending])
    gone.wait(timeout=60)
    if ending == "killed":
        assert describe_holder(path.read_bytes()) is not None  # its record is still there
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_WITHOUT_A_RECORD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(LockTimeout) as caught:
            AgentLock(path, "alpha").acquire(0.1)
    finally:
        holder.kill()
        holder.wait()
    assert str(caught.value) == "agent 'alpha': another compaction holds its lock (waited 0.1s)"
