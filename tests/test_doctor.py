from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import run
from support.daemon_proc import DaemonProcess
from support.memfiles import AgentWorkspace
from support.other_uid import NOBODY, can_switch_uid, reachable_tmp

from memd.core.config import MemdConfig, PrivacyConfig, SummarizerConfig
from memd.doctor import (
    check_descriptors,
    check_filesystem,
    check_flock,
    check_inotify,
    check_redaction,
    check_state_dir,
    check_summarizer,
    check_thresholds,
    check_tokenizer,
    check_workspace,
    endpoint_of,
    mount_of,
    provider_of,
    run_checks,
    worst,
)


def fake_proc(tmp_path: Path, watches: int, instances: int) -> Path:
    folder = tmp_path / "proc" / "sys" / "fs" / "inotify"
    folder.mkdir(parents=True)
    (folder / "max_user_watches").write_text(f"{watches}\n")
    (folder / "max_user_instances").write_text(f"{instances}\n")
    return tmp_path / "proc"


def test_inotify_limits(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, watches=8192, instances=128)
    few = check_inotify(10, poll=False, proc_root=proc)
    assert [c.status for c in few] == ["ok", "ok"]
    # One inotify instance serves every agent: the default 128 instances is
    # plenty at 200 (or 500) agents; only the watches grow with the fleet.
    for agents in (200, 500):
        watches, instances = check_inotify(agents, poll=False, proc_root=proc)
        assert watches.status == "ok" and f"needs {agents + 1} watches" in watches.message
        assert instances.status == "ok" and "needs 1 instance" in instances.message
    short = fake_proc(tmp_path / "short", watches=150, instances=0)
    watches, instances = check_inotify(200, poll=False, proc_root=short)
    assert watches.status == "fail" and "150 < 201" in watches.message
    assert "fs.inotify.max_user_watches=" in watches.fix and "--poll" in watches.fix
    assert instances.status == "fail" and "0 < 1" in instances.message
    assert "fs.inotify.max_user_instances=" in instances.fix and "--poll" in instances.fix
    tight = check_inotify(100, poll=False, proc_root=short)
    assert tight[0].status == "warn"  # 101 needed of 150: no room for anything else
    assert check_inotify(10_000, poll=True, proc_root=proc)[0].status == "ok"
    missing = check_inotify(3, poll=False, proc_root=tmp_path / "nothing")
    assert {c.status for c in missing} == {"warn"}


def test_real_inotify_limits_are_read() -> None:
    if not Path("/proc/sys/fs/inotify/max_user_watches").exists():
        pytest.skip("no inotify on this host")
    watches, instances = check_inotify(1, poll=False)
    assert "needs 2 watches" in watches.message or watches.status != "ok"
    assert "needs 1 instance" in instances.message or instances.status != "ok"


MOUNTS = """\
overlay / overlay rw,relatime 0 0
proc /proc proc rw 0 0
/dev/sda1 /srv ext4 rw 0 0
server:/export /srv/agents nfs4 rw,vers=4.2 0 0
grpcfuse /Users/me/my\\040work fuse.grpcfuse rw 0 0
tmpfs /srv/agents/tmp tmpfs rw 0 0
"""


def test_mount_of_longest_prefix_and_escapes() -> None:
    assert mount_of(Path("/srv/agents/x/y"), MOUNTS) == ("/srv/agents", "nfs4")
    assert mount_of(Path("/srv/agentsX"), MOUNTS) == ("/srv", "ext4")
    assert mount_of(Path("/srv/agents/tmp"), MOUNTS) == ("/srv/agents/tmp", "tmpfs")
    assert mount_of(Path("/Users/me/my work/ws"), MOUNTS) == ("/Users/me/my work", "fuse.grpcfuse")
    assert mount_of(Path("/home"), MOUNTS) == ("/", "overlay")


def test_filesystem_warnings(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"server:/x {tmp_path} nfs rw 0 0\n/dev/sda1 / ext4 rw 0 0\n")
    nfs = check_filesystem(tmp_path, mounts)[0]
    assert nfs.status == "warn" and "NFS" in nfs.message and "poll" in nfs.fix
    mounts.write_text(f"/dev/sda1 / ext4 rw 0 0\ngrpcfuse {tmp_path} fuse.grpcfuse rw 0 0\n")
    assert "Docker Desktop" in check_filesystem(tmp_path, mounts)[0].message
    mounts.write_text("/dev/sda1 / ext4 rw 0 0\n")
    assert check_filesystem(tmp_path, mounts)[0].status == "ok"
    assert check_filesystem(tmp_path)[0].status in {"ok", "warn"}  # the real /proc/mounts


