"""``memd doctor``: check that memd can work on this host, and say how to fix what can't.

Each check returns :class:`Check` results (ok / warn / fail, a message and the
fix). A check never raises: whatever goes wrong becomes a ``fail`` line, so the
report is always complete. Nothing here calls an LLM or sends data anywhere;
the summarizer check opens a TCP connection to the API host and then makes one
real 1-token request (``--offline`` skips it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from memd.core.config import MemdConfig, PrivacyConfig, SummarizerConfig
from memd.core.descriptor import AgentWindow
from memd.errors import ConfigError, MemdError, describe_error
from memd.fsutil import mount_of
from memd.workspace import AGENTS_DIR, MEMORY_FILE, agent_paths, list_agents

if TYPE_CHECKING:
    from memd.archive_crypto import MasterKey
    from memd.pointer import StatePointer

Status = Literal["ok", "warn", "fail"]

# Filesystems where flock is emulated, local-only or missing, or where inotify
# never sees writes made by other hosts/VMs.
REMOTE_FILESYSTEMS: dict[str, str] = {
    "nfs": "NFS",
    "nfs4": "NFS",
    "cifs": "CIFS/SMB",
    "smb3": "CIFS/SMB",
    "smbfs": "CIFS/SMB",
    "9p": "9p (WSL/VM share)",
    "virtiofs": "virtiofs (Docker Desktop / VM share)",
    "fuse.grpcfuse": "gRPC FUSE (Docker Desktop)",
    "fakeowner": "Docker Desktop file share",
    "vboxsf": "VirtualBox shared folder",
    "ceph": "CephFS",
    "glusterfs": "GlusterFS",
    "fuse.sshfs": "sshfs",
    "lustre": "Lustre",
}

# Where litellm providers look for their key, for "is a key configured?".
PROVIDER_KEY_VARS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY",),
    "text-completion-openai": ("OPENAI_API_KEY",),
    "azure": ("AZURE_API_KEY", "AZURE_OPENAI_API_KEY"),
    "anthropic": ("ANTHROPIC_API_KEY",),
    "gemini": ("GEMINI_API_KEY", "GOOGLE_API_KEY"),
    "groq": ("GROQ_API_KEY",),
    "mistral": ("MISTRAL_API_KEY",),
    "cohere": ("COHERE_API_KEY",),
    "cohere_chat": ("COHERE_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY",),
    "together_ai": ("TOGETHERAI_API_KEY", "TOGETHER_API_KEY"),
    "xai": ("XAI_API_KEY",),
    "fireworks_ai": ("FIREWORKS_AI_API_KEY", "FIREWORKS_API_KEY"),
    "perplexity": ("PERPLEXITYAI_API_KEY", "PERPLEXITY_API_KEY"),
}
# Providers that run locally and need no key.
KEYLESS_PROVIDERS = frozenset({"ollama", "ollama_chat", "lm_studio", "vllm", "hosted_vllm"})

PROVIDER_DEFAULT_BASE: dict[str, str] = {
    "openai": "https://api.openai.com",
    "text-completion-openai": "https://api.openai.com",
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    "groq": "https://api.groq.com",
    "mistral": "https://api.mistral.ai",
    "cohere": "https://api.cohere.ai",
    "cohere_chat": "https://api.cohere.ai",
    "deepseek": "https://api.deepseek.com",
    "openrouter": "https://openrouter.ai",
    "together_ai": "https://api.together.xyz",
    "xai": "https://api.x.ai",
    "fireworks_ai": "https://api.fireworks.ai",
    "perplexity": "https://api.perplexity.ai",
    "ollama": "http://localhost:11434",
    "ollama_chat": "http://localhost:11434",
}

CONNECT_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    message: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _ok(name: str, message: str) -> Check:
    return Check(name, "ok", message)


def _warn(name: str, message: str, fix: str) -> Check:
    return Check(name, "warn", message, fix)


def _fail(name: str, message: str, fix: str) -> Check:
    return Check(name, "fail", message, fix)


# --------------------------------------------------------------------- inotify


def check_inotify(agent_count: int, poll: bool, proc_root: Path = Path("/proc")) -> list[Check]:
    """inotify limits vs what the watcher needs: one watch per agent folder + one for
    ``agents/``, all on a single inotify instance (see :class:`memd.watcher.InotifyBackend`).
    """
    if poll:
        return [_ok("inotify", "watch.poll = true: polling, inotify limits do not apply")]
    checks = []
    for key, sysctl, needed, what in (
        ("max_user_watches", "fs.inotify.max_user_watches", agent_count + 1, "watches"),
        ("max_user_instances", "fs.inotify.max_user_instances", 1, "instance"),
    ):
        name = f"inotify {key}"
        path = proc_root / "sys" / "fs" / "inotify" / key
        try:
            limit = int(path.read_text().strip())
        except (OSError, ValueError) as exc:
            checks.append(
                _warn(
                    name,
                    f"cannot read {path} ({exc.__class__.__name__}): the limit is unknown "
                    "(/proc/sys is hidden in a sandbox such as systemd's ProcSubset=pid; "
                    "inotify itself still works there)",
                    f"check it outside the sandbox: sysctl {sysctl}",
                )
            )
            continue
        # Room for everything else this user runs (editors, IDEs, other daemons).
        wanted = max(needed * 2, needed + 128)
        fix = (
            f"sysctl -w {sysctl}={wanted} and persist it: "
            f"echo '{sysctl}={wanted}' > /etc/sysctl.d/60-memd.conf "
            "(or run memd with --poll)"
        )
        if limit < needed:
            checks.append(
                _fail(name, f"{limit} < {needed} {what} needed for {agent_count} agents", fix)
            )
        elif limit < needed + 64:
            checks.append(
                _warn(
                    name,
                    f"{limit}: little headroom over {needed} {what} needed (other programs)",
                    fix,
                )
            )
        else:
            checks.append(_ok(name, f"{limit} (needs {needed} {what} for {agent_count} agents)"))
    return checks


# ------------------------------------------------------------------- workspace


def _no_access(name: str, folder: Path) -> Check:
    return _fail(
        name,
        f"{folder} is not readable by uid {os.getuid()}",
        "run memd as the agents' user or group, or grant it r-x on the folder",
    )


def check_workspace(workspace: Path) -> list[Check]:
    name = "workspace"
    if not workspace.exists():
        return [
            _fail(
                name,
                f"{workspace} does not exist",
                f"create it (mkdir -p {workspace / AGENTS_DIR}) or pass --workspace",
            )
        ]
    if not workspace.is_dir():
        return [_fail(name, f"{workspace} is not a directory", "point --workspace at a folder")]
    if not os.access(workspace, os.R_OK | os.X_OK):
        return [_no_access(name, workspace)]
    agents_dir = workspace / AGENTS_DIR
    try:
        agents_dir_found = agents_dir.is_dir()
    except PermissionError:
        return [_no_access(name, agents_dir)]
    if not agents_dir_found:
        return [
            _warn(
                name,
                f"{workspace} has no {AGENTS_DIR}/ folder yet (no agents)",
                f"mkdir {agents_dir}; agents create agents/<name>/MEMORY.md",
            )
        ]
    if not os.access(agents_dir, os.R_OK | os.X_OK):
        return [_no_access(name, agents_dir)]
    problems = []
    try:
        agents = list_agents(workspace)
    except PermissionError:
        return [_no_access(name, agents_dir)]
    for agent in agents:
        folder = agents_dir / agent
        memory = folder / MEMORY_FILE
        # Re-seeding replaces MEMORY.md and adds archive/ and .memd/: memd needs
        # write access to the folder, and read access to the file.
        if not os.access(folder, os.R_OK | os.W_OK | os.X_OK):
            problems.append(f"{agent}/ not writable")
        elif memory.exists() and not os.access(memory, os.R_OK | os.W_OK):
            problems.append(f"{agent}/{MEMORY_FILE} not readable+writable")
    if problems:
        shown = ", ".join(problems[:5]) + (
            f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        )
        return [
            _fail(
                name,
                f"uid {os.getuid()} lacks access: {shown}",
                "run memd as the agents' user/group (User=/Group= in systemd, --user in docker) "
                "and make agent folders group-writable",
            )
        ]
    return [_ok(name, f"{workspace}: {len(agents)} agents, readable and writable")]


def _first(names: list[str], shown: int = 5) -> str:
    more = f" (+{len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_journals(workspace: Path, agents: Iterable[str]) -> list[Check]:
    """Agents whose compaction journal holds a job: a crash (or a kill) left a
    compaction or erasure unfinished, or one is at work now. Reads each journal
    only (no lock taken, nothing created); recovery finishes or rolls it back."""
    from memd.compaction import journal_unfinished

    name = "journals"
    unfinished: list[str] = []
    unreadable: list[str] = []
    for agent in agents:
        try:
            if journal_unfinished(agent_paths(workspace, agent)):
                unfinished.append(agent)
        except (OSError, MemdError):
            unreadable.append(agent)
    if not unfinished and not unreadable:
        return [_ok(name, "no agent has an unfinished compaction or erasure")]
    parts = []
    if unfinished:
        parts.append(
            f"{len(unfinished)} agent(s) with an unfinished job in their journal "
            f"(a crash left it, or one is at work now): {_first(unfinished)}"
        )
    if unreadable:
        parts.append(f"cannot read the journal of {_first(unreadable)}")
    return [
        _warn(
            name,
            "; ".join(parts),
            "none needed: the daemon or compact-now finishes it on the agent's next lock "
            "(memd run's start, or memd compact-now AGENT)",
        )
    ]


# ------------------------------------------------------------------------ lock

_LOCK_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(0)  # the parent's lock is seen: locking works across processes
sys.exit(3)
"""


