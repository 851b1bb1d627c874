"""eurekaclaw.orchestrator.meta_orchestrator.MetaOrchestrator: builds the memory, registry, injector
and learning loop as EurekaClaw's does (names imported at module import), runs the theory task and
post-run learning."""

from __future__ import annotations

from typing import Any

from eurekaclaw.agents.theory.agent import TheoryAgent
from eurekaclaw.config import settings
from eurekaclaw.knowledge_bus.bus import KnowledgeBus
from eurekaclaw.learning.loop import ContinualLearningLoop
from eurekaclaw.llm import LLMClient, create_client
from eurekaclaw.memory.manager import MemoryManager
from eurekaclaw.skills.injector import SkillInjector
from eurekaclaw.skills.registry import SkillRegistry
from eurekaclaw.types.agents import AgentResult, AgentRole
from eurekaclaw.types.artifacts import ResearchBrief
from eurekaclaw.types.tasks import InputSpec, Task, TaskPipeline


class MetaOrchestrator:
    def __init__(
        self,
        bus: KnowledgeBus,
        tool_registry: Any = None,
        skill_registry: SkillRegistry | None = None,
        client: LLMClient | None = None,
        domain_plugin: Any = None,
        selected_skills: list[str] | None = None,
    ) -> None:
        self.bus = bus
        self.client: LLMClient = client or create_client()
        self.skill_registry = skill_registry or SkillRegistry()
        self.skill_injector = SkillInjector(self.skill_registry, selected_skills=selected_skills)
        self.memory = MemoryManager(session_id=bus.session_id)
        self.agents = {
            AgentRole.THEORY: TheoryAgent(
                bus=bus, tool_registry=tool_registry, skill_injector=self.skill_injector, memory=self.memory,
                client=self.client,
            )
        }
        self.learning_loop = ContinualLearningLoop(
            mode=settings.eurekaclaw_mode, skill_registry=self.skill_registry, client=self.client
        )

    async def run(self, input_spec: InputSpec) -> AgentResult:
        brief = ResearchBrief(
            session_id=self.bus.session_id,
            input_mode="detailed",
            domain=input_spec.domain,
            query=input_spec.query or input_spec.conjecture or input_spec.domain,
            conjecture=input_spec.conjecture,
            selected_skills=input_spec.selected_skills,
        )
        self.bus.put_research_brief(brief)
        task = Task(task_id="t1", name="theory", agent_role="theory", description="prove the regret bound")
        pipeline = TaskPipeline(pipeline_id="p1", session_id=self.bus.session_id, tasks=[task])
        self.bus.put_pipeline(pipeline)
        result = await self.agents[AgentRole.THEORY].execute(task)
        await self.learning_loop.post_run(pipeline, self.bus)
        return result
