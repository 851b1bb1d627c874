"""Three-tier memory system (as EurekaClaw's package: re-exports MemoryManager)."""

from eurekaclaw.memory.manager import MemoryManager

__all__ = ["MemoryManager"]
