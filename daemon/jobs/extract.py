"""Session extraction (job kind `session.extract`): what a closed research session teaches, kept.

Rules kept here:
- The input is what session.close captured (the session's events, EurekaClaw's TheoryState, the
  domain); nothing is read later from a session that has moved on. Closing the same session again
  with the same TheoryState and domain is the same job (its key), so its memories are made once.
- The LLM is asked, in one call, for EurekaClaw's four categories (domain_knowledge,
  proof_strategy, open_problems, pitfalls), each item with a title, content, confidence and the
  L0 abstract and L1 overview. The answer's shape is checked by the LLM layer against
  SessionInsights (unknown categories, wrong types, confidence outside 0..1, empty text: refused,
  asked once more, then the job fails with the reason). Items under confidence 0.5 are dropped and
  listed in the result; every kept item goes into the session's own domain ("general" when none
  was given): those that look like kept memories as the judge decides (daemon/jobs/judge.py, one
  more LLM call for all of them), the others through memory.add's dedup rules.
- Proven lemmas become knowledge-graph nodes (one per lemma, `uses` edges to the lemmas it depends
  on, the main theorem's node using the lemmas nothing else depends on); a statement already in
  the graph (matched by normalised statement, daemon/tiers/graph.py) is the same node, never a
  second one. Failed attempts are given to the LLM as pitfall candidates (once per lemma and
  reason, as EurekaClaw's learning loop deduplicates them) and are kept as persistent records
  `theory.failed_strategies.<domain slug>.<lemma id>`, the key EurekaClaw's docs give for failed
  strategies (its inner loop keys proof hints the same way: `proof_hint.<domain>.<lemma id>`).
- An insight the LLM marks `general` (it holds beyond its domain: a proof technique, a convention)
  is proposed for sharing once kept: a review request of kind "proposal" (daemon/memory/review.py's
  propose, under the domain's share policy and the automatic check) made in the memory tier's part
  of the commit; the memory stays local until the request is approved.
- A repeated successful tool pattern in the captured events becomes a draft skill (daemon/jobs/
  distill.py: the pattern found without the LLM, one more LLM call only when there is one).
- The agent's own LLM may do the asking instead (session.learned: the items EurekaClaw's extractor
  got from the agent's LLM when the daemon has none): `deliver` takes them through the same rules
  (redaction, the confidence rule, the judge when the daemon has an LLM, else the dedup rules;
  lemmas, failed strategies, the draft skill) into the same one commit, which completes the job;
  the result says `extracted_by: "client"`.
- Everything lands in one commit (daemon/jobs/actor.py): memories, proposals, nodes, edges,
  records, the draft skill and the job's completion, or none of it. What the LLM wrote is redacted first, under the domain's policy,
  as every request's text is at dispatch (daemon/redact.py); what the session gave was redacted
  when session.close arrived.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from ...protocol import (
    RESEARCH_CATEGORIES,
    EpisodicEntry,
    KnowledgeNode,
    ProtocolError,
    TheoryState,
    domain_slug,
    new_id,
)
from ...protocol import methods as m
from ..llm import LLMError
from ..memory.format import fingerprint
from ..memory.params import MIN_CONFIDENCE
from ..memory.review import propose
from ..memory.state import MemoryState
from ..retrieval.text import EMBED_WINDOW, passage_windows, pooled
from ..tiers.graph import GraphState, PutEdge, PutNode
from ..tiers.persistent import PersistentState
from .actor import JobContext
from .distill import Planned as DistilledPlan
from .distill import apply_skill, distill
from .judge import candidates_of, judge
from .outcome import JobFailed, Outcome
from .state import SessionInput

KIND = "session.extract"
CATEGORIES = RESEARCH_CATEGORIES
MAX_ITEMS = 12  # per category
MAX_EVENTS = 200  # events captured at session.close (the most recent)
MAX_EVENT_CHARS = 2000  # of each event's content, captured
PROMPT_LEMMAS = 12
PROMPT_FAILURES = 8
PROMPT_EVENTS = 30
SNIPPET = 240
MAX_FAILURES_KEPT = 20  # attempts in one theory.failed_strategies record

Title = Annotated[str, Meta(min_length=1, max_length=200)]
Content = Annotated[str, Meta(min_length=1, max_length=4000)]
Abstract = Annotated[str, Meta(min_length=1, max_length=400)]
Overview = Annotated[str, Meta(min_length=1, max_length=2000)]
Confidence = Annotated[float, Meta(ge=0.0, le=1.0)]


class Insight(msgspec.Struct, forbid_unknown_fields=True):
    """One lasting insight."""

    title: Title  # a few words
    content: Content  # L2: one to three self-contained sentences
    confidence: Confidence  # 0..1: how sure, and how useful to a later session
    abstract: Abstract  # L0: one line of at most 20 words
    overview: Overview  # L1: two to four sentences that stand alone
    general: bool = False  # true: it holds beyond this domain (a proof technique, a convention): proposed for sharing


Items = Annotated[list[Insight], Meta(max_length=MAX_ITEMS)]


class SessionInsights(msgspec.Struct, forbid_unknown_fields=True):
    """The lasting insights of one finished research session, in EurekaClaw's four categories."""

    domain_knowledge: Items = []
    proof_strategy: Items = []
    open_problems: Items = []
    pitfalls: Items = []


