"""``memd reload`` (systemd's ExecReload=): exit 0 only once the daemon applied the
config, 2 when it has a problem (the daemon keeps the previous one), 1 when no
daemon answered. Real daemon subprocesses and real SIGHUPs; the choice of the
record that answers a signal with scripted records and a made-up clock."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from support.daemon_proc import DaemonProcess

from memd.cli.commands_reload import is_answer, wait_for_answer
from memd.core.audit import AuditRecord

GOOD = "[trigger]\ncontext_length = 100000\n[daemon]\nstate_flush_s = 0.2\n"


def memd(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``memd ARGS`` as an operator runs it: no MEMD_* variables of this shell."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MEMD_", "STATE_DIRECTORY"))}
    clean["HOME"] = str(tmp_path / "operator-home")
    clean["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return subprocess.run(
        [sys.executable, "-m", "memd", *args],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        timeout=120,
    )


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[DaemonProcess, list[str]]]:
    """A running daemon on its config file, and the arguments that name both."""
    workspace = tmp_path / "ws"
    (workspace / "agents").mkdir(parents=True)
    config = tmp_path / "memd.toml"
    config.write_text(GOOD)
    state = tmp_path / "state"
    with DaemonProcess(workspace, state, config=config) as process:
        process.wait_ready()
        args = ["--workspace", str(workspace), "--config", str(config), "--state-dir", str(state)]
        yield process, args


def reloads(process: DaemonProcess) -> int:
    return len(process.events("reloading configuration"))


def test_applied_and_refused_configs_give_the_exit_code_systemctl_reload_needs(
    tmp_path: Path, daemon: tuple[DaemonProcess, list[str]]
) -> None:
    process, args = daemon
    config = tmp_path / "memd.toml"
    config.write_text(GOOD.replace("100000", "50000"))
    applied = memd(tmp_path, "reload", *args, "--pid", str(process.pid))
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.strip() == (
        f"reloaded: daemon pid {process.pid} applied {config} (changed: trigger)"
    )
    assert process.events("reloaded")

    # A bad value: said in one line naming the key and the file; no SIGHUP is
    # sent (kill -HUP exited 0 here, the daemon kept the old config silently).
    config.write_text(GOOD.replace("100000", "100000\nthreshold = 7"))
    refused = memd(tmp_path, "reload", *args, "--pid", str(process.pid))
    assert refused.returncode == 2
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("memd: error: ") and "trigger.threshold" in line and str(config) in line
    assert "the daemon keeps the configuration it runs with" in line
    assert refused.stdout == ""

    # The daemon found by its heartbeat (no --pid), after a refused one.
    config.write_text(GOOD)
    again = memd(tmp_path, "reload", *args)
    assert again.returncode == 0, again.stderr
    # Two reloads reached the daemon: the refused config was never signalled.
    assert reloads(process) == 2
    assert process.stop() == 0


def test_a_bad_config_the_daemon_was_started_with_is_refused_without_a_signal(
    tmp_path: Path, daemon: tuple[DaemonProcess, list[str]]
) -> None:
    # `memd reload` without --config checks the daemon's file, named by its
    # pointer in the workspace: a problem there was a warning ("not used"), the
    # SIGHUP was sent anyway and the answer was "its log says why".
    process, args = daemon
    config = tmp_path / "memd.toml"
    config.write_text(GOOD.replace("100000", "100000\nthreshold = 7"))
    without_config = [*args[:2], *args[4:]]
    refused = memd(tmp_path, "reload", *without_config, "--pid", str(process.pid))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("memd: error: ") and "trigger.threshold" in line and str(config) in line
    assert "the daemon keeps the configuration it runs with" in line
    config.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    refused = memd(tmp_path, "reload", *without_config, "--pid", str(process.pid))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert f"config file {config}: invalid TOML: arrays or tables nested too deeply" in line
    assert reloads(process) == 0
    config.write_text(GOOD.replace("100000", "50000"))
    applied = memd(tmp_path, "reload", *without_config, "--pid", str(process.pid))
    assert applied.returncode == 0, applied.stderr
    assert reloads(process) == 1
    assert process.stop() == 0


def test_a_retry_backoff_above_its_cap_is_refused_by_the_check_and_by_the_daemon(
    tmp_path: Path, daemon: tuple[DaemonProcess, list[str]]
) -> None:
    process, args = daemon
    config = tmp_path / "memd.toml"
    config.write_text(GOOD + "retry_base_s = 900\nretry_max_s = 300\n")
    refused = memd(tmp_path, "reload", *args, "--pid", str(process.pid))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert "retry_base_s (900) is more than retry_max_s (300)" in line and str(config) in line
    assert reloads(process) == 0
    # Signalled all the same (kill -HUP): the daemon refuses it and keeps running.
    os.kill(process.pid, signal.SIGHUP)
    failed = process.wait_for("reload failed; keeping the previous configuration")
    assert "retry_base_s (900) is more than retry_max_s (300)" in failed["error"]
    assert process.stop() == 0


def test_an_encoding_the_daemon_cannot_load_is_its_refusal_and_says_what_this_command_found(
    tmp_path: Path, daemon: tuple[DaemonProcess, list[str]]
) -> None:
    # r50k_base is an encoding memd knows, but no wheel bundles its file: the
    # daemon kept its old encoding and applied the rest ("applied ... (changed:
    # nothing)", exit 0). It now refuses the reload whole; this command, whose
    # own look-up uses its caller's TIKTOKEN_CACHE_DIR, says what it found too.
    process, args = daemon
    config = tmp_path / "memd.toml"
    config.write_text(GOOD + '[tokenizer]\nencoding = "r50k_base"\n')
    empty = tmp_path / "no-tiktoken-files"
    empty.mkdir()
    refused = memd(
        tmp_path, "reload", *args, "--pid", str(process.pid), env={"TIKTOKEN_CACHE_DIR": str(empty)}
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(
        f"memd: error: daemon pid {process.pid} refused the configuration (1 problem) and "
        "keeps the previous one; its log says why (here: tokenizer encoding 'r50k_base': "
    ), line
    assert f"as this command looks (TIKTOKEN_CACHE_DIR={empty}; the daemon looks with its own)" in (
        line
    )
    failed = process.wait_for("reload failed; keeping the previous configuration")
    assert "r50k_base" in failed["error"]
    assert process.stop() == 0


def test_an_encoding_only_this_command_cannot_find_does_not_stop_the_reload(
    tmp_path: Path,
    daemon: tuple[DaemonProcess, list[str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The caller's TIKTOKEN_CACHE_DIR is not the daemon's (a shell beside a
    # unit's Environment=): its look-up refused, without a signal, an encoding
    # the daemon loads. The daemon's answer decides.
    import memd.tokenizer
    from memd.cli.app import main
    from memd.errors import TokenizerError

    def not_here(name: str) -> Path:
        raise TokenizerError(f"tokenizer encoding {name!r}: not found offline (scripted)")

    monkeypatch.setattr(memd.tokenizer, "locate_encoding", not_here)
    process, args = daemon
    config = tmp_path / "memd.toml"
    config.write_text(GOOD + '[tokenizer]\nencoding = "o200k_base"\n')
    with pytest.raises(SystemExit) as exited:
        main(["reload", *args, "--pid", str(process.pid)])
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    assert (
        out.strip() == f"reloaded: daemon pid {process.pid} applied {config} (changed: tokenizer)"
    )
    assert reloads(process) == 1
    assert process.stop() == 0


def test_a_config_the_daemon_refuses_fails_the_reload_even_when_the_check_passed(
    tmp_path: Path, daemon: tuple[DaemonProcess, list[str]]
) -> None:
    # The check read another file than the daemon reloads (a --config of its
    # own; the same goes for a file root can read and memd cannot): only the
    # daemon's answer decides.
    process, args = daemon
    (tmp_path / "memd.toml").write_text(GOOD.replace("100000", "100000\nthreshold = 7"))
    checked = tmp_path / "other.toml"
    checked.write_text(GOOD)
    args = [*args[:2], "--config", str(checked), *args[4:]]
    result = memd(tmp_path, "reload", *args, "--pid", str(process.pid))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"memd: error: daemon pid {process.pid} refused the configuration (1 problem) "
        "and keeps the previous one; its log says why"
    ]
    failed = process.wait_for("reload failed; keeping the previous configuration")
    assert "trigger.threshold" in failed["error"]
    assert process.stop() == 0


def test_two_reloads_at_once_each_get_an_answer(
    tmp_path: Path, daemon: tuple[DaemonProcess, list[str]]
) -> None:
    process, args = daemon
    (tmp_path / "memd.toml").write_text(GOOD.replace("100000", "60000"))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MEMD_")}
    clean["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    command = [sys.executable, "-m", "memd", "reload", *args, "--pid", str(process.pid)]
    both = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean)
        for _ in range(2)
    ]
    results = [(child.wait(120), *child.communicate()) for child in both]
    assert [code for code, _, _ in results] == [0, 0], results
    assert process.stop() == 0


def test_no_daemon_or_a_daemon_that_does_not_answer_fails(
    tmp_path: Path, daemon: tuple[DaemonProcess, list[str]]
) -> None:
    process, args = daemon
    # Not a memd daemon: refused before any signal (a bare SIGHUP would kill it).
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        result = memd(tmp_path, "reload", *args, "--pid", str(other.pid))
        assert result.returncode == 1
        assert result.stderr.strip() == (
            f"memd: error: pid {other.pid} is not a running memd daemon (memd run)"
        )
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()
    # A daemon that cannot answer (stopped): the wait ends at --timeout, exit 1.
    process.signal(signal.SIGSTOP)
    try:
        silent = memd(tmp_path, "reload", *args, "--pid", str(process.pid), "--timeout", "0.5")
    finally:
        process.signal(signal.SIGCONT)
    assert silent.returncode == 1
    assert silent.stderr.strip().startswith(
        f"memd: error: daemon pid {process.pid} did not answer the reload within 0.5s"
    )
    # The SIGHUP it was sent is taken once it runs again.
    process.wait_for("reloaded")
    assert process.stop() == 0
    # No daemon at all: its clean stop is in the heartbeat.
    gone = memd(tmp_path, "reload", *args)
    assert gone.returncode == 1
    assert f"daemon pid {process.pid} is not running" in gone.stderr
    assert "nothing to reload" in gone.stderr


def audit_log_of(args: list[str]) -> Path:
    from memd.audit import audit_path

    return audit_path(Path(args[5]), Path(args[1]))


def test_a_reload_the_daemon_cannot_write_to_its_full_audit_log_is_confirmed(
    tmp_path: Path, daemon: tuple[DaemonProcess, list[str]]
) -> None:
    # The log at the most the daemon may write (RLIMIT_FSIZE: EFBIG, as a full
    # disk's ENOSPC): the reload happens, its record cannot be written. memd
    # reload read the log, found no answer and failed after --timeout (exit 1).
    process, args = daemon
    log = audit_log_of(args)
    with log.open("ab") as grown:
        grown.truncate(64 << 20)  # sparse; the state DB stays far below it
    resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    config = tmp_path / "memd.toml"
    config.write_text(GOOD.replace("100000", "50000"))
    applied = memd(tmp_path, "reload", *args, "--pid", str(process.pid), "--timeout", "30")
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.strip() == (
        f"reloaded: daemon pid {process.pid} applied {config} (changed: trigger)"
    )
    assert applied.stderr.strip().splitlines() == [
        f"memd: warning: daemon pid {process.pid} could not write the reload to its audit "
        f"log {log}: File too large"
    ]
    assert process.wait_for("cannot write the audit log")["audit_event"] == "config_reload"
    assert log.stat().st_size == 64 << 20

    # Refused the same way: exit 2.
    (tmp_path / "other.toml").write_text(GOOD)
    config.write_text(GOOD.replace("100000", "100000\nthreshold = 7"))
    checked = [*args[:2], "--config", str(tmp_path / "other.toml"), *args[4:]]
    refused = memd(tmp_path, "reload", *checked, "--pid", str(process.pid), "--timeout", "30")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"memd: warning: daemon pid {process.pid} could not write the reload to its audit "
        f"log {log}: File too large",
        f"memd: error: daemon pid {process.pid} refused the configuration (1 problem) "
        "and keeps the previous one; its log says why",
    ]
    assert process.stop() == 0


def test_with_no_audit_log_to_read_a_reload_is_confirmed_and_no_answer_says_what_was_read(
    tmp_path: Path, daemon: tuple[DaemonProcess, list[str]]
) -> None:
    process, args = daemon
    log = audit_log_of(args)
    log.mkdir()  # neither written by the daemon nor read by memd reload
    (tmp_path / "memd.toml").write_text(GOOD.replace("100000", "50000"))
    applied = memd(tmp_path, "reload", *args, "--pid", str(process.pid), "--timeout", "30")
    assert applied.returncode == 0, applied.stderr
    assert applied.stderr.strip().splitlines() == [
        f"memd: warning: daemon pid {process.pid} could not write the reload to its audit "
        f"log {log}: Is a directory"
    ]
    # Nothing answers (the daemon stopped): one line, each place and what it lacked.
    process.signal(signal.SIGSTOP)
    try:
        silent = memd(tmp_path, "reload", *args, "--pid", str(process.pid), "--timeout", "0.5")
    finally:
        process.signal(signal.SIGCONT)
    assert silent.returncode == 1
    from memd.state import state_db_path

    db = state_db_path(Path(args[5]), Path(args[1]))
    assert silent.stderr.splitlines() == [
        f"memd: error: daemon pid {process.pid} did not answer the reload within 0.5s "
        f"(audit log {log}: not a regular file; state DB {db} has no record of this reload; "
        "its log says why)"
    ]
    process.wait_for("reloaded")
    assert process.stop() == 0


def record(pid: int = 10, started_ns: int | None = 100, **fields: object) -> AuditRecord:
    extra = {"trigger": "sighup", "ok": True, **fields}
    if started_ns is not None:
        extra["started_ns"] = started_ns
    return AuditRecord(event="config_reload", ts=0.0, actor="daemon", pid=pid, uid=0, fields=extra)


def test_the_answer_is_a_reload_of_that_daemon_begun_after_the_signal() -> None:
    assert is_answer(record(started_ns=100), 10, 100)
    # Under way before the signal: it may have read the file before its edit.
    assert not is_answer(record(started_ns=99), 10, 100)
    assert not is_answer(record(pid=11), 10, 100)  # another daemon's
    assert not is_answer(record(started_ns=None), 10, 100)  # an older memd's record
    cli = AuditRecord(
        event="config_reload", ts=0, actor="cli", pid=10, uid=0, fields={"started_ns": 200}
    )
    assert not is_answer(cli, 10, 100)
    other = AuditRecord(
        event="compaction", ts=0, actor="daemon", pid=10, uid=0, fields={"started_ns": 200}
    )
    assert not is_answer(other, 10, 100)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_waiting_skips_the_reload_under_way_and_takes_the_next() -> None:
    clock = Clock()
    batches: list[list[AuditRecord]] = [
        [],
        [record(started_ns=50, ok=False)],  # began before the signal: refused, not ours
        [],
        [record(started_ns=150, ok=True)],
    ]

    def answers() -> Iterable[AuditRecord]:
        return batches.pop(0) if batches else []

    found = wait_for_answer(
        answers, 10, 100, 5.0, alive=lambda _pid: True, clock=clock, sleep=clock.sleep
    )
    assert found is not None and found.fields["started_ns"] == 150


def test_waiting_ends_at_the_timeout_or_when_the_daemon_is_gone() -> None:
    clock = Clock()
    never = wait_for_answer(
        lambda: [], 10, 100, 2.0, alive=lambda _pid: True, clock=clock, sleep=clock.sleep
    )
    assert never is None and 2.0 <= clock.now < 2.2
    clock = Clock()
    gone = wait_for_answer(
        lambda: [], 10, 100, 60.0, alive=lambda _pid: False, clock=clock, sleep=clock.sleep
    )
    assert gone is None and clock.now == 0.0


def test_an_older_memds_reload_record_is_read_and_answers_no_reload() -> None:
    # As memd before started_ns wrote it (format v1 all the same).
    from memd.core.audit import decode

    old = decode(
        b'{"v":1,"ts":"2026-12-02T17:40:00.000Z","event":"config_reload","agent":null,'
        b'"actor":"daemon","pid":10,"uid":998,"trigger":"sighup","ok":true,"changed":[]}'
    )
    assert (old.event, old.fields["ok"], old.fields["changed"]) == ("config_reload", True, ())
    assert not is_answer(old, 10, 0)
