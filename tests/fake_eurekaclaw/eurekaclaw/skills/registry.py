"""eurekaclaw.skills.registry.SkillRegistry: skills_dir/<name>/SKILL.md, as EurekaClaw's (the folder
name is the skill's name; a small frontmatter reader stands in for python-frontmatter and PyYAML)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from eurekaclaw.config import settings
from eurekaclaw.types.skills import SkillMeta, SkillRecord

_SEED_DIR = Path(__file__).parent / "seed_skills"


def _scalar(text: str) -> Any:
    text = text.strip()
    if text[:1] in "'\"" and text[-1:] == text[:1]:
        return text[1:-1]
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", text):
        return float(text)
    if text in ("null", "~", ""):
        return None
    if text.startswith("[") and text.endswith("]"):
        return [_scalar(t) for t in text[1:-1].split(",") if t.strip()]
    return text


def read_frontmatter(text: str) -> tuple[dict[str, Any], str]:
    match = re.match(r"^---\n(.*?)\n---\n?(.*)$", text, re.DOTALL)
    if not match:
        return {}, text.strip()
    meta: dict[str, Any] = {}
    key = ""
    for line in match.group(1).splitlines():
        if line.startswith("- ") and key:
            meta.setdefault(key, [])
            meta[key].append(_scalar(line[2:]))
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip()
            if value.strip():
                meta[key] = _scalar(value)
    return {k: v for k, v in meta.items() if v is not None}, match.group(2).strip()


class SkillRegistry:
    """Discovers .md files from skills_dir, bundled seed_skills/, and domain plugins."""

    def __init__(self, skills_dir: Path | None = None) -> None:
        self._skills_dir = skills_dir or settings.skills_dir
        self._extra_dirs: list[Path] = []
        self._skills: dict[str, SkillRecord] = {}
        self._loaded = False

    def add_skills_dir(self, path: Path) -> None:
        if path not in self._extra_dirs:
            self._extra_dirs.append(path)
        self._loaded = False

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._load()

    def _load(self) -> None:
        self._skills.clear()
        self._skills_dir.mkdir(parents=True, exist_ok=True)
        for folder in [s for s in self._skills_dir.iterdir() if s.is_dir()]:
            record = self._load_file(folder / "SKILL.md")
            record.meta.name = folder.name
            self._skills[folder.name] = record
        self._loaded = True

    def _load_file(self, path: Path, is_seed: bool = False, seed_stats: dict[str, Any] | None = None) -> SkillRecord:
        meta, content = read_frontmatter(path.read_text(encoding="utf-8"))
        meta.setdefault("name", path.stem)
        return SkillRecord(meta=SkillMeta.model_validate(meta), content=content, file_path=str(path))

    def load_all(self) -> list[SkillRecord]:
        self._ensure_loaded()
        return list(self._skills.values())

    def get(self, name: str) -> SkillRecord | None:
        self._ensure_loaded()
        return self._skills.get(name)

    def get_by_tags(self, tags: list[str]) -> list[SkillRecord]:
        self._ensure_loaded()
        return [s for s in self._skills.values() if set(tags) & set(s.meta.tags)]

    def get_by_role(self, role: str) -> list[SkillRecord]:
        self._ensure_loaded()
        return [s for s in self._skills.values() if role in s.meta.agent_roles]

    def get_by_pipeline_stage(self, stage: str) -> list[SkillRecord]:
        self._ensure_loaded()
        return [s for s in self._skills.values() if stage in s.meta.pipeline_stages]

    @property
    def _seed_stats_path(self) -> Path:
        return settings.eurekaclaw_dir / "seed_skill_stats.json"

    def _write(self, path: Path, skill: SkillRecord) -> None:
        lines = []
        for key, value in skill.meta.model_dump(mode="json").items():
            if isinstance(value, list):
                lines += [f"{key}:", *(f"- {json.dumps(v)}" for v in value)]
            elif value is not None:
                lines.append(f"{key}: {json.dumps(value)}")
        path.write_text("---\n" + "\n".join(lines) + f"\n---\n\n{skill.content}", encoding="utf-8")

    def upsert(self, skill: SkillRecord) -> None:
        folder = self._skills_dir / skill.meta.name
        folder.mkdir(parents=True, exist_ok=True)
        self._write(folder / "SKILL.md", skill)
        skill.file_path = str(folder / "SKILL.md")
        self._skills[skill.meta.name] = skill

    def update_stats(self, name: str, success: bool) -> None:
        """As EurekaClaw's: the moving average; a seed skill's figures go to seed_skill_stats.json
        (json.dumps indent=2, its file never touched), any other skill's into its own file."""
        skill = self.get(name)
        if not skill:
            return
        skill.meta.usage_count += 1
        prev = skill.meta.success_rate
        skill.meta.success_rate = (1.0 if success else 0.0) if prev is None else 0.7 * prev + 0.3 * float(success)
        if skill.meta.source == "seed":
            path = self._seed_stats_path
            stats = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
            stats[name] = {"usage_count": skill.meta.usage_count, "success_rate": skill.meta.success_rate}
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(stats, indent=2), encoding="utf-8")
        elif skill.file_path and Path(skill.file_path).exists():
            self._write(Path(skill.file_path), skill)

    def reload(self) -> None:
        self._loaded = False
        self._ensure_loaded()
