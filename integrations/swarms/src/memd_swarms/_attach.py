"""``attach(agent) -> agent``: one call wires a Swarms agent to memd."""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from memd_swarms._descriptor import DESCRIPTOR_NAME, descriptor_for, write_descriptor
from memd_swarms._probe import (
    Delivery,
    UnsupportedSwarms,
    probe_delivery,
    swarms_version,
    unsupported,
)
from memd_swarms._recall import (
    PRELOAD_NOTICE,
    RecallUnavailable,
    add_recall_tool,
    socket_path,
    status,
)
from memd_swarms._wiring import HOLD_S, ROW_TAG, Wiring, static_prefix_length, wrap_run

log = logging.getLogger("memd_swarms")

__version__ = "0.1.0"

AgentT = TypeVar("AgentT")
WIRING_ATTRIBUTE = "_memd_swarms"


class AttachError(ValueError):
    """The agent is configured in a way memd cannot keep inside its window."""


def attach(
    agent: AgentT, *, descriptor: bool = True, recall: bool = False, hold_s: float = HOLD_S
) -> AgentT:
    """Wire ``agent`` (a ``swarms.Agent`` with ``persistent_memory=True``) to memd.

    - The MEMORY.md Swarms preloaded reaches the model on the next request, as
      system context, exactly once; nothing is written back into MEMORY.md.
    - When memd re-seeds MEMORY.md (a new inode), the working context is rebuilt
      from the new file at the start of the next ``run``: with the turns memd's
      drain moves there from the old file (waited for up to 2 s, else the first
      run after the drain is rebuilt again; never read from the old file), and
      with a tool call the model has not answered yet, and its results, after
      the memory. So is a MEMORY.md rewritten in place (it no longer starts
      with the bytes loaded from it, or what follows them is not the entries
      Swarms appended since), and one another writer appended entries to. A
      MEMORY.md that is not a regular file in the agent's folder is not
      loaded: the agent runs on as Swarms alone would (one warning).
    - Before each ``run``, and before each model request of a run after its
      first (``max_loops`` over 1, a tool loop), while memd's count of MEMORY.md
      is over the agent's threshold and memd is to compact it (also when a
      cooldown of memd's ends with a compaction within the wait), the run waits
      for the re-seed (at most ``hold_s`` seconds; 0: never), so an agent that
      writes turns faster than memd compacts still sends requests within the
      threshold; a re-seed inside a run keeps the run's task and its turns memd
      kept verbatim as turns. memd says where the file stands over its recall socket; without
      it, nothing waits.
    - ``descriptor=True`` writes ``memd-agent.json`` beside MEMORY.md: the model,
      its context length and the text sent beside the memory in every request,
      from which memd derives this agent's threshold.
    - ``recall=True`` adds the tool ``recall_memory(query, limit=5)``: the model
      can search the raw turns memd archived behind its summary (through the
      daemon's recall socket, which serves only the agent's own uid), and the
      preload tells it so.

    - The copies swarms builds of the agent (``PhasedFanOutWorkflow``'s fresh
      agent per use: ``type(agent)(**config)``) are attached as it was.

    Returns the same agent (its class now a subclass of its own that attaches
    the agents it builds). Attaching twice is harmless. Raises AttachError for
    an agent memd cannot serve (no persistent memory, Swarms' own compression
    on, ``transforms=``, ``max_loops="auto"``) and UnsupportedSwarms when the
    installed swarms is not one it knows.
    """
    attached = getattr(agent, WIRING_ATTRIBUTE, None)
    if attached is not None:
        if recall:
            _enable_recall(agent, attached)
        return agent
    conversation = _conversation_of(agent)
    name = str(getattr(agent, "agent_name", "agent"))
    if isinstance(hold_s, bool) or not isinstance(hold_s, (int, float)) or not 0 <= hold_s < 1e9:
        # NaN compares false with everything: a wait bounded by it is unbounded.
        raise AttachError(f"hold_s={hold_s!r}: give a number of seconds, 0 or more (0: never)")
    memory_path = getattr(conversation, "memory_md_path", None)
    if not memory_path:
        raise AttachError(
            f"agent {name!r} has no MEMORY.md: construct it with persistent_memory=True"
        )
    if getattr(agent, "context_compression", False):
        raise AttachError(
            f"agent {name!r} has context_compression=True: Swarms would rewrite MEMORY.md "
            "itself; construct it with context_compression=False and let memd compact"
        )
    if getattr(agent, "max_loops", None) == "auto":
        raise AttachError(
            f"agent {name!r} has max_loops='auto': Swarms' autonomous loop builds its "
            "requests from a transcript of its own, without the agent's memory; give it "
            "a number of loops"
        )
    if getattr(agent, "transforms", None) is not None:
        raise AttachError(
            f"agent {name!r} uses transforms=...: its requests are not built from the "
            "conversation memd_swarms delivers the memory through"
        )
    if getattr(agent, "messages", None):
        log.warning(
            "memd_swarms: agent %r was given messages=...; Swarms writes them into "
            "MEMORY.md at every construction, so they pile up across restarts",
            name,
        )

    delivery = probe_delivery(type(conversation), name)
    if delivery is Delivery.NATIVE:
        log.info(
            "memd_swarms: swarms %s already sends its MEMORY.md preload; leaving agent %r as it is",
            swarms_version(),
            name,
        )
    else:
        wiring = Wiring(
            conversation=conversation,
            memory_path=str(memory_path),
            static_rows=static_prefix_length(conversation),
            notice=PRELOAD_NOTICE if recall else "",
            status=status_source(str(memory_path)),
            hold_s=hold_s,
        )
        # Swarms' own preload row (and any rows since, all in the file) give way
        # to one read together with the file's identity.
        try:
            wiring.rebuild()
        except OSError as exc:  # the agent goes on as Swarms alone would; retried each run
            wiring.refused(exc)
        _check_delivered(conversation, name)
        wrap_run(agent, wiring)
        setattr(agent, WIRING_ATTRIBUTE, wiring)
    if recall:
        add_recall_tool(agent, str(memory_path))
    if descriptor:
        writer = f"memd-swarms {__version__} (swarms {swarms_version()})"
        write_descriptor(os.path.dirname(str(memory_path)), descriptor_for(agent, writer))
    _attach_copies(agent, name, descriptor=descriptor, recall=recall, hold_s=hold_s)
    return agent


