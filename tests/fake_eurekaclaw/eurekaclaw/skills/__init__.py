"""Skills subsystem — registry, injection, and post-run evolution."""

from eurekaclaw.skills.injector import SkillInjector
from eurekaclaw.skills.registry import SkillRegistry

__all__ = ["SkillInjector", "SkillRegistry"]