SYSTEM = (
    "You distil lasting research insights from finished mathematical research sessions, for the "
    "sessions that come after them in the same field. You are precise and brief, and you answer "
    "only through the tool you are given."
)


def session_key(session_id: str, domain: str, theory_state: TheoryState | None, events: list[EpisodicEntry]) -> str:
    """Two session.close calls with this key are the same job: the session, its domain and its
    TheoryState (its events when it has none)."""
    basis: Any = (
        theory_state if theory_state is not None and not theory_state.is_empty() else [e.content for e in events]
    )
    digest = hashlib.sha256(msgspec.msgpack.encode([KIND, session_id, domain, basis])).hexdigest()
    return f"{KIND}:{session_id}:{digest[:32]}"


def capture(
    session_id: str, domain: str, theory_state: TheoryState | None, events: list[EpisodicEntry]
) -> SessionInput | None:
    """The job's input, or None when there is nothing to learn from."""
    if theory_state is not None and theory_state.is_empty():
        theory_state = None
    if theory_state is None and not events:
        return None
    kept = [
        msgspec.structs.replace(e, content=e.content[:MAX_EVENT_CHARS]) if len(e.content) > MAX_EVENT_CHARS else e
        for e in events[-MAX_EVENTS:]
    ]
    return SessionInput(
        session_id=session_id,
        domain=domain,
        theory_state=theory_state,
        events=kept,
        events_dropped=max(0, len(events) - MAX_EVENTS),
    )


def _cut(text: str, limit: int = SNIPPET) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def unique_failures(theory_state: TheoryState) -> list[m.FailedAttempt]:
    """Failed attempts once per lemma and reason (its first 80 characters), in order."""
    seen: set[str] = set()
    out = []
    for failure in theory_state.failed_attempts:
        key = f"{failure.lemma_id}::{failure.failure_reason[:80]}"
        if key not in seen:
            seen.add(key)
            out.append(failure)
    return out


def statement_of(theory_state: TheoryState, lemma_id: str) -> str:
    node = theory_state.lemma_dag.get(lemma_id)
    return node.statement if node is not None else ""


