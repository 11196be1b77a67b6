"""The lifecycle's one signal rule, with real signals raised against the real handler."""

from __future__ import annotations

import signal
from pathlib import Path

from memd.daemon import Daemon, DaemonOptions
from memd.settings import LoadedConfig, build_config


def make_daemon(tmp_path: Path, install: bool = True) -> Daemon:
    config, _ = build_config({}, {})
    loaded = LoadedConfig(config, None, tmp_path / "ws", ())
    return Daemon(loaded, DaemonOptions(install_signal_handlers=install))


def test_real_signals_set_only_flags_and_a_second_sigint_forces(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    with daemon.capture_signals():
        signal.raise_signal(signal.SIGHUP)
        assert daemon.reload_requested and not daemon.should_exit
        signal.raise_signal(signal.SIGINT)
        assert daemon.should_exit and not daemon.force_exit
        signal.raise_signal(signal.SIGINT)  # the second SIGINT forces
        assert daemon.force_exit
    # The previous handlers are back.
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_sigterm_never_forces(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path)
    with daemon.capture_signals():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
    assert daemon.should_exit and not daemon.force_exit


def test_handlers_are_left_alone_when_not_asked_to_install(tmp_path: Path) -> None:
    daemon = make_daemon(tmp_path, install=False)
    before = signal.getsignal(signal.SIGTERM)
    with daemon.capture_signals():
        assert signal.getsignal(signal.SIGTERM) is before
