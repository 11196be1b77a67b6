"""Threads carry their Python names into the kernel (``/proc/PID/task/TID/comm``).

So ``top -H``, ``ps -L -o tid,comm,time`` and a benchmark reading
``/proc/PID/task/*/stat`` tell memd's threads apart (``memd-count``,
``memd-inotify``, ``memd-recall-sync``, the scheduler's pool, ...) instead of
seeing every one as ``python3``. Python 3.14 does this itself; before that,
:func:`name_native_threads` does it for ``memd run`` with a profile hook that
runs once, in each new thread before its target, and removes itself.

The kernel keeps 15 bytes of a name (``memd-recall-sync`` shows as
``memd-recall-syn``). Linux only; elsewhere nothing is named and nothing fails.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType

from setproctitle import setthreadtitle


def set_native_name(name: str) -> None:
    """Name the calling thread in the kernel (its first 15 bytes are kept).

    setproctitle's ``setthreadtitle`` is ``prctl(PR_SET_NAME)`` on Linux and
    does nothing where the platform has no such call.
    """
    setthreadtitle(name)


def _name_then_leave(_frame: FrameType, _event: str, _arg: object) -> None:
    # Called for the first event of a new thread (its run() being called):
    # hand its name to the kernel, then stop profiling this thread.
    sys.setprofile(None)
    set_native_name(threading.current_thread().name)


def name_native_threads() -> None:
    """Every thread started from now on gets its Python name in the kernel.

    Process-wide (``threading.setprofile``): for ``memd run``, not for a library
    caller. A no-op on Python 3.14+, which names native threads itself.
    """
    if sys.version_info < (3, 14) and sys.platform.startswith("linux"):
        threading.setprofile(_name_then_leave)


__all__ = ["name_native_threads", "set_native_name"]
