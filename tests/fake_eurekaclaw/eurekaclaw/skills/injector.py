"""eurekaclaw.skills.injector.SkillInjector: EurekaClaw's tag retrieval and rendering (its semantic
retrieval needs sentence-transformers, which the stand-in does not have)."""

from __future__ import annotations

from typing import Literal

from eurekaclaw.skills.registry import SkillRegistry
from eurekaclaw.types.skills import SkillRecord
from eurekaclaw.types.tasks import Task


class SkillInjector:
    """Retrieves top-k skills relevant to a task and formats for system prompt injection."""

    def __init__(self, registry: SkillRegistry, selected_skills: list[str] | None = None) -> None:
        self.registry = registry
        self._injected: set[str] = set()
        self.selected_skills: list[SkillRecord] = []
        for skill_name in selected_skills or []:
            skill = self.registry.get(skill_name)
            if skill:
                self.selected_skills.append(skill)

    def top_k(
        self, task: Task, role: str, k: int = 5, strategy: Literal["tag", "semantic", "hybrid"] = "tag"
    ) -> list[SkillRecord]:
        if strategy == "semantic":
            return self._semantic_retrieval(f"{task.name} {task.description} {role}", role, k)
        return self._tag_retrieval(task.agent_role, role, k)

    def _tag_retrieval(self, task_role: str, role: str, k: int) -> list[SkillRecord]:
        by_role = self.registry.get_by_role(role)
        by_stage = self.registry.get_by_pipeline_stage(task_role)
        all_names = {s.meta.name for s in by_role + by_stage}
        must_have = {s.meta.name for s in self.selected_skills} & all_names
        optional = [self.registry.get(n) for n in all_names - must_have]
        optional_skills = sorted((s for s in optional if s), key=lambda s: s.meta.usage_count, reverse=True)
        must_have_skills = [s for s in (self.registry.get(n) for n in must_have) if s]
        return (must_have_skills + optional_skills)[:k]

    def _semantic_retrieval(self, query: str, role: str, k: int) -> list[SkillRecord]:
        raise RuntimeError("the stand-in has no sentence-transformers")

    def render_for_prompt(self, skills: list[SkillRecord], domain: str = "") -> str:
        parts: list[str] = []
        if skills:
            parts.append("<skills>")
            for skill in skills:
                parts.append(f'<skill name="{skill.meta.name}">')
                parts.append(skill.content.strip())
                parts.append("</skill>")
                self._injected.add(skill.meta.name)
            parts.append("</skills>")
        if domain:
            from eurekaclaw.memory.manager import MemoryManager

            block = MemoryManager(session_id="injector").load_for_injection(domain, k=4)
            if block:
                parts.append(block)
        return "\n".join(parts)
