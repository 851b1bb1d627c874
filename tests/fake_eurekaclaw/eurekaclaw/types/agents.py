"""eurekaclaw.types.agents: AgentRole and AgentResult."""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, Field


class AgentRole(str, Enum):  # noqa: UP042 (as EurekaClaw declares it: str() differs from a StrEnum's)
    SURVEY = "survey"
    IDEATION = "ideation"
    THEORY = "theory"
    EXPERIMENT = "experiment"
    WRITER = "writer"
    ORCHESTRATOR = "orchestrator"


class AgentResult(BaseModel):
    task_id: str
    agent_role: AgentRole
    success: bool
    output: dict[str, Any] = Field(default_factory=dict)
    text_summary: str = ""