def check_flock(workspace: Path) -> list[Check]:
    """Take a lock on the workspace filesystem and check another process sees it."""
    name = "file locks"
    directory = workspace / AGENTS_DIR if (workspace / AGENTS_DIR).is_dir() else workspace
    fix = "put the workspace on a local filesystem (ext4, xfs, btrfs, a docker named volume)"
    try:
        handle = tempfile.NamedTemporaryFile(  # noqa: SIM115 (closed in finally)
            prefix=".memd-doctor-lock-", dir=directory, delete=False
        )
    except OSError as exc:
        return [
            _fail(
                name,
                f"cannot create a file in {directory}: {describe_error(exc, with_file=False)}",
                fix,
            )
        ]
    path = Path(handle.name)
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                return [_fail(name, f"flock is not supported in {directory}: {exc}", fix)]
            raise
        probe = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _LOCK_PROBE, str(path)],
            capture_output=True,
            timeout=30,
            check=False,
        )
        if probe.returncode == 3:
            return [
                _fail(
                    name,
                    f"a second process could take a lock already held in {directory}: "
                    "locks are not enforced, two compactions could overlap",
                    fix,
                )
            ]
        if probe.returncode != 0:
            detail = probe.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["?"]
            return [_fail(name, f"lock probe failed: {detail[0]}", fix)]
        return [_ok(name, f"flock works across processes in {directory}")]
    except (OSError, subprocess.SubprocessError) as exc:
        return [_fail(name, f"lock test in {directory} failed: {exc}", fix)]
    finally:
        handle.close()
        with contextlib.suppress(OSError):
            path.unlink()


