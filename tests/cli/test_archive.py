"""``memd archive keygen | cat | rekey`` and ``memd forget`` shredding encrypted archives."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from support.cli import run
from support.memfiles import AgentWorkspace, append_entry

from memd.archive_crypto import (
    DATA_KEY_NAME,
    ArchiveKeyError,
    open_archive,
    read_archive,
    read_master_key,
)
from memd.compaction import CompactionOptions, compact_agent
from memd.core.summary import SummaryRequest, SummaryResult
from memd.errors import ConfigError
from memd.settings import build_config

PLANTED = "kalomiren-7731 planted for the archive"


class Fixed:
    model = "test-fixed"

    def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(
            text="The user prefers tea. Task: ship memd. Decisions: archive first, then "
            "re-seed. Open tasks: docs, crash tests, landing the branch today.",
            model=self.model,
        )


@pytest.fixture
def key_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "master.key"
    code, out, err = run(capsys, "archive", "keygen", str(path))
    assert code == 0, err
    assert "wrote master key" in out and "back this file up" in err
    return path


@pytest.fixture
def config_file(tmp_path: Path, key_file: Path) -> Path:
    path = tmp_path / "memd.toml"
    path.write_text(f'[privacy]\nencrypt_archives = true\nkey_file = "{key_file}"\n')
    return path


def compacted(ws: AgentWorkspace, name: str, key_file: Path) -> tuple[Path, bytes]:
    paths = ws.create_agent(name, entries=4)
    append_entry(paths.memory, "Human", PLANTED)
    before = paths.memory.read_bytes()
    options = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, key_file=key_file)
    return compact_agent(paths, Fixed(), options).archive, before


def test_keygen_is_0600_and_refuses_to_overwrite(
    key_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    before = key_file.read_bytes()
    code, _out, err = run(capsys, "archive", "keygen", str(key_file))
    assert code == 2
    assert err.count("\n") == 1 and "refusing to overwrite" in err
    assert key_file.read_bytes() == before


def test_cat_decrypts_for_an_operator(
    ws: AgentWorkspace, key_file: Path, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive, before = compacted(ws, "alpha", key_file)
    assert PLANTED.encode() not in archive.read_bytes()
    code, out, err = run(
        capsys, "archive", "cat", "alpha", archive.name, "-w", str(ws.root), "-c", str(config_file)
    )
    assert code == 0, err
    assert out.encode() == before


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("../alpha/MEMORY.md", "is not an archive name"),
        ("history_x/../../y.md", "is not an archive name"),
        ("history_2000-01-01_00-00-00.md.enc", "no archive history_2000"),
        ("MEMORY.md", "is not an archive name"),
    ],
)
def test_cat_bad_names_are_one_line_errors(
    ws: AgentWorkspace,
    key_file: Path,
    config_file: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    message: str,
) -> None:
    compacted(ws, "alpha", key_file)
    code, out, err = run(
        capsys, "archive", "cat", "alpha", name, "-w", str(ws.root), "-c", str(config_file)
    )
    assert code != 0 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_cat_with_the_wrong_key_is_a_one_line_error(
    ws: AgentWorkspace, key_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive, _before = compacted(ws, "alpha", key_file)
    other = tmp_path / "other.key"
    run(capsys, "archive", "keygen", str(other))
    code, out, err = run(
        capsys,
        "archive",
        "cat",
        "alpha",
        archive.name,
        "-w",
        str(ws.root),
        "--key-file",
        str(other),
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "wrapped under master key id" in err


def test_rekey_rewraps_every_agent_and_is_rerunnable(
    ws: AgentWorkspace,
    key_file: Path,
    config_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    archives = {name: compacted(ws, name, key_file) for name in ("alpha", "beta")}
    ws.create_agent("gamma", entries=1)
    new_key = tmp_path / "new.key"
    run(capsys, "archive", "keygen", str(new_key))
    args = ["-w", str(ws.root), "-c", str(config_file), "--state-dir", str(tmp_path / "state")]

    code, out, err = run(capsys, "archive", "rekey", "--new-key", str(new_key), *args)
    assert code == 0, err
    assert "rekeyed 2 agent(s)" in out and "1 without encrypted archives" in out
    # Audited per agent, by key id only (a hash of the key, never key bytes).
    code, out, err = run(capsys, "audit", "--json", *args)
    assert code == 0, err
    rekeys = [line for line in json.loads(out)["records"] if line["event"] == "rekey"]
    assert sorted(line["agent"] for line in rekeys) == ["alpha", "beta"]
    new_id = read_master_key(new_key).key_id
    assert all(line["new_key_id"] == new_id for line in rekeys)
    assert read_master_key(new_key).key.hex() not in out
    code, out, err = run(capsys, "archive", "rekey", "--new-key", str(new_key), *args)
    assert code == 0, err
    assert "rekeyed 0 agent(s)" in out and "2 already under it" in out

    old, new = read_master_key(key_file), read_master_key(new_key)
    for name, (archive, before) in archives.items():
        paths = ws.paths(name)
        assert read_archive(paths, archive.name, new) == before
        with pytest.raises(ArchiveKeyError):
            read_archive(paths, archive.name, old)
    code, out, err = run(
        capsys,
        "archive",
        "cat",
        "beta",
        archives["beta"][0].name,
        "-w",
        str(ws.root),
        "--key-file",
        str(new_key),
    )
    assert code == 0 and out.encode() == archives["beta"][1]


def test_rekey_with_the_same_key_is_refused(
    ws: AgentWorkspace, key_file: Path, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _out, err = run(
        capsys,
        "archive",
        "rekey",
        "--new-key",
        str(key_file),
        "-w",
        str(ws.root),
        "-c",
        str(config_file),
    )
    assert code == 2 and "is the same key" in err


def test_forget_destroys_the_data_key_so_surviving_copies_stay_sealed(
    ws: AgentWorkspace,
    key_file: Path,
    config_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    archive, _before = compacted(ws, "alpha", key_file)
    copy = archive.read_bytes()  # a backup, or blocks the unlink left behind
    paths = ws.paths("alpha")
    master = read_master_key(key_file)
    from memd.agentdir import AgentDir
    from memd.archive_crypto import read_data_key

    with AgentDir.open(paths, create_private=False) as pinned:
        data_key = read_data_key(pinned.private_fd, "alpha", master, "test")
    assert data_key is not None and open_archive(data_key, archive.name, copy)

    code, out, err = run(
        capsys,
        "forget",
        "alpha",
        "--yes",
        "-w",
        str(ws.root),
        "-c",
        str(config_file),
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert code == 0, err
    assert "archive data key" in out
    assert not (paths.private_dir / DATA_KEY_NAME).exists()
    # The copy is useless: its data key is gone, and the agent's next key is another.
    archive.parent.mkdir(exist_ok=True)
    archive.write_bytes(copy)
    with pytest.raises(ArchiveKeyError, match="no data key"):
        read_archive(paths, archive.name, master)
    append_entry(paths.memory, "Human", "alpha is back")
    compact_agent(
        paths, Fixed(), CompactionOptions(lock_wait_s=5, key_file=key_file, require_shrink=False)
    )
    with pytest.raises(ArchiveKeyError, match="encrypted with data key"):
        read_archive(paths, archive.name, master)


# -- config ----------------------------------------------------------------------------


def test_encryption_without_a_key_file_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"privacy\.encrypt_archives: encryption needs"):
        build_config({"privacy": {"encrypt_archives": True}}, {}, "memd.toml")
    with pytest.raises(ConfigError, match=r"MEMD_PRIVACY_ENCRYPT_ARCHIVES"):
        build_config({}, {"MEMD_PRIVACY_ENCRYPT_ARCHIVES": "true"}, "memd.toml")
    config, applied = build_config(
        {"privacy": {"encrypt_archives": True}},
        {"MEMD_PRIVACY_KEY_FILE": "/etc/memd/archive.key"},
        "memd.toml",
    )
    assert config.privacy.key_file == "/etc/memd/archive.key"
    assert applied == ("MEMD_PRIVACY_KEY_FILE",)


@pytest.mark.parametrize(
    "value",
    [
        "memd-master-key v1\nq83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq8s=",
        "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq8s=",
        "ab" * 32,
    ],
)
def test_a_key_in_the_config_is_refused_without_echoing_it(value: str) -> None:
    with pytest.raises(ConfigError, match="looks like a key, not a file name") as info:
        build_config({"privacy": {"key_file": value}}, {}, "memd.toml")
    assert value not in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "value", ["/etc/memd/archive.key", "/run/credentials/memd.service/key", "~/memd.key"]
)
def test_paths_are_not_mistaken_for_keys(value: str) -> None:
    config, _ = build_config({"privacy": {"key_file": value}}, {}, "memd.toml")
    assert config.privacy.key_file == value


@pytest.mark.parametrize("value", ["keys/master.key", "archive.key"])
def test_a_relative_key_file_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError, match=r"privacy\.key_file: must be an absolute path"):
        build_config({"privacy": {"key_file": value}}, {}, "memd.toml")
    with pytest.raises(ConfigError, match=r"invalid setting MEMD_PRIVACY_KEY_FILE"):
        build_config({}, {"MEMD_PRIVACY_KEY_FILE": value}, "memd.toml")


def test_rekey_interrupted_part_way_finishes_on_the_next_run(
    ws: AgentWorkspace,
    key_file: Path,
    config_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash after some agents: each key file is whole under one key or the other;
    the rerun finishes, and the documented rotation (rekey, then mv) keeps compacting."""
    import memd.archive_crypto as archive_crypto

    archives = {name: compacted(ws, name, key_file) for name in ("alpha", "beta", "gamma")}
    new_key = tmp_path / "new.key"
    run(capsys, "archive", "keygen", str(new_key))
    args = ["-w", str(ws.root), "-c", str(config_file)]

    real_write = archive_crypto.write_data_key
    writes: list[str] = []

    def dies_on_second(private_fd: int, data_key: archive_crypto.DataKey, master: object) -> None:
        writes.append(data_key.agent)
        if len(writes) == 2:
            raise OSError(5, "Input/output error")  # the machine dies mid-rekey
        real_write(private_fd, data_key, master)  # type: ignore[arg-type]

    monkeypatch.setattr(archive_crypto, "write_data_key", dies_on_second)
    code, out, err = run(capsys, "archive", "rekey", "--new-key", str(new_key), *args)
    assert code == 1 and "1 failed (run again)" in out and "Input/output error" in err
    monkeypatch.setattr(archive_crypto, "write_data_key", real_write)

    old, new = read_master_key(key_file), read_master_key(new_key)
    readable = {
        name: [k.key_id for k in (old, new) if _opens(ws, name, archive, k)]
        for name, (archive, _before) in archives.items()
    }
    assert all(len(ids) == 1 for ids in readable.values()), readable  # whole, one key each

    code, out, err = run(capsys, "archive", "rekey", "--new-key", str(new_key), *args)
    assert code == 0, err
    assert "rekeyed 1 agent(s)" in out and "2 already under it" in out

    # Before the key file is switched, a compaction fails cleanly (nothing changes)...
    paths = ws.paths("alpha")
    append_entry(paths.memory, "Human", "alpha after rotation")
    before = paths.memory.read_bytes()
    options = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, key_file=key_file)
    with pytest.raises(ArchiveKeyError, match="wrapped under master key id"):
        compact_agent(paths, Fixed(), options)
    assert paths.memory.read_bytes() == before
    # ... and once the new key is moved over the configured file, it goes on.
    new_key.replace(key_file)
    archive = compact_agent(paths, Fixed(), options).archive
    assert b"alpha after rotation" in read_archive(paths, archive.name, new)


