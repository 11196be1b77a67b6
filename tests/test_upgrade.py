"""The current memd on workspaces REAL older builds left behind.

Each ``tests/fixtures/upgrade/<commit>.tar.gz`` was made by that commit's own
memd (``tests/fixtures/upgrade/make_fixtures.py`` says how and re-makes them):
compactions by compact-now and by a daemon, its counts in the state DB (schema
2, 6 and the dev schema 8), a recall index (schema 1), an encrypted archive,
forgotten agents and erased entries, and compactions and an erasure killed at a
journal checkpoint. The fixture is unpacked as if the same files were still
there (:func:`unpack`), then the current memd runs on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.daemon_proc import DaemonProcess, wait_until
from support.memfiles import append_entry

from memd.archive_crypto import read_archive, read_master_key
from memd.audit import audit_path, read_audit
from memd.core.carry import carry_material
from memd.core.memfile import MemoryDocument, parse
from memd.core.plan import lone_summary
from memd.core.secrets import contains_secret
from memd.core.summary_block import parse_summary
from memd.counting import count_file
from memd.fsutil import SlotJournal
from memd.state import state_db_path
from memd.tokenizer import TokenCounter
from memd.workspace import agent_paths

FIXTURES = Path(__file__).parent / "fixtures" / "upgrade"
COMMITS = sorted(path.name.removesuffix(".tar.gz") for path in FIXTURES.glob("*.tar.gz"))


@dataclass
class Upgraded:
    root: Path
    manifest: dict[str, Any]

    @property
    def ws(self) -> Path:
        return self.root / "ws"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def config(self) -> Path:
        return self.root / "memd.toml"

    @property
    def key_file(self) -> Path | None:
        key = self.root / "master.key"
        return key if key.exists() else None

    def args(self) -> list[str]:
        return ["-w", str(self.ws), "-c", str(self.config), "--state-dir", str(self.state)]

    def agents(self) -> list[str]:
        return sorted(path.name for path in (self.ws / "agents").iterdir())

    def erased(self, agent: str) -> re.Pattern[str] | None:
        pattern = self.manifest.get("erased", {}).get(agent)
        return None if pattern is None else re.compile(pattern)


def _rehome(
    body: dict[str, Any], old_root: str, new_root: str, remap: dict[str, Any]
) -> dict[str, Any]:
    """A journal record with the old files' (dev, ino), paths and erase manifest
    digest mapped onto the unpacked ones."""
    body = json.loads(json.dumps(body).replace(old_root, new_root))
    for key, value in list(body.items()):
        if key.endswith("_dev") and value in remap["dev"]:
            body[key] = remap["dev"][value]
        elif key.endswith("_ino") and value in remap["ino"]:
            body[key] = remap["ino"][value]
        elif key == "manifest_sha256" and value in remap["sha"]:
            body[key] = remap["sha"][value]
    return body


def _rehome_journal(path: Path, old_root: str, new_root: str, remap: dict[str, Any]) -> None:
    """Each slot of a journal rehomed (:func:`_rehome`) and re-sealed the way it
    was written (sorted JSON, sha256 of the body), or the first build's plain
    JSON ``journal.json`` rewritten."""
    if path.name == "journal.json":
        body = _rehome(json.loads(path.read_text()), old_root, new_root, remap)
        path.write_text(json.dumps(body, sort_keys=True))
        return
    data = bytearray(path.read_bytes())
    for offset in range(0, len(data), SlotJournal.SLOT_SIZE):
        text = bytes(data[offset : offset + SlotJournal.SLOT_SIZE]).rstrip(b" \x00\n")
        if not text:
            continue
        record = json.loads(text)
        record["body"] = _rehome(record["body"], old_root, new_root, remap)
        canonical = json.dumps(record["body"], sort_keys=True)
        record["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
        sealed = json.dumps(record, sort_keys=True).encode()
        assert len(sealed) < SlotJournal.SLOT_SIZE
        data[offset : offset + SlotJournal.SLOT_SIZE] = sealed.ljust(SlotJournal.SLOT_SIZE, b" ")
    path.write_bytes(bytes(data))


def unpack(commit: str, into: Path) -> Upgraded:
    """The fixture unpacked under ``into``, as if the old build had run there.

    What a real upgrade keeps and a tar does not is put back: the state files'
    names (a digest of the workspace's path), the paths in the config, pointer
    and journals, every file's (dev, ino) where the journals, the erase manifest
    and the state DB name them, and every file's mtime."""
    root = into / commit
    root.mkdir(parents=True)
    with tarfile.open(FIXTURES / f"{commit}.tar.gz") as tar:
        tar.extractall(root, filter="tar")
    manifest: dict[str, Any] = json.loads((root / "manifest.json").read_text())
    old_root, new_root = manifest["root"], str(root)
    old_digest = state_db_path(Path("/"), Path(old_root) / "ws").stem
    new_digest = state_db_path(Path("/"), root / "ws").stem
    for path in list((root / "state").iterdir()):
        if path.name.startswith(old_digest):
            path.rename(path.with_name(new_digest + path.name[len(old_digest) :]))
    for name in ("memd.toml", "memd-encrypted.toml", "ws/.memd-state"):
        if (root / name).exists():
            (root / name).write_text((root / name).read_text().replace(old_root, new_root))

    stats: dict[str, list[int]] = manifest["stats"]
    remap: dict[str, Any] = {"dev": {}, "ino": {}, "sha": {}}
    for rel, (dev, ino, _mtime) in stats.items():
        path = root / rel.replace(old_digest, new_digest)
        if not path.exists() and path.name.endswith(".sock"):
            # A killed daemon's recall socket (a tar holds none): left bound, no one listening.
            with socket.socket(socket.AF_UNIX) as stale:
                stale.bind(str(path))
        st = os.lstat(path)
        remap["dev"][dev] = st.st_dev
        remap["ino"][ino] = st.st_ino
    for manifest_file in (root / "ws" / "agents").glob("*/.memd/erase.manifest"):
        before = manifest_file.read_bytes()
        rehomed = json.loads(before)
        for entry in rehomed.get("files", []):
            entry["ino"] = remap["ino"].get(entry["ino"], entry["ino"])
        after = json.dumps(rehomed, sort_keys=True).encode()
        manifest_file.write_bytes(after)
        remap["sha"][hashlib.sha256(before).hexdigest()] = hashlib.sha256(after).hexdigest()
    for journal in (root / "ws" / "agents").glob("*/.memd/journal*"):
        _rehome_journal(journal, old_root, new_root, remap)
    db = root / "state" / f"{new_digest}.sqlite3"
    with sqlite3.connect(db) as conn:
        for table in ("agents", "file_counts"):
            rows = conn.execute(f"SELECT rowid, dev, ino FROM {table}").fetchall()
            for rowid, dev, ino in rows:
                conn.execute(
                    f"UPDATE {table} SET dev = ?, ino = ? WHERE rowid = ?",
                    (remap["dev"].get(dev, dev), remap["ino"].get(ino, ino), rowid),
                )
    conn.close()
    # mtimes last (deepest first, so a folder's is not changed by its files').
    for rel, (_dev, _ino, mtime_ns) in sorted(stats.items(), key=lambda kv: -kv[0].count("/")):
        if rel.startswith("state/") or rel.endswith(".sock"):
            continue  # the state dir is memd's; its files' mtimes mean nothing
        os.utime(root / rel, ns=(mtime_ns, mtime_ns), follow_symlinks=False)
    return Upgraded(root, manifest)


def _sources(up: Upgraded, agent: str) -> Iterator[tuple[str, bytes]]:
    """(name, plain bytes) of the agent's MEMORY.md and every archive."""
    paths = agent_paths(up.ws, agent)
    master = None if up.key_file is None else read_master_key(up.key_file)
    if paths.archive_dir.is_dir():
        for archive in sorted(paths.archive_dir.iterdir()):
            yield archive.name, read_archive(paths, archive.name, master)
    if paths.memory.exists():
        yield "MEMORY.md", paths.memory.read_bytes()


def _lines(up: Upgraded, agent: str) -> tuple[set[str], set[str]]:
    """(lines kept, lines erased) across the agent's MEMORY.md and archives:
    every non-blank line but those of an entry a pattern erases (the erasure
    rewrites a summary it matches), and the lines of those the pattern matches."""
    erased = up.erased(agent)
    kept: set[str] = set()
    gone: set[str] = set()
    for _name, data in _sources(up, agent):
        for segment in MemoryDocument(data).segments:
            lines = {line for line in segment.raw.decode().splitlines() if line.strip()}
            text = getattr(segment, "text", None)
            if erased is not None and isinstance(text, str) and erased.search(text):
                gone |= {line for line in lines if erased.search(line)}
            else:
                kept |= lines
    return kept, gone


def _all_lines(up: Upgraded) -> dict[str, tuple[set[str], set[str]]]:
    return {agent: _lines(up, agent) for agent in up.agents()}


def _assert_no_turn_lost(
    up: Upgraded, before: dict[str, tuple[set[str], set[str]]], *, erasing: bool
) -> None:
    after = _all_lines(up)
    for agent, (kept, gone) in before.items():
        now_kept, _now_gone = after[agent]
        assert kept <= now_kept, (agent, sorted(kept - now_kept)[:5])
        if erasing:  # an erasure that committed is finished, never undone
            assert not (gone & now_kept), (agent, sorted(gone & now_kept)[:5])


# The oldest (first journal, schema 1) and the newest (the last build of
# 2026-12-03, an erasure killed mid-way) run by default; the ones between are slow
# (a daemon each, ~5 s): a6fe599 is the dev schema 8 that is brought back to 7.
_BETWEEN = ("f65dacb", "7f47eb0", "a6fe599")


def _param(commit: str) -> Any:
    return pytest.param(commit, marks=pytest.mark.slow) if commit in _BETWEEN else commit


PARAMS = [_param(commit) for commit in COMMITS]


def _drop_other_crashes(up: Upgraded) -> None:
    """The agents killed at every other checkpoint, recovered in the other tests:
    here folders gone since the old build ran, their rows still in its state DB."""
    for agent in up.manifest.get("other_crashes", {}):
        shutil.rmtree(up.ws / "agents" / agent)


@pytest.fixture(params=PARAMS)
def upgraded(request: pytest.FixtureRequest, tmp_path: Path) -> Upgraded:
    return unpack(request.param, tmp_path)


def _archive_names(up: Upgraded, agent: str) -> list[str]:
    folder = agent_paths(up.ws, agent).archive_dir
    return sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []


def _fresh_tokens(up: Upgraded, agent: str) -> int:
    counter = TokenCounter("cl100k_base")
    counted, _kind = count_file(agent_paths(up.ws, agent).memory, None, counter.count_bytes)
    return counted.tokens


def test_upgrade_fixtures_are_there() -> None:
    assert len(COMMITS) >= 3, COMMITS


def _lone_summaries_over_threshold(
    up: Upgraded, capsys: pytest.CaptureFixture[str]
) -> dict[str, tuple[int, int]]:
    """The agents whose MEMORY.md is one summary block over its threshold, with that
    threshold and how many archives they have."""
    rows = _status(up, capsys)
    over: dict[str, tuple[int, int]] = {}
    for agent in _alive(up):
        document = MemoryDocument(agent_paths(up.ws, agent).memory.read_bytes())
        threshold = rows[agent]["threshold_tokens"]
        if lone_summary(document) is not None and _fresh_tokens(up, agent) > threshold:
            over[agent] = (threshold, len(_archive_names(up, agent)))
    return over


def test_an_old_builds_summary_over_the_threshold_is_shrunk_by_compact_now(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """726ab50's builtin summary carried every earlier line forward: beta and zeta are
    a summary block alone of ~3,970 tokens against a threshold of 1,800. compact-now
    refused both ('nothing to compact (no raw entries since the last summary)'),
    even with the operator's own --summary-file; it now re-summarizes beta and puts
    the operator's summary in zeta's place, the old blocks archived."""
    up = unpack("726ab50", tmp_path)
    over = _lone_summaries_over_threshold(up, capsys)
    assert sorted(over) == ["beta", "zeta"], over
    before = _all_lines(up)
    code, out, err = run(capsys, "compact-now", "beta", *up.args())
    assert code == 0, err
    assert out.startswith("beta: compacted "), out
    summary = tmp_path / "zeta-summary.txt"
    summary.write_text("zeta: the build passed on the second try; answers short, in tables.\n")
    summary.chmod(0o600)
    code, out, err = run(capsys, "compact-now", "zeta", "--summary-file", str(summary), *up.args())
    assert code == 0, err
    assert out.startswith("zeta: compacted "), out
    _assert_no_turn_lost(up, before, erasing=False)
    rows = _status(up, capsys)
    for agent, (threshold, archives) in over.items():
        assert rows[agent]["tokens"] == _fresh_tokens(up, agent) < threshold, rows[agent]
        assert len(_archive_names(up, agent)) == archives + 1, agent
        assert not rows[agent]["last_error"], rows[agent]
    # Within their budgets now: nothing more to compact.
    code, out, err = run(capsys, "compact-now", "beta", "zeta", *up.args())
    assert code == 0, err
    assert out.count("nothing to compact (no raw entries since the last summary)") == 2, out


def _assert_recovered(up: Upgraded, crashed: dict[str, str]) -> None:
    """No job left: every journal idle (or none: 726ab50 removed its when done),
    no journal.json, no temp or staging file under .memd/."""
    for agent in crashed:
        paths = agent_paths(up.ws, agent)
        left = SlotJournal(paths.journal).read()
        assert left is None or left.get("phase") == "idle", (agent, left)
        leftovers = sorted(
            name
            for name in os.listdir(paths.private_dir)
            if name not in ("journal", "lock", "archive.key")
        )
        assert leftovers == [], (agent, leftovers)


def _status(up: Upgraded, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    code, out, err = run(capsys, "status", "--json", "--all", *up.args())
    assert code == 0, err
    return {row["agent"]: row for row in json.loads(out)}


def _alive(up: Upgraded) -> list[str]:
    return [agent for agent in up.agents() if agent_paths(up.ws, agent).memory.exists()]


def _check_status(up: Upgraded, rows: dict[str, dict[str, Any]], source: str) -> None:
    """Every agent with a MEMORY.md, its count as a fresh count of the file, its
    archives as the folder holds them; no error that is not so."""
    assert set(_alive(up)) <= set(rows), (_alive(up), sorted(rows))
    for agent in _alive(up):
        row = rows[agent]
        archives = _archive_names(up, agent)
        assert row["source"] == source, (agent, row)
        assert row["tokens"] == _fresh_tokens(up, agent), (agent, row)
        assert row["archives"] == len(archives), (agent, row, archives)
        sealed = [name for name in archives if name.endswith(".enc")]
        assert row["encrypted_archives"] == len(sealed), (agent, row)
        # Nothing here has bytes after its last entry that do not parse.
        assert "cannot be parsed" not in (row["last_error"] or ""), (agent, row)


def test_old_workspace_runs_recovers_and_counts(
    upgraded: Upgraded, capsys: pytest.CaptureFixture[str]
) -> None:
    up = upgraded
    before = _all_lines(up)
    crashed = {**up.manifest["crashes"], **up.manifest["other_crashes"]}
    over = _lone_summaries_over_threshold(up, capsys)
    with DaemonProcess(up.ws, up.state, config=up.config) as daemon:
        daemon.wait_ready(timeout=60)
        recovered = {line.get("agent"): line.get("action") for line in daemon.events(
            "recovered an interrupted compaction")}  # fmt: skip
        # An erasure (forget --match) the old build was killed in is said as one.
        erasures = {line.get("agent"): line.get("action") for line in daemon.events(
            "recovered an interrupted erasure")}  # fmt: skip
        assert not set(recovered) & set(erasures), (recovered, erasures)
        assert all(str(a).startswith("finished an interrupted erasure") for a in erasures.values())
        assert set(erasures) == {agent for agent in recovered | erasures if "erase" in agent}
        recovered |= erasures
        # A summary block alone over its threshold (726ab50's beta and zeta: its
        # builtin summary carried every line forward) is re-summarized by the
        # daemon, then under the threshold; it was "nothing to compact" for good.
        wait_until(
            lambda: all(
                _fresh_tokens(up, agent) <= threshold and len(_archive_names(up, agent)) > archives
                for agent, (threshold, archives) in over.items()
            ),
            timeout=30,
            step=0.2,
        )
        wait_until(lambda: not any(row["state"] in ("running", "pending") for row in _status(
            up, capsys).values()), timeout=30, step=0.1)  # fmt: skip
        # The live daemon's counts (restored from the old state DB where the file
        # is the one it counted, else counted anew) and archive figures (the old
        # DB's until its first survey, a second after start) as status shows them.
        fresh = {agent: _fresh_tokens(up, agent) for agent in _alive(up)}
        listed = {agent: len(_archive_names(up, agent)) for agent in _alive(up)}

        def live() -> bool:
            rows = _status(up, capsys)
            return all(
                rows.get(agent, {}).get("source") == "daemon"
                and rows[agent]["tokens"] == tokens
                and rows[agent]["archives"] == listed[agent]
                and tokens <= rows[agent]["threshold_tokens"]
                for agent, tokens in fresh.items()
            )

        wait_until(live, timeout=20, step=0.1)
        _check_status(up, _status(up, capsys), "daemon")
        daemon.signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
    problems = [line for line in daemon.lines if line.get("level") in ("error", "critical")]
    assert not problems, problems
    # Each crashed job finished or rolled back as its phase says, never taken for a
    # MEMORY.md replaced behind memd's back.
    # (A job killed after its journal went idle has nothing left to do.)
    assert set(up.manifest["crashes"]) <= set(recovered) <= set(crashed), recovered
    for agent, action in recovered.items():
        assert "another program" not in str(action) and "dropped" not in str(action), (
            agent,
            action,
        )
    _assert_recovered(up, crashed)
    _assert_no_turn_lost(up, before, erasing=True)
    # Each erasure the daemon finished is audited as a finished one is, marked recovered.
    audited = [
        record.agent
        for record in read_audit(audit_path(up.state, up.ws)).records
        if record.event == "erase_match" and record.fields.get("recovered")
    ]
    assert sorted(audited) == sorted(erasures), audited
    _check_status(up, _status(up, capsys), "files")
    alive = _alive(up)
    archives_before = {agent: _archive_names(up, agent) for agent in alive}

    # compact-now on what the old build left, after new turns: nothing lost.
    for agent in alive:
        for index in range(6):
            append_entry(
                agent_paths(up.ws, agent).memory,
                "Human",
                f"{agent} new turn {index}: " + "after the upgrade " * 20,
            )
    before = _all_lines(up)
    code, out, err = run(capsys, "compact-now", "--all", "--wait", "20", *up.args())
    assert code == 0, (out, err)
    _assert_no_turn_lost(up, before, erasing=False)
    for agent in alive:
        assert len(_archive_names(up, agent)) > len(archives_before[agent]), agent

    # Recall finds the old archives' text, including an index an old build made.
    code, out, err = run(
        capsys, "recall", "alpha", "alpha turn 5", "-n", "20", "--json", *up.args()
    )
    assert code == 0, err
    hits = json.loads(out)
    assert any(hit["text"].startswith("alpha turn 5:") and not hit["live"] for hit in hits), hits

    # Sealed archives the old build wrote open with its key.
    for agent in alive:
        for name in archives_before[agent]:
            if not name.endswith(".enc"):
                continue
            assert up.key_file is not None
            code, out, err = run(
                capsys, "archive", "cat", agent, name, "--key-file", str(up.key_file),
                "-w", str(up.ws),
            )  # fmt: skip
            assert code == 0, err
            assert f"{agent} turn 3:" in out

    # doctor: every check holds on the upgraded workspace (ok lines only).
    code, out, err = run(capsys, "doctor", *up.args())
    assert code == 0, (out, err)
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines and all(line.startswith("ok ") for line in lines), out


# The builds that sealed an archive (encrypt_archives came on 2026-12-02).
ENCRYPTED = [_param(commit) for commit in COMMITS if commit in ("7f47eb0", "a6fe599", "5600ee9")]


@pytest.mark.parametrize("commit", ENCRYPTED)
def test_old_sealed_archives_and_data_keys_serve_the_current_memd(
    commit: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With encryption on (the old build's key and data keys): compact-now seals
    with the old data key, forget --match re-seals the old archives, rekey re-wraps,
    and every archive still opens; doctor says every sealed archive opens."""
    up = unpack(commit, tmp_path)
    _drop_other_crashes(up)
    assert up.key_file is not None
    sealed_args = ["-w", str(up.ws), "-c", str(up.root / "memd-encrypted.toml")]
    args = [*sealed_args, "--state-dir", str(up.state)]
    up.manifest.setdefault("erased", {})["gamma"] = "gamma turn 2:"
    before = _lines(up, "gamma")
    gamma = agent_paths(up.ws, "gamma")
    for index in range(6):
        append_entry(gamma.memory, "Human", f"gamma new turn {index}: " + "sealed " * 30)
    code, out, err = run(capsys, "compact-now", "gamma", "crash-swapping", *args)
    assert code == 0, (out, err)
    archives = _archive_names(up, "gamma")
    assert len(archives) == 2 and all(name.endswith(".md.enc") for name in archives), archives
    code, out, err = run(capsys, "forget", "gamma", "--match", "gamma turn 2:", "--yes", *args)
    assert code == 0, (out, err)
    assert "re-sealed" in out, out
    fresh_key = up.root / "new.key"
    assert run(capsys, "archive", "keygen", str(fresh_key))[0] == 0
    code, out, err = run(capsys, "archive", "rekey", "--new-key", str(fresh_key), *sealed_args)
    assert code == 0, (out, err)
    (up.root / "master.key").unlink()
    fresh_key.rename(up.root / "master.key")
    kept, gone = _lines(up, "gamma")
    assert before[0] <= kept, sorted(before[0] - kept)[:5]
    assert before[1] and not gone, gone
    code, out, err = run(capsys, "doctor", *args)
    assert code == 0, (out, err)
    assert "archive data keys: 1 agent(s) with encrypted archives; every one opens" in out, out


@pytest.mark.parametrize("commit", PARAMS)
def test_compact_now_recovers_every_job_an_old_build_left(
    commit: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A compaction killed at each of the old build's checkpoints (an erasure too,
    where it has them), its journal in that build's format: the first command
    after the upgrade is compact-now. Every job is finished or rolled back, no
    temp is left, no turn is lost, an erasure that committed stays done."""
    up = unpack(commit, tmp_path)
    crashed = {**up.manifest["crashes"], **up.manifest["other_crashes"]}
    assert len(crashed) >= 9, crashed
    before = _all_lines(up)
    old_modes = {
        archive: stat.S_IMODE(archive.stat().st_mode)
        for agent in _alive(up)
        for archive in agent_paths(up.ws, agent).archive_dir.glob("*")
    }
    code, out, err = run(capsys, "compact-now", "--all", "--wait", "20", *up.args())
    assert code == 0, (out, err)
    _assert_no_turn_lost(up, before, erasing=True)
    _assert_recovered(up, crashed)
    # An archive/ a build before 5f6c7ea made private (0700) is opened as a fresh one
    # (0750) once an archive of a group-readable MEMORY.md goes in (s10upgrade B); the
    # old archives keep their modes (README "Upgrading": the operator's call).
    for agent in _alive(up):
        paths = agent_paths(up.ws, agent)
        if f"{agent}: compacted" in out and paths.memory.stat().st_mode & stat.S_IRGRP:
            assert stat.S_IMODE(paths.archive_dir.stat().st_mode) == 0o750, agent
    for archive, mode in old_modes.items():
        if archive.exists():
            assert stat.S_IMODE(archive.stat().st_mode) == mode, archive
    for agent in crashed:
        assert f"{agent}: compacted" in out or f"{agent}: nothing to compact" in out, out


def test_an_old_builds_summary_blocks_hold_no_carried_section_and_lose_no_line(
    upgraded: Upgraded,
) -> None:
    """The carried section (s11) is read only where memd writes it: every summary
    block an older build left reads as before, its lines all in its body, pins or
    provenance, and lends the next compaction's candidates no credential."""
    for agent in upgraded.agents():
        for name, data in _sources(upgraded, agent):
            document = parse(data)
            for entry in document.entries:
                if not document.is_summary_entry(entry):
                    continue
                parsed = parse_summary(entry.summary_text)
                assert parsed.carried == (), (agent, name)
                kept = "\n".join([parsed.body, *(pin.text for pin in parsed.pins)])
                for line in entry.summary_text.splitlines():
                    said = line.strip().removeprefix("- ")
                    if said and not said.startswith(("memd-", "Pinned facts", "20", "undated")):
                        assert said in kept, (agent, name, line)
            candidates = carry_material(document.prefix(document.boundary))
            assert not any(contains_secret(line.text) for line in candidates.lines)