# ------------------------------------------------------------------ filesystem


# /proc/self/mounts, not /proc/mounts: systemd's ProcSubset=pid (the shipped
# unit sets it) hides /proc/mounts but keeps the process's own view readable.
def check_filesystem(workspace: Path, mounts_file: Path = Path("/proc/self/mounts")) -> list[Check]:
    name = "filesystem"
    try:
        mounts_text = mounts_file.read_text(errors="replace")
    except OSError as exc:
        return [
            _warn(name, f"cannot read {mounts_file}: {describe_error(exc, with_file=False)}", "")
        ]
    found = mount_of(workspace.resolve(), mounts_text)
    if found is None:
        return [_warn(name, f"no mount found for {workspace}", "")]
    point, fstype = found
    label = REMOTE_FILESYSTEMS.get(fstype)
    if label is None and fstype.startswith("fuse."):
        label = f"FUSE ({fstype})"
    if label is not None:
        return [
            _warn(
                name,
                f"{workspace} is on {fstype} ({label}, mounted at {point}): "
                "file events from other hosts/VMs are not delivered and locks may not work",
                "use a local disk or docker named volume; else set [watch] poll = true "
                "and run a single memd per workspace",
            )
        ]
    return [_ok(name, f"{fstype} at {point}")]


# ------------------------------------------------------------------- tokenizer


