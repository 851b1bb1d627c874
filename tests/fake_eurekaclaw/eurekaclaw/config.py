"""eurekaclaw.config: `settings`, read once at import as EurekaClaw's pydantic-settings Config is."""

from __future__ import annotations

import os
from pathlib import Path


class Config:
    def __init__(self) -> None:
        self.eurekaclaw_dir = Path(os.environ.get("EUREKACLAW_DIR") or Path.home() / ".eurekaclaw").expanduser()
        self.eurekaclaw_mode = "skills_only"
        self.fast_model = "claude-haiku"
        self.max_tokens_formalizer = 4096

    @property
    def skills_dir(self) -> Path:
        return self.eurekaclaw_dir / "skills"

    @property
    def memory_dir(self) -> Path:
        return self.eurekaclaw_dir / "memory"

    @property
    def runs_dir(self) -> Path:
        return self.eurekaclaw_dir / "runs"

    def ensure_dirs(self) -> None:
        for d in (self.skills_dir, self.memory_dir, self.runs_dir):
            d.mkdir(parents=True, exist_ok=True)


settings = Config()
