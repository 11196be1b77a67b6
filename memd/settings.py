"""Load the configuration: TOML file, then ``MEMD_<SECTION>_<KEY>`` env vars, then flags.

Resolution order (DESIGN.md §3): the config file is ``--config``, else
``MEMD_CONFIG``, else ``/etc/memd/memd.toml`` when present. The workspace is
``--workspace`` > ``MEMD_WORKSPACE`` > ``WORKSPACE_DIR`` > ``workspace`` in the
file > ``./agent_workspace``.

We merge the sources ourselves rather than through pydantic-settings because
every validation error must name its source (the file, or the env var), and a
nested-delimiter parser cannot tell ``MEMD_TRIGGER_CONTEXT_LENGTH`` apart from
a ``context`` section.
"""

from __future__ import annotations

import contextlib
import difflib
import os
import re
import stat
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from memd.core.config import MemdConfig, resolve_policy
from memd.core.summary_plan import BudgetError
from memd.errors import ConfigError, describe_error
from memd.pointer import StatePointer

SYSTEM_CONFIG = Path("/etc/memd/memd.toml")
DEFAULT_WORKSPACE = Path("agent_workspace")


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    config: MemdConfig
    source: Path | None  # the TOML file used, if any
    workspace: Path  # absolute, resolved per the precedence rules
    env_overrides: tuple[str, ...]  # names of MEMD_* vars that applied
    # The config file was named (--config or MEMD_CONFIG), not found by default.
    config_explicit: bool = False
    # The daemon's pointer in the workspace, when one is trusted (memd.pointer).
    pointer: StatePointer | None = None


# -- where memd keeps its files: each setting in one small function,
#    argument → environment → default (watchfiles' shape).


