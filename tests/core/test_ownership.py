from __future__ import annotations

import stat

from hypothesis import given
from hypothesis import strategies as st

from memd.core.ownership import ArchiveAccess, archive_access, widens_archive_dir


def test_group_readable_memory_gives_group_readable_archives_in_its_group() -> None:
    assert archive_access(0o100660, 1234) == ArchiveAccess(0o640, 0o750, 1234)
    assert archive_access(0o640, 55) == ArchiveAccess(0o640, 0o750, 55)


def test_memory_no_group_may_read_gives_private_archives() -> None:
    assert archive_access(0o600, 1234) == ArchiveAccess(0o600, 0o700, None)
    assert archive_access(0o620, 1234).shared is False  # write-only group: no read


@given(mode=st.integers(0, 0o7777), gid=st.integers(0, 2**31))
def test_archives_are_never_writable_by_group_or_readable_by_others(mode: int, gid: int) -> None:
    access = archive_access(mode, gid)
    for bits in (access.file_mode, access.dir_mode):
        assert not bits & (stat.S_IWGRP | stat.S_IRWXO)
    # never more readers than the live file had
    assert bool(access.file_mode & stat.S_IRGRP) == bool(mode & stat.S_IRGRP)


def test_only_a_private_archive_folder_memd_owns_without_an_acl_is_widened() -> None:
    # s10upgrade B: an older memd's 0700 folder kept the group from new 0640 archives.
    shared, private = archive_access(0o640, 55), archive_access(0o600, 55)
    assert widens_archive_dir(shared, 0o700, 100, 100, has_acl=False)
    assert not widens_archive_dir(private, 0o700, 100, 100, has_acl=False)
    assert not widens_archive_dir(shared, 0o700, 101, 100, has_acl=False)  # not memd's
    assert not widens_archive_dir(shared, 0o700, 100, 100, has_acl=True)  # the operator's ACL
    assert not widens_archive_dir(shared, 0o750, 100, 100, has_acl=False)  # already open
    assert not widens_archive_dir(shared, 0o710, 100, 100, has_acl=False)  # somebody chose that
