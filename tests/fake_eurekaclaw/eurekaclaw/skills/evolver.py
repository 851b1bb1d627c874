"""eurekaclaw.skills.evolver.SkillEvolver: distills a skill from the session's failures (the stand-in
writes one fixed skill per session instead of asking an LLM) and upserts it into the registry."""

from __future__ import annotations

from datetime import datetime

from eurekaclaw.llm import LLMClient
from eurekaclaw.skills.registry import SkillRegistry
from eurekaclaw.types.artifacts import FailedAttempt, ProofRecord
from eurekaclaw.types.skills import SkillMeta, SkillRecord


class SkillEvolver:
    def __init__(self, registry: SkillRegistry, client: LLMClient | None = None) -> None:
        self.registry = registry
        self.client = client

    async def distill_from_session(
        self, session_id: str, failures: list[FailedAttempt], successes: list[ProofRecord]
    ) -> list[SkillRecord]:
        meta = SkillMeta(
            name=f"check_the_variance_{session_id[:8]}",
            tags=["concentration"],
            agent_roles=["theory"],
            pipeline_stages=["proof_attempt"],
            description="Check the variance before reaching for Bernstein",
            source="distilled",
            created_at=datetime.now().astimezone(),
        )
        reasons = sorted({f.failure_reason for f in failures})
        record = SkillRecord(meta=meta, content="# Check the variance\n\nFailed before: " + "; ".join(reasons))
        self.registry.upsert(record)
        return [record]
