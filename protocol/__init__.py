"""eurekamem's wire protocol, sans-IO: records, params, the JSON-RPC envelope and the framings.

Both the daemon and the client import it; it does no I/O and imports no event loop.
See PROTOCOL.md beside this file for the description meant for other languages.
"""

from ._connection import (
    ALL_TIERS,
    ORDERING_KEYS,
    OUTBOUND_LIMIT,
    ConnectionLimits,
    RateLimiter,
    ServerConnection,
    ordering_key,
)
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
from ._methods import *  # noqa: F401,F403  (params Structs)
from ._methods import METHODS, RELATIONS, MethodSpec, TheoryState
from ._records import (
    MEMORY_CATEGORIES,
    SKILL_SOURCES,
    SKILL_STATUSES,
    CrossRunRecord,
    Edge,
    EpisodicEntry,
    KnowledgeNode,
    Memory,
    Skill,
    new_id,
    normalize_timestamp,
    now_rfc3339,
)

PROTOCOL_VERSION = 1

__all__ = [
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
    "Failure",
    "FrameTooLarge",
    "Incoming",
    "KIND_BY_CODE",
    "KnowledgeNode",
    "METHODS",
    "MEMORY_CATEGORIES",
    "Memory",
    "MethodSpec",
    "NdjsonDecoder",
    "ORDERING_KEYS",
    "OUTBOUND_LIMIT",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "RELATIONS",
    "RateLimiter",
    "Rejected",
    "Request",
    "SKILL_SOURCES",
    "SKILL_STATUSES",
    "Skill",
    "ServerConnection",
    "Success",
    "TheoryState",
    "decoder_for_first_byte",
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
