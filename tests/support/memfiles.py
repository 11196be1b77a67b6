"""Write and inspect memory files exactly as Swarms' Conversation does."""

from __future__ import annotations

import datetime
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from memd.core.memfile import EntrySegment, parse
from memd.workspace import AgentPaths, agent_paths


def swarms_header(name: str) -> str:
    return (
        f"# Agent Memory\n\n**Conversation:** {name}\n"
        f"**Created:** {datetime.datetime.now().isoformat()}\n\n---\n\n## Interaction Log\n\n"
    )


def swarms_block(role: str, content: str) -> str:
    stamp = datetime.datetime.now().isoformat()
    return f"### {role} — {stamp}\n\n{content.strip()}\n\n---\n\n"


def append_entry(path: Path, role: str, content: str) -> None:
    """One entry, appended the way Swarms does it (open 'a' per entry)."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(swarms_block(role, content))


@dataclass
class AgentWorkspace:
    root: Path

    def __post_init__(self) -> None:
        (self.root / "agents").mkdir(parents=True, exist_ok=True)

    def create_agent(self, name: str, entries: int = 0, size: int = 40) -> AgentPaths:
        folder = self.root / "agents" / name
        folder.mkdir(parents=True, exist_ok=True)
        memory = folder / "MEMORY.md"
        memory.write_text(swarms_header(name), encoding="utf-8")
        for index in range(entries):
            role = "Human" if index % 2 == 0 else "AI"
            append_entry(memory, role, f"{name} turn {index}: " + "lorem ipsum " * size)
        return agent_paths(self.root, name)

    def paths(self, name: str = "alpha") -> AgentPaths:
        return agent_paths(self.root, name)


def raw_entries(data: bytes) -> list[EntrySegment]:
    return [e for e in parse(data).entries if not e.is_summary]


def entry_contents_everywhere(paths: AgentPaths, key_file: Path | None = None) -> Counter[str]:
    """Every non-summary entry's content across all archives and MEMORY.md.

    With ``key_file``, encrypted archives (``.md.enc``) are decrypted and counted too.
    """
    from memd.archive_crypto import read_archive, read_master_key

    seen: Counter[str] = Counter()
    pattern = "history_*.md*" if key_file is not None else "history_*.md"
    sources = sorted(paths.archive_dir.glob(pattern)) if paths.archive_dir.exists() else []
    master = read_master_key(key_file) if key_file is not None else None
    for source in sources:
        data = (
            read_archive(paths, source.name, master)
            if source.name.endswith(".enc")
            else source.read_bytes()
        )
        for entry in raw_entries(data):
            seen[entry.text] += 1
    for entry in raw_entries(paths.memory.read_bytes()):
        seen[entry.text] += 1
    return seen


def snapshot_tree(root: Path) -> dict[str, bytes]:
    """Path → bytes of every regular file under root (dirs as b'<dir>')."""
    tree: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            tree[os.path.relpath(os.path.join(dirpath, d), root)] = b"<dir>"
        for f in filenames:
            full = os.path.join(dirpath, f)
            tree[os.path.relpath(full, root)] = Path(full).read_bytes()
    return tree
