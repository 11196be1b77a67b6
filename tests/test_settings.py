"""Config loading: TOML + MEMD_* env + flags, with errors naming the key and the source."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from memd.errors import ConfigError
from memd.settings import (
    api_key_vars,
    build_config,
    default_state_dir,
    environment_settings,
    load_settings,
    resolve_cache_dir,
    resolve_state_dir,
    resolve_workspace,
    tiktoken_cache_dir,
    tiktoken_cache_dir_kept,
)


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_without_any_file(tmp_path: Path) -> None:
    loaded = load_settings(environ={}, cwd=tmp_path)
    assert loaded.source is None
    assert loaded.workspace == tmp_path / "agent_workspace"
    assert loaded.config.summarizer.model == "builtin"
    assert loaded.config.trigger.threshold == 0.9


def test_file_then_env_then_flag(tmp_path: Path) -> None:
    config = write(
        tmp_path / "memd.toml",
        'workspace = "/from/file"\n[trigger]\nthreshold = 0.5\ncontext_length = 1000\n'
        '[summarizer]\nmodel = "openai/gpt-4o-mini"\n',
    )
    env = {"MEMD_TRIGGER_THRESHOLD": "0.75", "MEMD_TRIGGER_CONTEXT_LENGTH": "2048"}
    loaded = load_settings(config_file=config, environ=env, cwd=tmp_path)
    assert loaded.source == config
    assert loaded.config.trigger.threshold == 0.75
    assert loaded.config.trigger.context_length == 2048
    assert loaded.config.summarizer.model == "openai/gpt-4o-mini"
    assert loaded.workspace == Path("/from/file")
    assert loaded.env_overrides == ("MEMD_TRIGGER_CONTEXT_LENGTH", "MEMD_TRIGGER_THRESHOLD")


def test_workspace_precedence(tmp_path: Path) -> None:
    config, _ = build_config({"workspace": "/file"}, {})
    flag = Path("/flag")
    env_all = {"MEMD_WORKSPACE": "/memd", "WORKSPACE_DIR": "/swarms"}
    assert resolve_workspace(flag, config, env_all, tmp_path) == flag
    assert resolve_workspace(None, config, env_all, tmp_path) == Path("/memd")
    assert resolve_workspace(None, config, {"WORKSPACE_DIR": "/swarms"}, tmp_path) == Path(
        "/swarms"
    )
    assert resolve_workspace(None, config, {}, tmp_path) == Path("/file")
    default, _ = build_config({}, {})
    assert resolve_workspace(None, default, {}, tmp_path) == tmp_path / "agent_workspace"


def test_config_file_from_env(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "[tokenizer]\nencoding = 'o200k_base'\n")
    loaded = load_settings(environ={"MEMD_CONFIG": str(config)}, cwd=tmp_path)
    assert loaded.config.tokenizer.encoding == "o200k_base"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "[trigger]\nthreshold = 1.5\n",
            r"invalid config .*c\.toml: trigger\.threshold: .*less than or equal to 1",
        ),
        ("[trigger]\nthresold = 0.5\n", r"trigger\.thresold: unknown key"),
        ("[nosuch]\nx = 1\n", r"nosuch: unknown key"),
        ("[trigger\nthreshold = 0.5\n", r"c\.toml: invalid TOML"),
        ("[summarizer]\ntimeout_s = 'soon'\n", r"summarizer\.timeout_s"),
        ('[agents."R*"]\nthreshold = 0\n', r"agents\.R\*\.threshold"),
        ("[daemon]\nmax_concurrent_io = 0\n", r"daemon\.max_concurrent_io"),
        ("[daemon]\nmax_concurrent_io = 100000\n", r"daemon\.max_concurrent_io"),
        # A backoff starting above its cap: every retry waited the base.
        (
            "[daemon]\nretry_base_s = 700\nretry_max_s = 600\n",
            r"c\.toml: daemon: retry_base_s \(700\) is more than retry_max_s \(600\)",
        ),
        (
            "[daemon]\nretry_base_s = 700\n",
            r"daemon: retry_base_s \(700\) is more than retry_max_s \(600\)",
        ),
        ("[retention]\nmax_archives = -1\n", r"retention\.max_archives: .*greater than"),
        ("[retention]\nmax_age_days = 'month'\n", r"retention\.max_age_days: .*valid number"),
        ("[retention]\nmax_total_gb = 1\n", r"retention\.max_total_gb: unknown key"),
        ('[agents."R*"]\nmax_total_mb = -5\n', r"agents\.R\*\.max_total_mb"),
        # A table no agent can match was never applied, without a word.
        (
            '[agents."team/*"]\nthreshold = 0.5\n',
            r'agents: \[agents\."team/\*"\]: a glob holding "/" matches no agent',
        ),
        ('[agents.""]\nthreshold = 0.5\n', r'\[agents\.""\]: an empty glob matches no agent'),
    ],
)
def test_bad_files_name_key_and_file(tmp_path: Path, text: str, expected: str) -> None:
    config = write(tmp_path / "c.toml", text)
    with pytest.raises(ConfigError, match=expected) as info:
        load_settings(config_file=config, environ={}, cwd=tmp_path)
    assert "\n" not in str(info.value)


def test_bad_env_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"MEMD_TRIGGER_THRESHOLD \(trigger\.threshold\)"):
        load_settings(environ={"MEMD_TRIGGER_THRESHOLD": "lots"}, cwd=tmp_path)


def test_a_check_across_keys_names_the_variables_that_set_them(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "[daemon]\nretry_max_s = 30\n")
    with pytest.raises(
        ConfigError,
        match=r"^invalid setting MEMD_DAEMON_RETRY_BASE_S \(daemon\): retry_base_s \(60\) "
        r"is more than retry_max_s \(30\)",
    ):
        load_settings(config_file=config, environ={"MEMD_DAEMON_RETRY_BASE_S": "60"}, cwd=tmp_path)
    # Equal is a backoff that never grows: allowed.
    loaded = load_settings(
        config_file=config, environ={"MEMD_DAEMON_RETRY_BASE_S": "30"}, cwd=tmp_path
    )
    assert loaded.config.daemon.retry_base_s == loaded.config.daemon.retry_max_s == 30


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(config_file=tmp_path / "nope.toml", environ={}, cwd=tmp_path)


def test_api_key_is_never_echoed(tmp_path: Path) -> None:
    config = write(tmp_path / "c.toml", "[summarizer]\napi_key = 12345\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config_file=config, environ={}, cwd=tmp_path)
    assert "12345" not in str(info.value)
    loaded = load_settings(environ={"MEMD_SUMMARIZER_API_KEY": "sk-secret"}, cwd=tmp_path)
    assert "sk-secret" not in repr(loaded.config)
    assert loaded.config.summarizer.api_key.get_secret_value() == "sk-secret"


def test_misspelled_env_var_is_an_error_like_an_unknown_key(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"MEMD_TRIGGER_THRESHHOLD: \[trigger\] has no key 'threshhold'"
    ):
        load_settings(environ={"MEMD_TRIGGER_THRESHHOLD": "0.5"}, cwd=tmp_path)
    # Variables that are not config keys of a section are left alone.
    load_settings(environ={"MEMD_CACHE_DIR": "/x", "MEMD_SWARMS_PYTHON": "/y"}, cwd=tmp_path)


@pytest.mark.parametrize(
    ("variable", "expected"),
    [
        # A misspelled section: no section prefix matched, so nothing checked it.
        (
            "MEMD_TRIGER_DEBOUNCE_MS",
            "invalid setting MEMD_TRIGER_DEBOUNCE_MS: not a memd setting; "
            "did you mean MEMD_TRIGGER_DEBOUNCE_MS?",
        ),
        (
            "MEMD_DAEMON_MAX_CONCURENT_LLM",
            "invalid setting MEMD_DAEMON_MAX_CONCURENT_LLM: [daemon] has no key "
            "'max_concurent_llm'; did you mean MEMD_DAEMON_MAX_CONCURRENT_LLM?",
        ),
        (
            "MEMD_LOGLEVEL",
            "invalid setting MEMD_LOGLEVEL: not a memd setting; did you mean MEMD_LOG_LEVEL?",
        ),
        (
            "MEMD_CONFG",
            "invalid setting MEMD_CONFG: not a memd setting; did you mean MEMD_CONFIG?",
        ),
        (
            "MEMD_WORKSPCE",
            "invalid setting MEMD_WORKSPCE: not a memd setting; did you mean MEMD_WORKSPACE?",
        ),
        (
            "MEMD_AGENTS_RESEARCH_THRESHOLD",
            'invalid setting MEMD_AGENTS_RESEARCH_THRESHOLD: [agents."glob"] tables are set '
            "in the config file only",
        ),
        (
            "MEMD_BANANA",
            "invalid setting MEMD_BANANA: not a memd setting (settings are "
            "MEMD_<SECTION>_<KEY>, for the keys of memd.toml)",
        ),
    ],
)
def test_any_unknown_memd_variable_is_a_one_line_error_naming_it(
    tmp_path: Path, variable: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(environ={variable: "200"}, cwd=tmp_path)
    assert str(info.value) == expected


def test_every_unknown_variable_is_listed_for_config_check(tmp_path: Path) -> None:
    env = {"MEMD_TRIGER_DEBOUNCE_MS": "1", "MEMD_SUMARIZER_MODEL": "x", "MEMD_LOG_LEVEL": "info"}
    with pytest.raises(ConfigError) as info:
        load_settings(environ=env, cwd=tmp_path)
    assert str(info.value).startswith("invalid setting MEMD_SUMARIZER_MODEL: ")
    assert str(info.value).endswith(" (+1 more: see memd config check)")
    assert [problem.split(":")[0] for problem in info.value.problems] == [
        "invalid setting MEMD_SUMARIZER_MODEL",
        "invalid setting MEMD_TRIGER_DEBOUNCE_MS",
    ]


# Where memd's own MEMD_* names are written: the code, its deployment, its docs,
# and the test and bench harness (tests/ itself writes misspellings on purpose).
_NAMED_IN = ("memd", "integrations", "deploy", "systemd", "config", "docs", "bench", ".ci")
_NAMED_IN_FILES = ("README.md", "Dockerfile", "tests/conftest.py", "tests/support")
_MISSPELLED_ON_PURPOSE = {"MEMD_TRIGER_DEBOUNCE_MS"}  # the README's example of a refused typo


def test_every_memd_variable_the_repository_names_is_accepted(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    files = [
        path
        for place in (*_NAMED_IN, *_NAMED_IN_FILES)
        for path in ([root / place] if (root / place).is_file() else (root / place).rglob("*"))
        if path.is_file() and "venv" not in path.parts[-3:-1] and path.suffix != ".pyc"
    ]
    named = {
        name
        for path in files
        for name in re.findall(
            r"(?<![A-Za-z0-9_])MEMD_[A-Z0-9_]*[A-Z0-9]", path.read_text("utf-8", "replace")
        )
    }
    assert {"MEMD_SWARMS_PYTHON", "MEMD_UID", "MEMD_CONFIG", "MEMD_STATE_DIR"} <= named
    named -= _MISSPELLED_ON_PURPOSE
    for name in sorted(named):
        # A setting or memd's own variable takes any value to its name; a link
        # variable the README names (MEMD_PORT, the MEMD_ENV_ prefix) is one with
        # a link's value beside its service, or as a prefix.
        service = name.split("_PORT")[0]
        tries = (
            {name: "1"},
            {name: "tcp://10.96.4.20:9464", f"{service}_SERVICE_HOST": "10.96.4.20"},
            {f"{name}_LANG": "C.UTF-8"},
        )
        refused = [_unknown_name_error(name, environ, tmp_path) for environ in tries]
        assert None in refused, refused[0]


def _unknown_name_error(name: str, environ: dict[str, str], cwd: Path) -> ConfigError | None:
    """The error naming a variable of ``environ`` as unknown (``name``, or a name it
    starts), if loading refuses it so."""
    try:
        load_settings(environ=environ, cwd=cwd)
    except ConfigError as exc:
        # A value the setting refuses is not under test ("invalid setting
        # NAME (section.key): ..."); an unknown name is "invalid setting NAME: ...".
        if any(str(exc).startswith(f"invalid setting {var}: ") for var in environ):
            return exc
    return None


# What Kubernetes injects into every container of a namespace with a Service named
# "memd" (enableServiceLinks defaults to true), and Docker's legacy --link for a
# container aliased memd: variables the operator never wrote (review 16d F1).
KUBERNETES_SERVICE_LINKS = {
    "MEMD_SERVICE_HOST": "10.96.4.20",
    "MEMD_SERVICE_PORT": "9464",
    "MEMD_SERVICE_PORT_METRICS": "9464",
    "MEMD_PORT": "tcp://10.96.4.20:9464",
    "MEMD_PORT_9464_TCP": "tcp://10.96.4.20:9464",
    "MEMD_PORT_9464_TCP_PROTO": "tcp",
    "MEMD_PORT_9464_TCP_PORT": "9464",
    "MEMD_PORT_9464_TCP_ADDR": "10.96.4.20",
    # A Service "memd-recall" beside it.
    "MEMD_RECALL_SERVICE_HOST": "10.96.4.21",
    "MEMD_RECALL_PORT": "tcp://10.96.4.21:7000",
    "MEMD_RECALL_PORT_7000_TCP": "tcp://10.96.4.21:7000",
}
DOCKER_LINKS = {"MEMD_NAME": "/agent/memd", "MEMD_ENV_LANG": "C.UTF-8"}


def test_service_and_container_link_variables_are_not_settings(tmp_path: Path) -> None:
    environ = {**KUBERNETES_SERVICE_LINKS, **DOCKER_LINKS, "MEMD_TRIGGER_THRESHOLD": "0.5"}
    loaded = load_settings(environ=environ, cwd=tmp_path)
    assert loaded.config.trigger.threshold == 0.5


def test_a_setting_named_like_a_service_link_is_one_only_beside_its_service(
    tmp_path: Path,
) -> None:
    # A Service "memd-metrics": MEMD_METRICS_PORT is then Kubernetes' link, not the port.
    service = {
        "MEMD_METRICS_SERVICE_HOST": "10.96.4.22",
        "MEMD_METRICS_PORT": "tcp://10.96.4.22:9464",
    }
    loaded = load_settings(environ=service, cwd=tmp_path)
    assert loaded.config.metrics.port == load_settings(environ={}, cwd=tmp_path).config.metrics.port
    # Without the service beside it, the same value is the operator's, and refused.
    with pytest.raises(ConfigError, match="invalid setting MEMD_METRICS_PORT "):
        load_settings(environ={"MEMD_METRICS_PORT": "tcp://10.96.4.22:9464"}, cwd=tmp_path)
    # A typo that ends like a link name but carries a setting's value is still a typo.
    with pytest.raises(ConfigError, match="did you mean MEMD_METRICS_PORT"):
        load_settings(environ={"MEMD_METRIC_PORT": "9465"}, cwd=tmp_path)


def test_a_setting_in_the_wrong_case_gets_a_did_you_mean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"MEMD_summarizer_model": "builtin"}, cwd=tmp_path)
    assert str(caught.value) == (
        "invalid setting MEMD_summarizer_model: names are upper case; "
        "did you mean MEMD_SUMMARIZER_MODEL?"
    )


@pytest.mark.parametrize(
    ("var", "meant"),
    [("memd_log_level", "MEMD_LOG_LEVEL"), ("Memd_Config", "MEMD_CONFIG")],
)
def test_a_lower_case_setting_is_refused_not_silently_ignored(
    tmp_path: Path, var: str, meant: str
) -> None:
    """Environment names are case-sensitive: `memd_log_level=debug` used to be
    ignored without a word, and the operator kept looking for debug lines."""
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={var: "debug"}, cwd=tmp_path)
    assert str(caught.value) == (
        f"invalid setting {var}: names are upper case; did you mean {meant}?"
    )


def test_other_lower_case_memd_names_are_left_alone(tmp_path: Path) -> None:
    # Not a setting in any case: someone else's variable, not memd's to refuse.
    loaded = load_settings(environ={"memd_home": "/opt/memd", "memdx": "1"}, cwd=tmp_path)
    assert loaded.env_overrides == ()


def test_summary_budgets_that_cannot_fit_the_low_water_mark_are_refused() -> None:
    # 32,000 x 0.9 = 28,800 threshold; low water 0.6 -> 17,280 tokens.
    data = {"trigger": {"context_length": 32_000}, "summarizer": {"summary_tokens": 5_000}}
    config, _ = build_config(data, {})
    assert config.summarizer.summary_tokens == 5_000
    data["summarizer"]["pinned_tokens"] = 13_000
    with pytest.raises(ConfigError, match="summarizer.pinned_tokens.*low-water") as info:
        build_config(data, {}, "memd.toml")
    assert "\n" not in str(info.value) and "memd.toml" in str(info.value)
    # Per agent too: a small agent cannot take the global budgets.
    small = {
        "trigger": {"context_length": 200_000},
        "summarizer": {"summary_tokens": 9_000},
        "agents": {"tiny*": {"context_length": 8_000}},
    }
    with pytest.raises(ConfigError, match='agents."tiny\\*"'):
        build_config(small, {})
    with pytest.raises(ConfigError, match="summarizer.max_calls"):
        build_config({"summarizer": {"max_calls": 0}}, {})


def test_spending_caps_are_validated_and_named() -> None:
    config, _ = build_config(
        {"summarizer": {"max_calls_per_hour": 120, "max_usd_per_day": 2.5}}, {}
    )
    assert (config.summarizer.max_calls_per_hour, config.summarizer.max_usd_per_day) == (120, 2.5)
    assert build_config({}, {})[0].summarizer.max_calls_per_hour == 0  # off by default
    for key, value in (("max_calls_per_hour", -1), ("max_usd_per_day", -0.5)):
        with pytest.raises(ConfigError, match=f"summarizer.{key}") as info:
            build_config({"summarizer": {key: value}}, {}, "memd.toml")
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="MEMD_SUMMARIZER_MAX_USD_PER_DAY"):
        build_config({}, {"MEMD_SUMMARIZER_MAX_USD_PER_DAY": "lots"})


def test_default_state_dir_precedence(tmp_path: Path) -> None:
    assert default_state_dir({"MEMD_STATE_DIR": "/x/y", "STATE_DIRECTORY": "/a"}) == Path("/x/y")
    assert default_state_dir({"STATE_DIRECTORY": "/var/lib/memd:/var/lib/other"}) == Path(
        "/var/lib/memd"
    )
    assert default_state_dir({"HOME": str(tmp_path)}) == tmp_path / ".local/state/memd"
    assert resolve_state_dir(Path("/flag"), "/conf", {}) == Path("/flag")
    assert resolve_state_dir(None, "/conf", {"MEMD_STATE_DIR": "/env"}) == Path("/conf")
    assert resolve_state_dir(None, "", {"MEMD_STATE_DIR": "/env"}) == Path("/env")


def test_cache_dir_precedence(tmp_path: Path) -> None:
    env = {"MEMD_CACHE_DIR": "/m", "CACHE_DIRECTORY": "/c:/d", "XDG_CACHE_HOME": "/x"}
    assert resolve_cache_dir(env) == Path("/m")
    assert resolve_cache_dir({"CACHE_DIRECTORY": "/c:/d", "XDG_CACHE_HOME": "/x"}) == Path("/c")
    assert resolve_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/memd")


def test_privacy_defaults_and_env(tmp_path: Path) -> None:
    config, _ = build_config({}, {})
    assert config.privacy.redact is True
    assert config.privacy.redact_pii == "auto"
    env = {
        "MEMD_PRIVACY_REDACT": "false",
        "MEMD_PRIVACY_REDACT_PII": "true",
        "MEMD_PRIVACY_LOCAL_HOSTS": "gpu-box, 10.1.0.0/16",
        "MEMD_PRIVACY_PATTERNS": '{"ticket": "TS-[0-9]{8}"}',
    }
    config, applied = build_config({}, env)
    assert config.privacy.redact is False and config.privacy.redact_pii is True
    assert config.privacy.local_hosts == ("gpu-box", "10.1.0.0/16")
    assert config.privacy.patterns == {"ticket": "TS-[0-9]{8}"}
    assert set(applied) == set(env)


@pytest.mark.parametrize(
    ("privacy", "expected"),
    [
        ({"patterns": {"vault": "(unclosed"}}, "privacy.patterns: pattern 'vault' is not a valid"),
        ({"patterns": {"any": "x*"}}, "pattern 'any' matches the empty string"),
        ({"patterns": {"bad name": "x+"}}, "pattern name 'bad name'"),
        ({"redact_pii": "sometimes"}, 'privacy.redact_pii: must be true, false or "auto"'),
        ({"local_hosts": ["a host"]}, "privacy.local_hosts: 'a host' is not a host name"),
        ({"redact": "yes please"}, "privacy.redact"),
    ],
)
def test_bad_privacy_settings_are_one_line_naming_the_key(
    privacy: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({"privacy": privacy}, {}, "memd.toml")
    message = str(caught.value)
    assert message.startswith("invalid config memd.toml: ") and expected in message
    assert "\n" not in message


def test_budgets_are_checked_against_windows_taken_from_an_agents_model() -> None:
    from memd.settings import model_window_problems

    data = {
        "trigger": {"context_length": 200_000},
        "summarizer": {"summary_tokens": 6_000},
        "agents": {"small*": {"model": "tiny-model"}, "big*": {"model": "huge-model"}},
    }
    # Loading cannot know these windows (no model map at load): it passes.
    config, _ = build_config(data, {})
    windows = {"tiny-model": 8_192, "huge-model": 1_000_000}
    problems = model_window_problems(config, windows.get)
    # 8,192 x 0.9 x 0.6 = 4,423 tokens of low water: 6,000 cannot fit.
    assert len(problems) == 1
    [line] = problems
    assert line.startswith('[agents."small*"] model = "tiny-model" (a 8,192-token window')
    assert "summarizer.summary_tokens (6000)" in line and "\n" not in line
    # A window set explicitly is checked at load already; unknown models are not guessed.
    assert model_window_problems(config, lambda _model: None) == []


def test_config_check_fails_on_a_model_window_the_budgets_cannot_fit(tmp_path: Path) -> None:
    import subprocess
    import sys

    config = tmp_path / "memd.toml"
    config.write_text('[summarizer]\nsummary_tokens = 6000\n\n[agents."old*"]\nmodel = "gpt-4"\n')
    result = subprocess.run(
        [sys.executable, "-m", "memd", "config", "check", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and '[agents."old*"] model = "gpt-4"' in result.stderr
    assert "summarizer.summary_tokens" in result.stderr


def test_summary_budgets_are_overridable_per_agent() -> None:
    from memd.compaction import CompactionOptions
    from memd.core.config import resolve_policy

    data = {
        "trigger": {"context_length": 32_000},
        "agents": {
            "scratch-*": {"keep_recent_tokens": 0, "summary_tokens": 4_000},
            "chatty": {"keep_recent_tokens": 5_000},
        },
    }
    config, _ = build_config(data, {})
    default = CompactionOptions.from_config(config, resolve_policy(config, "other"))
    scratch = CompactionOptions.from_config(config, resolve_policy(config, "scratch-1"))
    chatty = CompactionOptions.from_config(config, resolve_policy(config, "chatty"))
    assert default.keep_recent_tokens > 2_500  # a tenth of 28,800, shrunk to fit
    assert (scratch.keep_recent_tokens, scratch.summary_max_tokens) == (0, 4_000)
    assert chatty.keep_recent_tokens == 5_000
    # The equation holds per table: 17,280 tokens of low water cannot take 18,000.
    data["agents"]["chatty"] = {"keep_recent_tokens": 18_000}
    with pytest.raises(ConfigError, match='agents."chatty".*summarizer.keep_recent_tokens'):
        build_config(data, {})


@pytest.mark.parametrize(
    ("encoding", "adds_up"),
    [("cl100k_base", True), ("o200k_base", True), ("p50k_base", False), ("r50k_base", False)],
)
def test_kept_turns_are_counted_once_only_where_entries_add_up(
    encoding: str, adds_up: bool
) -> None:
    from memd.compaction import CompactionOptions

    config, _ = build_config({"tokenizer": {"encoding": encoding}}, {})
    assert CompactionOptions.from_config(config).entries_add_up is adds_up


@pytest.mark.parametrize("model", ["ollama/llama3", "ollama_chat/llama3"])
def test_an_ollama_summarizer_goes_where_ollama_api_base_points(tmp_path: Path, model: str) -> None:
    from memd.core.privacy import is_local_summarizer, outbound_redaction

    config = write(tmp_path / "memd.toml", f'[summarizer]\nmodel = "{model}"\n')
    # litellm sends to $OLLAMA_API_BASE when api_base is unset: judge that host,
    # or a remote Ollama would count as local and receive credentials as written.
    env = {"OLLAMA_API_BASE": "http://192.0.2.2:11434"}
    remote = load_settings(config_file=config, environ=env, cwd=tmp_path).config
    assert remote.summarizer.api_base == "http://192.0.2.2:11434"
    assert not is_local_summarizer(remote.summarizer.model, remote.summarizer.api_base)
    assert outbound_redaction(remote) == "credentials and personal data"
    local = load_settings(config_file=config, environ={}, cwd=tmp_path).config
    assert local.summarizer.api_base == ""
    assert outbound_redaction(local) == "none (local summarizer)"
    # an explicit api_base wins over the environment, as it does in litellm
    pinned = write(
        tmp_path / "pinned.toml",
        f'[summarizer]\nmodel = "{model}"\napi_base = "http://127.0.0.1:11434"\n',
    )
    kept = load_settings(config_file=pinned, environ=env, cwd=tmp_path).config
    assert kept.summarizer.api_base == "http://127.0.0.1:11434"


def test_tiktoken_cache_dir_from_the_environment() -> None:
    assert tiktoken_cache_dir({"TIKTOKEN_CACHE_DIR": "/t"}) == Path("/t")
    assert tiktoken_cache_dir({"TIKTOKEN_CACHE_DIR": ""}) is None
    assert tiktoken_cache_dir({}) is None


def test_tiktoken_cache_dir_is_put_back_after_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/mine")
    with tiktoken_cache_dir_kept():
        os.environ["TIKTOKEN_CACHE_DIR"] = "/litellm's"  # what importing litellm does
    assert os.environ["TIKTOKEN_CACHE_DIR"] == "/mine"
    with tiktoken_cache_dir_kept(Path("/bundled")):
        assert tiktoken_cache_dir() == Path("/bundled")
    assert os.environ["TIKTOKEN_CACHE_DIR"] == "/mine"
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR")
    with tiktoken_cache_dir_kept(Path("/bundled")):
        pass
    assert "TIKTOKEN_CACHE_DIR" not in os.environ
    with tiktoken_cache_dir_kept():
        os.environ["TIKTOKEN_CACHE_DIR"] = "/litellm's"
    assert "TIKTOKEN_CACHE_DIR" not in os.environ


def test_a_value_set_by_another_thread_during_a_load_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/mine")
    with tiktoken_cache_dir_kept(Path("/bundled")):
        os.environ["TIKTOKEN_CACHE_DIR"] = "/other"
    assert os.environ["TIKTOKEN_CACHE_DIR"] == "/other"


def test_environment_settings_are_what_the_environment_set_and_never_a_secret(
    tmp_path: Path,
) -> None:
    """What a daemon tells the commands beside it (its workspace's pointer, which
    every agent may read) of its environment (review r7ops F1): the values as
    validated, but never the key nor an api_base that carries credentials."""
    config = tmp_path / "memd.toml"
    config.write_text('[summarizer]\nmodel = "builtin"\ntemperature = 0.5\n')
    env = {
        "MEMD_SUMMARIZER_MODEL": "openai/gpt-4o-mini",
        "MEMD_PRIVACY_REDACT": "false",
        "MEMD_TRIGGER_THRESHOLD": "0.8",
        "MEMD_SUMMARIZER_API_KEY": "sk-not-a-real-key",
        "MEMD_SUMMARIZER_API_BASE": "https://user:hunter2@llm.internal/v1",
        "MEMD_STATE_DIR": str(tmp_path / "state"),
        "OPENAI_API_KEY": "sk-other",
        "EMPTY_API_KEY": "",
    }
    loaded = load_settings(config_file=config, workspace=tmp_path, environ=env)
    settings, withheld = environment_settings(loaded)
    assert settings == {
        "summarizer": {"model": "openai/gpt-4o-mini"},
        "privacy": {"redact": False},
        "trigger": {"threshold": 0.8},
    }
    assert withheld == ("MEMD_SUMMARIZER_API_BASE", "MEMD_SUMMARIZER_API_KEY")
    assert api_key_vars(env) == ("MEMD_SUMMARIZER_API_KEY", "OPENAI_API_KEY")
    plain = {**env, "MEMD_SUMMARIZER_API_BASE": "http://127.0.0.1:8000/v1"}
    loaded = load_settings(config_file=config, workspace=tmp_path, environ=plain)
    assert environment_settings(loaded)[0]["summarizer"]["api_base"] == "http://127.0.0.1:8000/v1"


def test_a_config_nested_too_deeply_is_one_line_naming_the_file(tmp_path: Path) -> None:
    """tomllib recurses per nesting level: its RecursionError went past every
    caller (a traceback from every command, the daemon ended at a reload)."""
    config = tmp_path / "c.toml"
    config.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=r"c\.toml: invalid TOML: .*nested too deeply"):
        load_settings(config_file=config, environ={}, cwd=tmp_path)


def test_a_fifo_where_the_config_goes_is_refused_at_once(tmp_path: Path) -> None:
    """Opened for reading, a FIFO with no writer blocks for ever: every command,
    and the daemon's main loop at its next reload."""
    config = tmp_path / "c.toml"
    os.mkfifo(config)
    with pytest.raises(ConfigError, match=r"c\.toml is a FIFO, not a regular file"):
        load_settings(config_file=config, environ={}, cwd=tmp_path)