def check_tokenizer(encoding: str) -> list[Check]:
    name = "tokenizer"
    from memd.errors import MemdError

    try:
        from memd.tokenizer import TokenCounter

        started = time.perf_counter()
        counter = TokenCounter(encoding)
        sample = counter.count_text("memd doctor: hello, tokenizer")
        elapsed = time.perf_counter() - started
    except MemdError as exc:
        return [
            _fail(
                name,
                str(exc),
                "set [tokenizer] encoding to cl100k_base or o200k_base, or put the .tiktoken "
                "file in $TIKTOKEN_CACHE_DIR",
            )
        ]
    except Exception as exc:  # anything else from tiktoken: report, don't crash doctor
        return [_fail(name, f"tokenizer {encoding!r} failed: {exc}", "reinstall memd")]
    if sample <= 0:
        return [_fail(name, f"tokenizer {encoding!r} counted {sample} tokens", "reinstall memd")]
    return [_ok(name, f"{encoding} loaded offline in {elapsed * 1000:.0f} ms")]


@dataclass(frozen=True, slots=True)
class DeclaredWindows:
    """Every agent's ``memd-agent.json`` read once, as the daemon reads it: the
    windows memd uses, what it refuses or clamps (one line each), how many declare."""

    windows: dict[str, AgentWindow]
    problems: list[str]
    declared: int


def read_declared_windows(workspace: Path, agents: Iterable[str], encoding: str) -> DeclaredWindows:
    from memd.core.descriptor import DESCRIPTOR_NAME, DescriptorError
    from memd.descriptor import file_key, read_window

    def count_text(text: str) -> int:  # the tokenizer loaded only for a reserved text
        from memd.tokenizer import TokenCounter

        return TokenCounter(encoding).count_text(text)

    windows: dict[str, AgentWindow] = {}
    problems: list[str] = []
    declared = 0
    for agent in agents:
        folder = workspace / AGENTS_DIR / agent
        if file_key(folder) is None:
            continue
        declared += 1
        try:
            window = read_window(folder, count_text)[1]
        except DescriptorError as exc:
            problems.append(f"agent {agent!r}: {exc}: ignored, the config's window applies")
            continue
        except Exception as exc:  # the reserved text's count (tokenizer): report, never crash
            problems.append(f"agent {agent!r}: {DESCRIPTOR_NAME}: {describe_error(exc)}")
            continue
        if window is None:
            continue
        windows[agent] = window
        if window.clamped:
            problems.append(f"agent {agent!r}: {DESCRIPTOR_NAME}: {'; '.join(window.clamped)}")
    return DeclaredWindows(windows, problems, declared)


def _warn_agents(name: str, lines: list[str], fix: str) -> Check:
    """One warn line for many agents: the first named, how many more."""
    more = f" (+{len(lines) - 1} more agents)" if len(lines) > 1 else ""
    return _warn(name, lines[0] + more, fix)


def check_descriptors(
    workspace: Path,
    agents: Iterable[str],
    encoding: str,
    read: DeclaredWindows | None = None,
) -> list[Check]:
    """Each agent's ``memd-agent.json`` as the daemon reads it: one it refuses (or
    clamps) costs that agent its declared window, said only in the daemon's log
    and nowhere a one-shot command looks (status shows the config's window)."""
    name = "agent descriptors"
    from memd.core.descriptor import DESCRIPTOR_NAME

    if read is None:
        read = read_declared_windows(workspace, agents, encoding)
    if read.problems:
        fix = (
            f"fix or remove the agent's {DESCRIPTOR_NAME} (its framework writes it; "
            "memd-swarms does)"
        )
        return [_warn_agents(name, read.problems, fix)]
    if not read.declared:
        return [_ok(name, f"no agent declares its window ({DESCRIPTOR_NAME}): the config's apply")]
    return [
        _ok(name, f"{read.declared} agent(s) declare their window ({DESCRIPTOR_NAME}), all read")
    ]