def build_prompt(job_input: SessionInput) -> str:
    ts = job_input.theory_state
    lines = [f"Domain: {job_input.domain or 'mathematical research'}"]
    if ts is not None:
        statement = ts.informal_statement or ts.formal_statement
        lines.append(f"Statement attempted: {_cut(statement, 600) or '(not stated)'}")
        lines.append(f"Outcome: {ts.status or 'unknown'}")
        lemmas = list(ts.proven_lemmas.items())
        lines.append("")
        lines.append(f"Proven lemmas ({len(lemmas)}{', the first shown' if len(lemmas) > PROMPT_LEMMAS else ''}):")
        for lemma_id, proof in lemmas[:PROMPT_LEMMAS]:
            verified = "verified" if proof.verified else "not verified"
            statement = statement_of(ts, lemma_id)
            text = f"- [{lemma_id}] ({verified})"
            if statement:
                text += f" statement: {_cut(statement)};"
            lines.append(f"{text} proof: {_cut(proof.proof_text, 200)}")
        if not lemmas:
            lines.append("(none)")
        failures = unique_failures(ts)
        lines.append("")
        lines.append(f"Failed attempts, candidates for pitfalls ({len(failures)}):")
        for failure in failures[:PROMPT_FAILURES]:
            attempt = f"; attempt: {_cut(failure.attempt_text, 160)}" if failure.attempt_text else ""
            lines.append(f"- [{failure.lemma_id}] why it failed: {_cut(failure.failure_reason, 200)}{attempt}")
        if not failures:
            lines.append("(none)")
    events = job_input.events[-PROMPT_EVENTS:]
    if events:
        lines.append("")
        lines.append(
            f"The session's last {len(events)} events (of {len(job_input.events) + job_input.events_dropped}):"
        )
        for event in events:
            lines.append(f"- {event.agent_role}: {_cut(event.content, 200)}")
    lines += [
        "",
        "Record what a later session in this domain should know, in four categories:",
        "- domain_knowledge: facts, lemmas or results established or confirmed;",
        "- proof_strategy: techniques that worked, and when and how to apply them;",
        "- open_problems: what remains unresolved, and why;",
        "- pitfalls: approaches that looked promising but failed, and the root cause (see the candidates above).",
        "Only insights of lasting value; skip the obvious; an empty category is fine.",
        "Each item: title (a few words); content (one to three self-contained sentences); confidence "
        "(0 to 1: how sure you are and how useful it is; below 0.5 it is not kept); abstract (one line, "
        "at most 20 words); overview (two to four sentences that stand alone); general (true only when "
        "it holds beyond this domain, e.g. a proof technique or a convention any field could use).",
    ]
    return "\n".join(lines)


class Planned(msgspec.Struct):
    """One insight the LLM gave, as a memory to add, and what became of it before the commit."""

    category: str
    item: Insight
    vector: Any = None  # the memory's vector (its windows' pooled), as memory.add computes it
    passages: dict[str, Any] = {}  # each window's text -> its vector: what memory.add would embed
    judged: Any = None  # the judge's decision (daemon/jobs/judge.Judged), or None: the dedup rules decide

    def params(self, job_input: SessionInput) -> m.MemoryAdd:
        item = self.item
        return m.MemoryAdd(
            domain=job_input.domain,
            category=self.category,  # type: ignore[arg-type]
            title=item.title.strip(),
            content=item.content.strip(),
            confidence=round(item.confidence, 4),
            tags=["extracted", "general"] if item.general else ["extracted"],
            source_session=job_input.session_id,
            abstract=item.abstract.strip()[: m.MAX_KEY] or None,  # a delivered item may have none: derived
            overview=item.overview.strip() or None,
        )


