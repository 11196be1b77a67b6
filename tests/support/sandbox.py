"""Run a command inside an emulation of memd.service's sandbox, with no systemd.

systemd is installed here but not running, so the unit cannot be started. This
module rebuilds the parts of its sandbox that can break memd, from the unit
file itself, with the same kernel mechanisms systemd uses:

- ``SystemCallFilter=`` / ``SystemCallErrorNumber=EPERM``: a seccomp allow list
  (libseccomp through ctypes), the groups expanded by ``systemd-analyze``;
- ``RestrictAddressFamilies=``: ``socket()`` allowed only for those families;
- ``MemoryDenyWriteExecute=yes``: ``prctl(PR_SET_MDWE)``;
- ``NoNewPrivileges=yes``;
- ``ProtectSystem=strict`` / ``ProtectHome=yes`` / ``PrivateTmp=yes``: a private
  mount namespace where every filesystem is read-only except the writable paths
  given (the workspace, the state dir, /tmp) and /root, /home are empty;
- ``User=``: drop to an unprivileged uid/gid with no capabilities.

Usage (as root): ``python -m support.sandbox --unit FILE [--rw DIR]... [--user UID:GID]
[--group GID]... -- COMMAND...``. Linux x86-64/arm64 only; callers skip where it cannot work.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

PR_SET_NO_NEW_PRIVS = 38
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_EQ = 4


def scmp_act_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class ScmpArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


# --- reading the unit ----------------------------------------------------------------


def unit_values(unit_text: str, key: str) -> list[str]:
    found = []
    for raw in unit_text.splitlines():
        line = raw.strip()
        if line.startswith(f"{key}="):
            found.append(line.partition("=")[2].strip())
    return found


def syscall_groups() -> dict[str, list[str]]:
    listing = subprocess.run(
        ["systemd-analyze", "syscall-filter", "--no-pager"],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "err"},
        timeout=60,
        check=True,
    ).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] = []
    for line in listing.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif line.startswith(" ") and line.strip() and not line.strip().startswith("#"):
            current.append(line.strip())
    return groups


def expand(name: str, groups: dict[str, list[str]]) -> Iterator[str]:
    if not name.startswith("@"):
        yield name
        return
    for member in groups[name]:
        yield from expand(member, groups)


def allowed_syscalls(unit_text: str) -> set[str]:
    """The unit's SystemCallFilter= lines folded in order (first one is an allow list)."""
    groups = syscall_groups()
    allowed: set[str] = set()
    filters = unit_values(unit_text, "SystemCallFilter")
    if not filters or filters[0].startswith("~"):
        raise ValueError("expected SystemCallFilter= to start with an allow list")
    for entry in filters:
        deny = entry.startswith("~")
        names = {call for item in entry.lstrip("~").split() for call in expand(item, groups)}
        allowed = allowed - names if deny else allowed | names
    return allowed


def address_families(unit_text: str) -> list[int]:
    names = " ".join(unit_values(unit_text, "RestrictAddressFamilies")).split()
    return [int(getattr(socket, name)) for name in names]


# --- applying it -----------------------------------------------------------------------


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def protect_filesystems(libc: ctypes.CDLL, writable: list[Path], exposed: list[Path]) -> None:
    """ProtectSystem=strict + ProtectHome=tmpfs, in a private mount namespace.

    ``exposed`` paths inside the hidden home dirs stay visible read-only (as
    ``BindReadOnlyPaths=`` would): this machine's Python lives under /root.
    """
    _check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "make / private")
    for path in writable:  # own mounts first, so they stay writable below
        raw = os.fsencode(path)
        _check(libc.mount(raw, raw, None, MS_BIND | MS_REC, None), f"bind {path}")
    staging = Path(tempfile.mkdtemp(prefix="sandbox-expose-", dir=writable[0]))
    staged = []
    for index, path in enumerate(exposed):
        target = staging / str(index)
        target.mkdir()
        _check(libc.mount(os.fsencode(path), os.fsencode(target), None, MS_BIND, None), "stage")
        staged.append((target, path))
    mount_points = []
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        for line in info:
            mount_points.append(line.split()[4].replace("\\040", " "))
    api = ("/proc", "/sys", "/dev", "/run")
    keep_writable = {str(path) for path in writable}
    for point in mount_points:
        if point in keep_writable or point.startswith(api):
            continue
        if any(point.startswith(f"{path}/") for path in keep_writable):
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        if libc.mount(None, os.fsencode(point), None, flags, None) != 0:
            # Locked mount flags must be restated; try with the common ones.
            flags |= MS_NOSUID | MS_NODEV
            libc.mount(None, os.fsencode(point), None, flags, None)
    hidden = [Path(p) for p in ("/root", "/home", "/run/user") if Path(p).is_dir()]
    for home in hidden:
        raw = os.fsencode(home)
        _check(libc.mount(b"tmpfs", raw, b"tmpfs", 0, b"mode=0755"), f"hide {home}")
    for source, path in staged:
        path.mkdir(parents=True, exist_ok=True)
        raw = os.fsencode(path)
        _check(libc.mount(os.fsencode(source), raw, None, MS_BIND | MS_REC, None), "expose")
        _check(libc.mount(None, raw, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None), "expose ro")
    for home in hidden:
        raw = os.fsencode(home)
        _check(libc.mount(None, raw, None, MS_REMOUNT | MS_RDONLY, b"mode=0755"), "hide ro")


