"""eurekaclaw.learning.memory_extractor.SessionMemoryExtractor as EurekaClaw v0.2.0 has it: one LLM
call (`client.messages.create` with `settings.fast_model`, `settings.max_tokens_formalizer`, a system
line and `_EXTRACT_PROMPT` filled with the first 8 proven lemmas and the first 5 failed attempts),
its answer read by `_parse_json` (a ```json fence, else the outermost braces, else the whole text;
`{}` when none parses), then per category each entry with content and confidence >= 0.5 (0.8 when
absent, "untitled" without a title) that is not in the domain's `_index.json` fingerprints becomes
memories/<domain slug>/<YYYYMMDD>_<slug>.md with its frontmatter. Left out: the near-duplicate merge
step (a second LLM call over the three newest files of the category) and the embedding in the index
(a SentenceTransformer); a failed LLM call is logged and gives [] as in EurekaClaw."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from datetime import datetime
from pathlib import Path

from eurekaclaw.config import settings
from eurekaclaw.knowledge_bus.bus import KnowledgeBus
from eurekaclaw.llm import LLMClient, create_client

logger = logging.getLogger(__name__)

# The stand-in's own wording; what matters to the integration is the placeholders EurekaClaw's has.
_EXTRACT_PROMPT = """\
Analyze this finished research session and extract lasting memories.

Domain: {domain}
Conjecture attempted: {conjecture}
Session outcome: {outcome}

Proven lemmas:
{lemmas}

Failed attempts summary:
{failures}

Answer with JSON holding the four categories domain_knowledge, proof_strategy, open_problems and
pitfalls, each a list of {{"title", "content", "confidence"}}. Return only the JSON.
"""


class SessionMemoryExtractor:
    """Extracts session insights and persists them as markdown memory files."""

    def __init__(self, client: LLMClient | None = None) -> None:
        self.client: LLMClient = client or create_client()
        self._base_dir = settings.eurekaclaw_dir / "memories"
        self._base_dir.mkdir(parents=True, exist_ok=True)

    def _load_domain_index(self, domain_dir: Path) -> dict[str, dict]:
        index_path = domain_dir / "_index.json"
        if index_path.exists():
            try:
                return json.loads(index_path.read_text())
            except Exception:
                return {}
        return {}

    def _fingerprint(self, content: str) -> str:
        return hashlib.sha256(content.strip().lower().encode()).hexdigest()[:16]

    async def extract_and_save(self, bus: KnowledgeBus, domain: str = "") -> list[dict]:
        theory_state = bus.get_theory_state()
        if not theory_state:
            return []
        lemmas_text = "\n".join(
            f"- [{lid}] (verified={r.verified}): {r.proof_text[:120]}"
            for lid, r in list(theory_state.proven_lemmas.items())[:8]
        )
        failures_text = (
            "\n".join(f"- [{f.lemma_id}]: {f.failure_reason[:100]}" for f in theory_state.failed_attempts[:5]) or "(none)"
        )
        try:
            response = await self.client.messages.create(
                model=settings.fast_model,
                max_tokens=settings.max_tokens_formalizer,
                system="Extract lasting research insights.",
                messages=[
                    {
                        "role": "user",
                        "content": _EXTRACT_PROMPT.format(
                            domain=domain or "mathematical research",
                            conjecture=(theory_state.informal_statement or theory_state.formal_statement or "")[:300],
                            outcome=theory_state.status,
                            lemmas=lemmas_text or "(none)",
                            failures=failures_text,
                        ),
                    }
                ],
            )
            text = response.content[0].text if response.content else "{}"
            data = self._parse_json(text)
        except Exception as e:
            logger.warning("Memory extraction LLM call failed: %s", e)
            return []
        domain_slug = re.sub(r"[^\w]", "_", domain.lower())[:30] if domain else "general"
        domain_dir = self._base_dir / domain_slug
        domain_index = self._load_domain_index(domain_dir)
        domain_dir.mkdir(exist_ok=True)
        saved: list[dict] = []
        for category in ("domain_knowledge", "proof_strategy", "open_problems", "pitfalls"):
            for entry in data.get(category, []):
                if not isinstance(entry, dict):
                    continue
                title = entry.get("title", "untitled")
                content = entry.get("content", "").strip()
                confidence = float(entry.get("confidence", 0.8))
                if not content or confidence < 0.5:
                    continue
                fp = self._fingerprint(title + content)
                if any(known.get("fingerprint") == fp for known in domain_index.values()):
                    continue
                date_str = datetime.now().astimezone().strftime("%Y%m%d")
                slug = re.sub(r"[^\w]", "_", title.lower())[:40]
                path = domain_dir / f"{date_str}_{slug}.md"
                if path.exists():
                    path = domain_dir / f"{date_str}_{slug}_{fp[:4]}.md"
                path.write_text(
                    f"---\ncategory: {category}\ntitle: {title}\ndomain: {domain or 'general'}\n"
                    f"confidence: {confidence:.2f}\ncreated_at: {datetime.now().astimezone().isoformat()}\n---\n\n"
                    f"# {title}\n\n{content}\n",
                    encoding="utf-8",
                )
                domain_index[path.name] = {
                    "fingerprint": fp,
                    "created_at": datetime.now().astimezone().isoformat(),
                    "category": category,
                }
                saved.append({"title": title, "category": category, "path": str(path)})
        if saved:
            (domain_dir / "_index.json").write_text(json.dumps(domain_index, indent=2))
        return saved

    def _parse_json(self, text: str) -> dict:
        """The first of: a ```json fence's body, the outermost braces, the whole text, that parses; else {}."""
        fence = re.search(r"```json\n(.*?)```", text, re.DOTALL)
        braces = re.search(r"(\{.*\})", text, re.DOTALL)
        for candidate in [fence.group(1) if fence else None, braces.group(1) if braces else None, text]:
            if candidate is None:
                continue
            try:
                return json.loads(candidate)
            except ValueError:
                continue
        return {}
