"""The start-up and reload checks: a config (or a workspace) in, log lines out."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import structlog

from memd.core.config import MemdConfig
from memd.daemon import checks
from memd.settings import build_config


def config_of(data: dict[str, Any]) -> MemdConfig:
    return build_config(data, {})[0]


def events(logs: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [line for line in logs if line["event"] == name]


def test_a_filesystem_that_breaks_locks_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memd.doctor as doctor

    with structlog.testing.capture_logs() as logs:
        checks.warn_about_filesystem(tmp_path)
    assert events(logs, "workspace filesystem") == []
    found = doctor.mount_of(tmp_path.resolve(), Path("/proc/mounts").read_text())
    assert found is not None
    monkeypatch.setitem(doctor.REMOTE_FILESYSTEMS, found[1], "pretend NFS")
    with structlog.testing.capture_logs() as logs:
        checks.warn_about_filesystem(tmp_path)
    [line] = events(logs, "workspace filesystem")
    assert line["log_level"] == "warning" and "pretend NFS" in line["detail"]


def test_a_missing_archive_key_is_an_error_at_start(tmp_path: Path) -> None:
    missing = tmp_path / "no-such.key"
    encrypted = config_of({"privacy": {"encrypt_archives": True, "key_file": str(missing)}})
    with structlog.testing.capture_logs() as logs:
        checks.check_archive_key(encrypted)
        checks.check_archive_key(config_of({}))  # encryption off: nothing said
    [line] = events(logs, "archive key")
    assert line["log_level"] == "error" and str(missing) in line["detail"]
    assert len(logs) == 1


def test_budgets_that_cannot_fit_a_models_window_are_said() -> None:
    tight = config_of(
        {"summarizer": {"summary_tokens": 6000}, "agents": {"old*": {"model": "gpt-4"}}}
    )
    with structlog.testing.capture_logs() as logs:
        checks.check_model_windows(tight)
        checks.check_model_windows(config_of({}))
    [line] = events(logs, "summary budgets do not fit an agent's window")
    assert line["log_level"] == "warning" and '[agents."old*"]' in line["problem"]


def test_a_remote_summarizer_without_redaction_is_said_once_per_check() -> None:
    remote = {"summarizer": {"model": "openai/gpt-4o-mini"}}
    with structlog.testing.capture_logs() as logs:
        checks.warn_unredacted(config_of({**remote, "privacy": {"redact": False}}))
        checks.warn_unredacted(config_of(remote))  # redacted: nothing to say
        checks.warn_unredacted(config_of({"privacy": {"redact": False}}))  # builtin: local
    [line] = events(logs, "privacy: remote summarizer without redaction")
    assert "redact = false" in line["detail"]


def test_the_redaction_key_comes_from_the_state_dir(tmp_path: Path) -> None:
    from memd.redaction_key import key_path

    workspace = tmp_path / "ws"
    assert checks.redaction_key(None, workspace) is None  # no state dir: a per-process key
    key = checks.redaction_key(tmp_path / "state", workspace)
    assert key is not None
    assert checks.redaction_key(tmp_path / "state", workspace) == key  # the same one again
    path = key_path(tmp_path / "state", workspace)
    assert (path.stat().st_mode & 0o777) == 0o600
    os.chmod(path, 0o644)  # loose: refused, said, and a per-process key instead
    with structlog.testing.capture_logs() as logs:
        assert checks.redaction_key(tmp_path / "state", workspace) is None
    [line] = events(logs, "redaction key unusable; using one for this run only")
    assert line["log_level"] == "warning"


def test_settings_that_need_a_restart_are_named() -> None:
    old = config_of({})
    new = config_of({"daemon": {"max_concurrent_llm": 7}, "watch": {"poll": True}})
    with structlog.testing.capture_logs() as logs:
        checks.restart_only_changes(old, new, poll_fixed=False)
    assert [line.get("setting") for line in events(logs, "takes effect at the next restart")] == [
        "daemon.max_concurrent_llm"
    ]
    assert len(events(logs, "watch.poll takes effect at the next restart")) == 1
    with structlog.testing.capture_logs() as logs:
        checks.restart_only_changes(old, new, poll_fixed=True)  # --poll on the command line
        checks.restart_only_changes(old, old, poll_fixed=False)
    assert events(logs, "watch.poll takes effect at the next restart") == []
    assert len(events(logs, "takes effect at the next restart")) == 1


def test_changed_sections_names_keys_never_values() -> None:
    old = config_of({})
    new = config_of({"daemon": {"cooldown_s": 5}, "summarizer": {"max_tokens": 99}})
    assert checks.changed_sections(old, new) == ["daemon", "summarizer"]
    assert checks.changed_sections(old, old) == []


def test_litellm_is_warmed_only_for_a_model_that_needs_it() -> None:
    assert checks.warm_summarizer(config_of({})) is None  # the builtin summarizer


def test_an_archive_key_linked_from_elsewhere_is_an_error_at_start(tmp_path: Path) -> None:
    from memd.archive_crypto import generate_master_key

    real = tmp_path / "scratch" / "archive.key"
    real.parent.mkdir()
    generate_master_key(real)
    link = tmp_path / "etc" / "archive.key"
    link.parent.mkdir()
    link.symlink_to(real)
    encrypted = config_of({"privacy": {"encrypt_archives": True, "key_file": str(link)}})
    with structlog.testing.capture_logs() as logs:
        checks.check_archive_key(encrypted)
    [line] = events(logs, "archive key")
    assert line["log_level"] == "error"
    assert line["detail"] == f"key file {link} is a symlink to {real}, outside its folder"
