"""eurekaclaw.agents.theory.prover.Prover: attempt() builds the prover's prompt as EurekaClaw's does
(the first three past failures as PREVIOUS FAILED APPROACHES, the cross-session hint cut at 200
characters, the skill block after its system line) and sends it to the LLM client; the stand-in's
client records the call, and the attempt's text is its answer."""

from __future__ import annotations

from dataclasses import dataclass

from eurekaclaw.config import settings
from eurekaclaw.llm import LLMClient, create_client
from eurekaclaw.types.artifacts import TheoryState

PROVE_SYSTEM = "You are the prover of EurekaClaw's theory agent."

PROVE_USER = """\
Prove the following lemma:

Lemma ID: {lemma_id}
Statement: {statement}
{past_context}
Provide a complete, rigorous proof.
"""


@dataclass
class ProofAttempt:
    lemma_id: str
    proof_text: str
    lean4_sketch: str
    confidence: float
    gaps: list[str]
    success: bool


class Prover:
    def __init__(self, client: LLMClient | None = None) -> None:
        self.client: LLMClient = client or create_client()

    async def attempt(
        self,
        state: TheoryState,
        lemma_id: str,
        past_failures: list[str] | None = None,
        cross_session_hint: str | None = None,
        skill_context: str = "",
    ) -> ProofAttempt:
        node = state.lemma_dag.get(lemma_id)
        if not node:
            return ProofAttempt(lemma_id=lemma_id, proof_text="", lean4_sketch="", confidence=0.0, gaps=[], success=False)
        system = PROVE_SYSTEM + ("\n\n" + skill_context if skill_context else "")
        past_parts: list[str] = []
        if past_failures:
            fails_text = "\n".join(f"  - {r[:120]}" for r in past_failures[:3])
            past_parts.append(f"\nPREVIOUS FAILED APPROACHES (avoid repeating these):\n{fails_text}")
        if cross_session_hint:
            past_parts.append(
                f"\nCROSS-SESSION HINT (approach that worked in a prior session):\n  {cross_session_hint[:200]}"
            )
        response = await self.client.messages.create(
            model=settings.fast_model,
            max_tokens=settings.max_tokens_formalizer,
            system=system,
            messages=[{"role": "user", "content": PROVE_USER.format(
                lemma_id=lemma_id, statement=node.statement, past_context="\n".join(past_parts)
            )}],
        )
        text = response.content[0].text if response.content else ""
        return ProofAttempt(lemma_id=lemma_id, proof_text=text, lean4_sketch="", confidence=0.9, gaps=[], success=True)
