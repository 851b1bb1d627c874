"""Skill distillation, part of session extraction: a repeated successful tool pattern in a closed
session's events becomes a draft skill (source distilled), written by the LLM.

Rules kept here:
- The pattern is found without the LLM, from the events session.close (or the idle close) captured:
  an event is a tool step when its metadata names a tool (`tool`, else `tool_name`, else `action`: a
  non-empty string); the step failed when its metadata says `success: false` or `ok: false`, a
  `status` of failed / failure / error, or a non-empty `error`; otherwise it succeeded. Other
  events are ignored. A pattern is a run of 2 to MAX_LENGTH consecutive tool steps (in the
  session's order), of at least two different tools, every step successful, that occurs at least
  MIN_REPEATS times without overlapping. The run that covers the most steps (its length times its
  occurrences) wins, then the longer, then the earliest; a run that is a shorter run repeated
  (A B A B) counts as that shorter run. No pattern: no LLM call, no skill.
- A pattern's signature is a digest of its tool sequence. The draft carries it in its frontmatter
  (`distilled_pattern`), and a pattern that some skill already carries is not distilled again (no
  LLM call; checked again in the commit, where another job may have made it meanwhile): the same
  session closed twice, or two sessions showing the same pattern, give one draft.
- The answer is checked beyond its schema: the name must be a plain folder name (lower-case
  letters, digits, `_` and `-`, starting with a letter or digit, at most 64 characters) and the
  body must not be blank. A refused answer is asked once more with the problem, then the job fails
  with it (nothing of the job is applied). A name already taken by another skill gets `_2`, `_3`...
  (SkillsState.draft_mutation).
- The draft is stored through the skills tier's draft path (SkillsState.draft_mutation: status
  draft, in memory/skill_drafts/, never injected until skills.confirm) inside the extraction's one
  commit (daemon/jobs/actor.py), with the memories, nodes and records, or not at all.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from ...protocol import EpisodicEntry
from ..skills.format import clean_body, name_problem, yaml_str
from ..skills.state import SkillsState
from .actor import JobContext
from .outcome import JobFailed

MIN_REPEATS = 2  # occurrences of a run of tool steps, without overlap, that make it a pattern
MAX_LENGTH = 5  # tool steps in a pattern at most
TOOL_KEYS = ("tool", "tool_name", "action")
FAILED_STATUS = frozenset({"failed", "failure", "error"})
PATTERN_KEY = "distilled_pattern"  # the frontmatter entry with the pattern's signature
FROM_KEY = "distilled_from"  # ... and the session it was first seen in
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
SHOWN_OCCURRENCES = 3
SNIPPET = 200


class Step(msgspec.Struct, frozen=True):
    tool: str
    ok: bool
    event: EpisodicEntry


class Pattern(msgspec.Struct):
    tools: tuple[str, ...]
    occurrences: list[list[Step]]  # each occurrence's steps, in order

    @property
    def signature(self) -> str:
        return "sha256-" + hashlib.sha256("\x00".join(self.tools).encode("utf-8")).hexdigest()[:24]


def tool_steps(events: list[EpisodicEntry]) -> list[Step]:
    """The events that are tool steps (module rule), in order."""
    out = []
    for event in events:
        meta = event.metadata if isinstance(event.metadata, dict) else {}
        tool = next((meta[k] for k in TOOL_KEYS if isinstance(meta.get(k), str) and meta[k].strip()), None)
        if tool is None:
            continue
        status = meta.get("status")
        failed = (
            meta.get("success") is False
            or meta.get("ok") is False
            or (isinstance(status, str) and status.strip().lower() in FAILED_STATUS)
            or bool(meta.get("error"))
        )
        out.append(Step(" ".join(tool.split())[:64], not failed, event))
    return out


def _primitive(run: tuple[str, ...]) -> bool:
    """Is `run` not a shorter run repeated?"""
    n = len(run)
    return not any(n % p == 0 and run == run[:p] * (n // p) for p in range(1, n))


def find_pattern(events: list[EpisodicEntry]) -> Pattern | None:
    """The session's repeated successful tool pattern (module rule), or None."""
    steps = tool_steps(events)
    best: tuple[tuple[int, int, int], Pattern] | None = None
    for length in range(2, MAX_LENGTH + 1):
        starts: dict[tuple[str, ...], list[int]] = {}
        for i in range(len(steps) - length + 1):
            window = steps[i : i + length]
            if not all(step.ok for step in window):
                continue
            run = tuple(step.tool for step in window)
            if len(set(run)) < 2 or not _primitive(run):
                continue
            taken = starts.setdefault(run, [])
            if not taken or i >= taken[-1] + length:  # without overlap
                taken.append(i)
        for run, at in starts.items():
            if len(at) < MIN_REPEATS:
                continue
            rank = (length * len(at), length, -at[0])
            if best is None or rank > best[0]:
                best = (rank, Pattern(run, [steps[i : i + length] for i in at]))
    return best[1] if best is not None else None


Name = Annotated[str, Meta(min_length=1, max_length=64)]
Word = Annotated[str, Meta(min_length=1, max_length=64)]


