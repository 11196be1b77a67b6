"""``memd run``'s work, without Typer: the Typer command (:mod:`memd.cli.commands_run`)
and the plain reading of its arguments (:mod:`memd.cli.run_argv`) both call
:func:`run_daemon`; its start-up is timed to READY, so nothing here imports Typer."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memd.cli.common import load

if TYPE_CHECKING:
    from memd.settings import LoadedConfig

LogFormatChoice = Literal["auto", "json", "console"]
LogLevelChoice = Literal["debug", "info", "warning", "error"]


def run_daemon(
    workspace: Path | None = None,
    config: Path | None = None,
    state_dir: Path | None = None,
    poll: bool | None = None,
    log_format: LogFormatChoice | None = None,
    log_level: LogLevelChoice | None = None,
    demo: bool = False,
) -> int:
    """Run the daemon in the foreground until it stops; its exit code (a forced
    stop leaves the process at once)."""
    from memd.daemon import EXIT_FORCED, Daemon, DaemonOptions
    from memd.logs import configure_logging
    from memd.settings import locate_state_dir, require_state_dir, resolve_state_dir
    from memd.threads import name_native_threads

    transform = None
    settings: dict[str, dict[str, Any]] = {}
    if demo:
        from memd.demo import DEMO_DIR, DEMO_SETTINGS, demo_config, seed_demo_workspace

        workspace = (workspace or DEMO_DIR).absolute()
        workspace.mkdir(parents=True, exist_ok=True)
        seed_demo_workspace(workspace)
        transform = demo_config
        settings = DEMO_SETTINGS
    # The daemon's own settings: never another daemon's pointer.
    loaded = load(workspace, config, follow_pointer=False)
    if transform is not None:
        loaded = dataclasses.replace(loaded, config=transform(loaded.config))
    configure_logging(log_format or loaded.config.log.format, log_level or loaded.config.log.level)
    state = resolve_state_dir(state_dir, loaded.config.state_dir)
    # Refused before anything starts (exit 2, as a bad config): a daemon on a
    # temporary in-memory state is one `memd status` and `memd health` cannot see.
    require_state_dir(state, locate_state_dir(state_dir, loaded)[1])
    recorded, withheld = _pointer_settings(loaded, settings)
    pointer = _WorkspacePointer(loaded, state, recorded, withheld=withheld, demo=demo)
    pointer.leave()
    options = DaemonOptions(
        config_file=config,
        workspace_flag=workspace,
        state_dir=state,
        poll=poll,
        log_format=log_format,
        log_level=log_level,
        config_transform=transform,
        claim_pointer=pointer.retake,
    )
    name_native_threads()  # `top -H`, `ps -L` and /proc tell the daemon's threads apart
    keep_out_of_core_dumps()
    code = Daemon(loaded, options).run()
    if code == EXIT_FORCED:
        # A forced stop does not wait for a slow LLM call in a worker thread;
        # the transaction is crash-safe, so leave now.
        sys.stderr.flush()
        os._exit(code)
    return code


PR_SET_DUMPABLE = 4


def keep_out_of_core_dumps() -> None:
    """No core dump of the daemon, and no other process of its uid attaching to it
    (``ptrace``, ``/proc/PID/mem``): its memory holds agents' text, the archive
    master key and API keys, which a crash dump (apport, abrt, systemd-coredump
    may keep or upload it) would write out. RLIMIT_CORE 0 and PR_SET_DUMPABLE 0;
    where either is unavailable (not Linux) the daemon runs as before. The
    daemon's own /proc/self stays its own (the kernel lets a process read its
    fds whatever this flag says)."""
    import ctypes
    import resource

    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _pointer_settings(
    loaded: LoadedConfig, demo: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """What the pointer tells commands beside this daemon, over its config file:
    the settings of its environment (systemd's EnvironmentFile=, which those
    commands never see: else `memd doctor` judged a redaction the daemon does
    not use), then the demo's; and the variables kept out (secrets), by name."""
    from memd.logs import get_logger
    from memd.settings import environment_settings

    settings, withheld = environment_settings(loaded)
    if withheld:
        get_logger("memd.daemon").info(
            "settings of the environment kept out of the workspace's state pointer "
            "(secrets): commands beside the daemon need them in their own environment",
            variables=list(withheld),
        )
    for section, values in demo.items():
        settings[section] = {**settings.get(section, {}), **values}
    return settings, withheld


