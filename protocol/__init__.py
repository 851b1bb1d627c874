"""eurekamem's wire protocol, sans-IO: records, params, the JSON-RPC envelope and the framings.

Both the daemon and the client import it; it does no I/O and imports no event loop.
See PROTOCOL.md beside this file for the description meant for other languages.

Rule kept here: importing the package costs nothing; each name is imported from its module on first
use (PEP 562's module __getattr__), so a client that only frames requests (`eurekamem call`) never
pays for the records, the params Structs or the server's connection. _LAZY says where each name
lives, the block under TYPE_CHECKING says the same to the type checker (tests/test_client_unit.py
checks that the two agree), and any other public name of methods.py is found there, as the
`from .methods import *` this replaces found it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing at run time (a client command's start)

PROTOCOL_VERSION = 1

# module -> the names it gives the package (in step with the TYPE_CHECKING block below)
_LAZY = {
    "._connection": "ALL_TIERS ORDERING_KEYS OUTBOUND_LIMIT ConnectionLimits RateLimiter ServerConnection ordering_key",
    "._describe": "method_help",
    "._envelope": "Call Codec Failure Incoming Rejected Request Success failure framing_error_line success",
    "._errors": "ERROR_CODES KIND_BY_CODE ProtocolError",
    "._framing": "DEFAULT_MAX_FRAME_BYTES BinaryDecoder FrameTooLarge NdjsonDecoder decoder_for_first_byte frame_binary frame_ndjson",
    "._records": (
        "JOB_STATES REVIEW_KINDS SKILL_SOURCES SKILL_STATUSES CrossRunRecord Edge EpisodicEntry GraphStats "
        "InjectedMessage Injection Job JobTokens KnowledgeNode Link Memory MemoryAddResult MemoryDeleted "
        "MemoryFeedbackResult MemoryHit MemoryPage MemoryVersion Promotion Record ReviewItem ReviewView SearchWhy Skill "
        "SkillHit SkillsInjection new_id normalize_timestamp now_rfc3339"
    ),
    ".categories": (
        "ASSISTANT_CATEGORIES MEMORY_CATEGORIES RESEARCH_CATEGORIES AssistantCategory MemoryCategory ResearchCategory"
    ),
    ".methods": "METHODS RELATIONS FailedAttempt LemmaNode MethodSpec ProofRecord TheoryState",
    ".readable": "domain_slug",
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names.split()}
_SUBMODULES = frozenset({"blocks", "categories", "methods", "readable"})  # `from ..protocol import blocks` imports just that

if TYPE_CHECKING:
    from typing import Any

    from ._connection import (
        ALL_TIERS,
        ORDERING_KEYS,
        OUTBOUND_LIMIT,
        ConnectionLimits,
        RateLimiter,
        ServerConnection,
        ordering_key,
    )
    from ._describe import method_help
    from ._envelope import (
        Call,
        Codec,
        Failure,
        Incoming,
        Rejected,
        Request,
        Success,
        failure,
        framing_error_line,
        success,
    )
    from ._errors import ERROR_CODES, KIND_BY_CODE, ProtocolError
    from ._framing import (
        DEFAULT_MAX_FRAME_BYTES,
        BinaryDecoder,
        FrameTooLarge,
        NdjsonDecoder,
        decoder_for_first_byte,
        frame_binary,
        frame_ndjson,
    )
    from ._records import (
        JOB_STATES,
        REVIEW_KINDS,
        SKILL_SOURCES,
        SKILL_STATUSES,
        CrossRunRecord,
        Edge,
        EpisodicEntry,
        GraphStats,
        InjectedMessage,
        Injection,
        Job,
        JobTokens,
        KnowledgeNode,
        Link,
        Memory,
        MemoryAddResult,
        MemoryDeleted,
        MemoryFeedbackResult,
        MemoryHit,
        MemoryPage,
        MemoryVersion,
        Promotion,
        Record,
        ReviewItem,
        ReviewView,
        SearchWhy,
        Skill,
        SkillHit,
        SkillsInjection,
        new_id,
        normalize_timestamp,
        now_rfc3339,
    )
    from .categories import (
        ASSISTANT_CATEGORIES,
        MEMORY_CATEGORIES,
        RESEARCH_CATEGORIES,
        AssistantCategory,
        MemoryCategory,
        ResearchCategory,
    )
    from .methods import *  # noqa: F401,F403  (params Structs)
    from .methods import METHODS, RELATIONS, FailedAttempt, LemmaNode, MethodSpec, ProofRecord, TheoryState
    from .readable import domain_slug


def __getattr__(name: str) -> Any:
    """A name of the package, imported from its module now and kept (the next lookup is a plain one)."""
    module = _WHERE.get(name)
    if module is None and (name.startswith("_") or name in _SUBMODULES):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # else one of methods.py's params Structs and constants (what its `import *` gave the package);
    # __import__, not importlib.import_module: `python -X importtime` reports only the former
    source = __import__((module or ".methods").lstrip("."), globals(), None, [name], 1)
    try:
        value = getattr(source, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "method_help",
    "ASSISTANT_CATEGORIES",
    "AssistantCategory",
    "MemoryCategory",
    "RESEARCH_CATEGORIES",
    "ResearchCategory",
    "ALL_TIERS",
    "BinaryDecoder",
    "Call",
    "Codec",
    "ConnectionLimits",
    "CrossRunRecord",
    "DEFAULT_MAX_FRAME_BYTES",
    "ERROR_CODES",
    "Edge",
    "EpisodicEntry",
    "FailedAttempt",
    "Failure",
    "FrameTooLarge",
    "GraphStats",
    "InjectedMessage",
    "Injection",
    "Link",
    "MemoryAddResult",
    "MemoryDeleted",
    "MemoryFeedbackResult",
    "MemoryHit",
    "MemoryPage",
    "Record",
    "SearchWhy",
    "SkillHit",
    "SkillsInjection",
    "Incoming",
    "JOB_STATES",
    "Job",
    "JobTokens",
    "KIND_BY_CODE",
    "KnowledgeNode",
    "LemmaNode",
    "METHODS",
    "MEMORY_CATEGORIES",
    "Memory",
    "MemoryVersion",
    "MethodSpec",
    "NdjsonDecoder",
    "ORDERING_KEYS",
    "OUTBOUND_LIMIT",
    "PROTOCOL_VERSION",
    "ProofRecord",
    "ProtocolError",
    "RELATIONS",
    "REVIEW_KINDS",
    "RateLimiter",
    "Rejected",
    "Promotion",
    "ReviewItem",
    "ReviewView",
    "Request",
    "SKILL_SOURCES",
    "SKILL_STATUSES",
    "Skill",
    "ServerConnection",
    "Success",
    "TheoryState",
    "decoder_for_first_byte",
    "domain_slug",
    "failure",
    "frame_binary",
    "frame_ndjson",
    "framing_error_line",
    "new_id",
    "normalize_timestamp",
    "now_rfc3339",
    "ordering_key",
    "success",
]
