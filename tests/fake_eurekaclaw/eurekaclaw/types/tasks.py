"""eurekaclaw.types.tasks: Task, TaskPipeline, InputSpec (cut down)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class Task(BaseModel):
    task_id: str
    name: str
    agent_role: str
    description: str = ""
    inputs: dict[str, Any] = Field(default_factory=dict)


class TaskPipeline(BaseModel):
    pipeline_id: str
    session_id: str
    tasks: list[Task] = Field(default_factory=list)


class InputSpec(BaseModel):
    mode: str = "detailed"
    domain: str = ""
    query: str = ""
    conjecture: str | None = None
    selected_skills: list[str] = Field(default_factory=list)