def drop_privileges(user: str, groups: list[int]) -> None:
    uid, _, gid = user.partition(":")
    os.setgroups(groups)
    os.setgid(int(gid or uid))
    os.setuid(int(uid))


def load_seccomp(allowed: set[str], families: list[int]) -> None:
    name = ctypes.util.find_library("seccomp")
    if name is None:
        raise OSError(errno.ENOENT, "libseccomp is not installed")
    seccomp = ctypes.CDLL(name, use_errno=True)
    seccomp.seccomp_init.restype = ctypes.c_void_p
    seccomp.seccomp_init.argtypes = [ctypes.c_uint32]
    seccomp.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    seccomp.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ScmpArgCmp),
    ]
    seccomp.seccomp_load.argtypes = [ctypes.c_void_p]
    context = seccomp.seccomp_init(scmp_act_errno(errno.EPERM))
    if not context:
        raise OSError(errno.EINVAL, "seccomp_init failed")
    for call in sorted(allowed - {"socket"}):
        number = seccomp.seccomp_syscall_resolve_name(call.encode())
        if number >= 0:  # negative: not a syscall on this architecture
            seccomp.seccomp_rule_add_array(context, SCMP_ACT_ALLOW, number, 0, None)
    if "socket" in allowed:
        number = seccomp.seccomp_syscall_resolve_name(b"socket")
        for family in families:
            compare = (ScmpArgCmp * 1)(ScmpArgCmp(0, SCMP_CMP_EQ, family, 0))
            rc = seccomp.seccomp_rule_add_array(context, SCMP_ACT_ALLOW, number, 1, compare)
            if rc != 0:
                raise OSError(-rc, "seccomp_rule_add(socket)")
    rc = seccomp.seccomp_load(context)
    if rc != 0:
        raise OSError(-rc, "seccomp_load")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sandbox")
    parser.add_argument("--unit", type=Path, required=True)
    parser.add_argument("--rw", type=Path, action="append", default=[])
    parser.add_argument("--user", default="")
    parser.add_argument("--group", type=int, action="append", default=[])
    parser.add_argument("--expose", type=Path, action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    unit_text = args.unit.read_text(encoding="utf-8")
    allowed = allowed_syscalls(unit_text)
    families = address_families(unit_text)
    executable = shutil.which(command[0]) or command[0]

    libc = ctypes.CDLL(None, use_errno=True)
    exposed = [path for path in code_locations() + args.expose if under_hidden_home(path)]
    protect_filesystems(libc, [path.resolve() for path in args.rw], outermost(exposed))
    if args.user:
        drop_privileges(args.user, args.group)
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    if "MemoryDenyWriteExecute=yes" in unit_text:
        _check(libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0), "PR_SET_MDWE")
    load_seccomp(allowed, families)
    os.execv(executable, command)
    return 127  # not reached


HIDDEN_HOMES = (Path("/root"), Path("/home"), Path("/run/user"))
REPO_ROOT = Path(__file__).resolve().parents[2]


def code_locations() -> list[Path]:
    """What the sandboxed memd must read: the interpreter, the venv, the repo
    (an editable install, and tests/support on PYTHONPATH)."""
    return [
        Path(os.path.realpath(sys.executable)).parents[1],
        Path(sys.prefix).resolve(),
        REPO_ROOT,
    ]


def under_hidden_home(path: Path) -> bool:
    return any(path.is_relative_to(home) and path != home for home in HIDDEN_HOMES)


def outermost(paths: list[Path]) -> list[Path]:
    unique = sorted(set(paths), key=lambda path: len(path.parts))
    kept: list[Path] = []
    for path in unique:
        if not any(path.is_relative_to(outer) for outer in kept):
            kept.append(path)
    return kept


def unreachable_by_others(path: Path) -> Path | None:
    """A directory on the way to ``path`` an unprivileged user cannot traverse.

    The hidden homes themselves do not count: the sandbox replaces them with
    a traversable tmpfs holding only the exposed paths.
    """
    for parent in [*reversed(path.parents), path]:
        if parent in HIDDEN_HOMES or parent == Path("/"):
            continue
        if not os.stat(parent).st_mode & 0o001:
            return parent
    return None


def sandbox_available() -> str | None:
    """None when this machine can run the emulation, else why not."""
    if sys.platform != "linux":
        return "Linux only"
    if os.geteuid() != 0:
        return "needs root (mount namespace, dropping to another user)"
    for location in code_locations():
        blocked = unreachable_by_others(location)
        if blocked is not None:
            return f"{blocked} is not traversable by other users (the sandbox runs memd as one)"
    if shutil.which("systemd-analyze") is None:
        return "systemd-analyze is not installed"
    if ctypes.util.find_library("seccomp") is None:
        return "libseccomp is not installed"
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True)
    if probe.returncode != 0:
        return "cannot create a mount namespace here"
    libc = ctypes.CDLL(None, use_errno=True)
    child = os.fork()
    if child == 0:  # PR_SET_MDWE is one-way: probe it in a throwaway child
        os._exit(0 if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) == 0 else 1)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return "kernel lacks PR_SET_MDWE (Linux >= 6.3)"
    return None


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
