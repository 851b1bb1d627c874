"""eurekaclaw.types.memory: the three tier records (pydantic, as EurekaClaw's)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field


class EpisodicEntry(BaseModel):
    entry_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    session_id: str
    agent_role: str
    content: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    timestamp: datetime = Field(default_factory=datetime.utcnow)


class CrossRunRecord(BaseModel):
    record_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    key: str
    value: Any
    tags: list[str] = Field(default_factory=list)
    source_session: str = ""
    created_at: datetime = Field(default_factory=datetime.utcnow)
    updated_at: datetime = Field(default_factory=lambda: datetime.now().astimezone())


class KnowledgeNode(BaseModel):
    node_id: str = Field(default_factory=lambda: str(uuid.uuid4()))
    theorem_name: str
    formal_statement: str
    domain: str = ""
    session_id: str = ""
    tags: list[str] = Field(default_factory=list)
    created_at: datetime = Field(default_factory=datetime.utcnow)
