"""systemd/: the unit is valid, hardened (score <= 1.5), and still lets memd work.

The pure tests parse the unit file; the others run systemd's own tools
(`systemd-analyze`, `systemd-sysusers`, `systemd-tmpfiles`) on it and are
skipped where those are not installed. None of them needs a running systemd.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sandbox import expand, syscall_groups

from memd import poller
from memd.core.config import MemdConfig
from memd.errors import ConfigError, InvalidAgentName, TokenizerError, WorkspaceError

SYSTEMD_DIR = Path(__file__).resolve().parents[1] / "systemd"
UNIT = SYSTEMD_DIR / "memd.service"
SYSUSERS = SYSTEMD_DIR / "memd.sysusers.conf"
TMPFILES = SYSTEMD_DIR / "memd.tmpfiles.conf"
ENV_EXAMPLE = SYSTEMD_DIR / "memd.env.example"

MAX_EXPOSURE = 1.5
QUIET_ENV = {**os.environ, "SYSTEMD_LOG_LEVEL": "err", "SYSTEMD_COLORS": "0"}

# What `memd run` does at the syscall level: inotify, flock'd lock files,
# fsync'd temp + link/rename commits, chmod/chown of the re-seeded MEMORY.md
# (it keeps the old file's mode and group),
# SQLite (pread/pwrite/fcntl locks), sockets (notify datagram, HTTPS),
# threads and a process pool for the cold scan.
SYSCALLS_MEMD_NEEDS = (
    "inotify_init1",
    "inotify_add_watch",
    "inotify_rm_watch",
    "flock",
    "fcntl",
    "fsync",
    "fdatasync",
    "openat",
    "linkat",
    "renameat2",
    "rename",
    "unlinkat",
    "mkdirat",
    "fchmod",
    "chmod",
    "fchmodat",
    "chown",
    "fchown",
    "fchownat",
    "fstatfs",
    "statx",
    "getdents64",
    "pread64",
    "pwrite64",
    "socket",
    "connect",
    "sendto",
    "recvfrom",
    "epoll_wait",
    "poll",
    "clone3",
    "futex",
    "kill",
    "getrandom",
    "sched_getaffinity",
)


def parse_unit(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) in file order; systemd allows repeated keys."""
    entries: list[tuple[str, str, str]] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {raw!r}"
        entries.append((section, key.strip(), value.strip()))
    return entries


@pytest.fixture(scope="module")
def unit() -> list[tuple[str, str, str]]:
    return parse_unit(UNIT.read_text(encoding="utf-8"))


def values(unit: list[tuple[str, str, str]], key: str, section: str = "Service") -> list[str]:
    return [value for sect, name, value in unit if sect == section and name == key]


def single(unit: list[tuple[str, str, str]], key: str, section: str = "Service") -> str:
    found = values(unit, key, section)
    assert len(found) == 1, f"{key}= set {len(found)} times in [{section}]"
    return found[0]


def seconds(value: str) -> float:
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "ms": 0.001}
    total = 0.0
    for number, suffix in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[suffix]
    return total