def _opens(ws: AgentWorkspace, name: str, archive: Path, key: object) -> bool:
    try:
        read_archive(ws.paths(name), archive.name, key)  # type: ignore[arg-type]
    except ArchiveKeyError:
        return False
    return True


def test_compact_now_seals_its_archive_when_encryption_is_on(
    ws: AgentWorkspace,
    key_file: Path,
    config_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    paths = ws.create_agent("alpha", entries=4)
    append_entry(paths.memory, "Human", PLANTED)
    before = paths.memory.read_bytes()
    code, out, err = run(
        capsys,
        "compact-now",
        "alpha",
        "--summary",
        "Operator summary.",
        "-w",
        str(ws.root),
        "-c",
        str(config_file),
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert code == 0, err
    [archive] = list(paths.archive_dir.iterdir())
    assert archive.name.endswith(".md.enc") and archive.name in out
    assert b"kalomiren" not in archive.read_bytes()
    assert read_archive(paths, archive.name, read_master_key(key_file)) == before


def test_rekey_after_a_crashed_erase_finishes_it_first_and_keeps_every_archive_readable(
    ws: AgentWorkspace,
    key_file: Path,
    config_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """forget --match killed at its commit point leaves a new data key staged, wrapped
    under the old master key: rekey must install it (recovery) before re-wrapping."""
    import subprocess
    import sys

    archive, _before = compacted(ws, "alpha", key_file)
    child = Path(__file__).parent.parent / "support" / "erase_child.py"
    result = subprocess.run(
        [
            sys.executable,
            str(child),
            str(ws.root),
            "alpha",
            "kalomiren",
            "--crash-at",
            "journal-erasing",
            "--key-file",
            str(key_file),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 137, result.stderr
    new_key = tmp_path / "new.key"
    run(capsys, "archive", "keygen", str(new_key))
    code, _out, err = run(
        capsys,
        "archive",
        "rekey",
        "--new-key",
        str(new_key),
        "-w",
        str(ws.root),
        "-c",
        str(config_file),
        "--state-dir",
        str(tmp_path / "state"),
    )
    assert code == 0, err
    plain = read_archive(ws.paths("alpha"), archive.name, read_master_key(new_key))
    assert b"kalomiren" not in plain and b"Agent Memory" in plain


def test_cat_prints_a_plain_archive_without_any_key(
    ws: AgentWorkspace, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = ws.create_agent("alpha", entries=4)
    before = paths.memory.read_bytes()
    archive = compact_agent(
        paths, Fixed(), CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05)
    ).archive
    code, out, err = run(capsys, "archive", "cat", "alpha", archive.name, "-w", str(ws.root))
    assert code == 0, err
    assert out.encode() == before


def test_an_encrypted_archive_gets_the_plain_archive_modes(
    ws: AgentWorkspace, key_file: Path
) -> None:
    """DESIGN §1: readable by exactly the group that reads MEMORY.md, never writable
    by it; the agent's group can read the ciphertext, not the key (.memd/ is memd's)."""
    paths = ws.create_agent("alpha", entries=4)
    paths.memory.chmod(0o660)
    options = CompactionOptions(lock_wait_s=5, drain_quiet_s=0.05, key_file=key_file)
    archive = compact_agent(paths, Fixed(), options).archive
    assert stat.S_IMODE(archive.stat().st_mode) == 0o640
    assert stat.S_IMODE(paths.archive_dir.stat().st_mode) == 0o750
    assert stat.S_IMODE(paths.private_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((paths.private_dir / DATA_KEY_NAME).stat().st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give .memd/ another owner")
def test_cat_as_a_user_who_cannot_enter_memd_folder_is_one_line(
    ws: AgentWorkspace, key_file: Path, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive, _before = compacted(ws, "alpha", key_file)
    private = ws.paths("alpha").private_dir
    os.chown(private, 12345, 12345)  # as if memd's own user owned it, not this one
    try:
        code, out, err = run(
            capsys,
            "archive",
            "cat",
            "alpha",
            archive.name,
            "-w",
            str(ws.root),
            "-c",
            str(config_file),
        )
    finally:
        os.chown(private, os.getuid(), os.getgid())
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "owned by uid 12345" in err, err


def test_rekey_recovers_with_the_configs_drain_times(
    ws: AgentWorkspace,
    key_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recovery rekey runs first drains as [compaction] drain_quiet_s and
    drain_max_s say (it took recover_agent's fixed second and ten)."""
    import memd.cli.commands_archive as commands_archive

    compacted(ws, "alpha", key_file)
    config = tmp_path / "drain.toml"
    config.write_text(
        f'[privacy]\nencrypt_archives = true\nkey_file = "{key_file}"\n'
        "[compaction]\ndrain_quiet_s = 0.25\ndrain_max_s = 2.5\n"
    )
    seen: list[dict[str, object]] = []
    real = commands_archive.recover_agent

    def spy(paths: object, **kwargs: object) -> str | None:
        seen.append(kwargs)
        return real(paths, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(commands_archive, "recover_agent", spy)
    new_key = tmp_path / "new.key"
    run(capsys, "archive", "keygen", str(new_key))
    args = ["-w", str(ws.root), "-c", str(config), "--state-dir", str(tmp_path / "state")]
    code, _out, err = run(capsys, "archive", "rekey", "--new-key", str(new_key), *args)
    assert code == 0, err
    assert seen and all((call["quiet_s"], call["max_s"]) == (0.25, 2.5) for call in seen), seen