def default_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``MEMD_STATE_DIR``, else systemd's ``$STATE_DIRECTORY``, else ``~/.local/state/memd``."""
    env = os.environ if environ is None else environ
    explicit = env.get("MEMD_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    systemd = env.get("STATE_DIRECTORY")
    if systemd:
        # systemd passes every StateDirectory= entry, colon-separated.
        return Path(systemd.split(":")[0])
    home = env.get("HOME")
    base = Path(home) if home else Path.home()
    return base / ".local" / "state" / "memd"


def resolve_state_dir(
    flag: Path | None, configured: str, environ: Mapping[str, str] | None = None
) -> Path:
    """``--state-dir`` > config ``state_dir`` (which ``MEMD_STATE_DIR`` also sets) > default."""
    if flag is not None:
        return flag.expanduser()
    if configured:
        return Path(configured).expanduser()
    return default_state_dir(environ)


def locate_state_dir(
    flag: Path | None, loaded: LoadedConfig, environ: Mapping[str, str] | None = None
) -> tuple[Path, str]:
    """The state dir a command uses, and where that choice came from (printed, so a
    figure never comes from an unexpected place): ``--state-dir`` > ``MEMD_STATE_DIR``
    > ``state_dir`` of a config named by ``--config``/``MEMD_CONFIG`` > the daemon's
    pointer in the workspace > ``state_dir`` of the default config > the default."""
    env = os.environ if environ is None else environ
    if flag is not None:
        return flag.expanduser(), "--state-dir"
    configured = loaded.config.state_dir
    if configured and "MEMD_STATE_DIR" in loaded.env_overrides:
        return Path(configured).expanduser(), "MEMD_STATE_DIR"
    if configured and loaded.config_explicit:
        return Path(configured).expanduser(), f"state_dir in {loaded.source}"
    if loaded.pointer is not None:
        return loaded.pointer.state_dir, f"the daemon's pointer {loaded.pointer.path}"
    if configured:
        return Path(configured).expanduser(), f"state_dir in {loaded.source}"
    if env.get("STATE_DIRECTORY"):
        return default_state_dir(env), "$STATE_DIRECTORY"
    return default_state_dir(env), "the default"


def state_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot be memd's state dir: it, or a folder above it, exists and
    is not a folder (a file named by mistake, a DB file for its folder). None
    otherwise: missing folders are made, and permissions are said where the
    state dir is used (a state dir memd may not write keeps an in-memory state)."""
    probe = path
    while True:
        try:
            mode = os.stat(probe).st_mode
        except (FileNotFoundError, NotADirectoryError):
            if probe == probe.parent:
                return None
            probe = probe.parent
            continue
        except OSError:  # a folder above it memd may not search: said where it is used
            return None
        if stat.S_ISDIR(mode):
            return None
        kind = _file_kind(mode) or "a regular file"
        if probe == path:
            return f"state dir {path} is {kind}, not a folder"
        return f"state dir {path}: {probe} is {kind}, not a folder"


def require_state_dir(path: Path, found_by: str) -> Path:
    """``path``, or one line saying why it cannot be the state dir (exit 2): with a
    file there, every command fell back to a temporary in-memory state DB, which
    a daemon's ``memd status`` and ``memd health`` never see, with no audit log,
    recall index nor lasting redaction key."""
    problem = state_dir_problem(path)
    if problem is not None:
        raise ConfigError(
            f"{problem} (from {found_by}); name a folder memd may create or use "
            "(--state-dir, MEMD_STATE_DIR or state_dir in the config)"
        )
    return path


def apply_settings(
    config: MemdConfig, settings: Mapping[str, Mapping[str, Any]], source: str
) -> MemdConfig:
    """``config`` with per-section ``settings`` on top (``memd run --demo``'s, or
    those a daemon's pointer names), validated like a config file's."""
    data = config.model_dump()
    for section, values in settings.items():
        current = data.get(section)
        if not isinstance(current, dict):
            raise ConfigError(f"invalid settings in {source}: unknown section [{section}]")
        data[section] = {**current, **values}
    try:
        return MemdConfig.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, source, {}) from None


# What a daemon's environment set that a command beside it must not be told:
# secrets, and an api_base carrying credentials (user:password@, ?key=) — the
# pointer they would go into is readable by every agent of the workspace. The
# privacy patterns are the operator's own secrets (a literal password, a client's
# name), and summary instructions may name anything the operator keeps private.
_NEVER_RECORDED: Final = frozenset(
    {
        ("summarizer", "api_key"),
        ("privacy", "patterns"),
        ("summarizer", "summary_instructions"),
    }
)


def environment_settings(
    loaded: LoadedConfig,
) -> tuple[dict[str, dict[str, Any]], tuple[str, ...]]:
    """The settings ``loaded``'s ``MEMD_*`` variables set, by section, with their
    validated values, for the daemon's pointer (:mod:`memd.pointer`); and the
    names of the variables left out (secrets, an api_base with credentials)."""
    variables = setting_env_vars()
    values = loaded.config.model_dump(mode="json")
    recorded: dict[str, dict[str, Any]] = {}
    withheld: list[str] = []
    for var in loaded.env_overrides:
        path = variables.get(var)
        if path is None or len(path) != 2:
            continue  # workspace and state_dir: the pointer's place and its state_dir
        section, key = path
        value = values[section][key]
        if path in _NEVER_RECORDED or (key == "api_base" and _carries_credentials(value)):
            withheld.append(var)
            continue
        recorded.setdefault(section, {})[key] = value
    return recorded, tuple(withheld)


def _carries_credentials(url: str) -> bool:
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
    except ValueError:
        return True
    return bool(parts.username or parts.password or parts.query or parts.fragment)


def api_key_vars(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Names of the set ``*_API_KEY`` variables (every provider's key variable
    litellm reads ends so, as does ``MEMD_SUMMARIZER_API_KEY``): names only."""
    env = os.environ if environ is None else environ
    return tuple(sorted(var for var, value in env.items() if var.endswith("_API_KEY") and value))


def resolve_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``MEMD_CACHE_DIR``, else systemd's ``$CACHE_DIRECTORY``, else the XDG cache."""
    env = os.environ if environ is None else environ
    if env.get("MEMD_CACHE_DIR"):
        return Path(env["MEMD_CACHE_DIR"])
    if env.get("CACHE_DIRECTORY"):
        return Path(env["CACHE_DIRECTORY"].split(":")[0])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memd"


TIKTOKEN_CACHE_ENV = "TIKTOKEN_CACHE_DIR"


def tiktoken_cache_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where the user keeps tiktoken's files (``$TIKTOKEN_CACHE_DIR``), or None."""
    env = os.environ if environ is None else environ
    value = env.get(TIKTOKEN_CACHE_ENV)
    return Path(value) if value else None


@contextlib.contextmanager
def tiktoken_cache_dir_kept(during: Path | None = None) -> Iterator[None]:
    """``$TIKTOKEN_CACHE_DIR`` as it was before the block, whatever the block did
    to it (importing litellm rewrites it). With ``during``, the variable is that
    folder inside the block, and a value someone else set meanwhile wins."""
    previous = os.environ.get(TIKTOKEN_CACHE_ENV)
    if during is not None:
        os.environ[TIKTOKEN_CACHE_ENV] = str(during)
    try:
        yield
    finally:
        if during is None or os.environ.get(TIKTOKEN_CACHE_ENV) == str(during):
            if previous is None:
                os.environ.pop(TIKTOKEN_CACHE_ENV, None)
            else:
                os.environ[TIKTOKEN_CACHE_ENV] = previous


def find_config_file(explicit: Path | None, environ: Mapping[str, str]) -> Path | None:
    if explicit is not None:
        return explicit
    from_env = environ.get("MEMD_CONFIG")
    if from_env:
        return Path(from_env)
    return SYSTEM_CONFIG if SYSTEM_CONFIG.is_file() else None


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML of a config file; anything wrong with it is one ConfigError naming it.

    Opened without blocking and checked to be a regular file first: a FIFO
    (or a device) where the config goes would hang ``memd`` here for ever, and
    the daemon's main loop at its next reload. A file nested deeper than
    tomllib's recursion can follow (``x = [[[[…``) is said, not a RecursionError
    (which ended the daemon at a reload)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except PermissionError:
        raise ConfigError(f"config file {path} is not readable (permission denied)") from None
    except OSError as exc:  # a name too long for the OS, a symlink loop...
        raise ConfigError(f"config file {path}: {describe_error(exc, with_file=False)}") from None
    try:
        with os.fdopen(fd, "rb") as handle:
            kind = _file_kind(os.fstat(handle.fileno()).st_mode)
            if kind == "a directory":
                raise ConfigError(f"config file {path} is a directory")
            if kind:
                raise ConfigError(f"config file {path} is {kind}, not a regular file")
            raw = handle.read()
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory") from None
    except OSError as exc:  # an I/O error...
        raise ConfigError(f"config file {path}: {describe_error(exc, with_file=False)}") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        # What Notepad and some editors write first; TOML has no place for it.
        raise ConfigError(
            f"config file {path}: starts with a UTF-8 byte order mark (BOM); "
            "save it as UTF-8 without one"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"config file {path}: not valid UTF-8 (line {line})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(
            f"config file {path}: invalid TOML: arrays or tables nested too deeply"
        ) from None


def _file_kind(mode: int) -> str:
    """What a non-regular file is, for a message ("" for a regular file)."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "" if stat.S_ISREG(mode) else "of an unknown kind"


# MEMD_* variables memd, its tests and its deployment read that are not config
# keys; any other MEMD_* variable is a misspelled setting (an error, as an
# unknown key in the file is), never silently ignored.
NON_SETTING_ENV_VARS: Final = frozenset(
    {
        "MEMD_CONFIG",  # the config file (find_config_file)
        "MEMD_CACHE_DIR",  # memd's cache (resolve_cache_dir)
        "MEMD_SWARMS_PYTHON",  # tests, bench: the swarms virtualenv's interpreter
        "MEMD_BENCH_PROFILE",  # bench/bench_startup.py
        "MEMD_CI_CACHE",  # deploy/hostcheck
        # Docker build args: `docker build --build-arg MEMD_UID` takes the shell's value.
        "MEMD_UID",
        "MEMD_GID",
    }
)


def setting_env_vars() -> dict[str, tuple[str, ...]]:
    """Every ``MEMD_<SECTION>_<KEY>`` (and ``MEMD_<KEY>`` for top-level keys) the
    config model takes, with the field path it sets. ``[agents."glob"]`` tables
    have no variables: their names are globs."""
    variables: dict[str, tuple[str, ...]] = {}
    for name, field in MemdConfig.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            for key in annotation.model_fields:
                variables[f"MEMD_{name}_{key}".upper()] = (name, key)
        elif name != "agents":
            variables[f"MEMD_{name}".upper()] = (name,)
    return variables


# Variables a platform sets for a service or a linked container whose name starts
# with "memd", never written by an operator: Kubernetes' service links (every
# container of a namespace with a Service "memd" or "memd-metrics" gets them unless
# enableServiceLinks is false) and Docker's legacy --link (its _NAME, _ENV_* variables).
# Each ends in a suffix no memd setting has, or carries a link's value.
_SERVICE_LINK_NAME = re.compile(
    r"MEMD[A-Z0-9_]*?(?:_SERVICE_HOST|_SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|_PORT_\d+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)"
)
_LINK_VALUE = re.compile(r"(?:tcp|udp|sctp)://\S+", re.IGNORECASE)


def _is_link_var(var: str, value: str, environ: Mapping[str, str]) -> bool:
    """Whether ``var`` is a service/container link variable (above), not a setting.
    A setting's own name (``MEMD_METRICS_PORT`` for a Service "memd-metrics") counts
    as one only with a link's value *and* the service's ``_SERVICE_HOST`` beside it."""
    docker_link = var.removeprefix("MEMD_")
    if docker_link == "NAME" or docker_link.startswith("ENV_"):
        return True
    if _SERVICE_LINK_NAME.fullmatch(var):
        return True
    return (
        var.endswith("_PORT")
        and _LINK_VALUE.fullmatch(value.strip()) is not None
        and f"{var[:-5]}_SERVICE_HOST" in environ
    )


def _unknown_env_var(var: str, known: Mapping[str, tuple[str, ...]]) -> str:
    """One line for a ``MEMD_*`` variable memd does not read, with the closest name."""
    upper = var.upper()
    if upper in known or upper in NON_SETTING_ENV_VARS:
        return f"invalid setting {var}: names are upper case; did you mean {upper}?"
    rest = upper.removeprefix("MEMD_")
    sections = {path[0] for path in known.values() if len(path) == 2}
    section = next((s for s in sorted(sections) if rest.startswith(f"{s.upper()}_")), None)
    hint = ""
    if section is not None:
        reason = f"[{section}] has no key {rest.removeprefix(section.upper() + '_').lower()!r}"
    elif rest.startswith("AGENTS_"):
        reason = '[agents."glob"] tables are set in the config file only'
    else:
        reason = "not a memd setting"
        hint = " (settings are MEMD_<SECTION>_<KEY>, for the keys of memd.toml)"
    close = difflib.get_close_matches(upper, [*known, *NON_SETTING_ENV_VARS], n=1, cutoff=0.8)
    if close:
        hint = f"; did you mean {close[0]}?"
    return f"invalid setting {var}: {reason}{hint}"


def _env_overrides(
    environ: Mapping[str, str],
) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """Map ``MEMD_<SECTION>_<KEY>`` vars onto the model's fields.

    Returns the nested override dict and, for error messages, which env var
    set each field path. Raises ConfigError naming every ``MEMD_*`` variable
    that is neither a setting nor one of :data:`NON_SETTING_ENV_VARS`, except
    the link variables a platform sets (:func:`_is_link_var`).
    """
    known = setting_env_vars()
    links = {
        var
        for var, value in environ.items()
        if var.startswith("MEMD_") and _is_link_var(var, value, environ)
    }
    unknown = sorted(
        var
        for var in environ
        if var.startswith("MEMD_")
        and var not in known
        and var not in NON_SETTING_ENV_VARS
        and var not in links
    )
    # Environment names are case-sensitive: `memd_log_level=debug` would be
    # silently ignored. A name that is a setting's once upper-cased was meant as
    # one; other lower-case memd_* names may be anyone's and are left alone.
    unknown += sorted(
        var
        for var in environ
        if not var.startswith("MEMD_")
        and (var.upper() in known or var.upper() in NON_SETTING_ENV_VARS)
    )
    if unknown:
        problems = tuple(_unknown_env_var(var, known) for var in unknown)
        more = len(problems) - 1
        suffix = f" (+{more} more: see memd config check)" if more > 0 else ""
        raise ConfigError(problems[0] + suffix, problems)
    overrides: dict[str, Any] = {}
    origin: dict[tuple[str, ...], str] = {}
    for var, path in known.items():
        if var not in environ or var in links:
            continue
        if len(path) == 2:
            overrides.setdefault(path[0], {})[path[1]] = environ[var]
        else:
            overrides[path[0]] = environ[var]
        origin[path] = var
    return overrides, origin


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        current = merged.get(key)
        if isinstance(current, dict) and isinstance(value, Mapping):
            merged[key] = _merge(current, value)
        else:
            merged[key] = value
    return merged


def _describe_one(error: Any, source: str, origin: dict[tuple[str, ...], str]) -> str:
    location = tuple(str(part) for part in error["loc"])
    dotted = ".".join(location) or "(top level)"
    where = origin.get(location)
    unknown = error["type"] == "extra_forbidden"
    reason = "unknown key" if unknown else str(error["msg"]).removeprefix("Value error, ")
    if where is None and location:
        # A check across a section's keys (retry_base_s against retry_max_s) is
        # the section's error: the variables that set a key it names are named.
        named = [
            var
            for key, var in origin.items()
            if key[:-1] == location and re.search(rf"\b{re.escape(key[-1])}\b", reason)
        ]
        where = ", ".join(sorted(named)) or None
    value = error.get("input")
    shown = "" if unknown or isinstance(value, dict) else f" (got {value!r})"
    if "api_key" in dotted:
        shown = ""  # never echo secrets
    if where is not None:
        return f"invalid setting {where} ({dotted}): {reason}{shown}"
    return f"invalid config {source}: {dotted}: {reason}{shown}"


def _config_error(
    exc: ValidationError, source: str, origin: dict[tuple[str, ...], str]
) -> ConfigError:
    """One line for the first error (+ how many more); every error in ``problems``."""
    problems = tuple(_describe_one(error, source, origin) for error in exc.errors())
    more = len(problems) - 1
    suffix = f" (+{more} more: see memd config check)" if more > 0 else ""
    return ConfigError(problems[0] + suffix, problems)


def build_config(
    file_data: Mapping[str, Any],
    environ: Mapping[str, str],
    source: str = "<defaults>",
) -> tuple[MemdConfig, tuple[str, ...]]:
    """Validate file data with env overrides on top; errors name key and source."""
    overrides, origin = _env_overrides(environ)
    try:
        MemdConfig.model_validate(file_data)
    except ValidationError as exc:
        raise _config_error(exc, source, {}) from None
    try:
        config = MemdConfig.model_validate(_merge(dict(file_data), overrides))
    except ValidationError as exc:
        raise _config_error(exc, source, origin) from None
    _check_summary_budgets(config, source)
    _check_privacy(config, source, origin)
    return config, tuple(sorted(origin.values()))


def _check_privacy(config: MemdConfig, source: str, origin: dict[tuple[str, ...], str]) -> None:
    """``[privacy]``: encryption needs a key file, and the key never sits in the config.

    The key file's content is checked where it is read (compaction, ``memd
    archive``, ``memd doctor``), so a config check never needs the key.
    """
    privacy = config.privacy

    def where(key: str) -> str:
        var = origin.get(("privacy", key))
        return (
            f"invalid setting {var} (privacy.{key})"
            if var
            else f"invalid config {source}: privacy.{key}"
        )

    key_file = privacy.key_file.strip()
    if key_file and looks_like_key(key_file):
        raise ConfigError(
            f"{where('key_file')}: looks like a key, not a file name; put the key in a file "
            "(memd archive keygen FILE) and name that file here"
        )
    if key_file and not Path(key_file).expanduser().is_absolute():
        # The daemon (systemd: cwd /) and a CLI run from different folders.
        raise ConfigError(
            f"{where('key_file')}: must be an absolute path (got {key_file!r}); the daemon "
            "and the CLI resolve a relative one from different folders"
        )
    if privacy.encrypt_archives and not key_file:
        raise ConfigError(
            f"{where('encrypt_archives')}: encryption needs privacy.key_file (or "
            "MEMD_PRIVACY_KEY_FILE) naming a master key file made by `memd archive keygen FILE`"
        )


def looks_like_key(value: str) -> bool:
    """A value that is key material rather than a path (what keygen writes, or raw base64)."""
    from memd.archive_crypto import MASTER_KEY_MAGIC

    if MASTER_KEY_MAGIC in value:
        return True
    if re.fullmatch(r"[0-9a-fA-F]{64}", value):
        return True
    # 32 bytes of base64; a path starts with / or ., or holds a dot or a short part.
    return (
        re.fullmatch(r"[A-Za-z0-9+/_-]{42,44}={0,2}", value) is not None
        and not value.startswith("/")
        and all(any(test(c) for c in value) for test in (str.isdigit, str.isupper, str.islower))
    )


def _check_summary_budgets(config: MemdConfig, source: str) -> None:
    """The budget equation, for the defaults and each ``[agents."glob"]`` table.

    Models are not looked up here (no litellm map at load); an agent whose
    derived context is smaller is checked again when it compacts.
    """
    for name in ["", *config.agents]:
        policy = resolve_policy(config, name)
        try:
            policy.budgets()
        except BudgetError as exc:
            where = f' for [agents."{name}"]' if name else ""
            raise ConfigError(f"invalid config {source}{where}: {exc}") from None


def model_window_problems(
    config: MemdConfig, context_length_of: Callable[[str], int | None]
) -> list[str]:
    """The budget equation for each ``[agents."glob"]`` whose window comes from its
    ``model`` (litellm's map), which loading does not look up: one line per table
    whose budgets cannot fit, naming the keys. ``memd config check`` reports them
    as errors, the daemon logs them at start and reload."""
    problems: list[str] = []
    for pattern, override in config.agents.items():
        if override.model is None:
            continue
        policy = resolve_policy(config, pattern, context_length_of)
        if not policy.window_source.startswith("model"):
            continue
        try:
            policy.budgets()
        except BudgetError as exc:
            problems.append(
                f'[agents."{pattern}"] model = "{override.model}" (a '
                f"{policy.context_length:,}-token window from litellm's model map): {exc}"
            )
    return problems


def resolve_workspace(
    flag: Path | None, config: MemdConfig, environ: Mapping[str, str], cwd: Path
) -> Path:
    # MEMD_WORKSPACE is already folded into config.workspace by the env layer,
    # but WORKSPACE_DIR (what Swarms uses) ranks above the file's value.
    if flag is not None:
        chosen = flag
    elif environ.get("MEMD_WORKSPACE"):
        chosen = Path(environ["MEMD_WORKSPACE"])
    elif environ.get("WORKSPACE_DIR"):
        chosen = Path(environ["WORKSPACE_DIR"])
    elif config.workspace:
        chosen = Path(config.workspace)
    else:
        chosen = DEFAULT_WORKSPACE
    chosen = chosen.expanduser()
    return chosen if chosen.is_absolute() else cwd / chosen


_OLLAMA_MODEL_PREFIXES = ("ollama/", "ollama_chat/")


def with_ollama_api_base(config: MemdConfig, env: Mapping[str, str]) -> MemdConfig:
    """An ``ollama/*`` summarizer without ``api_base`` goes wherever litellm's
    ``OLLAMA_API_BASE`` points: name that address in the config, so whether it
    counts as local (redaction, audit, doctor) is judged on where requests
    really go, not on the localhost litellm would use without it."""
    summarizer = config.summarizer
    ollama_base = env.get("OLLAMA_API_BASE", "").strip()
    if (
        not ollama_base
        or summarizer.api_base.strip()
        or not summarizer.model.strip().lower().startswith(_OLLAMA_MODEL_PREFIXES)
    ):
        return config
    return config.model_copy(
        update={"summarizer": summarizer.model_copy(update={"api_base": ollama_base})}
    )


def load_settings(
    config_file: Path | None = None,
    workspace: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> LoadedConfig:
    env = os.environ if environ is None else environ
    path = find_config_file(config_file, env)
    data = read_toml(path) if path is not None else {}
    config, applied = build_config(data, env, str(path) if path else "<defaults>")
    resolved = resolve_workspace(workspace, config, env, cwd or Path.cwd())
    config = config.model_copy(update={"workspace": str(resolved)})
    config = with_ollama_api_base(config, env)
    return LoadedConfig(
        config=config,
        source=path,
        workspace=resolved,
        env_overrides=applied,
        config_explicit=config_file is not None or bool(env.get("MEMD_CONFIG")),
    )
