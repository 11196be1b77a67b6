"""Retention and the audit log: what a prune costs, what an audit line costs.

    python bench/bench_prune.py [--archives 10000] [--keep 1000] [--records 2000]

Builds one agent with ``--archives`` small archives (names one minute apart,
plain and every tenth ``.md.enc``), then times the real ``prune_agent`` (lock,
recovery check, listing through the pinned fd, the pure plan, one unlink per
archive, one fsync of the folder) deleting all but ``--keep``, and a second
prune that finds nothing to do (the cost paid after every compaction once the
policy holds). Then times ``--records`` audit appends (one O_APPEND write +
fsync each) and one read of the whole log. Prints wall times and per-item rates.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.memfiles import AgentWorkspace

from memd.audit import AuditLog, read_audit
from memd.compaction import prune_agent
from memd.core.audit import AuditEvent
from memd.core.retention import RetentionLimits


def build(root: Path, archives: int) -> AgentWorkspace:
    ws = AgentWorkspace(root / "ws")
    paths = ws.create_agent("bench", entries=2)
    paths.archive_dir.mkdir()
    start = datetime.datetime(2020, 1, 1, 0, 0, 0)
    for index in range(archives):
        stamp = (start + datetime.timedelta(minutes=index)).strftime("%Y-%m-%d_%H-%M-%S")
        suffix = ".md.enc" if index % 10 == 0 else ".md"
        (paths.archive_dir / f"history_{stamp}{suffix}").write_bytes(b"raw turns\n" * 20)
    return ws


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--archives", type=int, default=10_000)
    parser.add_argument("--keep", type=int, default=1_000)
    parser.add_argument("--records", type=int, default=2_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memd-bench-prune-") as tmp:
        root = Path(tmp)
        ws = build(root, args.archives)
        paths = ws.paths("bench")
        limits = RetentionLimits(max_archives=args.keep)
        started = time.perf_counter()
        first = prune_agent(paths, limits, lock_wait_s=5)
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        again = prune_agent(paths, limits, lock_wait_s=5)
        again_s = time.perf_counter() - started
        left = len(list(paths.archive_dir.iterdir()))
        assert len(first.deleted) == args.archives - args.keep and not again.deleted
        assert left == args.keep
        print(
            f"prune: {args.archives} archives -> {left}: {first_s * 1000:.0f} ms "
            f"({first_s / max(1, len(first.deleted)) * 1e6:.0f} us per deleted archive)"
        )
        print(f"prune with nothing to delete ({left} archives): {again_s * 1000:.1f} ms")

        log = AuditLog(root / "state" / "w.audit.jsonl", "cli")
        started = time.perf_counter()
        for index in range(args.records):
            log.record(AuditEvent.PRUNE, "bench", archives=index, bytes=index * 100, trigger="cli")
        append_s = time.perf_counter() - started
        started = time.perf_counter()
        assert log.path is not None
        contents = read_audit(log.path)
        read_s = time.perf_counter() - started
        assert len(contents.records) == args.records
        size = log.path.stat().st_size
        print(
            f"audit: {args.records} appends in {append_s * 1000:.0f} ms "
            f"({append_s / args.records * 1e6:.0f} us each, fsync included); "
            f"read {size / 1024:.0f} KiB back in {read_s * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