def test_a_byte_order_mark_is_named(tmp_path: Path) -> None:
    """tomllib's 'Invalid statement (at line 1, column 1)' points at nothing the
    operator can see in an editor."""
    config = tmp_path / "c.toml"
    config.write_bytes(b"\xef\xbb\xbf[trigger]\nthreshold = 0.5\n")
    with pytest.raises(ConfigError, match=r"c\.toml: starts with a UTF-8 byte order mark"):
        load_settings(config_file=config, environ={}, cwd=tmp_path)
    config.write_bytes(b"[trigger]\nthreshold = 0.5\n# \xff\n")
    with pytest.raises(ConfigError, match=r"c\.toml: not valid UTF-8 \(line 3\)"):
        load_settings(config_file=config, environ={}, cwd=tmp_path)


@pytest.mark.parametrize("name", ["nope", "gpt2", "CL100K_BASE"])
def test_an_unknown_encoding_is_refused_where_the_config_is_read(tmp_path: Path, name: str) -> None:
    """It was refused only by the daemon's tokenizer: `memd config check` called
    the file valid, and `memd reload` 'applied (changed: nothing)' with exit 0
    while the daemon kept the old encoding."""
    config = write(tmp_path / "c.toml", f'[tokenizer]\nencoding = "{name}"\n')
    with pytest.raises(ConfigError, match=r"c\.toml: tokenizer\.encoding: unknown encoding; use"):
        load_settings(config_file=config, environ={}, cwd=tmp_path)
    with pytest.raises(ConfigError, match=r"MEMD_TOKENIZER_ENCODING \(tokenizer\.encoding\)"):
        load_settings(environ={"MEMD_TOKENIZER_ENCODING": name}, cwd=tmp_path)


def test_the_encodings_the_config_takes_are_those_memd_can_load() -> None:
    from memd.core.tokens import ENCODING_NAMES
    from memd.tokenizer import OFFLINE_ENCODINGS

    assert set(OFFLINE_ENCODINGS) == ENCODING_NAMES
