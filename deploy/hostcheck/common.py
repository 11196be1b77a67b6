"""What the real-host checks share: the cache, the README's recipes, waiting, reporting."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# Built rootfs tarballs and images live outside the checkout, so CI on a clean
# clone reuses them.
CACHE_DIR = Path(os.environ.get("MEMD_CI_CACHE", "/var/cache/memd-ci"))
# pip inside a rootfs or an image build trusts the host's CA bundle (mirrors
# and proxies here present their own certificates).
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def missing_commands(names: Iterable[str]) -> list[str]:
    return [name for name in names if shutil.which(name) is None]


def wait_until(probe: Callable[[], T | None], timeout: float, what: str, every: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def readme_block(readme: Path, heading: str, nth: int = 0) -> str:
    """The ``nth`` ```sh block under ``heading``: a recipe as a user would copy it."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    inside, block, found = False, list[str](), 0
    for line in lines[start + 1 :]:
        if not inside and line.startswith("#"):
            break  # the next heading: the section has no more recipes
        if not inside and line.strip() == "```sh":
            inside, block = True, []
        elif inside and line.strip() == "```":
            if found == nth:
                return "\n".join(block) + "\n"
            inside, found = False, found + 1
        elif inside:
            block.append(line)
    raise ValueError(f"{readme}: no ```sh block #{nth + 1} under {heading!r}")


def checkout_files(checkout: Path) -> list[str]:
    """Tracked and untracked-but-not-ignored files: what a clone plus local edits holds."""
    result = subprocess.run(
        ["git", "-C", str(checkout), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        check=True,
    )
    names = [name for name in result.stdout.decode().split("\0") if name]
    return [name for name in names if (checkout / name).is_file()]


class Checks:
    """Collects named pass/fail results and prints them as they come."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.results: list[tuple[str, bool, str]] = []

    def record(self, name: str, passed: bool, detail: str = "") -> None:
        self.results.append((name, passed, detail))
        print(
            f"[{'ok' if passed else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True
        )

    def report(self) -> int:
        failed = [name for name, passed, _ in self.results if not passed]
        summary = (
            f"{self.title}: {len(self.results) - len(failed)}/{len(self.results)} checks passed"
        )
        print(summary + (f"; failed: {', '.join(failed)}" if failed else ""), flush=True)
        return 1 if failed or not self.results else 0