class _WorkspacePointer:
    """This daemon's state pointer in its workspace (memd.pointer): left at start
    unless another live daemon serves the workspace, and taken over later (the
    daemon's periodic job) once the daemon it names is gone."""

    def __init__(
        self,
        loaded: LoadedConfig,
        state_dir: Path,
        settings: dict[str, dict[str, Any]],
        *,
        withheld: tuple[str, ...] = (),
        demo: bool = False,
    ) -> None:
        self._loaded = loaded
        self._state_dir = state_dir
        self._settings = settings
        self._withheld = withheld
        self._demo = demo
        self._write_failed = False

    def leave(self) -> None:
        """At start: tell later commands on this workspace where this daemon's state
        is and how it is set: `memd status -w WS` then needs no --config or --state-dir."""
        from memd.logs import get_logger

        loaded = self._loaded
        if not loaded.workspace.is_dir():
            return  # the daemon refuses it with its own one-line reason
        other = _other_daemon_pid(loaded)
        if other is not None:
            # A second daemon on the workspace (DESIGN §4): the pointer stays the
            # first one's while it runs; retake() claims it once that one is gone.
            get_logger("memd.daemon").warning(
                "another memd daemon serves this workspace; its state pointer is left as it is",
                pid=other,
                pointer=str(loaded.workspace / ".memd-state"),
            )
            return
        if self._write() is not None and self._demo:
            # Said where the demo's user looks: the log on the terminal.
            get_logger("memd.daemon").info(
                "demo settings saved in the workspace; later commands there use them",
                pointer=str(loaded.workspace / ".memd-state"),
                settings=self._settings,
                next=f"memd status --workspace {loaded.workspace}",
            )

    def retake(self) -> None:
        """The periodic check: when the pointer does not name this daemon and no
        other live memd daemon serves the workspace (the one it names stopped: a
        rolling restart), leave ours, so `memd health`/`status -w` read the live
        daemon. A pointer naming us costs one small read."""
        from memd.logs import get_logger
        from memd.pointer import PointerRefused, read_pointer

        try:
            pointer = read_pointer(self._loaded.workspace)
        except (PointerRefused, OSError):
            pointer = None  # one we do not trust is replaced, as at start
        if pointer is not None and pointer.pid == os.getpid():
            return
        other = _other_daemon_pid(self._loaded)
        if other is not None:
            return
        path = self._write()
        if path is not None:
            get_logger("memd.daemon").info(
                "state pointer taken over: the daemon it named is gone",
                pointer=str(path),
                was_pid=pointer.pid if pointer is not None else None,
            )

    def _write(self) -> Path | None:
        from memd.errors import describe_error
        from memd.logs import get_logger
        from memd.pointer import write_pointer
        from memd.settings import api_key_vars

        loaded = self._loaded
        try:
            path = write_pointer(
                loaded.workspace,
                self._state_dir,
                config=loaded.source,
                settings=self._settings,
                key_vars=api_key_vars(),
                withheld=self._withheld,
            )
        except OSError as exc:
            if not self._write_failed:  # once, not at every periodic check
                get_logger("memd.daemon").warning(
                    "cannot leave the state pointer in the workspace; "
                    "commands there need --state-dir (or the daemon's --config)",
                    error=describe_error(exc),
                )
            self._write_failed = True
            return None
        self._write_failed = False
        return path


def _other_daemon_pid(loaded: LoadedConfig) -> int | None:
    """The pid of another memd daemon running on this workspace, if one is: the
    process answering its recall socket, else the pointer's pid, each only when
    it is a running `memd run` (state.is_memd_daemon: any other listener at the
    path, or a pid reused by something else, does not count). A listener in
    another pid namespace (SO_PEERCRED pid 0) cannot be told apart: it does not
    count either (its socket is still left alone); a process whose /proc is
    hidden from us is taken for the daemon."""
    from memd.pointer import PointerRefused, read_pointer
    from memd.recall.socket_server import serving_peer, socket_path_for
    from memd.state import is_memd_daemon

    socket_path = socket_path_for(loaded.config.recall.socket, loaded.workspace)
    if socket_path is not None:
        peer = serving_peer(socket_path)
        if (
            peer is not None
            and peer.pid not in (0, os.getpid())
            and is_memd_daemon(peer.pid) is not False
        ):
            return peer.pid
    try:
        pointer = read_pointer(loaded.workspace)
    except (PointerRefused, OSError):
        return None  # one we do not trust is replaced
    pid = pointer.pid if pointer is not None else None
    if pid is None or pid <= 0 or pid == os.getpid():
        return None
    return pid if is_memd_daemon(pid) is not False else None


__all__ = ["LogFormatChoice", "LogLevelChoice", "run_daemon"]
