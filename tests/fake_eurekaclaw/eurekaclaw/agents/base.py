"""eurekaclaw.agents.base.BaseAgent: build_system_prompt as EurekaClaw's (selected skills, top_k,
render_for_prompt without a domain, injected_skills on the bus, the domain plugin's workflow hint);
a tool call is logged to memory as its tool loop (run_agent_loop) does: "Tool <name>: <result[:200]>",
no metadata."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from eurekaclaw.knowledge_bus.bus import KnowledgeBus
from eurekaclaw.llm import LLMClient, create_client
from eurekaclaw.memory.manager import MemoryManager
from eurekaclaw.skills.injector import SkillInjector
from eurekaclaw.types.agents import AgentResult, AgentRole
from eurekaclaw.types.tasks import Task


class BaseAgent(ABC):
    role: AgentRole

    def __init__(
        self,
        bus: KnowledgeBus,
        tool_registry: Any,
        skill_injector: SkillInjector,
        memory: MemoryManager,
        client: LLMClient | None = None,
    ) -> None:
        self.bus = bus
        self.tool_registry = tool_registry
        self.skill_injector = skill_injector
        self.memory = memory
        self.client: LLMClient = client or create_client()

    @abstractmethod
    async def execute(self, task: Task) -> AgentResult: ...

    def build_system_prompt(self, task: Task) -> str:
        brief = self.bus.get_research_brief()
        selected_skill_names = brief.selected_skills if brief else []
        selected_skills = []
        seen: set[str] = set()
        for name in selected_skill_names:
            skill = self.skill_injector.registry.get(name)
            if not skill:
                continue
            if skill.meta.agent_roles and self.role.value not in skill.meta.agent_roles:
                continue
            selected_skills.append(skill)
            seen.add(skill.meta.name)
        auto_skills = self.skill_injector.top_k(task=task, role=self.role.value, k=5)
        skills = selected_skills[:5]
        for skill in auto_skills:
            if skill.meta.name in seen:
                continue
            skills.append(skill)
            seen.add(skill.meta.name)
            if len(skills) >= 5:
                break
        skill_block = self.skill_injector.render_for_prompt(skills)
        if skills:
            existing: set[str] = self.bus.get("injected_skills") or set()
            existing.update(s.meta.name for s in skills)
            self.bus.put("injected_skills", existing)
        parts = [self._role_system_prompt(task)]
        if skill_block:
            parts.append(skill_block)
        workflow_hint: str = self.bus.get("domain_workflow_hint") or ""
        if workflow_hint:
            parts.append(f"<domain_guidance>\n{workflow_hint}\n</domain_guidance>")
        return "\n\n".join(parts)

    def _role_system_prompt(self, task: Task) -> str:
        return f"You are the {self.role.value} agent."

    def log_tool_call(self, tool_name: str, result: str) -> None:
        self.memory.log_event(self.role.value, f"Tool {tool_name}: {result[:200]}")