def check_thresholds(
    config: MemdConfig,
    workspace: Path,
    agents: Iterable[str],
    read: DeclaredWindows | None = None,
) -> list[Check]:
    """Agents whose threshold no compaction can bring them under (a summary block
    alone needs more than its low-water mark leaves): compacted at every cooldown,
    over their threshold for good, and nothing else says why. Windows as the daemon
    resolves them: each agent's ``memd-agent.json`` (its reserved text counted; one
    memd refuses leaves the config's window, as in the daemon), ``[agents."glob"]``
    tables, models' windows from litellm's map."""
    name = "thresholds"
    from memd.core.config import resolve_policy
    from memd.core.plan import threshold_too_small
    from memd.modelinfo import context_length_for_model

    agents = list(agents)
    if read is None:
        read = read_declared_windows(workspace, agents, config.tokenizer.encoding)
    small: list[str] = []
    for agent in agents:
        window = read.windows.get(agent)
        why = threshold_too_small(resolve_policy(config, agent, context_length_for_model, window))
        if why:
            small.append(f"agent {agent!r}: {why}")
    if small:
        fix = (
            "give the agent a larger window or a higher [trigger] threshold / max_tokens, "
            "or reserve less of its window (a shorter system prompt, fewer tools)"
        )
        return [_warn_agents(name, small, fix)]
    return [_ok(name, "every agent's threshold leaves room for a summary")]


# ------------------------------------------------------------------ summarizer


def provider_of(model: str) -> str:
    if "/" in model:
        return model.split("/", 1)[0]
    lowered = model.lower()
    if lowered.startswith("claude"):
        return "anthropic"
    if lowered.startswith(("gpt-", "gpt4", "o1", "o3", "o4", "chatgpt", "text-")):
        return "openai"
    if lowered.startswith("gemini"):
        return "gemini"
    if lowered.startswith(("mistral", "codestral")):
        return "mistral"
    return ""


def endpoint_of(url: str) -> tuple[str, int] | None:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


Connector = Callable[[tuple[str, int], float], None]
# One real minimal request to the summarizer: seconds taken, or SummarizerError.
Prober = Callable[[SummarizerConfig], float]


def _tcp_connect(address: tuple[str, int], timeout: float) -> None:
    with socket.create_connection(address, timeout=timeout):
        pass


