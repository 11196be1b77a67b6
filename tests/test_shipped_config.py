"""config/memd.toml documents every key of MemdConfig with its default and env var.

The file is the configuration reference operators read: these tests make it
impossible to add a key, or change a default, without updating it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from memd.core.config import AgentOverride, MemdConfig, resolve_policy
from memd.settings import build_config, load_settings

SHIPPED = Path(__file__).resolve().parents[1] / "config" / "memd.toml"

# Commented-out example TOML lines are written "#key = ..." / "#[table]" (no space
# after "#"); prose comments are "# text".
EXAMPLE_LINE = re.compile(r"^#(?=[\[A-Za-z_])")


def shipped_data() -> dict[str, Any]:
    with SHIPPED.open("rb") as handle:
        return tomllib.load(handle)


def sections() -> dict[str, type[BaseModel]]:
    found: dict[str, type[BaseModel]] = {}
    for name, field in MemdConfig.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found[name] = annotation
    return found


def top_level_scalars() -> list[str]:
    return [name for name in MemdConfig.model_fields if name not in sections() and name != "agents"]


def env_var(*parts: str) -> str:
    return "MEMD_" + "_".join(parts).upper()


def test_loads_through_load_settings_without_error(tmp_path: Path) -> None:
    loaded = load_settings(config_file=SHIPPED, environ={}, cwd=tmp_path)
    assert loaded.source == SHIPPED
    assert loaded.env_overrides == ()
    # The shipped file leaves the workspace unset: the documented fallback applies.
    assert loaded.workspace == tmp_path / "agent_workspace"


def test_every_value_equals_the_model_default() -> None:
    config, applied = build_config(shipped_data(), {}, str(SHIPPED))
    assert applied == ()
    assert config == MemdConfig()
    # Field by field too, so a failure names the key that drifted.
    defaults = MemdConfig()
    for name, model in sections().items():
        for key in model.model_fields:
            shipped = getattr(getattr(config, name), key)
            assert shipped == getattr(getattr(defaults, name), key), f"[{name}] {key}"


def test_every_field_of_every_section_is_in_the_file() -> None:
    data = shipped_data()
    for name in top_level_scalars():
        assert name in data, f"top-level key {name!r} is not documented in {SHIPPED.name}"
    for name, model in sections().items():
        assert name in data, f"section [{name}] is missing from {SHIPPED.name}"
        missing = set(model.model_fields) - set(data[name])
        assert not missing, f"[{name}] keys not documented in {SHIPPED.name}: {sorted(missing)}"
    # Nothing active beyond the model (the loader would reject it anyway).
    assert "agents" not in data, "the shipped agents tables must stay commented examples"


def test_each_key_names_its_env_var_in_a_comment() -> None:
    text = SHIPPED.read_text(encoding="utf-8")
    for name in top_level_scalars():
        assert env_var(name) in text, f"{env_var(name)} not mentioned"
    for name, model in sections().items():
        for key in model.model_fields:
            assert env_var(name, key) in text, f"{env_var(name, key)} not mentioned"


def test_each_named_env_var_really_overrides_its_key(tmp_path: Path) -> None:
    # Guards against documenting a variable name the loader does not read.
    named = set(re.findall(r"env: (MEMD_[A-Z0-9_]+)", SHIPPED.read_text(encoding="utf-8")))
    assert named
    for var in sorted(named):
        environ = {var: _a_valid_value(var)}
        _, applied = build_config(shipped_data(), environ, str(SHIPPED))
        assert applied == (var,), var


def _a_valid_value(var: str) -> str:
    defaults = MemdConfig()
    if var == "MEMD_PRIVACY_ENCRYPT_ARCHIVES":
        return "false"  # true alone is refused: it needs privacy.key_file as well
    if var == "MEMD_PRIVACY_KEY_FILE":
        return "/etc/memd/archive.key"  # a path, absolute
    for name in top_level_scalars():
        if env_var(name) == var:
            return "/somewhere/else"
    for name, model in sections().items():
        for key in model.model_fields:
            if env_var(name, key) == var:
                value = getattr(getattr(defaults, name), key)
                if isinstance(value, bool):
                    return str(not value).lower()
                if isinstance(value, (int, float)):
                    return str(value)
                if isinstance(value, dict):
                    return '{"example": "EX-[0-9]{6}"}'
                if value == "auto" and name == "privacy":
                    return "true"
                if name == "log":
                    return {"format": "json", "level": "debug"}[key]
                if (name, key) == ("tokenizer", "encoding"):
                    return "o200k_base"  # one memd can load: any other name is refused
                return "x"
    raise AssertionError(f"{var} names no config key")


def example_tables() -> dict[str, Any]:
    lines = SHIPPED.read_text(encoding="utf-8").splitlines()
    uncommented = [EXAMPLE_LINE.sub("", line) for line in lines if EXAMPLE_LINE.match(line)]
    return tomllib.loads("\n".join(uncommented))


def test_commented_agent_examples_are_valid_and_cover_every_override_key() -> None:
    examples = example_tables()
    assert set(examples) == {"agents"}, "only [agents] examples are commented out"
    config, _ = build_config(examples, {}, "examples")
    used = {key for table in examples["agents"].values() for key in table}
    assert used == set(AgentOverride.model_fields), "an override key has no example"
    research = resolve_policy(config, "Research-1", lambda model: 1_000_000)
    assert research.context_length == 1_000_000
    assert research.threshold == pytest.approx(0.75)
    assert not resolve_policy(config, "audit-log").compress
    assert resolve_policy(config, "scratch-9").threshold_tokens == 20_000
