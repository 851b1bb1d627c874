"""eurekaclaw.learning.loop.ContinualLearningLoop: post_run as EurekaClaw's (skill stats, distillation
past two novel failures, then the memory extractor with `getattr(bus, "domain", "")`)."""

from __future__ import annotations

import logging
from typing import Literal

from eurekaclaw.knowledge_bus.bus import KnowledgeBus
from eurekaclaw.learning.memory_extractor import SessionMemoryExtractor
from eurekaclaw.llm import LLMClient, create_client
from eurekaclaw.skills.evolver import SkillEvolver
from eurekaclaw.skills.registry import SkillRegistry
from eurekaclaw.types.tasks import TaskPipeline

logger = logging.getLogger(__name__)

_MIN_NOVEL_FAILURES = 2


class ContinualLearningLoop:
    """Intercepts run outputs and improves skills/weights for future runs."""

    def __init__(
        self,
        mode: Literal["skills_only", "rl", "madmax"] = "skills_only",
        skill_registry: SkillRegistry | None = None,
        client: LLMClient | None = None,
    ) -> None:
        self.mode = mode
        self.client: LLMClient = client or create_client()
        self._registry = skill_registry or SkillRegistry()
        self.skill_evolver = SkillEvolver(registry=self._registry, client=self.client)
        self.memory_extractor = SessionMemoryExtractor(client=self.client)

    async def post_run(self, pipeline: TaskPipeline, bus: KnowledgeBus) -> None:
        theory_state = bus.get_theory_state()
        failures = theory_state.failed_attempts if theory_state else []
        successes = list(theory_state.proven_lemmas.values()) if theory_state else []
        session_succeeded = theory_state.status == "proved" if theory_state else False
        for skill_name in bus.get("injected_skills") or set():
            self._registry.update_stats(skill_name, success=session_succeeded)
        novel = {f"{f.lemma_id}::{f.failure_reason[:80]}" for f in failures}
        if len(novel) >= _MIN_NOVEL_FAILURES or len(successes) >= 5:
            await self.skill_evolver.distill_from_session(session_id=bus.session_id, failures=failures, successes=successes)
        domain = getattr(bus, "domain", "") or ""
        try:
            memories = await self.memory_extractor.extract_and_save(bus, domain=domain)
            if memories:
                logger.info("SessionMemoryExtractor: saved %d new memories", len(memories))
        except Exception as e:
            logger.warning("Memory extraction failed (non-fatal): %s", e)