class SessionExtraction:
    kind = KIND
    needs_llm = True

    async def run(self, ctx: JobContext) -> Outcome:
        job_input = ctx.input
        assert isinstance(job_input, SessionInput)  # this kind's input (JobInput is a union of them)
        asked = await ctx.ask(SYSTEM, build_prompt(job_input), SessionInsights, name="session_insights")
        insights = ctx.redact(asked, job_input.domain)  # before anything of it is stored
        items = [(category, item) for category in CATEGORIES for item in getattr(insights, category)]
        return await self.outcome(ctx, items, by="daemon")

    async def deliver(self, ctx: JobContext, items: list[m.LearnedItem]) -> Outcome:
        """session.learned: the insights the client's own LLM extracted, through this job's rules."""
        job_input = ctx.input
        assert isinstance(job_input, SessionInput)
        given = [
            (
                item.category,
                Insight(item.title, item.content, item.confidence, item.abstract, item.overview, item.general),
            )
            for item in items
        ]
        # dispatch redacted them already (every kind: session.learned names no domain); idempotent
        redacted: list[tuple[str, Insight]] = [(c, ctx.redact(insight, job_input.domain)) for c, insight in given]
        return await self.outcome(ctx, redacted, by="client")

    async def outcome(self, ctx: JobContext, items: list[tuple[str, Insight]], *, by: str) -> Outcome:
        """The commit's parts for the insights (category, item), from the daemon's LLM (`by`
        "daemon": an LLM error ends the attempt) or delivered by the client ("client": without a
        usable LLM the dedup rules decide and no skill is drafted)."""
        job_input = ctx.input
        assert isinstance(job_input, SessionInput)
        planned: list[Planned] = []
        dropped: list[dict[str, Any]] = []
        for category, item in items:
            blank = [name for name in ("title", "content") if not getattr(item, name).strip()]
            if item.confidence < MIN_CONFIDENCE or blank:
                reason = f"confidence {item.confidence:.2f} is below {MIN_CONFIDENCE}" if not blank else f"blank {blank[0]}"
                dropped.append({"title": item.title, "category": category, "confidence": item.confidence, "reason": reason})
            else:
                planned.append(Planned(category, item))
        adds = [plan.params(job_input) for plan in planned]
        await embed_planned(ctx, planned, adds)
        skill: Any = None
        unusable = ""  # a delivered result's: why the dedup rules decided, or no skill was drafted
        if by == "daemon":
            await self.judge(ctx, planned, adds)
            skill = await distill(ctx, job_input.session_id, job_input.domain, job_input.events)
        else:
            if not ctx.llm.available:
                unusable = f"the daemon has no LLM ({ctx.llm.unavailable_reason}): the dedup rules decided"
            if not unusable:
                try:
                    await self.judge(ctx, planned, adds)
                except (LLMError, JobFailed) as exc:  # the client did the work: the rules decide instead
                    unusable = f"the judge could not be asked ({exc})"
                    for plan in planned:
                        plan.judged = None
            if not unusable:
                try:
                    skill = await distill(ctx, job_input.session_id, job_input.domain, job_input.events)
                except (LLMError, JobFailed) as exc:
                    unusable = f"no skill drafted ({exc})"
        ts = job_input.theory_state
        stages: dict[str, Any] = {}
        if planned:
            stages["memory"] = lambda state: apply_memories(state, planned, adds)
        if isinstance(skill, DistilledPlan):
            stages["skills"] = lambda state: apply_skill(state, skill)
        if ts is not None and (ts.proven_lemmas or (ts.formal_statement or ts.informal_statement)):
            stages["graph"] = lambda state: apply_lemmas(state, job_input)
        if ts is not None and ts.failed_attempts:
            stages["persistent"] = lambda state: apply_failures(state, job_input)

        def result(summaries: dict[str, Any]) -> dict[str, Any]:
            graph = summaries.get("graph", {"nodes": [], "edges": 0})
            return {
                "session_id": job_input.session_id,
                "domain": job_input.domain or "general",
                "memories": summaries.get("memory", []),
                "dropped": dropped,
                "nodes": graph["nodes"],
                "edges": graph["edges"],
                "records": summaries.get("persistent", []),
                "skill": summaries.get("skills", skill if isinstance(skill, dict) else None),
                "llm_calls": ctx.llm_calls,
                "extracted_by": by,
                **({"note": unusable} if unusable else {}),
            }

        return Outcome(stages, result)

    async def judge(self, ctx: JobContext, planned: list[Planned], adds: list[m.MemoryAdd]) -> None:
        """The insights that look like memories already kept go to the judge, in one call."""
        assert isinstance(ctx.input, SessionInput)
        await judge_planned(ctx, ctx.input.domain, planned, adds)


async def embed_planned(ctx: JobContext, planned: list[Any], adds: list[m.MemoryAdd]) -> None:
    """Every insight's passages, in ONE embedding call off the actors: the very texts memory.add
    embeds (state.passage_texts: title, the model's abstract, content; a long content's windows), so
    that the commit, which holds tier 4 until its journal write, embeds nothing itself."""
    window = getattr(ctx.actor.tiers.get("memory"), "embed_window", None) or EMBED_WINDOW["default"]
    texts = [passage_windows(p.title, p.content, p.abstract, window) for p in adds]
    unique = list(dict.fromkeys(text for each in texts for text in each))
    by_text = dict(zip(unique, await ctx.embed(unique), strict=True))
    for plan, each in zip(planned, texts, strict=True):
        plan.passages = {text: by_text[text] for text in each}
        plan.vector = pooled(list(plan.passages.values()))


async def judge_planned(ctx: JobContext, domain: str, planned: list[Any], adds: list[m.MemoryAdd]) -> None:
    """Each planned item (with its .vector) whose add looks like a memory already kept goes to the
    judge, all in one call; its decision is set as the item's .judged (else the dedup rules decide)."""
    wanted: list[tuple[str, str, str, Any]] = [
        (p.category, p.title, p.content, plan.vector) for plan, p in zip(planned, adds, strict=True)
    ]
    found = await ctx.read("memory", lambda state: candidates_of(state, domain, wanted))
    chosen = [index for index, candidates in enumerate(found) if candidates]
    if not chosen:
        return
    items: list[tuple[str, str, str]] = [(adds[i].category, adds[i].title, adds[i].content) for i in chosen]
    decided = await judge(ctx, domain, items, [found[i] for i in chosen])
    for index, judged in zip(chosen, decided, strict=True):
        planned[index].judged = judged


