from __future__ import annotations

import stat

from hypothesis import given
from hypothesis import strategies as st

from memd.core.ownership import ArchiveAccess, archive_access


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