def check_summarizer(
    summarizer: SummarizerConfig,
    environ: Mapping[str, str],
    connect: Connector = _tcp_connect,
    probe: Prober | None = None,
    daemon_key_vars: tuple[str, ...] = (),
) -> list[Check]:
    """Key, endpoint reachability and, with ``probe``, a real 1-token request.

    ``daemon_key_vars``: the key variables the running daemon's environment
    holds (its pointer's, names only): a key there and not here is the daemon's
    (systemd's EnvironmentFile=), and this process cannot make the request."""
    name = "summarizer"
    model = summarizer.model
    if model == "builtin":
        return [_ok(name, "builtin extractive summarizer: offline, no key needed")]
    provider = provider_of(model)
    checks: list[Check] = []
    has_key = bool(summarizer.api_key.get_secret_value())
    key_vars = PROVIDER_KEY_VARS.get(provider, ())
    env_key = next((var for var in key_vars if environ.get(var)), None)
    daemon_key = next(
        (var for var in (*key_vars, "MEMD_SUMMARIZER_API_KEY") if var in daemon_key_vars), None
    )
    if has_key:
        checks.append(_ok(f"{name} key", f"{model}: api_key set in the config"))
    elif env_key:
        checks.append(_ok(f"{name} key", f"{model}: key from ${env_key}"))
    elif daemon_key:
        checks.append(_ok(f"{name} key", f"{model}: key from ${daemon_key} of the daemon"))
    elif provider in KEYLESS_PROVIDERS:
        checks.append(_ok(f"{name} key", f"{model}: local provider {provider!r}, no key needed"))
    elif summarizer.api_base:
        checks.append(
            _warn(
                f"{name} key",
                f"{model}: no api_key for {summarizer.api_base} (fine if that server needs none)",
                "set [summarizer] api_key or MEMD_SUMMARIZER_API_KEY",
            )
        )
    else:
        wanted = " or ".join(f"${var}" for var in key_vars) or "the provider's key env var"
        checks.append(
            _fail(
                f"{name} key",
                f"{model}: no API key found (summarizer.api_key, {wanted})",
                f"export {key_vars[0] if key_vars else 'MEMD_SUMMARIZER_API_KEY'}=... "
                '(systemd: EnvironmentFile=), or use model = "builtin"',
            )
        )
    base = summarizer.api_base or PROVIDER_DEFAULT_BASE.get(provider, "")
    if not base:
        checks.append(
            _warn(
                f"{name} endpoint",
                f"{model}: cannot tell which host provider {provider or '?'!r} uses",
                "set [summarizer] api_base to test reachability",
            )
        )
        return checks
    endpoint = endpoint_of(base)
    if endpoint is None:
        checks.append(
            _fail(
                f"{name} endpoint", f"api_base {base!r} is not a URL", "fix [summarizer] api_base"
            )
        )
        return checks
    started = time.perf_counter()
    try:
        connect(endpoint, CONNECT_TIMEOUT_S)
    except OSError as exc:
        reason = describe_error(exc, with_file=False)
        if isinstance(exc, TimeoutError):
            reason = f"timed out after {CONNECT_TIMEOUT_S:g}s"
        checks.append(
            _fail(
                f"{name} endpoint",
                f"{base} ({endpoint[0]}:{endpoint[1]}) unreachable: {reason}",
                "check the network, proxy and firewall (systemd: IPAddressDeny/RestrictAddress"
                "Families), or start the local model server",
            )
        )
        return checks
    elapsed = (time.perf_counter() - started) * 1000
    checks.append(_ok(f"{name} endpoint", f"{base} reachable (TCP connect {elapsed:.0f} ms)"))
    if probe is not None and daemon_key and not has_key and not env_key:
        checks.append(
            _warn(
                "summarizer request",
                f"{model}: not tried: the key is in the running daemon's environment, "
                "not in this command's",
                "run doctor with the daemon's environment (systemd: sudo sh -c 'set -a; "
                ". /etc/memd/memd.env; exec memd doctor -w WORKSPACE'), or --offline",
            )
        )
    elif probe is not None:
        checks.append(_request_check(summarizer, probe))
    return checks


def _request_check(summarizer: SummarizerConfig, probe: Prober) -> Check:
    from memd.errors import SummarizerError

    name = "summarizer request"
    try:
        seconds = probe(summarizer)
    except SummarizerError as exc:
        return _fail(
            name,
            f"{summarizer.model}: a 1-token request failed: {exc}",
            "check summarizer.model, api_base and the key; `memd doctor --offline` skips this",
        )
    return _ok(name, f"{summarizer.model} answered a 1-token request in {seconds * 1000:.0f} ms")


# ------------------------------------------------------------------- state dir


def check_state_dir(state_dir: Path, workspace: Path) -> list[Check]:
    from memd.fsutil import as_owner_of
    from memd.settings import state_dir_problem
    from memd.state import NewerStateDB, StateStore

    problem = state_dir_problem(state_dir)
    if problem is not None:
        # Every other command refuses it; the daemon would not start.
        return [
            _fail("state dir", problem, "name a folder (--state-dir, MEMD_STATE_DIR, state_dir)")
        ]
    try:
        # As the state dir's owner (the daemon's user, when root runs doctor):
        # the DB and lock it creates before the first start must be ones the
        # daemon can open, and the check then answers for that user.
        with as_owner_of(state_dir):
            store = StateStore.open(state_dir, workspace)
    except NewerStateDB as exc:
        return [_fail("state dir", str(exc), "run the newer memd that wrote it")]
    except ConfigError as exc:  # not memd's own (fsutil.ensure_private_dir)
        return [_fail("state dir", str(exc), f"give memd a state dir of its own: {state_dir}")]
    with store:
        if store.path is None:
            return [
                _fail(
                    "state dir",
                    store.warnings[-1],
                    f"make {state_dir} writable by memd's user, or pass --state-dir",
                )
            ]
        notes = "; ".join(store.warnings)
        if notes:
            return [_warn("state dir", notes, "none needed: the DB was rebuilt")]
        return [_ok("state dir", f"{store.path}")]


