"""The merge judge: CREATE / MERGE / SKIP for the insights of one extraction that look like memories
already kept.

Rules kept here:
- An insight goes to the judge when active memories of the same domain and category pass the dedup
  rules of memory.add (the model's calibrated cosine threshold, or EurekaClaw's 40 % keyword
  overlap): at most 3 of them, the nearest first. An exact duplicate (same fingerprint) never
  does: the rules skip it.
- One LLM call judges every such insight of the extraction. The model sees short local ids (N1,
  N2, ... for the new insights, E1, E2, ... for the memories), never a memory's id, so it cannot
  name a memory it was not shown; an answer that names an unknown id, a memory that was not one of
  that insight's candidates, judges an insight twice or not at all, or merges without the merged
  text is refused and asked once more with the problem, then the job fails with it.
- SKIP: already known (nothing changes). MERGE: the memory's title, L2 content, L1 overview and L0
  abstract are rewritten to hold both; on a conflict the newer statement (the insight) wins, and
  the older text stays in the memory's history (memory.history). MERGE with `conflict: true` (the
  insight says the memory stopped being true): the merged text becomes a new memory and the old one
  is closed, not rewritten (valid_until = the new one's valid_from, superseded_by = the new one;
  MemoryState.supersede). CREATE: a different facet, a new memory. Every decision is journaled
  with its reason (in the job's result, and for a merge or a creation in the memory's history).
- A decision is applied only to the memory it was made about: if that memory changed or went away
  before the commit, the insight goes through the dedup rules instead (and the result says so).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ...protocol import Memory, domain_slug
from ..memory.format import fingerprint
from ..memory.state import MemoryState
from ..retrieval.text import embed_text
from .actor import JobContext
from .outcome import JobFailed

MAX_CANDIDATES = 3
SHOWN_CHARS = 1500  # of a memory's content in the judge's prompt

Reason = Annotated[str, Meta(min_length=1, max_length=600)]
Text = Annotated[str, Meta(min_length=1, max_length=4000)]


class Verdict(msgspec.Struct, forbid_unknown_fields=True):
    """The decision on one new insight."""

    item: Annotated[str, Meta(max_length=16)]  # N1, N2, ...
    decision: Literal["SKIP", "MERGE", "CREATE"]
    reason: Reason  # one sentence: why
    target: Annotated[str, Meta(max_length=16)] | None = None  # E1, E2, ...: the memory of a SKIP or MERGE
    title: Annotated[str, Meta(max_length=200)] | None = None  # MERGE: the merged memory's title
    content: Text | None = None  # MERGE: its full text (L2)
    abstract: Annotated[str, Meta(max_length=400)] | None = None  # MERGE: one line (L0)
    overview: Annotated[str, Meta(max_length=2000)] | None = None  # MERGE: two to four sentences (L1)
    conflict: bool = False  # MERGE: the memory is no longer true (the merged one replaces it, the old is closed)


class Verdicts(msgspec.Struct, forbid_unknown_fields=True):
    """One decision for each new insight shown."""

    decisions: Annotated[list[Verdict], Meta(max_length=64)]


class Candidate(msgspec.Struct):
    memory: Memory
    version: int
    rule: str  # the dedup rule that found it, with its figure


class Judged(msgspec.Struct):
    """What the judge decided about one insight, with the memory it was decided about."""

    decision: str  # SKIP | MERGE | CREATE
    reason: str
    target: Candidate | None = None
    text: tuple[str, str, str, str] | None = None  # MERGE: title, content, abstract, overview
    vector: Any = None  # MERGE: the embedding of the merged text
    conflict: bool = False  # MERGE: the memory stopped being true: close it, the merged text a new memory


SYSTEM = (
    "You keep a research memory free of duplicates. For each new insight you decide whether the "
    "memory already holds it (SKIP), whether it belongs in an existing memory (MERGE, writing the "
    "merged memory), or whether it is a different facet worth its own memory (CREATE). You answer "
    "only through the tool you are given."
)


def candidates_of(state: MemoryState, domain: str, wanted: list[tuple[str, str, str, Any]]) -> list[list[Candidate]]:
    """Run by the memory actor (a read): for each (category, title, content, vector), the active
    memories the dedup rules call near duplicates, nearest first (none for an exact duplicate)."""
    slug = domain_slug(domain)
    out: list[list[Candidate]] = []
    for category, title, content, vector in wanted:
        if state.has_fingerprint(slug, fingerprint(title, content)):
            out.append([])
            continue
        found = state.near_duplicates(slug, category, title, content, vector, limit=MAX_CANDIDATES)
        out.append([Candidate(state.memories[i], state.version_of(i), rule) for i, rule in found])
    return out


def _shown(memory: Memory) -> str:
    content = memory.content if len(memory.content) <= SHOWN_CHARS else memory.content[:SHOWN_CHARS] + "…"
    return f"{memory.category}: {memory.title}\n{content}"


def build_prompt(
    domain: str, items: list[tuple[str, str, str]], candidates: list[list[Candidate]]
) -> tuple[str, dict[str, Candidate]]:
    """The judge's prompt for the insights (category, title, content) with candidates, and the local
    id of each memory shown."""
    local: dict[str, str] = {}  # memory id -> E<n>
    shown: dict[str, Candidate] = {}
    lines = [f"Domain: {domain or 'general'}", "", "New insights, each with the memories it may duplicate:"]
    for index, ((category, title, content), found) in enumerate(zip(items, candidates, strict=True), 1):
        names = []
        for candidate in found:
            name = local.get(candidate.memory.id)
            if name is None:
                name = local[candidate.memory.id] = f"E{len(local) + 1}"
                shown[name] = candidate
            names.append(name)
        lines += ["", f"[N{index}] {category}: {title}", content, f"  may duplicate: {', '.join(names)}"]
    lines += ["", "Memories kept so far:"]
    for name, candidate in shown.items():
        lines += ["", f"[{name}] {_shown(candidate.memory)}"]
    lines += [
        "",
        "Decide each new insight once, by its N id:",
        "- SKIP: one of its listed memories already says it; give that memory's E id as target.",
        "- MERGE: it adds to one of its listed memories; give that E id as target and write the merged "
        "memory: title, content (the full text), abstract (one line, at most 20 words) and overview (two to "
        "four sentences). Where the two disagree the new insight is the newer statement: the merged text "
        "states it. Set conflict to true when the new insight says the memory is no longer true (a fact that "
        "changed, a claim refuted): the merged memory then replaces it and the old one is kept as closed.",
        "- CREATE: it is a different facet; it becomes a memory of its own.",
        "Give a one-sentence reason for each decision. Use only the N and E ids shown above.",
    ]
    return "\n".join(lines), shown


def check(answer: Verdicts, count: int, candidates: list[list[Candidate]], shown: dict[str, Candidate]) -> str:
    """What is wrong with the judge's answer ("" when nothing is)."""
    seen: set[str] = set()
    for verdict in answer.decisions:
        if not (verdict.item.startswith("N") and verdict.item[1:].isdigit() and 1 <= int(verdict.item[1:]) <= count):
            return f"{verdict.item!r} is not one of the new insights N1..N{count}"
        if verdict.item in seen:
            return f"{verdict.item} is decided twice"
        seen.add(verdict.item)
        if verdict.decision == "CREATE":
            continue
        if verdict.target is None:
            return f"{verdict.item}: {verdict.decision} needs the target memory's E id"
        if verdict.target not in shown:
            return f"{verdict.item}: {verdict.target!r} is not one of the memories shown"
        own = {candidate.memory.id for candidate in candidates[int(verdict.item[1:]) - 1]}
        if shown[verdict.target].memory.id not in own:
            return f"{verdict.item}: {verdict.target} was not listed for it"
        if verdict.decision == "MERGE":
            missing = [
                f for f in ("title", "content", "abstract", "overview") if not (getattr(verdict, f) or "").strip()
            ]
            if missing:
                return f"{verdict.item}: MERGE needs the merged {', '.join(missing)}"
    absent = [f"N{i}" for i in range(1, count + 1) if f"N{i}" not in seen]
    if absent:
        return f"no decision for {', '.join(absent)}"
    return ""


