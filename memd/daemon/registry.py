"""The agents: scan ``agents/``, refuse bad names (said once), build each agent's
paths (fast), recover a crashed compaction when an agent is added (a recovery that
fails is noted on the entry, for the runner to finish), keep the table.

The registry owns the agents table, the set of agents removed since the last
state flush, and the lock guarding both (and each entry's policy). An entry's
job state is the runner's (under the runner's lock), its count the counter's
(under the entry's ``count_lock``). While holding this lock the registry
calls into no other service (it takes only the descriptors' lock, a leaf), so
any service may take it while holding its own.

Each rescan of the agent set is published (:class:`Rescans`): the watch service
(:mod:`memd.daemon.watches`) waits for it and keeps the watches matching the
set. The registry is read, it tells no one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memd.compaction import (
    AuditSink,
    archive_key_file,
    finished_an_erasure,
    journal_unfinished,
    record_recovered_erasure,
)
from memd.core.config import AgentPolicy, MemdConfig, matching_overrides, resolve_policy
from memd.core.descriptor import AgentWindow
from memd.core.names import validate_agent_name
from memd.core.plan import threshold_too_small
from memd.daemon.entries import AgentEntry, UnfinishedJournal
from memd.descriptor import Descriptors
from memd.errors import MemdError, describe_error
from memd.logs import get_logger
from memd.workspace import (
    AGENTS_DIR,
    AgentPaths,
    FolderFacts,
    agent_paths_scanned,
    make_agents_folder,
    scan_agents,
)

_log = get_logger("memd.daemon")


@dataclass(frozen=True, slots=True)
class RecoveryOptions:
    """What a recovery takes from the current config: the master key file archives
    are sealed with (None: not encrypting), and the drain's ``[compaction]
    drain_quiet_s`` and ``drain_max_s`` (a late writer's turns are moved over
    until the old file has been quiet that long, as after any swap)."""

    key_file: Path | None
    quiet_s: float
    max_s: float

    @classmethod
    def of(cls, config: MemdConfig) -> RecoveryOptions:
        compaction = config.compaction
        return cls(archive_key_file(config), compaction.drain_quiet_s, compaction.drain_max_s)


# Finishes or rolls back a crashed compaction of the agent; says what it did.
RecoverFn = Callable[[AgentPaths, RecoveryOptions], "str | None"]
ContextLengthOf = Callable[[str], "int | None"]
# What an agent's policy is made of: its matching [agents."glob"] tables, its window.
PolicyKey = tuple[tuple[str, ...], AgentWindow | None]
# How many policies are kept for sharing (an agent keeps its own either way).
MAX_SHARED_POLICIES = 4096


class Rescans:
    """The registry's rescans, published: a number that grows with each one, and a
    wait for the next (the watch service's). Nobody is called: readers wait."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._number = 0

    @property
    def number(self) -> int:
        with self._changed:
            return self._number

    def publish(self) -> None:
        with self._changed:
            self._number += 1
            self._changed.notify_all()

    def wait(self, seen: int, timeout: float, stop: threading.Event) -> int:
        """The latest rescan's number once it is past ``seen``, or after ``timeout``
        seconds, or once ``stop`` is set (and :meth:`wake` called)."""
        with self._changed:
            self._changed.wait_for(lambda: self._number != seen or stop.is_set(), timeout)
            return self._number

    def wake(self) -> None:
        """Wake the waiters (one of them is stopping: it set its ``stop`` first)."""
        with self._changed:
            self._changed.notify_all()


class AgentRegistry:
    def __init__(
        self,
        workspace: Path,
        config: MemdConfig,
        recover: RecoverFn,
        context_length_of: ContextLengthOf | None,
    ) -> None:
        self.workspace = workspace
        self._lock = threading.RLock()  # the table, the removed set, the policies
        self._config = config
        # The config and its policies, one per set of matching [agents."glob"]
        # tables and declared window, shared by the agents that resolve alike (one
        # attribute, swapped whole: a reader sees one config's policies).
        self._policies: tuple[MemdConfig, dict[PolicyKey, AgentPolicy]] = (config, {})
        self._recover = recover
        self._context_length_of = context_length_of
        self._agents: dict[str, AgentEntry] = {}
        self._removed: set[str] = set()
        self._rejected: dict[str, str] = {}
        self._root = workspace
        self._agents_root = workspace / AGENTS_DIR
        self._agents_base = os.fspath(self._agents_root)
        self._agents_dir_plain = False
        # Each agent's memd-agent.json (set at start-up, when the tokenizer exists).
        self.descriptors: Descriptors | None = None
        self.rescans = Rescans()
        # The workspace's audit log (set at start-up; None: no state dir): an
        # erasure recovery finishes is recorded there, as a finished one is.
        self.audit: AuditSink | None = None

    @property
    def root(self) -> Path:
        """The workspace, resolved at start."""
        return self._root

    def start(self, stack: contextlib.ExitStack) -> None:
        """Resolve the workspace and make sure ``agents/`` exists (the watches need
        it). Nothing to stop: no thread, nothing held open, so nothing is pushed
        on ``stack`` (taken like every service's start, in the lifecycle's order)."""
        self._root = self.workspace.resolve()
        self._agents_root = self._root / AGENTS_DIR
        self._agents_base = os.fspath(self._agents_root)
        self._agents_dir_plain = not self._agents_root.is_symlink()
        try:
            problem = make_agents_folder(self._root)
        except OSError:
            return  # the workspace's own check says what is wrong with it
        if problem is not None:
            _log.warning("agents folder not open to the agents' group", error=problem)

    def reconfigure(
        self, config: MemdConfig, count_text: Callable[[str], int] | None = None
    ) -> None:
        """New per-agent policies (reload); ``count_text``: the new tokenizer's, when
        the reload brought one (agents' reserved text is counted with it)."""
        with self._lock:
            self._config = config
            self._policies = (config, {})
            if self.descriptors is not None:
                self.descriptors.clear(count_text)
            for entry in self._agents.values():
                entry.policy = self.policy(entry.name)
                entry.dirty = True

    # -------------------------------------------------------------------- table

    def policy(
        self, name: str, agent_dir: Path | None = None, has_descriptor: bool | None = None
    ) -> AgentPolicy:
        """``has_descriptor=False``: the caller just listed the folder and saw no
        memd-agent.json (nothing to look at, ``agent_dir`` unused)."""
        window = None
        if self.descriptors is not None:
            if has_descriptor is False:
                self.descriptors.absent(name)
            else:
                folder = self._agents_root / name if agent_dir is None else agent_dir
                window = self.descriptors.window(name, folder)
        config, policies = self._policies
        key = (matching_overrides(config, name), window)
        policy = policies.get(key)
        if policy is None:
            if len(policies) >= MAX_SHARED_POLICIES:
                # Bounded: agents that rewrite their descriptor (a new reserved
                # text, a new window) would otherwise add policies for ever.
                policies.clear()
            policy = policies[key] = resolve_policy(config, name, self._context_length_of, window)
            too_small = threshold_too_small(policy)
            if too_small:
                # Once per policy (agents that resolve alike share it; a reload
                # makes new ones): the compactions' own lines would only say it
                # ended over the mark, at every cooldown.
                _log.warning(
                    "threshold too small to compact under",
                    agent=name,
                    why=too_small,
                    fix="a larger window or threshold, or less reserved (memd doctor)",
                )
        return policy

    def refresh_window(self, name: str) -> None:
        """The agent's folder changed: re-resolve its policy if its memd-agent.json did."""
        if self.descriptors is None:
            return
        known = self._agents.get(name)
        folder = known.paths.dir_fspath() if known is not None else f"{self._agents_base}/{name}"
        if not self.descriptors.changed(name, folder):
            return
        with self._lock:
            entry = self._agents.get(name)
            if entry is not None:
                entry.policy = self.policy(name)
                entry.dirty = True

    def agents(self) -> dict[str, AgentEntry]:
        with self._lock:
            return dict(self._agents)

    def get(self, name: str) -> AgentEntry | None:
        return self._agents.get(name)

    def is_current(self, entry: AgentEntry) -> bool:
        """Still the registered entry for its name (not removed or replaced)."""
        return self._agents.get(entry.name) is entry

    def names(self) -> set[str]:
        with self._lock:
            return set(self._agents)

    def all_paths(self) -> list[AgentPaths]:
        with self._lock:
            return [entry.paths for entry in self._agents.values()]

    def dirs(self) -> dict[str, str]:
        """Each agent's folder, as a ``str`` (no ``Path`` made per agent)."""
        with self._lock:
            return {name: entry.paths.dir_fspath() for name, entry in self._agents.items()}

    def plain_folders(self, scanned: dict[str, bool]) -> dict[str, str]:
        """The folders of :meth:`scan`'s agents that :meth:`make_entry` takes by the fast
        path (not a symlink, under a plain ``agents/``), as ``str``: what may be watched
        before anything in them is read (a symlinked one only once it is checked)."""
        if not self._agents_dir_plain:
            return {}
        base = self._agents_base
        return {name: f"{base}/{name}" for name, link in scanned.items() if not link}

    def __len__(self) -> int:
        return len(self._agents)

    def register(self, entries: list[AgentEntry], known_before: set[str]) -> None:
        """Start-up: the scanned agents; stored agents no longer present are removed."""
        with self._lock:
            for entry in entries:
                self._agents[entry.name] = entry
            self._removed.update(known_before - set(self._agents))

    def add(self, name: str) -> AgentEntry | None:
        """A new agent folder: its entry (recovered), or None (refused, or known)."""
        entry = self.make_entry(name)
        if entry is None:
            return None
        self.recover(entry)
        with self._lock:
            if name in self._agents:
                return None
            self._agents[name] = entry
            self._removed.discard(name)
        _log.info("agent added", agent=name)
        return entry

    def reconcile(self) -> tuple[list[str], list[str]]:
        """Rescan ``agents/``: new folders are added (recovered), gone ones removed.
        Returns (added, removed) and publishes the rescan (the watches follow it)."""
        names = set(self.scan())
        known = self.names()
        added = [name for name in sorted(names - known) if self.add(name) is not None]
        removed = [name for name in sorted(known - names) if self.remove(name) is not None]
        self.rescans.publish()
        return added, removed

    def remove(self, name: str) -> AgentEntry | None:
        with self._lock:
            entry = self._agents.pop(name, None)
            if entry is None:
                return None
            self._removed.add(name)
        _log.info("agent removed", agent=name)
        return entry

    def take_changes(self) -> tuple[list[AgentEntry], list[str]]:
        """Entries changed and names removed since the last call (their dirty
        flags cleared: whoever changes an entry sets the field, then ``dirty``)."""
        with self._lock:
            dirty = [entry for entry in self._agents.values() if entry.dirty]
            for entry in dirty:
                entry.dirty = False
            removed = list(self._removed)
            self._removed.clear()
        return dirty, removed

    def give_back(self, dirty: list[AgentEntry], removed: list[str]) -> None:
        """A flush failed: mark them again for the next one."""
        with self._lock:
            for entry in dirty:
                entry.dirty = True
            self._removed.update(removed)

    # --------------------------------------------------------------------- scan

    def scan(self) -> dict[str, bool]:
        """Agent folder names under ``agents/`` (valid names only) -> is it a symlink."""
        scanned = scan_agents(self._root)
        for name in scanned.invalid_folders:
            self._note_invalid_name(name)
        return scanned.agents

    def _note_invalid_name(self, name: str) -> None:
        # Hidden folders (.git) are expected; anything else that cannot be an
        # agent name is said once, so a fleet with a badly named agent folder
        # is not silently left uncounted.
        if name.startswith(".") or name in self._rejected:
            return
        try:
            validate_agent_name(name)
        except MemdError as exc:
            self._rejected[name] = str(exc)
            _log.warning("agent skipped", agent=repr(name), error=str(exc))

    def make_entry(
        self,
        name: str,
        is_link: bool | None = None,
        folder: FolderFacts | None = None,
        where: str | None = None,
    ) -> AgentEntry | None:
        """The agent's entry (None: refused, said once); ``folder``: its folder as
        the last run listed it (from the state DB), to skip the listing if unchanged;
        ``where``: the folder's path (:meth:`plain_folders`)."""
        try:
            scanned = agent_paths_scanned(
                self.workspace,
                name,
                root=self._root,
                is_link=is_link,
                agents_dir_plain=self._agents_dir_plain,
                agents_root=self._agents_root,
                # From the scan (is_link known): its names were validated there.
                name_valid=is_link is not None,
                known=folder,
                folder=where,
            )
        except (MemdError, OSError) as exc:
            reason = str(exc)
            if self._rejected.get(name) != reason:
                _log.warning("agent skipped", agent=name, error=reason)
            self._rejected[name] = reason
            return None
        self._rejected.pop(name, None)
        paths = scanned.paths
        return AgentEntry(
            name=name,
            paths=paths,
            # The fast path listed the folder: no memd-agent.json there, no lstat.
            policy=self.policy(
                name, None if scanned.has_descriptor is False else paths.dir, scanned.has_descriptor
            ),
            may_need_recovery=scanned.has_private,
            folder=scanned.folder,
        )

    def recover(self, entry: AgentEntry) -> bool:
        """Finish or roll back the agent's interrupted compaction (at start-up, and
        for an agent added while running: a folder moved in, or restored from a
        backup, with a journal mid-job). True when it failed and left the journal
        holding a job: the entry then carries it (:attr:`AgentEntry.unfinished_journal`)
        and the runner's first decision owes the drain, so its finish job retries
        with backoff (``memd status`` shows why) instead of the late turns waiting
        for the agent's next compaction."""
        if not entry.may_need_recovery:
            return False  # no .memd/: never compacted, nothing to finish
        try:
            # The current config's key (reconfigure keeps it): a crash's old file
            # kept as an archive is sealed like any other archive; its drain waits
            # for quiet as the config says, as a compaction's does.
            done = self._recover(entry.paths, RecoveryOptions.of(self._config))
        except Exception as exc:
            reason = describe_error(exc)
            _log.error("recovery failed", agent=entry.name, error=reason)
            if not _journal_left(entry):
                return False  # failed around an idle journal (a stale temp): nothing owed
            entry.unfinished_journal = UnfinishedJournal(reason)
            return True
        if finished_an_erasure(done):
            _log.warning("recovered an interrupted erasure", agent=entry.name, action=done)
            if self.audit is not None:
                record_recovered_erasure(self.audit, entry.name)
        elif done:
            _log.warning("recovered an interrupted compaction", agent=entry.name, action=done)
        return False


def _journal_left(entry: AgentEntry) -> bool:
    """Whether the agent's journal still holds a job after a failed recovery; one
    that cannot be read counts as holding one (the finish job retries, and says why)."""
    try:
        return journal_unfinished(entry.paths)
    except (OSError, MemdError):
        return True


__all__ = ["AgentRegistry", "ContextLengthOf", "RecoverFn", "RecoveryOptions", "Rescans"]
