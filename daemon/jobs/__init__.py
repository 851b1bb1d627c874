"""The durable job queue (the learning loop's LLM work) and its job kinds.

state.py holds the journaled records and the one-record commit's shape; actor.py the actor that
schedules and runs jobs and commits their results exactly once (the rules are atop each module).
"""

from typing import Any

from .actor import JobContext, JobKind, JobsActor, LLMHandle
from .outcome import JobFailed, Outcome
from .state import ConversationInput, JobRecord, JobsState, MaintainInput, SessionInput

__all__ = [
    "ConversationInput",
    "JobContext",
    "JobFailed",
    "JobKind",
    "JobRecord",
    "JobsActor",
    "JobsState",
    "LLMHandle",
    "MaintainInput",
    "Outcome",
    "SessionInput",
    "default_kinds",
]


def default_kinds(conversation_token_budget: int) -> dict[str, Any]:
    """The job kinds the daemon runs (the budget: Config.conversation_extract_token_budget)."""
    from ..memory.maintenance import MemoryMaintenance
    from .conversation import ConversationExtraction
    from .extract import SessionExtraction

    conversation = ConversationExtraction(conversation_token_budget)
    return {
        SessionExtraction.kind: SessionExtraction(),
        MemoryMaintenance.kind: MemoryMaintenance(),
        conversation.kind: conversation,
    }
