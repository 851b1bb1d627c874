"""eurekaclaw.agents.theory.agent.TheoryAgent: what EurekaClaw's theory agent asks of memory in a run
(its system prompt, tool events, lemmas and the theorem in the graph, a failed strategy remembered,
memory-guided retrieval), with a fixed proof instead of an LLM's."""

from __future__ import annotations

from eurekaclaw.agents.base import BaseAgent
from eurekaclaw.agents.theory.inner_loop import TheoryInnerLoop
from eurekaclaw.types.agents import AgentResult, AgentRole
from eurekaclaw.types.artifacts import FailedAttempt, LemmaNode, ProofRecord, TheoryState
from eurekaclaw.types.tasks import Task


class TheoryAgent(BaseAgent):
    role = AgentRole.THEORY

    async def execute(self, task: Task) -> AgentResult:
        brief = self.bus.get_research_brief()
        domain = brief.domain if brief else ""
        self.bus.put("system_prompt", self.build_system_prompt(task))
        memory_block = self.memory.load_for_injection(domain, k=4, query=brief.query if brief else None)
        related = self.memory.retrieve_relevant_theorems(brief.query if brief else "", domain=domain)
        prior = TheoryInnerLoop(self.memory).prior_attempt("theory.failed_strategies.L_tail")
        self.log_tool_call("lean4", "L_conc checks")
        self.log_tool_call("arxiv", "found Auer et al. 2002")
        conc = self.memory.add_theorem("L_conc", "Hoeffding for bounded rewards", domain, self.bus.session_id, ["lemma"])
        pulls = self.memory.add_theorem("L_pulls", "Each suboptimal arm is pulled O(log T) times", domain)
        self.memory.link_theorems(pulls.node_id, conc.node_id, relation="uses")
        self.memory.remember("theory.failed_strategies.L_tail", {"reason": "variance unbounded"}, tags=[domain])
        state = TheoryState(
            session_id=self.bus.session_id,
            theorem_id="thm-ucb",
            informal_statement="UCB1 has logarithmic regret",
            formal_statement="R_T <= C sqrt(K T log T)",
            lemma_dag={
                "L_conc": LemmaNode(lemma_id="L_conc", statement="Hoeffding for bounded rewards", verified=True),
                "L_pulls": LemmaNode(
                    lemma_id="L_pulls", statement="Each suboptimal arm is pulled O(log T) times", dependencies=["L_conc"]
                ),
            },
            proven_lemmas={"L_conc": ProofRecord(lemma_id="L_conc", proof_text="Chernoff.", verified=True)},
            failed_attempts=[
                FailedAttempt(lemma_id="L_tail", attempt_text="Bernstein", failure_reason="variance unbounded", iteration=1),
                FailedAttempt(lemma_id="L_tail", attempt_text="Azuma", failure_reason="increments unbounded", iteration=2),
            ],
            status="in_progress",
        )
        self.bus.put_theory_state(state)
        output = {
            "memory_block": memory_block,
            "related": [n.theorem_name for n in related],
            "prior": prior,
            "recent": [e.content for e in self.memory.recent_events(5, agent_role="theory")],
        }
        return AgentResult(task_id=task.task_id, agent_role=self.role, success=True, output=output)
