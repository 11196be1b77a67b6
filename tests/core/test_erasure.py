from __future__ import annotations

from memd.core.erasure import FileStamp, Tombstone, agent_key, revives

STONE = Tombstone(key="k", erased_at_ns=1_000)


def test_no_memory_file_keeps_the_agent_erased() -> None:
    assert not revives(STONE, None)


def test_a_file_changed_at_or_after_the_erasure_brings_the_agent_back() -> None:
    assert revives(STONE, FileStamp(dev=1, ino=2, ctime_ns=1_000))
    assert revives(STONE, FileStamp(dev=1, ino=2, ctime_ns=5_000))
    assert not revives(STONE, FileStamp(dev=1, ino=2, ctime_ns=999))


def test_the_erased_inode_linked_back_is_not_a_new_file() -> None:
    stone = Tombstone(key="k", erased_at_ns=1_000, survivor_dev=1, survivor_ino=2)
    assert not revives(stone, FileStamp(dev=1, ino=2, ctime_ns=9_000))
    assert revives(stone, FileStamp(dev=1, ino=3, ctime_ns=9_000))


def test_agent_key_is_salted_and_hides_the_name() -> None:
    assert agent_key(b"a", "alpha") != agent_key(b"b", "alpha")
    assert agent_key(b"a", "alpha") == agent_key(b"a", "alpha")
    assert "alpha" not in agent_key(b"a", "alpha")
