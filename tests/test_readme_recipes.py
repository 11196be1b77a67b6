"""The README's systemd recipe is complete and literal (deploy/hostcheck runs it for real)."""

from __future__ import annotations

import grp
import importlib.util
import os
import re
import shlex
import subprocess
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
        for part in re.split(r"&&|\|\|", line.split("#", 1)[0]):
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


def test_running_the_recipe_again_keeps_the_config_and_the_api_key(tmp_path: Path) -> None:
    """Review r7ops F5: re-running the recipe (the way to upgrade) replaced
    /etc/memd/memd.env (the API key) and memd.toml with the examples. Its
    /etc/memd lines run twice here, in a folder standing in for /etc/memd."""
    block = hostcheck_common().readme_block(ROOT / "README.md", "### systemd")
    etc = tmp_path / "etc-memd"
    etc.mkdir()
    group = grp.getgrgid(os.getegid()).gr_name
    lines = [
        line.replace("/etc/memd/", f"{etc}/").replace("-g memd", f"-g {group}")
        for line in block.splitlines()
        if "/etc/memd/" in line
    ]
    assert len(lines) == 2, lines
    script = "set -eu\n" + "\n".join(lines) + "\n"
    subprocess.run(["sh", "-c", script], cwd=ROOT, check=True, timeout=30)
    assert (etc / "memd.toml").read_text() == (ROOT / "config/memd.toml").read_text()
    (etc / "memd.toml").write_text("[trigger]\ncontext_length = 1000\n")
    (etc / "memd.env").write_text("OPENAI_API_KEY=sk-the-operators-key\n")
    subprocess.run(["sh", "-c", script], cwd=ROOT, check=True, timeout=30)
    assert (etc / "memd.toml").read_text() == "[trigger]\ncontext_length = 1000\n"
    assert (etc / "memd.env").read_text() == "OPENAI_API_KEY=sk-the-operators-key\n"


def test_the_upgrade_recipe_installs_the_new_code_and_restarts() -> None:
    """Review r7ops F5: no upgrade procedure; `enable --now` does not restart a
    running daemon, so the old code kept running."""
    upgrade = hostcheck_common().readme_block(ROOT / "README.md", "### Upgrading")
    install = hostcheck_common().readme_block(ROOT / "README.md", "### systemd")
    venv_pip = next(line for line in install.splitlines() if "bin/pip install ." in line)
    assert venv_pip.split("&& ")[-1] in upgrade.splitlines()
    for line in install.splitlines():  # the unit and snippets again, never the config
        if line.startswith("install ") and "/etc/memd/" not in line:
            assert line in upgrade.splitlines(), line
    assert "/etc/memd/" not in upgrade
    assert upgrade.splitlines()[-2] == "systemctl daemon-reload && systemctl restart memd"


def _etc_memd_installs(text: str) -> list[str]:
    return [
        line.split("#", 1)[0].strip()
        for line in text.splitlines()
        if re.search(r"\binstall\b.*\s/etc/memd/memd\.(toml|env)\b", line.split("#", 1)[0])
    ]


def test_the_operations_guide_and_the_unit_install_the_config_as_the_readme_does() -> None:
    """Review r8docs F4: docs/operations.md (the page the unit's Documentation=
    names) and the unit's own comment installed /etc/memd/memd.toml and memd.env
    unconditionally: run again to upgrade, they replaced the tuned config and the
    API key, as the README's recipe did before review r7ops F5."""
    readme = _etc_memd_installs(hostcheck_common().readme_block(ROOT / "README.md", "### systemd"))
    assert len(readme) == 2 and all(line.startswith("test -e /etc/memd/") for line in readme)
    operations = hostcheck_common().readme_block(ROOT / "docs/operations.md", "### Install")
    assert _etc_memd_installs(operations) == readme
    unit = "\n".join(
        line.lstrip("#").strip()
        for line in (ROOT / "systemd/memd.service").read_text().splitlines()
        if line.startswith("#")
    )
    assert _etc_memd_installs(unit) == readme


def _python_block(path: Path, heading: str) -> str:
    text = path.read_text(encoding="utf-8")
    match = re.compile(r"```python\n(.*?)```", re.DOTALL).search(text, text.index(f"\n{heading}\n"))
    assert match is not None, (path, heading)
    return match.group(1)


def test_the_operations_guide_wires_swarms_agents_as_the_readme_does() -> None:
    """Review r8docs F3: docs/operations.md wired a bare swarms Agent (no
    memd_swarms.attach), with which the model never sees MEMORY.md."""
    readme = _python_block(ROOT / "README.md", "## Wiring a Swarms agent")
    assert "memd_swarms.attach(" in readme
    assert _python_block(ROOT / "docs/operations.md", "## Wiring a Swarms agent") == readme