def apply_memories(state: MemoryState, planned: list[Any], adds: list[m.MemoryAdd]) -> list[dict[str, Any]]:
    """Run by the memory actor inside the commit: each insight as the judge decided, else through
    the dedup rules, in order."""
    state.use_passages({text: vector for plan in planned for text, vector in plan.passages.items()})
    out = []
    for plan, p in zip(planned, adds, strict=True):
        answer, by = (state.add(p), "rules") if plan.judged is None else apply_judged(state, p, plan)
        memory = answer["memory"]
        entry = {
            "decision": answer["decision"],
            "id": memory.id if memory is not None else None,
            "title": p.title,
            "category": p.category,
            "reason": answer.get("reason", ""),
            "by": by,
        }
        if getattr(plan.item, "general", False) and memory is not None:  # session insights only
            entry["proposal"] = propose_general(state, memory.id, p.title)
        out.append(entry)
    return out


def propose_general(state: MemoryState, memory_id: str, title: str) -> dict[str, Any]:
    """A memory the LLM judged general, proposed for sharing (daemon/memory/review.py's propose:
    the domain's share policy and the automatic check apply; never global without approval unless
    the policy is auto). A memory that cannot be proposed (global already, say) is left as it is
    and the result says why."""
    current = state.memories.get(memory_id)
    if current is not None and current.scope == "global":
        return {"state": "not proposed", "reason": "the memory is global already"}
    try:
        return propose(state, memory_id, f"the learning loop judged it general: {title}")
    except ProtocolError as exc:
        return {"state": "not proposed", "reason": exc.message}


def apply_judged(state: MemoryState, p: m.MemoryAdd, plan: Any) -> tuple[dict[str, Any], str]:
    """The judge's decision, applied to the memory it was made about if that is unchanged."""
    judged = plan.judged
    reason = f"judge: {judged.reason}"
    if judged.decision == "CREATE":
        if state.has_fingerprint(domain_slug(p.domain), fingerprint(p.title, p.content)):
            return state.add(p), "rules"  # made meanwhile: the rules skip the exact duplicate
        return {"decision": "created", "memory": state.create(p, plan.vector, reason), "reason": reason}, "judge"
    target = judged.target
    current = state.memories.get(target.memory.id)
    if current is None or current.status != "active" or state.version_of(current.id) != target.version:
        answer = state.add(p)
        answer["reason"] = f"{answer.get('reason') or 'new'} (the memory the judge chose changed before the commit)"
        return answer, "rules"
    if judged.decision == "SKIP":
        return {"decision": "skipped", "memory": current, "reason": reason}, "judge"
    if judged.conflict:  # the memory stopped being true: the merged text is a new memory, the old one closed
        return supersede_judged(state, p, plan, current.id, reason), "judge"
    merged = state.merge_rewritten(current.id, judged.text, p, judged.vector, reason)
    return {"decision": "merged", "memory": merged, "reason": reason}, "judge"


def supersede_judged(state: MemoryState, p: m.MemoryAdd, plan: Planned, old_id: str, reason: str) -> dict[str, Any]:
    """The judge's MERGE on a conflict: the merged text (the newer statement) as a new memory, and
    the old one closed when the new one became valid, linked to it (superseded_by)."""
    title, content, abstract, overview = plan.judged.text
    merged = msgspec.structs.replace(p, title=title, content=content, abstract=abstract, overview=overview)
    if state.has_fingerprint(domain_slug(p.domain), fingerprint(title, content)):
        return state.add(merged)  # made meanwhile: the rules skip the exact duplicate
    new = state.create(merged, plan.judged.vector, reason)
    state.supersede(old_id, new.id)
    return {"decision": "created", "memory": new, "reason": f"{reason} (supersedes {old_id}, now closed)"}


