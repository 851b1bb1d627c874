"""eurekaclaw.types.artifacts: the research brief and the TheoryState (the fields the daemon reads, and some it does not)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class ResearchBrief(BaseModel):
    session_id: str
    input_mode: Literal["detailed", "reference", "exploration"]
    domain: str
    query: str
    conjecture: str | None = None
    selected_skills: list[str] = Field(default_factory=list)
    created_at: datetime = Field(default_factory=datetime.utcnow)
    updated_at: datetime = Field(default_factory=datetime.utcnow)


class LemmaNode(BaseModel):
    lemma_id: str
    statement: str
    informal: str = ""
    dependencies: list[str] = Field(default_factory=list)
    verified: bool | None = None
    confidence_score: float | None = None
    verification_method: str | None = None


class ProofRecord(BaseModel):
    lemma_id: str
    proof_text: str
    lean4_proof: str = ""
    coq_proof: str = ""
    verification_method: Literal["lean4", "coq", "peer_review", "llm_check", "auto_high_confidence"] = "llm_check"
    verified: bool = False
    verifier_notes: str = ""
    proved_at: datetime = Field(default_factory=datetime.utcnow)


class FailedAttempt(BaseModel):
    lemma_id: str
    attempt_text: str
    failure_reason: str
    iteration: int
    timestamp: datetime = Field(default_factory=datetime.utcnow)


class TheoryState(BaseModel):
    session_id: str
    theorem_id: str
    informal_statement: str = ""
    formal_statement: str = ""
    memory_theorems: list[str] = Field(default_factory=list)
    lemma_dag: dict[str, LemmaNode] = Field(default_factory=dict)
    proven_lemmas: dict[str, ProofRecord] = Field(default_factory=dict)
    open_goals: list[str] = Field(default_factory=list)
    failed_attempts: list[FailedAttempt] = Field(default_factory=list)
    iteration: int = 0
    status: Literal["pending", "in_progress", "proved", "refuted", "abandoned"] = "pending"
    updated_at: datetime = Field(default_factory=datetime.utcnow)
