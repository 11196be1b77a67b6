"""The README's systemd recipe is complete and literal (deploy/hostcheck runs it for real)."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def hostcheck_common() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "hostcheck_common", ROOT / "deploy" / "hostcheck" / "common.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def systemd_recipe() -> list[list[str]]:
    block = hostcheck_common().readme_block(ROOT / "README.md", "### systemd")
    commands = []
    for line in block.splitlines():
        for part in re.split(r"&&", line.split("#", 1)[0]):
            if part.strip():
                commands.append(shlex.split(part))
    return commands


def test_recipe_installs_memd_where_the_unit_starts_it() -> None:
    commands = systemd_recipe()
    exec_start = re.search(
        r"^ExecStart=(\S+)", (ROOT / "systemd/memd.service").read_text(), re.MULTILINE
    )
    assert exec_start is not None
    binary = Path(exec_start.group(1))
    venv = binary.parent.parent
    assert ["python3", "-m", "venv", str(venv)] in commands
    assert [str(venv / "bin/pip"), "install", "."] in commands


def test_every_file_the_recipe_installs_exists_in_the_checkout() -> None:
    installed = [command for command in systemd_recipe() if command[0] == "install"]
    sources = [command[-2] for command in installed if "-d" not in command]
    assert "systemd/memd.service" in sources
    for source in sources:
        assert (ROOT / source).is_file(), source


def test_the_unit_documentation_is_installed_by_the_recipe() -> None:
    unit = (ROOT / "systemd/memd.service").read_text()
    documented = re.findall(r"^Documentation=file:(\S+)", unit, re.MULTILINE)
    targets = {command[-1] for command in systemd_recipe() if command[0] == "install"}
    for path in documented:
        assert path in targets, path


def test_readme_block_reads_the_first_sh_block_under_a_heading(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# t\n\n### a\n\ntext\n\n```sh\necho one\necho two\n```\n\n### b\n")
    assert hostcheck_common().readme_block(readme, "### a") == "echo one\necho two\n"