async def judge(
    ctx: JobContext, domain: str, items: list[tuple[str, str, str]], candidates: list[list[Candidate]]
) -> list[Judged]:
    """Ask the LLM about the insights (category, title, content) with their candidates, in one call
    (and once more if the answer fails the checks); the decisions in the order of `items`."""
    prompt, shown = build_prompt(domain, items, candidates)
    problem = ""
    for _ in range(2):
        asked = prompt if not problem else f"{prompt}\n\nYour previous answer was refused: {problem}. Answer again."
        answer = ctx.redact(await ctx.ask(SYSTEM, asked, Verdicts, name="merge_decisions"), domain)
        problem = check(answer, len(items), candidates, shown)
        if not problem:
            break
    else:
        raise JobFailed(f"the judge's answer was refused twice; last: {problem}")
    by_item = {verdict.item: verdict for verdict in answer.decisions}
    out = []
    for index in range(1, len(items) + 1):
        verdict = by_item[f"N{index}"]
        target = shown[verdict.target] if verdict.target is not None and verdict.decision != "CREATE" else None
        text = None
        if verdict.decision == "MERGE":
            text = (verdict.title or "", verdict.content or "", verdict.abstract or "", verdict.overview or "")
            text = tuple(part.strip() for part in text)  # type: ignore[assignment]
        conflict = verdict.decision == "MERGE" and verdict.conflict
        out.append(Judged(verdict.decision, verdict.reason.strip(), target, text, conflict=conflict))
    merged = [j for j in out if j.text is not None]
    vectors = await ctx.embed([embed_text(j.text[0], j.text[1]) for j in merged])  # type: ignore[index]
    for j, vector in zip(merged, vectors, strict=True):
        j.vector = vector
    return out