def apply_lemmas(state: GraphState, job_input: SessionInput) -> dict[str, Any]:
    """Run by the graph actor inside the commit: a node per proven lemma (or the node that already
    has its statement), `uses` edges to its dependencies, the main theorem's node."""
    ts = job_input.theory_state
    assert ts is not None
    now = state.now()
    nodes: list[dict[str, Any]] = []
    node_of: dict[str, str] = {}

    def node_for(name: str, statement: str, tags: list[str]) -> tuple[str, bool]:
        existing = state.node_with_statement(statement) if statement.strip() else None
        if existing is not None:
            if not set(tags) <= set(existing.tags):
                state.commit(PutNode(msgspec.structs.replace(existing, tags=list(dict.fromkeys(existing.tags + tags)))))
            return existing.node_id, False
        node = KnowledgeNode(
            node_id=new_id(),
            theorem_name=name,
            formal_statement=statement,
            domain=job_input.domain,
            session_id=job_input.session_id,
            tags=tags,
            created_at=now,
        )
        state.commit(PutNode(node))
        return node.node_id, True

    for lemma_id, proof in ts.proven_lemmas.items():
        tags = ["lemma", "proved"] + (["verified"] if proof.verified else [])
        node_id, created = node_for(lemma_id, statement_of(ts, lemma_id), tags)
        node_of[lemma_id] = node_id
        nodes.append({"lemma_id": lemma_id, "node_id": node_id, "created": created})
    edges = 0

    def link(from_id: str, to_id: str) -> None:
        nonlocal edges
        if from_id != to_id and (from_id, to_id, "uses") not in state.edges:
            state.commit(PutEdge(from_id, to_id, "uses"))
            edges += 1

    depended_on: set[str] = set()
    for lemma_id in ts.proven_lemmas:
        dag = ts.lemma_dag.get(lemma_id)
        for dependency in dag.dependencies if dag is not None else []:
            depended_on.add(dependency)
            target = node_of.get(dependency)
            if target is None:  # not proved here: perhaps in an earlier session
                known = state.node_with_statement(statement_of(ts, dependency))
                target = known.node_id if known is not None else None
            if target is not None:
                link(node_of[lemma_id], target)
    statement = ts.formal_statement or ts.informal_statement
    if statement.strip() and (ts.status == "proved" or ts.proven_lemmas):
        name = _cut(ts.informal_statement or ts.formal_statement, 200)
        tags = ["theorem"] + ([ts.status] if ts.status else [])
        theorem_id, created = node_for(name, statement, tags)
        nodes.append({"lemma_id": None, "node_id": theorem_id, "created": created})
        for lemma_id, node_id in node_of.items():
            if lemma_id not in depended_on:
                link(theorem_id, node_id)
    return {"nodes": nodes, "edges": edges}


def failures_key(domain: str, lemma_id: str) -> str:
    return f"theory.failed_strategies.{domain_slug(domain)}.{lemma_id}"


def apply_failures(state: PersistentState, job_input: SessionInput) -> list[str]:
    """Run by the persistent actor inside the commit: each lemma's failed attempts added to its
    theory.failed_strategies record (once per reason; the most recent MAX_FAILURES_KEPT kept)."""
    ts = job_input.theory_state
    assert ts is not None
    by_lemma: dict[str, list[m.FailedAttempt]] = {}
    for failure in unique_failures(ts):
        by_lemma.setdefault(failure.lemma_id, []).append(failure)
    keys = []
    for lemma_id, failures in by_lemma.items():
        key = failures_key(job_input.domain, lemma_id)
        old = state.records.get(key)
        value: dict[str, Any] = {}
        if old is not None:  # a record of ours is extended; anything else at the key is kept under "previous"
            value = dict(old.value) if isinstance(old.value, dict) else {"previous": old.value}
        kept = value.get("attempts")
        attempts = [a for a in kept if isinstance(a, dict)] if isinstance(kept, list) else []
        seen = {str(a.get("reason", ""))[:80] for a in attempts}
        for failure in failures:
            if failure.failure_reason[:80] in seen:
                continue
            seen.add(failure.failure_reason[:80])
            attempts.append(
                {
                    "session_id": job_input.session_id,
                    "iteration": failure.iteration,
                    "reason": failure.failure_reason,
                    "attempt": failure.attempt_text[:500],
                }
            )
        statement = statement_of(ts, lemma_id)
        value.update(
            {
                "lemma_id": lemma_id,
                "domain": job_input.domain or "general",
                "statement": statement or value.get("statement", ""),
                "attempts": attempts[-MAX_FAILURES_KEPT:],
            }
        )
        tags = (old.tags if old is not None else []) + ["failed_strategy", domain_slug(job_input.domain)]
        tags = list(dict.fromkeys(tags))
        state.do_remember(m.PersistentRemember(key=key, value=value, tags=tags, source_session=job_input.session_id))
        keys.append(key)
    return keys