#: Set on the classes ``_attach_copies`` makes: the agents they build attach themselves.
_COPIES_ATTACHED = "_memd_swarms_copies_attached"
_copying_classes: dict[tuple[type[Any], bool, bool, float], type[Any]] = {}
_copying_lock = threading.Lock()


def _attach_copies(agent: Any, name: str, *, descriptor: bool, recall: bool, hold_s: float) -> None:
    """Make the agents swarms builds as copies of ``agent`` attached too.

    swarms 16.0.3's ``PhasedFanOutWorkflow`` runs a fresh copy of each agent (and
    of its lead) for every use: ``type(agent)(**config)``, the constructor's
    arguments read back from the agent (``fresh_agent``). Such a copy loads the
    same MEMORY.md and writes its turns there, but without attach its requests
    never carry the memory. So the agent's class becomes a subclass of its own
    (same name, same constructor signature) whose constructor attaches what it
    builds, as this agent was (without rewriting memd-agent.json: the copy's
    configuration is the agent's; a copy whose MEMORY.md has none, another
    ``agent_name``'s, writes its own unless the agent was attached with
    ``descriptor=False``). An agent whose class cannot be changed (or
    refuses a subclass: its ``__init_subclass__``) is said once: its copies run
    without memd's memory. (A deep copy is none of
    this: a swarms Agent holds locks, so ``copy.deepcopy`` fails and swarms'
    ``AgentRearrange`` runs the agent itself.)
    """
    base = type(agent)
    if getattr(base, _COPIES_ATTACHED, False):
        return
    key = (base, descriptor, recall, float(hold_s))
    try:
        with _copying_lock:
            copying = _copying_classes.get(key)
            if copying is None:
                # The class's own __init_subclass__ runs here, and may refuse (a
                # registry of its subclasses by name): attach is done by now.
                copying = _copying_class(base, descriptor=descriptor, recall=recall, hold_s=hold_s)
                _copying_classes[key] = copying
        agent.__class__ = copying
    except Exception as exc:  # a TypeError from __class__, or whatever the class raises
        log.warning(
            "memd_swarms: agent %r: the copies swarms builds of it (PhasedFanOutWorkflow "
            "runs one per use) are not attached and run without memd's memory (%s)",
            name,
            exc,
        )