class DistilledSkill(msgspec.Struct, forbid_unknown_fields=True):
    """A reusable skill distilled from a repeated successful tool pattern."""

    name: Name  # a folder name: lower-case letters, digits, _ and -
    description: Annotated[str, Meta(min_length=1, max_length=300)]  # one sentence: what it does, when to use it
    body: Annotated[str, Meta(min_length=1, max_length=8000)]  # Markdown: when to apply it, then the steps
    tags: Annotated[list[Word], Meta(max_length=8)] = []
    pipeline_stages: Annotated[list[Word], Meta(max_length=8)] = []


SYSTEM = (
    "You turn a procedure that an AI research agent repeated successfully into a reusable skill: a "
    "short, general instruction another agent can follow. You answer only through the tool you are given."
)


def _cut(text: str, limit: int = SNIPPET) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def build_prompt(domain: str, pattern: Pattern) -> str:
    lines = [
        f"Domain: {domain or 'general'}",
        f"The agent ran this sequence of tools successfully {len(pattern.occurrences)} times: "
        + " -> ".join(pattern.tools),
    ]
    for number, occurrence in enumerate(pattern.occurrences[:SHOWN_OCCURRENCES], 1):
        lines += ["", f"Occurrence {number}:"]
        lines += [f"- {s.event.agent_role} used {s.tool}: {_cut(s.event.content)}" for s in occurrence]
    lines += [
        "",
        "Write the skill: name (a folder name of lower-case letters, digits, _ and -, at most 64 characters, "
        "e.g. bound_then_verify); description (one sentence: what it achieves and when to use it); body "
        "(Markdown: when to apply it, then the steps, naming the tools); tags (a few keywords); "
        "pipeline_stages (optional).",
    ]
    return "\n".join(lines)


def check(answer: DistilledSkill) -> str:
    """What is wrong with the answer beyond its schema ("" when nothing is)."""
    if not NAME.match(answer.name) or name_problem(answer.name) is not None:
        return (
            f"the name {answer.name!r} is not a plain folder name (lower-case letters, digits, _ and -, "
            "starting with a letter or digit, at most 64 characters)"
        )
    if not clean_body(answer.body):
        return "the body is blank"
    if not answer.description.strip():
        return "the description is blank"
    return ""


class Planned(msgspec.Struct):
    """A draft to store in the commit."""

    pattern: Pattern
    session_id: str
    skill: DistilledSkill
    agent_roles: list[str]


def carrying(state: SkillsState, signature: str) -> str | None:
    """Run by the skills actor: the skill whose frontmatter carries this pattern signature, if any."""
    line = f"{PATTERN_KEY}: {signature}"
    for name, extra in state.extra.items():
        if line in extra.split("\n"):
            return name
    return None


async def distill(ctx: JobContext, session_id: str, domain: str, events: list[EpisodicEntry]) -> Any:
    """The draft to store (a Planned), a summary dict saying why there is none, or None (no pattern)."""
    pattern = find_pattern(events)
    if pattern is None or "skills" not in ctx.actor.tiers:
        return None
    signature = pattern.signature
    known = await ctx.read("skills", lambda state: carrying(state, signature))
    if known is not None:
        return skipped(pattern, known)
    prompt = build_prompt(domain, pattern)
    problem = ""
    for _ in range(2):
        asked = prompt if not problem else f"{prompt}\n\nYour previous answer was refused: {problem}. Answer again."
        answer = ctx.redact(await ctx.ask(SYSTEM, asked, DistilledSkill, name="distilled_skill"), domain)
        problem = check(answer)
        if not problem:
            break
    else:
        raise JobFailed(f"the distilled skill was refused twice; last: {problem}")
    roles = list(dict.fromkeys(step.event.agent_role for occ in pattern.occurrences for step in occ))
    return Planned(pattern, session_id, answer, [r for r in roles if r][:8])


def skipped(pattern: Pattern, name: str) -> dict[str, Any]:
    return {
        "decision": "skipped",
        "name": name,
        "pattern": list(pattern.tools),
        "reason": f"skill {name!r} was distilled from this pattern already",
    }


def apply_skill(state: SkillsState, plan: Planned) -> dict[str, Any]:
    """Run by the skills actor inside the commit: the draft, unless a skill carries the pattern by now."""
    signature = plan.pattern.signature
    known = carrying(state, signature)
    if known is not None:
        return skipped(plan.pattern, known)
    skill = plan.skill
    extra = f"{FROM_KEY}: {yaml_str(plan.session_id)}\n{PATTERN_KEY}: {signature}"
    mutation, stored = state.draft_mutation(
        skill.name,
        skill.body,
        description=skill.description.strip(),
        tags=[t.strip() for t in skill.tags if t.strip()],
        agent_roles=plan.agent_roles,
        pipeline_stages=[s.strip() for s in skill.pipeline_stages if s.strip()],
        extra=extra,
    )
    if mutation is not None:
        state.commit(mutation)
    return {
        "decision": "drafted",
        "name": stored.name,
        "pattern": list(plan.pattern.tools),
        "occurrences": len(plan.pattern.occurrences),
    }
