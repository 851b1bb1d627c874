"""eurekamem's thin clients: a blocking `Client`, an `AsyncClient` (asyncio and trio),
`MemoryManager`, a drop-in for EurekaClaw's class of that name, and `ConversationMemory` /
`AsyncConversationMemory`, an agent loop's conversation memory (turns in, the block to inject
before each model call, extraction on flush); and `LineClient`, a blocking NDJSON client of the
standard library alone, for processes that start, make a call or two and exit (the CLI, hooks).

Only the standard library, msgspec and eurekamem.protocol are imported: neither trio nor the daemon.

    from eurekamem.client import Client
    with Client() as c:                       # socket: default_socket_path()
        c.remember("lemma:7", {"status": "proved"}, tags=["lemma"])
        c.recall("lemma:7").value

Errors are raised as one exception class per contract kind (NotFound, InvalidParams, ...), all
subclasses of EurekamemError; ConnectionLost when the socket breaks or cannot be reached.

Rule kept here: importing the package costs nothing; a name is imported from its module on first use
(PEP 562's module __getattr__), so `from eurekamem.client import Client` loads the blocking client and
what it needs, not the async client, the drop-in MemoryManager or the protocol's records. _LAZY says
where each name lives, the block under TYPE_CHECKING says the same to the type checker
(tests/test_client_unit.py checks that the two agree).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (a client command's start)

# module -> the names it gives the package (in step with the TYPE_CHECKING block below)
_LAZY = {
    "..protocol": (
        "CrossRunRecord EpisodicEntry GraphStats Injection Job KnowledgeNode Link Memory MemoryAddResult "
        "MemoryDeleted MemoryFeedbackResult MemoryHit MemoryPage Promotion ReviewView SearchWhy Skill "
        "SkillHit SkillsInjection"
    ),
    "._async": "AsyncClient current_async_library",
    "._autostart": "daemon_answers",
    "._conversation": "AsyncConversationMemory ConversationMemory",
    "._errors": (
        "ConnectionLost EurekamemError InternalError InvalidParams InvalidRequest MethodNotFound NotFound "
        "Overloaded ParseError ReadOnly Timeout TooLarge Unavailable error_from_wire"
    ),
    "._line": "LineClient",
    "._manager": "MemoryManager",
    "._paths": (
        "ConfigFileError data_root default_config_path default_socket_path eurekaclaw_dir resolve_locations "
        "root_socket_path lock_text read_lock recorded_socket find_socket"
    ),
    "._sync": "Client",
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names.split()}

if TYPE_CHECKING:
    from typing import Any

    from ..protocol import (
        CrossRunRecord,
        EpisodicEntry,
        GraphStats,
        Injection,
        Job,
        KnowledgeNode,
        Link,
        Memory,
        MemoryAddResult,
        MemoryDeleted,
        MemoryFeedbackResult,
        MemoryHit,
        MemoryPage,
        Promotion,
        ReviewView,
        SearchWhy,
        Skill,
        SkillHit,
        SkillsInjection,
    )
    from ._async import AsyncClient, current_async_library
    from ._autostart import daemon_answers
    from ._conversation import AsyncConversationMemory, ConversationMemory
    from ._errors import (
        ConnectionLost,
        EurekamemError,
        InternalError,
        InvalidParams,
        InvalidRequest,
        MethodNotFound,
        NotFound,
        Overloaded,
        ParseError,
        ReadOnly,
        Timeout,
        TooLarge,
        Unavailable,
        error_from_wire,
    )
    from ._line import LineClient
    from ._manager import MemoryManager
    from ._paths import (
        ConfigFileError,
        data_root,
        default_config_path,
        default_socket_path,
        eurekaclaw_dir,
        find_socket,
        lock_text,
        read_lock,
        recorded_socket,
        resolve_locations,
        root_socket_path,
    )
    from ._sync import Client


def __getattr__(name: str) -> Any:
    """A name of the package, imported from its module now and kept (the next lookup is a plain one)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    level = len(module) - len(module.lstrip("."))  # __import__, not importlib: -X importtime reports only it
    value = getattr(__import__(module[level:], globals(), None, [name], level), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "daemon_answers",
    "eurekaclaw_dir",
    "root_socket_path",
    "AsyncClient",
    "AsyncConversationMemory",
    "Client",
    "ConfigFileError",
    "ConnectionLost",
    "ConversationMemory",
    "CrossRunRecord",
    "EpisodicEntry",
    "EurekamemError",
    "GraphStats",
    "Injection",
    "InternalError",
    "InvalidParams",
    "InvalidRequest",
    "Job",
    "LineClient",
    "KnowledgeNode",
    "Link",
    "Memory",
    "MemoryAddResult",
    "MemoryDeleted",
    "MemoryFeedbackResult",
    "MemoryHit",
    "MemoryPage",
    "MemoryManager",
    "MethodNotFound",
    "NotFound",
    "Overloaded",
    "ParseError",
    "Promotion",
    "ReadOnly",
    "ReviewView",
    "SearchWhy",
    "Skill",
    "SkillHit",
    "SkillsInjection",
    "Timeout",
    "TooLarge",
    "Unavailable",
    "current_async_library",
    "data_root",
    "default_config_path",
    "default_socket_path",
    "error_from_wire",
    "find_socket",
    "lock_text",
    "read_lock",
    "recorded_socket",
    "resolve_locations",
]