# ---------------------------------------------------------------- archive key


def check_archive_key(privacy: PrivacyConfig, workspace: Path | None = None) -> list[Check]:
    """``[privacy] encrypt_archives``: the master key file is there, valid, 0600, owned by
    memd's user and not a symlink out of its folder; with
    ``workspace``, every agent's encrypted archives open with its data key."""
    from memd.archive_crypto import ArchiveKeyError, key_file_problem, read_master_key

    name = "archive key"
    if not privacy.encrypt_archives:
        if privacy.key_file:
            return [_ok(name, f"encryption off; key file {privacy.key_file} set for memd archive")]
        return []
    path = Path(privacy.key_file).expanduser()
    try:
        key = read_master_key(path)
    except ArchiveKeyError as exc:
        return [
            _fail(
                name,
                str(exc),
                "restore the key file from its backup (archives written under it need it), "
                "or for a new workspace: memd archive keygen FILE",
            )
        ]
    problem = key_file_problem(path)
    if problem is not None:
        return [_fail(name, *problem)]
    checks = [
        _ok(
            name,
            f"{path} (key id {key.key_id}, mode 0600); keep a backup apart from the "
            "workspace: losing it loses every encrypted archive",
        )
    ]
    if workspace is not None and workspace.is_dir():
        checks += _check_data_keys(workspace, key)
    return checks


def _check_data_keys(workspace: Path, master: MasterKey) -> list[Check]:
    from memd.archive_crypto import sealed_archive_problem

    name = "archive data keys"
    sealed_agents = 0
    problems: list[str] = []
    for agent in list_agents(workspace):
        try:
            count, problem = sealed_archive_problem(agent_paths(workspace, agent), master)
        except (MemdError, OSError) as exc:
            count, problem = 1, f"agent {agent!r}: {describe_error(exc)}"
        sealed_agents += count > 0
        if problem is not None:
            problems.append(problem)
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        return [
            _fail(
                name,
                "; ".join(problems[:3]) + more,
                "restore the agent's .memd/archive.key from a backup of its folder, or the "
                "master key it was wrapped under; `memd forget AGENT --yes` drops what no "
                "key opens",
            )
        ]
    if not sealed_agents:
        return []
    return [_ok(name, f"{sealed_agents} agent(s) with encrypted archives; every one opens")]


# ------------------------------------------------------------------ redaction


def check_redaction(config: MemdConfig, state_dir: Path, workspace: Path) -> list[Check]:
    """What the summarizer receives (README "Privacy"); the workspace's redaction key."""
    from memd.core.privacy import Privacy, api_base_ignored_warning, unredacted_remote_warning
    from memd.errors import ConfigError, describe_error
    from memd.llm import litellm_provider
    from memd.redaction_key import key_path, process_key, read_key

    name = "redaction"
    routing: list[Check] = []
    ignored = api_base_ignored_warning(config, litellm_provider)
    if ignored is not None:
        routing.append(
            _warn(
                "summarizer api_base",
                ignored,
                "for a model server of your own, name the model with a provider that sends to "
                "api_base (openai/NAME for an OpenAI-compatible server, hosted_vllm/, ollama/), "
                "or drop api_base",
            )
        )
    warning = unredacted_remote_warning(config, litellm_provider)
    if warning is not None:
        return [
            *routing,
            _warn(
                name,
                warning,
                "set [privacy] redact = true (the default), or use a local summarizer",
            ),
        ]
    summarizer = config.summarizer
    outbound = Privacy(process_key(), config.privacy).outbound(
        summarizer.model, summarizer.api_base, litellm_provider
    )
    if outbound is None:
        what = f"summarizer {summarizer.model!r} is local: it receives turns as written"
    else:
        pii = " and personal data" if outbound.pii else ""
        what = (
            f"credentials{pii} are replaced by placeholders before {summarizer.model!r} sees them"
        )
    from memd.settings import state_dir_problem

    if state_dir_problem(state_dir) is not None:  # `fail state dir` says it
        return [*routing, _ok(name, f"{what}; key: no state dir to keep it in (see state dir)")]
    path = key_path(state_dir, workspace)
    try:
        read_key(path)
    except FileNotFoundError:
        return [*routing, _ok(name, f"{what}; key {path} is made at the first compaction")]
    except (OSError, ConfigError) as exc:
        return [
            *routing,
            _fail(
                name,
                f"{what}, but {describe_error(exc, with_file=False)}",
                f"chmod 600 {path} and chown it to memd's user, or remove it (placeholders "
                "then change once)",
            ),
        ]
    return [
        *routing,
        _ok(name, f"{what}; summaries never keep a credential; key {path} (0600)"),
    ]


