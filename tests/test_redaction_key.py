"""The workspace's redaction key file: 0600, versioned, created once even under a race."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from memd.errors import ConfigError
from memd.redaction_key import KEY_BYTES, key_path, load_or_create_key


def test_created_private_and_reused(tmp_path: Path) -> None:
    path = key_path(tmp_path / "state", tmp_path / "ws")
    key = load_or_create_key(path)
    assert len(key) == KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.read_text().startswith("memd-redaction-key v1\n")
    assert load_or_create_key(path) == key
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp left


def test_one_key_per_workspace(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = key_path(state, tmp_path / "a")
    assert first != key_path(state, tmp_path / "b")
    assert first == key_path(state, tmp_path / "a")
    assert first.name.endswith(".redaction-key")


def _load(path: str, queue: multiprocessing.Queue[bytes]) -> None:
    queue.put(load_or_create_key(Path(path)))


def test_racing_processes_agree_on_one_key(tmp_path: Path) -> None:
    path = key_path(tmp_path / "state", tmp_path / "ws")
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[bytes] = context.Queue()
    workers = [context.Process(target=_load, args=(str(path), queue)) for _ in range(6)]
    for worker in workers:
        worker.start()
    keys = {queue.get(timeout=60) for _ in workers}
    for worker in workers:
        worker.join(timeout=60)
    assert keys == {load_or_create_key(path)}


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("memd-redaction-key v9\n" + "00" * 32 + "\n", "format 9, newer"),
        ("memd-redaction-key v1\nzz\n", "damaged"),
        ("hello\n", "not a memd redaction key"),
    ],
)
def test_bad_files_are_refused_with_the_reason(tmp_path: Path, content: str, reason: str) -> None:
    path = tmp_path / "x.redaction-key"
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match=reason):
        load_or_create_key(path)
    assert path.read_text() == content  # never overwritten


def test_a_readable_key_is_refused(tmp_path: Path) -> None:
    path = key_path(tmp_path, tmp_path / "ws")
    load_or_create_key(path)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="mode 0644; it must be 0600"):
        load_or_create_key(path)


def test_a_symlinked_key_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    load_or_create_key(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match="redaction key"):
        load_or_create_key(link)
    assert os.path.islink(link)