def _copying_class(base: type[Any], *, descriptor: bool, recall: bool, hold_s: float) -> type[Any]:
    """A subclass of ``base`` whose constructor attaches each agent it builds."""
    init = base.__init__

    @functools.wraps(init)  # inspect.signature (swarms' fresh_agent) sees base's
    def init_and_attach(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        try:
            attach(self, descriptor=descriptor and _undescribed(self), recall=recall, hold_s=hold_s)
        except (AttachError, UnsupportedSwarms) as exc:  # a copy must not fail swarms' run
            log.warning(
                "memd_swarms: a copy swarms built of agent %r is not attached: %s",
                getattr(self, "agent_name", "agent"),
                exc,
            )
        except OSError as exc:  # its memd-agent.json (a full disk): attached all the same
            log.warning(
                "memd_swarms: a copy swarms built of agent %r: %s",
                getattr(self, "agent_name", "agent"),
                exc,
            )

    namespace = {
        "__init__": init_and_attach,
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        _COPIES_ATTACHED: True,
    }
    return type(base.__name__, (base,), namespace)


def _undescribed(agent: Any) -> bool:
    """Whether the agent's MEMORY.md has no memd-agent.json beside it (a copy with
    another ``agent_name`` than the agent it was built from has its own folder)."""
    path = getattr(getattr(agent, "short_memory", None), "memory_md_path", None)
    if not path:
        return False
    return not os.path.lexists(os.path.join(os.path.dirname(str(path)), DESCRIPTOR_NAME))


def status_source(memory_path: str) -> Callable[[], dict[str, Any] | None]:
    """Asks memd's daemon where this MEMORY.md stands (None: it cannot say). The
    memd agent is the file's folder, the workspace two levels up."""
    folder = Path(memory_path).parent
    name, path = folder.name, socket_path(folder.parent.parent)

    def ask_status() -> dict[str, Any] | None:
        try:
            return status(name, path=path)
        except RecallUnavailable as exc:
            log.debug("memd_swarms: no status from memd: %s", exc)
            return None

    return ask_status


def _enable_recall(agent: Any, wiring: Wiring) -> None:
    """``attach(agent, recall=True)`` on an agent attached without recall."""
    if add_recall_tool(agent, wiring.memory_path) and not wiring.notice:
        wiring.notice = PRELOAD_NOTICE
        try:
            wiring.rebuild()
        except OSError as exc:
            wiring.refused(exc)


def _conversation_of(agent: Any) -> Any:
    conversation = getattr(agent, "short_memory", None)
    history = getattr(conversation, "conversation_history", None)
    if not isinstance(history, list) or not callable(getattr(conversation, "to_messages", None)):
        raise unsupported("has an Agent without short_memory.conversation_history/to_messages")
    if not callable(getattr(agent, "run", None)):
        raise unsupported("has an Agent without run()")
    return conversation


def _check_delivered(conversation: Any, name: str) -> None:
    """The rebuilt history must put the preload into the request exactly once."""
    history: list[dict[str, Any]] = conversation.conversation_history
    preload = [row for row in history if row.get(ROW_TAG) == "preload"]
    if not preload:
        return  # MEMORY.md holds no entry yet: nothing to deliver
    sent = conversation.to_messages(name, 0, ())
    content = preload[0]["content"]
    if sum(message.get("content") == content for message in sent) != 1:
        raise unsupported("does not send a chat-form system row from its history")