def test_flock_works_here(tmp_path: Path) -> None:
    (tmp_path / "agents").mkdir()
    result = check_flock(tmp_path)[0]
    assert result.status == "ok", result
    assert list((tmp_path / "agents").iterdir()) == []  # probe file cleaned up


def test_flock_in_unwritable_place(tmp_path: Path) -> None:
    result = check_flock(tmp_path / "missing")[0]
    assert result.status == "fail" and "cannot create" in result.message


def test_workspace_checks(tmp_path: Path) -> None:
    assert check_workspace(tmp_path / "nope")[0].status == "fail"
    (tmp_path / "file").write_text("")
    assert check_workspace(tmp_path / "file")[0].status == "fail"
    assert check_workspace(tmp_path)[0].status == "warn"  # no agents/ yet
    (tmp_path / "agents" / "a").mkdir(parents=True)
    (tmp_path / "agents" / "a" / "MEMORY.md").write_text("x")
    ok = check_workspace(tmp_path)[0]
    assert ok.status == "ok" and "1 agents" in ok.message


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_workspace_permissions(tmp_path: Path) -> None:
    folder = tmp_path / "agents" / "a"
    folder.mkdir(parents=True)
    folder.chmod(0o500)
    try:
        result = check_workspace(tmp_path)[0]
    finally:
        folder.chmod(0o700)
    assert result.status == "fail" and "a/ not writable" in result.message


def test_tokenizer_check() -> None:
    assert check_tokenizer("cl100k_base")[0].status == "ok"
    bad = check_tokenizer("no_such_encoding")[0]
    assert bad.status == "fail" and "no_such_encoding" in bad.message and bad.fix


def test_provider_and_endpoint_parsing() -> None:
    assert provider_of("openai/gpt-4o-mini") == "openai"
    assert provider_of("claude-haiku-4-5") == "anthropic"
    assert provider_of("gpt-4o") == "openai"
    assert provider_of("mystery") == ""
    assert endpoint_of("https://api.openai.com/v1") == ("api.openai.com", 443)
    assert endpoint_of("http://127.0.0.1:11434") == ("127.0.0.1", 11434)
    assert endpoint_of("localhost:8000") == ("localhost", 8000)
    assert endpoint_of("http://:bad") is None


@pytest.fixture
def listener() -> object:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server
    server.close()


def closed_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = int(probe.getsockname()[1])
    probe.close()
    return port


def test_summarizer_builtin() -> None:
    checks = check_summarizer(SummarizerConfig(), {})
    assert [c.status for c in checks] == ["ok"]


