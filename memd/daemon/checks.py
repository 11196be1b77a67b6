"""What the daemon says at start-up and on reload about its surroundings: plain
functions, each a config (or a workspace) in and log lines out, so operators read
at start what ``memd doctor`` and ``memd config check`` would tell them.

None of them stops the daemon: a problem named here makes the affected
compactions fail later with the same words, while the other agents go on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from memd.core.config import MemdConfig
from memd.core.privacy import unredacted_remote_warning
from memd.errors import ConfigError
from memd.logs import get_logger
from memd.modelinfo import context_length_for_model
from memd.settings import model_window_problems

_log = get_logger("memd.daemon")


def warn_about_filesystem(workspace: Path) -> None:
    # NFS without lockd, CIFS and Docker Desktop shares (virtiofs, gRPC
    # FUSE) break flock between hosts/VMs and drop inotify events: say so
    # at start, where operators look, not only in `memd doctor`.
    from memd.doctor import check_filesystem

    for check in check_filesystem(workspace):
        if check.status != "ok":
            _log.warning("workspace filesystem", detail=check.message, fix=check.fix)


def check_archive_key(config: MemdConfig) -> None:
    # Every compaction reads the key file; a missing or loose one is said
    # at start (and reload), not first at the next compaction's failure.
    from memd.doctor import check_archive_key as doctor_check

    for check in doctor_check(config.privacy):
        if check.status == "fail":
            _log.error("archive key", detail=check.message, fix=check.fix)
        elif config.privacy.encrypt_archives:
            _log.info("archives encrypted at rest", detail=check.message)


def check_model_windows(config: MemdConfig) -> None:
    """Budgets that cannot fit a window taken from an agent's model: said at once
    (those agents' compactions would fail until the config changes)."""
    for problem in model_window_problems(config, context_length_for_model):
        _log.warning("summary budgets do not fit an agent's window", problem=problem)


def warn_unredacted(config: MemdConfig) -> None:
    from memd.llm import litellm_provider

    warning = unredacted_remote_warning(config, litellm_provider)
    if warning is not None:
        _log.warning("privacy: remote summarizer without redaction", detail=warning)


def redaction_key(state_dir: Path | None, workspace: Path) -> bytes | None:
    """The workspace's key from the state dir, shared with the CLI (README "Privacy").

    When it cannot be used, compactions still redact, with a key of this
    process only: placeholders then differ from the CLI's and after a restart.
    """
    if state_dir is None:
        return None
    from memd.redaction_key import key_path, load_or_create_key

    try:
        return load_or_create_key(key_path(state_dir, workspace))
    except ConfigError as exc:
        _log.warning("redaction key unusable; using one for this run only", detail=str(exc))
        return None


def warm_summarizer(config: MemdConfig) -> threading.Thread | None:
    """Import litellm in the background now, not seconds into the first compaction
    (the thread, or None when the summarizer needs no litellm)."""
    from memd.summarizers import needs_litellm

    if not needs_litellm(config.summarizer):
        return None

    def warm() -> None:
        from memd.llm import warm_up

        started = time.monotonic()
        loaded = warm_up()
        _log.info("summarizer loaded", ok=loaded, seconds=round(time.monotonic() - started, 2))

    thread = threading.Thread(target=warm, name="memd-warm-litellm", daemon=True)
    thread.start()
    return thread


def warm_tokenizer(tokenizer: object) -> threading.Thread | None:
    """Load the tokenizer's encoding in the background (the thread, or None when
    it has nothing to load): a restart with every file unchanged reached READY
    without it, and the first append should not wait for it."""
    warm = getattr(tokenizer, "warm", None)
    if not callable(warm):
        return None
    thread = threading.Thread(target=warm, name="memd-warm-tokenizer", daemon=True)
    thread.start()
    return thread


def restart_only_changes(old: MemdConfig, new: MemdConfig, poll_fixed: bool) -> None:
    """Reload: settings a running daemon cannot change are named (``poll_fixed``:
    the command line chose the watcher, so ``watch.poll`` does not matter)."""
    for key in ("max_concurrent_llm", "max_concurrent_io"):
        if getattr(new.daemon, key) != getattr(old.daemon, key):
            _log.warning("takes effect at the next restart", setting=f"daemon.{key}")
    if new.watch.poll != old.watch.poll and not poll_fixed:
        _log.warning("watch.poll takes effect at the next restart")


def changed_sections(old: MemdConfig, new: MemdConfig) -> list[str]:
    """The config's top-level keys whose values differ (names only, never values)."""
    before, after = old.model_dump(), new.model_dump()
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))


__all__ = [
    "changed_sections",
    "check_archive_key",
    "check_model_windows",
    "redaction_key",
    "restart_only_changes",
    "warm_summarizer",
    "warm_tokenizer",
    "warn_about_filesystem",
    "warn_unredacted",
]
