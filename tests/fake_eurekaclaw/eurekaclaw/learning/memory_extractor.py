"""eurekaclaw.learning.memory_extractor.SessionMemoryExtractor: one LLM call, then one
memories/<domain>/<date>_<slug>.md file per insight (as EurekaClaw's, without its merge step)."""

from __future__ import annotations

import json
import re
from datetime import datetime

from eurekaclaw.config import settings
from eurekaclaw.knowledge_bus.bus import KnowledgeBus
from eurekaclaw.llm import LLMClient, create_client


class SessionMemoryExtractor:
    """Extracts session insights and persists them as markdown memory files."""

    def __init__(self, client: LLMClient | None = None) -> None:
        self.client: LLMClient = client or create_client()
        self._base_dir = settings.eurekaclaw_dir / "memories"
        self._base_dir.mkdir(parents=True, exist_ok=True)

    async def extract_and_save(self, bus: KnowledgeBus, domain: str = "") -> list[dict]:
        theory_state = bus.get_theory_state()
        if not theory_state:
            return []
        response = await self.client.messages.create(model=settings.fast_model, messages=[])
        data = json.loads(response.content[0].text)
        domain_slug = re.sub(r"[^\w]", "_", domain.lower())[:30] if domain else "general"
        domain_dir = self._base_dir / domain_slug
        domain_dir.mkdir(exist_ok=True)
        saved: list[dict] = []
        for category, entries in data.items():
            for entry in entries:
                slug = re.sub(r"[^\w]", "_", entry["title"].lower())[:40]
                path = domain_dir / f"{datetime.now().strftime('%Y%m%d')}_{slug}.md"
                path.write_text(f"---\ncategory: {category}\n---\n\n# {entry['title']}\n\n{entry['content']}\n")
                saved.append({"title": entry["title"], "category": category, "path": str(path)})
        return saved