def test_summarizer_reachable_with_key(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    config = SummarizerConfig(model="openai/gpt-4o-mini", api_base=f"http://127.0.0.1:{port}/v1")
    key, endpoint = check_summarizer(config, {"OPENAI_API_KEY": "sk-test"})
    assert key.status == "ok" and "OPENAI_API_KEY" in key.message
    assert endpoint.status == "ok" and "reachable" in endpoint.message


def test_summarizer_missing_key_and_unreachable() -> None:
    port = closed_port()
    config = SummarizerConfig(model="anthropic/claude-haiku-4-5")
    key, _ = check_summarizer(config, {}, connect=lambda address, timeout: None)
    assert key.status == "fail" and "ANTHROPIC_API_KEY" in key.fix
    config = SummarizerConfig(
        model="openai/gpt-4o-mini", api_base=f"http://127.0.0.1:{port}", api_key="sk-x"
    )
    key, endpoint = check_summarizer(config, {})
    assert key.status == "ok" and "config" in key.message
    assert endpoint.status == "fail" and f"127.0.0.1:{port}" in endpoint.message


def test_summarizer_keyless_local_provider(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    config = SummarizerConfig(model="ollama/llama3.1", api_base=f"http://127.0.0.1:{port}")
    assert [c.status for c in check_summarizer(config, {})] == ["ok", "ok"]
    # A custom OpenAI-compatible server may need no key: a warning, not a failure.
    config = SummarizerConfig(model="openai/local", api_base=f"http://127.0.0.1:{port}")
    assert [c.status for c in check_summarizer(config, {})] == ["warn", "ok"]


def test_state_dir_check(tmp_path: Path) -> None:
    assert check_state_dir(tmp_path / "state", tmp_path)[0].status == "ok"
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    assert check_state_dir(blocker, tmp_path)[0].status == "fail"


def test_state_dir_check_fails_on_a_newer_memds_db_and_keeps_it(tmp_path: Path) -> None:
    import sqlite3

    from memd.state import state_db_path

    path = state_db_path(tmp_path / "state", tmp_path)
    assert check_state_dir(tmp_path / "state", tmp_path)[0].status == "ok"
    conn = sqlite3.connect(path)
    conn.execute("UPDATE schema_version SET version = 30")
    conn.commit()
    conn.close()
    (check,) = check_state_dir(tmp_path / "state", tmp_path)
    assert check.status == "fail" and "is schema 30, written by a newer memd" in check.message
    assert not list(path.parent.glob("*.corrupt-*"))


def test_run_checks_on_a_healthy_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "agents" / "a").mkdir(parents=True)
    checks = run_checks(MemdConfig(), ws, tmp_path / "state", environ={})
    names = [c.name for c in checks]
    for expected in ("workspace", "file locks", "filesystem", "tokenizer", "summarizer"):
        assert expected in names
    assert worst(checks) in {"ok", "warn"}
    assert not [c for c in checks if c.status == "fail"]


def test_hidden_proc_sys_is_not_reported_as_missing_inotify(tmp_path: Path) -> None:
    # Under systemd's ProcSubset=pid (the shipped unit) /proc/sys is hidden
    # while inotify works: the check must not send operators to --poll.
    checks = check_inotify(3, poll=False, proc_root=tmp_path)
    assert checks and all(check.status == "warn" for check in checks)
    for check in checks:
        assert "no inotify" not in check.message
        assert "ProcSubset=pid" in check.message
        assert "--poll" not in check.fix


def test_filesystem_check_reads_the_process_own_mount_table() -> None:
    # /proc/mounts is hidden by ProcSubset=pid; /proc/self/mounts is not.
    import inspect

    default = inspect.signature(check_filesystem).parameters["mounts_file"].default
    assert default == Path("/proc/self/mounts")


def test_archive_key_check_presence_validity_and_mode(tmp_path: Path) -> None:
    from memd.archive_crypto import generate_master_key
    from memd.core.config import PrivacyConfig
    from memd.doctor import check_archive_key

    key = tmp_path / "master.key"
    on = PrivacyConfig(encrypt_archives=True, key_file=str(key))
    assert check_archive_key(PrivacyConfig()) == []

    [missing] = check_archive_key(on)
    assert missing.status == "fail" and "does not exist" in missing.message

    generate_master_key(key)
    [good] = check_archive_key(on)
    assert good.status == "ok" and "mode 0600" in good.message and "backup" in good.message

    key.chmod(0o644)
    [loose] = check_archive_key(on)
    assert loose.status == "fail" and "mode 0644" in loose.message and "chmod 600" in loose.fix

    key.chmod(0o600)
    key.write_text("not a key\n")
    [bad] = check_archive_key(on)
    assert bad.status == "fail" and "not a memd master key" in bad.message

    checks = run_checks(MemdConfig(privacy=on), tmp_path, tmp_path / "state", environ={})
    assert any(check.name == "archive key" and check.status == "fail" for check in checks)


def test_redaction_check_warns_for_a_remote_summarizer_with_redaction_off(tmp_path: Path) -> None:
    remote = SummarizerConfig(model="openai/gpt-4o-mini")
    config = MemdConfig(summarizer=remote, privacy=PrivacyConfig(redact=False))
    [check] = check_redaction(config, tmp_path / "state", tmp_path / "ws")
    assert check.status == "warn"
    assert "remote" in check.message and "redact = false" in check.message
    assert "redact = true" in check.fix


def test_redaction_check_says_what_the_summarizer_receives(tmp_path: Path) -> None:
    from memd.redaction_key import key_path, load_or_create_key

    state, ws = tmp_path / "state", tmp_path / "ws"
    remote = MemdConfig(summarizer=SummarizerConfig(model="anthropic/claude-haiku-4-5"))
    [check] = check_redaction(remote, state, ws)
    assert check.status == "ok" and "credentials and personal data are replaced" in check.message
    assert "made at the first compaction" in check.message
    [local] = check_redaction(MemdConfig(), state, ws)
    assert local.status == "ok" and "is local" in local.message
    path = key_path(state, ws)
    load_or_create_key(path)
    [check] = check_redaction(remote, state, ws)
    assert check.status == "ok" and "(0600)" in check.message
    path.chmod(0o640)
    [check] = check_redaction(remote, state, ws)
    assert check.status == "fail" and "mode 0640" in check.message and "chmod 600" in check.fix


def test_archive_data_keys_are_checked_against_each_agents_archives(tmp_path: Path) -> None:
    """A data key gone (or another one) is said by doctor, before the archives are needed."""
    from support.memfiles import AgentWorkspace, append_entry

    from memd.archive_crypto import DATA_KEY_NAME, generate_master_key
    from memd.compaction import CompactionOptions, ProvidedSummary, compact_agent
    from memd.core.config import PrivacyConfig
    from memd.doctor import check_archive_key

    key = tmp_path / "master.key"
    generate_master_key(key)
    privacy = PrivacyConfig(encrypt_archives=True, key_file=str(key))
    ws = AgentWorkspace(tmp_path / "ws")
    options = CompactionOptions(drain_quiet_s=0.05, key_file=key)
    for name in ("alpha", "beta"):
        paths = ws.create_agent(name, entries=3)
        append_entry(paths.memory, "Human", f"{name} turn")
        compact_agent(paths, ProvidedSummary("Summary."), options, manual=True)
    ws.create_agent("gamma", entries=1)  # never compacted: nothing to check

    checks = {check.name: check for check in check_archive_key(privacy, ws.root)}
    assert checks["archive data keys"].status == "ok"
    assert "2 agent(s) with encrypted archives" in checks["archive data keys"].message

    (ws.paths("alpha").private_dir / DATA_KEY_NAME).unlink()  # lost, not forgotten
    [_, keys] = check_archive_key(privacy, ws.root)
    assert (
        keys.status == "fail"
        and "agent 'alpha': 1 encrypted archive(s) but no data key" in keys.message
    )

    # A new key made since (the next compaction): the old archive is still unreadable.
    append_entry(ws.paths("alpha").memory, "Human", "alpha again")
    compact_agent(ws.paths("alpha"), ProvidedSummary("Summary."), options, manual=True)
    [_, keys] = check_archive_key(privacy, ws.root)
    assert keys.status == "fail" and "1 of 2 encrypted archive(s) were not sealed" in keys.message
    assert "beta" not in keys.message


@pytest.mark.skipif(not can_switch_uid(), reason="needs root to hand the state dir to another uid")
def test_root_doctor_leaves_no_root_owned_file_in_the_daemons_state_dir() -> None:
    """systemd's StateDirectory= hands the state dir to memd's user; the operator
    runs ``sudo memd doctor`` before the first start. The DB, its lock file (and
    any -wal/-shm) must belong to the state dir's owner, as every other root CLI
    command leaves them (``as_owner_of``): else the daemon, as its user, cannot
    open its state DB and runs on a temporary in-memory one (review 14e, F2)."""
    with reachable_tmp("memd-doctor-") as base:
        agent = base / "ws" / "agents" / "alpha"
        agent.mkdir(parents=True)
        (agent / "MEMORY.md").write_text("### user — 2026-01-01T00:00:01\n\nhello\n\n---\n\n")
        state = base / "st"
        state.mkdir(mode=0o700)
        os.chown(state, NOBODY, NOBODY)
        args = ["--offline", "--workspace", str(base / "ws"), "--state-dir", str(state)]
        subprocess.run(
            [sys.executable, "-m", "memd", "doctor", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        owners = {p.name: p.stat().st_uid for p in state.iterdir()}
        assert owners  # doctor did open (create) the state DB
        # What the daemon, as the state dir's owner, then sees:
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                "import os, sys\n"
                "from pathlib import Path\n"
                "from memd.state import StateStore\n"
                f"os.setegid({NOBODY}); os.seteuid({NOBODY})\n"
                "store = StateStore.open(Path(sys.argv[1]), Path(sys.argv[2]))\n"
                "print(store.path)\n",
                str(state),
                str(base / "ws"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert probe.stdout.strip() != "None", probe.stderr  # the daemon's DB opens
        assert set(owners.values()) == {NOBODY}, owners


def test_redaction_check_warns_when_the_provider_may_ignore_api_base(tmp_path: Path) -> None:
    """A bare name litellm routes to a provider that posts to its own cloud: the
    operator's local api_base is not where the turns go (they are redacted)."""
    state, ws = tmp_path / "state", tmp_path / "ws"
    bedrock = SummarizerConfig(model="anthropic.claude-v2", api_base="http://127.0.0.1:8000")
    routing, redaction = check_redaction(MemdConfig(summarizer=bedrock), state, ws)
    assert routing.name == "summarizer api_base" and routing.status == "warn"
    assert "'bedrock'" in routing.message and "http://127.0.0.1:8000" in routing.message
    assert "openai/NAME" in routing.fix
    assert redaction.status == "ok" and "replaced by placeholders" in redaction.message
    local = SummarizerConfig(model="gpt-4o-mini", api_base="http://127.0.0.1:8000")
    [check] = check_redaction(MemdConfig(summarizer=local), state, ws)
    assert check.name == "redaction" and "is local" in check.message


def test_doctor_beside_a_daemon_checks_the_settings_of_its_environment(
    ws: AgentWorkspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The systemd layout: the daemon takes MEMD_* from /etc/memd/memd.env
    (EnvironmentFile=), which the operator's shell never sees; the operator runs
    `sudo -u memd memd doctor --workspace /srv/agents` (docs/operations.md). The
    daemon sends turns unredacted to openai: doctor must not call that ok
    (review r7ops, F1: it said "summarizer 'builtin' is local"). The key itself
    never leaves the daemon's environment: not in the workspace's pointer."""
    ws.create_agent("alice")
    state = tmp_path / "state"
    env = {
        "MEMD_SUMMARIZER_MODEL": "openai/gpt-4o-mini",
        "MEMD_PRIVACY_REDACT": "false",
        "MEMD_SUMMARIZER_API_KEY": "sk-memd-test-not-a-real-key",
        "OPENAI_API_KEY": "sk-test-not-a-real-key",
    }
    with DaemonProcess(ws.root, state, env=env) as daemon:
        daemon.wait_for("privacy: remote summarizer without redaction", timeout=60)
        daemon.wait_ready(timeout=60)
        _code, out, _ = run(capsys, "doctor", "--workspace", str(ws.root), "--json", "--offline")
        _, checked, _ = run(capsys, "config", "check", "--workspace", str(ws.root))
        daemon.stop()
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["redaction"]["status"] == "warn", checks["redaction"]
    assert "openai/gpt-4o-mini" in checks["redaction"]["message"]
    assert checks["settings"]["status"] == "ok"
    assert "privacy.redact, summarizer.model" in checks["settings"]["message"]
    # The key is the daemon's: known by its name, not missing (a false `fail`).
    assert checks["summarizer key"]["status"] == "ok", checks["summarizer key"]
    assert "$OPENAI_API_KEY of the daemon" in checks["summarizer key"]["message"]
    # `memd config check` checks the file, and says what the daemon sets over it.
    assert 'privacy.redact = false, summarizer.model = "openai/gpt-4o-mini"' in checked
    pointer = (ws.root / ".memd-state").read_text()
    assert "sk-" not in pointer and "api_key" not in pointer
    assert json.loads(pointer)["key_vars"] == ["MEMD_SUMMARIZER_API_KEY", "OPENAI_API_KEY"]


def test_a_key_only_in_the_daemons_environment_is_the_daemons(listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    config = SummarizerConfig(model="openai/gpt-4o-mini", api_base=f"http://127.0.0.1:{port}/v1")

    def probe(_: SummarizerConfig) -> float:
        raise AssertionError("no request without the key")

    key, endpoint, request = check_summarizer(
        config, {}, probe=probe, daemon_key_vars=("OPENAI_API_KEY",)
    )
    assert key.status == "ok" and "$OPENAI_API_KEY of the daemon" in key.message
    assert endpoint.status == "ok"
    assert request.status == "warn" and "daemon's environment" in request.message
    # A key of another provider is no key for this one.
    [key, _] = check_summarizer(config, {}, daemon_key_vars=("ANTHROPIC_API_KEY",))
    assert key.status == "warn" and "no api_key" in key.message


def test_each_agents_descriptor_is_read_as_the_daemon_reads_it(tmp_path: Path) -> None:
    """A memd-agent.json memd refuses or clamps was said only in the daemon's log:
    status shows the config's window, doctor said nothing."""
    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alpha", "beta", "gamma"):
        ws.create_agent(name, entries=1)
    agents = ["alpha", "beta", "gamma"]
    [none] = check_descriptors(ws.root, agents, "cl100k_base")
    assert none.status == "ok" and "no agent declares its window" in none.message
    good = b'{"format": "memd-agent", "version": 1, "context_length": 100000}'
    (ws.root / "agents/alpha/memd-agent.json").write_bytes(good)
    [read] = check_descriptors(ws.root, agents, "cl100k_base")
    assert read.status == "ok" and read.message.startswith("1 agent(s) declare")
    (ws.root / "agents/beta/memd-agent.json").write_bytes(good.replace(b"100000", b"NaN"))
    (ws.root / "agents/gamma/memd-agent.json").write_bytes(good.replace(b"100000", b"10**9"))
    [bad] = check_descriptors(ws.root, agents, "cl100k_base")
    assert bad.status == "warn" and bad.fix
    assert bad.message.startswith(
        "agent 'beta': memd-agent.json: context_length must be a positive integer: ignored"
    )
    assert bad.message.endswith("(+1 more agents)")
    (ws.root / "agents/gamma/memd-agent.json").write_bytes(good.replace(b"100000", b"1000000000"))
    (ws.root / "agents/beta/memd-agent.json").unlink()
    [clamped] = check_descriptors(ws.root, agents, "cl100k_base")
    assert clamped.status == "warn" and "'gamma'" in clamped.message
    assert "context_length 1000000000 clamped to" in clamped.message
    checks = run_checks(MemdConfig(), ws.root, tmp_path / "state", {}, offline=True)
    assert [c.status for c in checks if c.name == "agent descriptors"] == ["warn"]


def test_an_agent_whose_threshold_no_compaction_can_meet_is_named(tmp_path: Path) -> None:
    """A threshold whose low-water mark is under what a summary block needs: every
    compaction ends over it, the agent is compacted at each cooldown and stays
    over, and nothing said why (a system prompt reserving most of a small window,
    as memd_swarms declares it, or a max_tokens set very low)."""
    ws = AgentWorkspace(tmp_path / "ws")
    for name in ("alpha", "beta", "off"):
        ws.create_agent(name, entries=1)
    agents = ["alpha", "beta", "off"]
    [fine] = check_thresholds(MemdConfig(), ws.root, agents)
    assert fine.status == "ok"
    # beta declares a small window and reserves half of it (the most memd lets a
    # descriptor reserve) for its system prompt.
    prompt = "You are a careful assistant. " * 170
    descriptor = {
        "format": "memd-agent",
        "version": 1,
        "context_length": 1024,
        "reserved": {"unit": "text", "text": prompt},
    }
    (ws.root / "agents/beta/memd-agent.json").write_text(json.dumps(descriptor))
    [small] = check_thresholds(MemdConfig(), ws.root, agents)
    assert small.status == "warn" and small.fix
    assert small.message.startswith("agent 'beta': threshold ")
    assert "window 1024, 512 of it reserved" in small.message
    assert "no compaction brings it under its threshold" in small.message
    # A max_tokens set low in a table; an agent memd never compacts is not named.
    config = MemdConfig.model_validate(
        {
            "agents": {
                "a*": {"max_tokens": 300},
                "off": {"max_tokens": 10, "context_compression": False},
            }
        }
    )
    [both] = check_thresholds(config, ws.root, agents)
    assert both.message.startswith("agent 'alpha': threshold 300 tokens")
    assert both.message.endswith("(+1 more agents)")
    checks = run_checks(config, ws.root, tmp_path / "state", {}, offline=True)
    assert [c.status for c in checks if c.name == "thresholds"] == ["warn"]