# ------------------------------------------------------------------------- all


def run_checks(
    config: MemdConfig,
    workspace: Path,
    state_dir: Path,
    environ: Mapping[str, str] | None = None,
    *,
    offline: bool = False,
    pointer: StatePointer | None = None,
    own_overrides: tuple[str, ...] = (),
) -> list[Check]:
    """Every check; ``offline`` skips the summarizer's real request (no tokens spent).

    ``config`` is the running daemon's when ``pointer`` (its pointer, which the
    command followed) names one: what is checked is what the daemon uses."""
    env = os.environ if environ is None else environ
    # A workspace this uid cannot enter is check_workspace's `fail`, with its
    # fix; the checks that need to look inside it are skipped.
    usable = workspace.is_dir() and os.access(workspace, os.R_OK | os.X_OK)
    try:
        agents = list_agents(workspace) if usable else []
    except PermissionError:
        agents = []
    results: list[Check] = []
    if pointer is not None:
        results += check_daemon_settings(pointer, own_overrides)
    results += check_workspace(workspace)
    results += check_inotify(len(agents), config.watch.poll)
    if usable:
        results += check_filesystem(workspace)
        results += check_flock(workspace)
        results += check_journals(workspace, agents)
    results += check_state_dir(state_dir, workspace)
    results += check_tokenizer(config.tokenizer.encoding)
    if agents:
        # Each descriptor read (its reserved text tokenized) once for both checks.
        declared = read_declared_windows(workspace, agents, config.tokenizer.encoding)
        results += check_descriptors(workspace, agents, config.tokenizer.encoding, declared)
        results += check_thresholds(config, workspace, agents, declared)
    results += check_archive_key(config.privacy, workspace)
    results += check_redaction(config, state_dir, workspace)
    probe: Prober | None = None
    if not offline and config.summarizer.model != "builtin":
        from memd.llm import probe as real_probe

        probe = real_probe
    daemon_keys = pointer.key_vars if pointer is not None else ()
    results += check_summarizer(config.summarizer, env, probe=probe, daemon_key_vars=daemon_keys)
    return results


def check_daemon_settings(
    pointer: StatePointer, own_overrides: tuple[str, ...] = ()
) -> list[Check]:
    """Which settings are checked: the daemon's, as its pointer names them (and
    this command's own ``MEMD_*`` variables, which win)."""
    config = f"config {pointer.config}" if pointer.config else "no config file"
    applied = sorted(
        f"{section}.{key}" for section, keys in pointer.settings.items() for key in keys
    )
    extra = f", with {', '.join(applied)} as it set them" if applied else ""
    message = f"the daemon's (its pointer {pointer.path}): {config}{extra}"
    if own_overrides:
        return [
            _warn(
                "settings",
                f"{message}; but this command's {', '.join(own_overrides)} win",
                "unset them to check exactly the daemon's settings",
            )
        ]
    return [_ok("settings", message)]


def worst(checks: Iterable[Check]) -> Status:
    statuses = {check.status for check in checks}
    if "fail" in statuses:
        return "fail"
    return "warn" if "warn" in statuses else "ok"


__all__ = [
    "Check",
    "check_archive_key",
    "check_daemon_settings",
    "check_filesystem",
    "check_flock",
    "check_inotify",
    "check_redaction",
    "check_state_dir",
    "check_summarizer",
    "check_tokenizer",
    "check_workspace",
    "endpoint_of",
    "mount_of",
    "provider_of",
    "run_checks",
    "worst",
]