def environment(unit: list[tuple[str, str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for assignment in values(unit, "Environment"):
        for item in assignment.split():
            name, _, value = item.strip('"').partition("=")
            env[name] = value
    return env


# --- pure checks of the unit file ------------------------------------------------


def test_lifecycle_keys(unit: list[tuple[str, str, str]]) -> None:
    # notify-reload's own SIGHUP cannot fail: a refused config must fail the reload.
    assert single(unit, "Type") == "notify"
    assert single(unit, "NotifyAccess") == "main"
    assert 10 <= seconds(single(unit, "WatchdogSec")) <= 300
    assert single(unit, "Restart") == "on-failure"
    assert single(unit, "ExecStart").split()[-1] == "run"
    assert single(unit, "ExecStart").split()[0].endswith("/memd")
    assert single(unit, "WantedBy", section="Install") == "multi-user.target"


def test_reload_waits_for_the_daemons_answer(unit: list[tuple[str, str, str]]) -> None:
    # `kill -HUP` exits 0 whatever the daemon makes of the config: `systemctl
    # reload` said nothing of a refused memd.toml.
    memd = single(unit, "ExecStart").split()[0]
    assert single(unit, "ExecReload").split() == [memd, "reload", "--pid", "$MAINPID"]
    # Within the reload job's timeout (TimeoutStartSec=, 90 s by default).
    assert "TimeoutStartSec" not in {key for _, key, _ in unit}
    from memd.cli.commands_reload import reload_command

    timeout = inspect.signature(reload_command).parameters["timeout"].default
    assert timeout < 90


def test_bad_config_stops_the_restart_loop(unit: list[tuple[str, str, str]]) -> None:
    # Bad config, a bad MEMD_* in memd.env, a missing workspace, a bad flag: exit
    # 2, which no retry mends; Restart=on-failure restarted it every 5 s forever.
    prevented = " ".join(values(unit, "RestartPreventExitStatus")).split()
    for error in (ConfigError, WorkspaceError, InvalidAgentName, TokenizerError):
        assert str(error.exit_code) in prevented, error.__name__
    # ... and only that: a crash, an I/O error (exit 1) or a forced stop (130)
    # is restarted as before.
    assert prevented == ["2"]


def test_stop_timeout_outlasts_the_llm_timeout(unit: list[tuple[str, str, str]]) -> None:
    llm_timeout = MemdConfig().summarizer.timeout_s
    assert seconds(single(unit, "TimeoutStopSec")) > llm_timeout


def test_the_fd_limit_lets_the_poller_hold_a_large_fleets_files(
    unit: list[tuple[str, str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # systemd's default soft limit (1,024) leaves the poller no fd to hold.
    soft, _, hard = single(unit, "LimitNOFILE").partition(":")
    limit = (int(soft), int(hard or soft))
    monkeypatch.setattr(poller.resource, "getrlimit", lambda _which: limit)
    monkeypatch.setattr(poller, "filesystem_of", lambda _path: "ext4")
    agents = 20_000  # MEMORY.md and memd-agent.json each
    assert poller.default_fd_budget(Path("/srv/agents")) >= 2 * agents


def test_fixed_user_state_dir_and_workspace(unit: list[tuple[str, str, str]]) -> None:
    assert single(unit, "User") == "memd"
    assert single(unit, "Group") == "memd"
    assert values(unit, "DynamicUser") in ([], ["no"])
    assert single(unit, "StateDirectory") == "memd"
    assert single(unit, "UMask") == "0077"
    workspace = environment(unit)["MEMD_WORKSPACE"]
    assert workspace in single(unit, "ReadWritePaths").split()
    assert single(unit, "ProtectSystem") == "strict"


def test_keys_come_from_an_environment_file_never_from_the_unit(
    unit: list[tuple[str, str, str]],
) -> None:
    assert single(unit, "EnvironmentFile") == "-/etc/memd/memd.env"
    for name, value in environment(unit).items():
        if re.search(r"KEY|TOKEN|SECRET|PASSWORD", name):
            pytest.fail(f"{name} is set in the unit: secrets belong in the EnvironmentFile")
        assert not re.match(r"sk-|sk_|xox", value)
    text = UNIT.read_text(encoding="utf-8")
    assert not re.search(r"sk-[A-Za-z0-9]{8,}", text)


def test_env_example_holds_no_real_key() -> None:
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.partition("=")
        if "KEY" in name:
            assert value == "", f"{name} has a value in the example"


def test_sandbox_keeps_what_memd_needs(unit: list[tuple[str, str, str]]) -> None:
    families = " ".join(values(unit, "RestrictAddressFamilies")).split()
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= set(families)
    assert values(unit, "PrivateNetwork") in ([], ["no"])
    assert values(unit, "IPAddressDeny") == []  # remote LLM APIs
    assert values(unit, "PrivateUsers") in ([], ["no"])  # agents' files keep real owners


def test_tmpfiles_workspace_matches_the_unit(unit: list[tuple[str, str, str]]) -> None:
    workspace = environment(unit)["MEMD_WORKSPACE"]
    paths = {
        fields[1]: fields
        for line in TMPFILES.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
        for fields in [line.split()]
    }
    assert workspace in paths
    assert f"{workspace}/agents" in paths
    agents_mode = int(paths[f"{workspace}/agents"][2], 8)
    # Agent folders must keep their agents' own groups (isolation, DESIGN §1):
    # agents/ is sticky (no agent removes another's folder), never setgid.
    assert agents_mode & 0o1000, "agents/ must be sticky"
    assert not agents_mode & 0o2000, "agents/ must not be setgid: folders would share a group"
    assert not int(paths[workspace][2], 8) & 0o007, "others must not reach the workspace"


# --- systemd's own tools -------------------------------------------------------------

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


def an_existing_memd() -> str:
    candidate = Path(sys.executable).parent / "memd"
    found = str(candidate) if candidate.exists() else shutil.which("memd")
    return found or "/bin/true"


@pytest.fixture()
def verifiable_unit(tmp_path: Path) -> Path:
    """The unit with ExecStart= and ExecReload= pointing at a binary that exists
    on this machine."""
    text = UNIT.read_text(encoding="utf-8")
    text, count = re.subn(
        r"^(ExecStart|ExecReload)=\S+", rf"\1={an_existing_memd()}", text, flags=re.MULTILINE
    )
    assert count == 2
    copy = tmp_path / "memd.service"
    copy.write_text(text, encoding="utf-8")
    return copy


@needs_analyze
def test_systemd_analyze_verify_passes(verifiable_unit: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "verify", str(verifiable_unit)],
        capture_output=True,
        text=True,
        env=QUIET_ENV,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "memd.service" not in result.stderr, result.stderr


def exposure(unit_path: Path) -> tuple[float, str]:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", "--no-pager", str(unit_path)],
        capture_output=True,
        text=True,
        env=QUIET_ENV,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match.group(1)), result.stdout


@needs_analyze
def test_security_exposure_is_at_most_1_5() -> None:
    score, report = exposure(UNIT)
    failing = "\n".join(line for line in report.splitlines() if line.startswith("✗"))
    assert score <= MAX_EXPOSURE, f"exposure {score} > {MAX_EXPOSURE}:\n{failing}"


@needs_analyze
def test_security_score_reacts_to_weaker_hardening(tmp_path: Path) -> None:
    # The score parser must see a real change, or the test above proves nothing.
    weaker = tmp_path / "memd.service"
    weaker.write_text(
        re.sub(
            r"^(ProtectSystem|ProtectHome|SystemCallFilter|CapabilityBoundingSet)=.*$",
            "",
            UNIT.read_text(encoding="utf-8"),
            flags=re.MULTILINE,
        ),
        encoding="utf-8",
    )
    assert exposure(weaker)[0] > MAX_EXPOSURE


@needs_analyze
def test_syscall_filter_allows_what_memd_needs(unit: list[tuple[str, str, str]]) -> None:
    groups = syscall_groups()
    allowed: set[str] = set()
    filters = values(unit, "SystemCallFilter")
    assert filters and not filters[0].startswith("~"), "expected an allow list first"
    for entry in filters:
        deny = entry.startswith("~")
        names = {call for item in entry.lstrip("~").split() for call in expand(item, groups)}
        allowed = allowed - names if deny else allowed | names
    missing = [call for call in SYSCALLS_MEMD_NEEDS if call not in allowed]
    assert not missing, f"SystemCallFilter= blocks syscalls memd uses: {missing}"


# --- sysusers.d / tmpfiles.d, applied to a scratch root -------------------------------

needs_sysusers = pytest.mark.skipif(
    shutil.which("systemd-sysusers") is None or shutil.which("systemd-tmpfiles") is None,
    reason="systemd-sysusers/systemd-tmpfiles are not installed",
)


def read_db(path: Path) -> dict[str, list[str]]:
    """/etc/passwd or /etc/group, by name."""
    return {line.split(":")[0]: line.split(":") for line in path.read_text().splitlines()}


@needs_sysusers
@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-tmpfiles --root chowns: needs root")
def test_sysusers_and_tmpfiles_create_user_group_and_dirs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    subprocess.run(
        ["systemd-sysusers", f"--root={root}", str(SYSUSERS)],
        check=True,
        capture_output=True,
        env=QUIET_ENV,
        timeout=60,
    )
    passwd = read_db(root / "etc/passwd")
    group = read_db(root / "etc/group")
    memd_user = passwd["memd"]
    assert memd_user[5] == "/var/lib/memd"
    assert memd_user[6] == "/usr/sbin/nologin"
    assert int(memd_user[2]) != 0
    assert "memd" in group["agents"][3].split(",")

    subprocess.run(
        ["systemd-tmpfiles", f"--root={root}", "--create", str(TMPFILES)],
        check=True,
        capture_output=True,
        env=QUIET_ENV,
        timeout=60,
    )
    agents_gid = int(group["agents"][2])
    workspace = (root / "srv/agents").stat()
    assert workspace.st_gid == agents_gid
    assert workspace.st_mode & 0o7777 == 0o750
    # memd alone writes the top (its .memd-state pointer); agents only reach agents/.
    assert workspace.st_uid == int(memd_user[2])
    # Sticky, not setgid: an agent's folder keeps the agent's own group (the
    # isolation between agents; tests/test_agent_isolation.py runs it as uids).
    agents_dir = (root / "srv/agents/agents").stat()
    assert agents_dir.st_gid == agents_gid
    assert agents_dir.st_mode & 0o7777 == 0o1770
    etc = (root / "etc/memd").stat()
    assert etc.st_gid == int(group["memd"][2])
    assert etc.st_mode & 0o777 == 0o750


# --- memd itself, run inside an emulation of the unit's sandbox -------------------------
# (support/sandbox.py: the unit's seccomp filter, address families, W^X, read-only
# system, hidden homes, an unprivileged user; systemd is not running here)

AGENT_UID, SHARED_GID, MEMD_UID = 4242, 4243, 4300


def sandbox_skip_reason() -> str | None:
    from support.sandbox import sandbox_available

    return sandbox_available()


needs_sandbox = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0 or shutil.which("systemd-analyze") is None,
    reason="the sandbox emulation needs Linux, root and systemd-analyze",
)


def shared_workspace(root: Path) -> Path:
    """The tmpfiles layout: setgid shared-group workspace; the agent's own folder
    is 0770 without setgid (an agent that created it itself), the hard case."""
    from support.memfiles import AgentWorkspace

    workspace = root / "srv-agents"
    agents = AgentWorkspace(workspace)
    paths = agents.create_agent("alpha", entries=40)
    for directory in (workspace, workspace / "agents"):
        os.chown(directory, 0, SHARED_GID)
        directory.chmod(0o2770)
    os.chown(paths.dir, AGENT_UID, SHARED_GID)
    paths.dir.chmod(0o770)
    os.chown(paths.memory, AGENT_UID, SHARED_GID)
    paths.memory.chmod(0o660)
    return workspace


def run_sandboxed(
    unit_file: Path, writable: Path, command: list[str]
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONPATH": str(Path(__file__).parent),
        # 40 short turns sit well inside the default kept tail (a tenth of the
        # threshold): keep none, so there is something to compact.
        "MEMD_SUMMARIZER_KEEP_RECENT_TOKENS": "0",
    }
    launcher = [sys.executable, "-m", "support.sandbox", "--unit", str(unit_file)]
    launcher += ["--rw", str(writable), "--user", f"{MEMD_UID}:{MEMD_UID}"]
    launcher += ["--group", str(SHARED_GID), "--"]
    return subprocess.run(launcher + command, capture_output=True, text=True, env=env, timeout=120)


def append_as_agent(memory: Path, text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", f'printf "%s" "$1" >> "{memory}"', "sh", text],
        user=AGENT_UID,
        group=SHARED_GID,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture()
def sandbox_root() -> Iterator[Path]:
    """A scratch dir other users can traverse (pytest's tmp_path root is 0700)."""
    reason = sandbox_skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="memd-sandbox-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def compact_in_sandbox(unit_file: Path, tmp_path: Path) -> tuple[Path, Path]:
    tmp_path.mkdir(mode=0o755, exist_ok=True)
    workspace = shared_workspace(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    os.chown(state, MEMD_UID, MEMD_UID)
    memd = str(Path(sys.executable).parent / "memd")
    result = run_sandboxed(
        unit_file,
        tmp_path,
        [memd, "compact-now", "alpha", "--workspace", str(workspace), "--state-dir", str(state)],
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return workspace, workspace / "agents" / "alpha" / "MEMORY.md"


@needs_sandbox
def test_compaction_works_inside_the_sandbox_and_the_agent_keeps_appending(
    sandbox_root: Path,
) -> None:
    from support.memfiles import swarms_block

    workspace, memory = compact_in_sandbox(UNIT, sandbox_root)
    archives = list((workspace / "agents" / "alpha" / "archive").glob("history_*.md"))
    assert len(archives) == 1
    assert b"[Compressed Memory Summary]" in memory.read_bytes()
    info = memory.stat()
    assert info.st_mode & 0o777 == 0o660, "the re-seeded file keeps the old mode"
    assert info.st_gid == SHARED_GID, "the re-seeded file keeps the shared group"
    appended = append_as_agent(memory, swarms_block("Human", "still appending"))
    assert appended.returncode == 0, appended.stderr
    assert memory.read_bytes().endswith(b"\n\nstill appending\n\n---\n\n")


@needs_sandbox
def test_without_chown_in_the_filter_the_shared_group_is_lost(sandbox_root: Path) -> None:
    # Why the unit re-allows @chown (and pays 0.2 of its exposure score for it).
    stricter = sandbox_root / "memd.service"
    text = UNIT.read_text(encoding="utf-8")
    stricter.write_text(text.replace("SystemCallFilter=@chown\n", ""), encoding="utf-8")
    assert stricter.read_text(encoding="utf-8") != text
    _, memory = compact_in_sandbox(stricter, sandbox_root / "run")
    assert memory.stat().st_gid != SHARED_GID


class NotifyListener:
    """The $NOTIFY_SOCKET end of the sd_notify protocol, as systemd holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        path.chmod(0o777)  # the daemon runs as another user
        self.messages: list[str] = []

    def wait_for(self, field: str, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                message = self.sock.recv(4096).decode()
            except TimeoutError:
                return False
            self.messages.append(message)
            if field in message.splitlines():
                return True
        return False

    def close(self) -> None:
        self.sock.close()


@needs_sandbox
def test_daemon_lifecycle_inside_the_sandbox(sandbox_root: Path) -> None:
    """memd run under the unit's restrictions: READY, WATCHDOG, a compaction,
    SIGHUP reload, SIGTERM stop with exit 0, and `memd health` while it runs."""
    from support.memfiles import append_entry

    workspace = shared_workspace(sandbox_root)
    memory = workspace / "agents" / "alpha" / "MEMORY.md"
    state = sandbox_root / "state"
    state.mkdir(mode=0o700)
    os.chown(state, MEMD_UID, MEMD_UID)
    listener = NotifyListener(sandbox_root / "notify")
    memd = str(Path(sys.executable).parent / "memd")
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONPATH": str(Path(__file__).parent),
        "NOTIFY_SOCKET": str(listener.path),
        "WATCHDOG_USEC": "1000000",
        "MEMD_TRIGGER_CONTEXT_LENGTH": "8000",
        "MEMD_TRIGGER_DEBOUNCE_MS": "100",
        "MEMD_DAEMON_STATE_FLUSH_S": "0.5",
        "MEMD_LOG_FORMAT": "json",
    }
    launcher = [sys.executable, "-m", "support.sandbox", "--unit", str(UNIT)]
    launcher += ["--rw", str(sandbox_root), "--user", f"{MEMD_UID}:{MEMD_UID}"]
    launcher += ["--group", str(SHARED_GID), "--"]
    log = sandbox_root / "daemon.log"  # a file, not a pipe nobody drains while it runs
    with log.open("wb") as sink:
        daemon = subprocess.Popen(
            [*launcher, memd, "run", "--workspace", str(workspace), "--state-dir", str(state)],
            env=env,
            stdout=sink,
            stderr=sink,
        )
    try:
        assert listener.wait_for("READY=1"), listener.messages
        assert listener.wait_for("WATCHDOG=1", timeout=5), listener.messages
        health = subprocess.run(
            [memd, "health", "--workspace", str(workspace), "--state-dir", str(state)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert health.returncode == 0, health.stdout + health.stderr

        for turn in range(60):  # from ~4.3k to ~11k tokens: over the 7.2k threshold
            append_entry(memory, "Human", f"turn {turn} " + "lorem ipsum dolor " * 30)
        archive_dir = memory.parent / "archive"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(archive_dir.glob("history_*.md")):
            time.sleep(0.2)
        assert list(archive_dir.glob("history_*.md")), "no compaction:\n" + log.read_text()[-4000:]

        daemon.send_signal(signal.SIGHUP)
        assert listener.wait_for("RELOADING=1", timeout=15), listener.messages
        assert listener.wait_for("READY=1", timeout=15), listener.messages
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        stopping = listener.wait_for("STOPPING=1", timeout=5)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        listener.close()
    stderr = log.read_text(encoding="utf-8", errors="replace")
    assert daemon.returncode == 0, stderr[-3000:]
    assert stopping, listener.messages
    assert "Operation not permitted" not in stderr, stderr[-3000:]
    info = memory.stat()
    assert (info.st_gid, info.st_mode & 0o777) == (SHARED_GID, 0o660)


def test_the_daemon_leaves_no_core_dump(unit: list[tuple[str, str, str]]) -> None:
    """Review r9leak (notes): a crash dump holds agents' text, the archive master
    key and API keys (apport/abrt may upload it)."""
    assert single(unit, "LimitCORE") == "0"
