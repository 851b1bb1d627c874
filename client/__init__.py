"""eurekamem's thin clients: a blocking `Client`, an `AsyncClient` (asyncio and trio),
`MemoryManager`, a drop-in for EurekaClaw's class of that name, and `ConversationMemory` /
`AsyncConversationMemory`, an agent loop's conversation memory (turns in, the block to inject
before each model call, extraction on flush).

Only the standard library, msgspec and eurekamem.protocol are imported: neither trio nor the daemon.

    from eurekamem.client import Client
    with Client() as c:                       # socket: default_socket_path()
        c.remember("lemma:7", {"status": "proved"}, tags=["lemma"])
        c.recall("lemma:7").value

Errors are raised as one exception class per contract kind (NotFound, InvalidParams, ...), all
subclasses of EurekamemError; ConnectionLost when the socket breaks or cannot be reached.
"""

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
from ._manager import MemoryManager
from ._paths import (
    ConfigFileError,
    data_root,
    default_config_path,
    default_socket_path,
    eurekaclaw_dir,
    resolve_locations,
    root_socket_path,
)
from ._sync import Client

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
    "resolve_locations",
]
