"""eurekaclaw.agents.theory.inner_loop_yaml: the LemmaDeveloper stage as EurekaClaw's (per open lemma:
this session's last three failures, the cross-session hint recalled from `proof_hint.<domain>.<lemma
id>`, then the prover's attempt; a proved lemma's hint remembered), the stage registry holding the
class by identity, and TheoryInnerLoopYaml._instantiate comparing with `is`, as EurekaClaw's do.
Verification is left out: every attempt passes."""

from __future__ import annotations

from typing import Any

from eurekaclaw.agents.theory.prover import Prover
from eurekaclaw.knowledge_bus.bus import KnowledgeBus
from eurekaclaw.memory.manager import MemoryManager
from eurekaclaw.types.artifacts import FailedAttempt, ProofRecord, TheoryState

STAGE_REGISTRY: dict[str, Any] = {}


class LemmaDeveloper:
    def __init__(self, bus: KnowledgeBus, prover: Prover | None = None, memory: MemoryManager | None = None) -> None:
        self.bus = bus
        self.prover = prover or Prover()
        self.memory = memory
        self._failure_log: list[FailedAttempt] = []

    async def run_iterative(
        self, state: TheoryState, max_iterations: int, stagnation_window: int, domain: str = "", checkpoint: Any = None
    ) -> TheoryState:
        for iteration in range(max_iterations):
            state.iteration = iteration
            if not state.open_goals:
                break
            for lemma_id in list(state.open_goals):
                past_failures = [f.failure_reason for f in self._failure_log if f.lemma_id == lemma_id][-3:]
                cross_session_hint = self.memory.recall(f"proof_hint.{domain}.{lemma_id}") if self.memory else None
                proof_attempt = await self.prover.attempt(
                    state, lemma_id, past_failures=past_failures or None, cross_session_hint=cross_session_hint
                )
                state.proven_lemmas[lemma_id] = ProofRecord(lemma_id=lemma_id, proof_text=proof_attempt.proof_text, verified=True)
                state.open_goals.remove(lemma_id)
                if self.memory:
                    self.memory.remember(
                        key=f"proof_hint.{domain}.{lemma_id}", value=proof_attempt.proof_text[:400],
                        tags=[domain, "proof_hint"], source_session=state.session_id,
                    )
                self.bus.put_theory_state(state)
        return state


STAGE_REGISTRY = {"LemmaDeveloper": LemmaDeveloper}


class TheoryInnerLoopYaml:
    def __init__(self, bus: KnowledgeBus, memory: MemoryManager | None = None) -> None:
        self.bus = bus
        self._memory = memory
        self._prover = Prover()

    def _instantiate(self, class_name: str) -> Any:
        cls = STAGE_REGISTRY.get(class_name)
        if cls is LemmaDeveloper:
            return LemmaDeveloper(bus=self.bus, prover=self._prover, memory=self._memory)
        raise ValueError(f"Unknown stage class {class_name!r}")
