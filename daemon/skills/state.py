"""The skills tier's state: the skills, their search indexes, and what the file projector owes.

Rules kept here:
- One owner: the SkillsActor (daemon/skills/actor.py) reads and changes this state, one batch or
  internal call at a time. Durable changes go through `apply(PutSkill)` only; a PutSkill carries the
  whole skill and the frontmatter entries the daemon does not read, so replaying one twice, or one
  already in the files, gives the same state. Handlers check everything before they commit.
- A name is a skill's identity and its folder; the daemon never deletes an active skill (only another
  program's removal of its file does: RemoveSkill, daemon/skills/watch.py), and its status only moves
  from draft to active. A draft may be discarded (skills.discard: RemoveSkill with discard=True), which
  also owes the removal of its file, replayed or not, so a discarded draft never comes back from it. Drafts live in memory/skill_drafts/<name>/SKILL.md, out of the folder
  EurekaClaw reads (so not even EurekaClaw's own loader can inject them); every other skill in
  skills/<name>/SKILL.md, or where its file was found.
- Vectors are derived data: computed in the background from each skill's text (never journaled),
  so a skill is found by BM25 from the moment it is stored and by its vector once embedded.
- `skills.inject` never shows a draft.
- A seed skill's use (usage_count, success_rate) goes to seed_skill_stats.json only, as EurekaClaw's
  update_stats keeps it: its SKILL.md is never rewritten for a use (at start that file's figures
  win where they count more uses than the SKILL.md's).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec
import numpy as np

from ...protocol import ProtocolError, Skill, normalize_timestamp
from ...protocol import methods as m
from ...protocol.blocks import skill_element, skills_block
from ..primitives import Histogram
from ..retrieval.fusion import DEFAULT_RRF_FUSION, FETCH, RRF_FUSION, RRF_K, fuse
from ..retrieval.lexical import LexicalIndex
from ..retrieval.text import estimate_tokens
from ..retrieval.vectors import VectorStore
from ..tier import TierState, Undo, handles
from .format import (
    clean_body,
    name_problem,
    next_success_rate,
    render_skill,
)

log = logging.getLogger("eurekamem.skills")


SKILLS_FOLDER = "skills"  # relative to the data root: EurekaClaw's skills_dir
DRAFTS_FOLDER = "memory/skill_drafts"  # the daemon's own: drafts wait here until skills.confirm
SEED_STATS_FILE = "seed_skill_stats.json"  # EurekaClaw's usage statistics of seed skills


class PutSkill(msgspec.Struct, tag="skills.put"):
    skill: Skill
    extra: str = ""  # frontmatter entries the daemon does not read, written back verbatim
    from_file: bool = False  # read from skills/<name>/SKILL.md, written by another program: the file shows it


class RemoveSkill(msgspec.Struct, tag="skills.remove"):
    """Another program removed skills/<name>/SKILL.md (daemon/skills/watch.py): the skill is gone.
    `discard`: skills.discard dropped a draft, whose file the projector removes."""

    name: str
    discard: bool = False


def skill_file(name: str, status: str) -> str:
    """Where a skill of this status lives, relative to the data root."""
    return f"{DRAFTS_FOLDER if status == 'draft' else SKILLS_FOLDER}/{name}/SKILL.md"


def check_name(name: str) -> None:
    problem = name_problem(name)
    if problem is not None:
        raise ProtocolError("invalid_params", f"invalid params: skill name {name!r} {problem}", field="name")


def embed_text(skill: Skill) -> str:
    """What a skill's vector is computed from: EurekaClaw's semantic retrieval embeds name,
    description and tags."""
    name = skill.name.replace("_", " ").replace("-", " ")
    return " ".join(part for part in (name, skill.description, " ".join(skill.tags)) if part)


def lexical_text(skill: Skill) -> str:
    """What BM25 sees: name, description, tags and the whole body."""
    return "\n".join((skill.name, skill.description, " ".join(skill.tags), skill.body))


def only_usage(skill: Skill, old: Skill) -> Skill:
    """`skill` with `old`'s usage figures: equal to `old` when the figures are all that changed."""
    return msgspec.structs.replace(skill, usage_count=old.usage_count, success_rate=old.success_rate)


class Projection(msgspec.Struct):
    """What the file projector must do: write these files, remove those, update the seed statistics."""

    writes: list[tuple[str, str, str]]  # (name, relative path, SKILL.md text)
    removes: list[str]  # relative paths no skill lives at any more
    seed_stats: dict[str, dict[str, Any]]  # name -> {"usage_count", "success_rate"} for seed_skill_stats.json
    keep_originals: list[str]  # relative paths whose file must be kept aside before its first rewrite

    def empty(self) -> bool:
        return not (self.writes or self.removes or self.seed_stats)


class SkillsState(TierState):
    name = "skills"

    def __init__(self, embedder: Any) -> None:
        super().__init__()
        self.embedder = embedder
        self.model = embedder.name
        self.skills: dict[str, Skill] = {}
        self.extra: dict[str, str] = {}
        self.files: dict[str, str] = {}  # name -> its file, relative to the data root
        self._label: dict[str, int] = {}
        self._name_of: dict[int, str] = {}
        self._next_label = 0
        self.lexical = LexicalIndex()
        self.vectors = VectorStore(embedder.dim, model=self.model)
        self._unembedded: dict[str, None] = {}  # names without a vector of their current text
        self._drafts = 0  # kept up to date so that counts() (sys.stats, from the event loop) iterates nothing
        self.dirty: dict[str, None] = {}  # names whose file must be written
        self.stale_files: dict[str, None] = {}  # files a skill moved away from (a confirmed draft)
        self.seed_stats_dirty: dict[str, None] = {}  # seed skills whose usage changed
        self.keep_original: dict[str, None] = {}  # files read with undecodable bytes: kept aside once
        self.embed_error: str | None = None
        self._queries: dict[str, np.ndarray] = {}  # query vectors computed for the batch in progress
        self.search_time = Histogram()

    # --- handlers ----------------------------------------------------------------------------------------

    @handles("skills.list")
    def do_list(self, p: m.SkillsList) -> list[Skill]:
        return [
            skill
            for _, skill in sorted(self.skills.items())
            if (p.agent_role is None or p.agent_role in skill.agent_roles)
            and (p.tag is None or p.tag in skill.tags)
            and (p.status == "any" or skill.status == p.status)
        ]

    @handles("skills.get")
    def do_get(self, p: m.SkillRef) -> Skill:
        return self._get(p.name)

    @handles("skills.put")
    def do_put(self, p: m.SkillsPut) -> Skill:
        check_name(p.name)
        body = clean_body(p.body)
        if not body:
            raise ProtocolError("invalid_params", "invalid params: body is empty", field="body")
        old = self.skills.get(p.name)
        if old is not None and old.status == "active" and p.status == "draft":
            raise ProtocolError(
                "invalid_params",
                f"invalid params: skill {p.name!r} is active; an active skill cannot become a draft",
                field="status",
            )
        if p.created_at is not None:
            try:
                created_at = normalize_timestamp(p.created_at)
            except ValueError:
                message = f"invalid params: created_at {p.created_at!r} is not a timestamp"
                raise ProtocolError("invalid_params", message, field="created_at") from None
        else:
            created_at = old.created_at if old is not None else self.now()

        def pick(value: Any, field: str, default: Any) -> Any:
            if value is not None:
                return value
            return getattr(old, field) if old is not None else default

        skill = Skill(
            name=p.name,
            version=pick(p.version, "version", "1.0"),
            tags=list(dict.fromkeys(pick(p.tags, "tags", []))),
            agent_roles=list(dict.fromkeys(pick(p.agent_roles, "agent_roles", []))),
            pipeline_stages=list(dict.fromkeys(pick(p.pipeline_stages, "pipeline_stages", []))),
            description=pick(p.description, "description", ""),
            source=pick(p.source, "source", "manual"),
            created_at=created_at,
            usage_count=pick(p.usage_count, "usage_count", 0),
            success_rate=pick(p.success_rate, "success_rate", None),
            status=pick(p.status, "status", "active"),
            body=body,
        )
        if skill != old:
            self.commit(PutSkill(skill, self.extra.get(p.name, "")))
        return skill

    @handles("skills.record_use")
    def do_record_use(self, p: m.SkillsRecordUse) -> Skill:
        old = self._get(p.name)
        skill = msgspec.structs.replace(
            old, usage_count=old.usage_count + 1, success_rate=next_success_rate(old.success_rate, p.success)
        )
        self.commit(PutSkill(skill, self.extra.get(p.name, "")))
        return skill

    @handles("skills.confirm")
    def do_confirm(self, p: m.SkillRef) -> Skill:
        old = self._get(p.name)
        if old.status == "active":
            return old
        skill = msgspec.structs.replace(old, status="active")
        self.commit(PutSkill(skill, self.extra.get(p.name, "")))
        return skill

    @handles("skills.discard")
    def do_discard(self, p: m.SkillRef) -> Skill:
        old = self._get(p.name)
        if old.status != "draft":
            raise ProtocolError(
                "invalid_params",
                f"invalid params: skill {p.name!r} is {old.status}; only a draft can be discarded",
                field="name",
            )
        self.commit(RemoveSkill(p.name, discard=True))
        return old

    @handles("skills.search")
    def do_search(self, p: m.SkillsSearch) -> list[dict[str, Any]]:
        started = time.perf_counter_ns()
        try:
            names = [name for name, skill in self.skills.items() if p.status == "any" or skill.status == p.status]
            return [
                {"skill": self.skills[name], "score": score, "why": why}
                for name, score, why in self.search(p.query, p.k, names, p.mode)
            ]
        finally:
            self.search_time.add((time.perf_counter_ns() - started) / 1000)

    @handles("skills.inject")
    def do_inject(self, p: m.SkillsInject) -> dict[str, Any]:
        role, stage = p.agent_role, p.pipeline_stage

        def matches(skill: Skill) -> int:
            return (role in skill.agent_roles) + (stage is not None and stage in skill.pipeline_stages)

        pool = {name: skill for name, skill in self.skills.items() if skill.status == "active" and matches(skill)}
        relevance: dict[str, int] = {}
        if p.query is not None and pool:
            hits = self.search(p.query, len(pool), list(pool), "hybrid")
            relevance = {name: rank for rank, (name, _, _) in enumerate(hits)}
        ordered = sorted(
            pool.values(),
            key=lambda s: (
                -matches(s),
                relevance.get(s.name, len(relevance)),
                -s.usage_count,
                -(s.success_rate or 0.0),
                s.name,
            ),
        )
        # whole skills only, in order, within the budget; the frame and the newlines are counted
        spent = estimate_tokens(skills_block([]))  # the frame and its note
        elements: list[str] = []
        names: list[str] = []
        for skill in ordered:
            if len(names) >= p.k:
                break
            element = skill_element(skill.name, skill.body)
            cost = estimate_tokens(element) + 1
            if p.token_budget is None or spent + cost <= p.token_budget:
                elements.append(element)
                names.append(skill.name)
                spent += cost
        if not elements:
            return {"text": "", "names": [], "tokens": 0}
        text = skills_block(elements)
        return {"text": text, "names": names, "tokens": estimate_tokens(text)}

    # --- for the learning loop's extraction job ----------------------------------------------------------

    def draft_mutation(
        self,
        name: str,
        body: str,
        *,
        description: str = "",
        tags: list[str] | tuple[str, ...] = (),
        agent_roles: list[str] | tuple[str, ...] = (),
        pipeline_stages: list[str] | tuple[str, ...] = (),
        version: str = "1.0",
        extra: str = "",
    ) -> tuple[PutSkill | None, Skill]:
        """The PutSkill that stores a distilled skill as a draft, and the skill, without applying it.

        Checked as skills.put checks (ProtocolError invalid_params). A draft with this name and the
        same body already there gives (None, that skill): a job run again stores nothing twice. Any
        other skill of that name keeps it, and the draft takes the first free `<name>_2`, `<name>_3`...
        `extra`: frontmatter entries of the daemon's own (the learning loop's distilled_pattern).
        """
        check_name(name)
        body = clean_body(body)
        if not body:
            raise ProtocolError("invalid_params", "invalid params: body is empty", field="body")
        chosen, n = name, 1
        while chosen in self.skills:
            existing = self.skills[chosen]
            if existing.body == body and existing.source == "distilled":
                return None, existing
            n += 1
            suffix = f"_{n}"
            chosen = name[: len(name) - max(0, len((name + suffix).encode()) - 255)] + suffix
            check_name(chosen)
        skill = Skill(
            name=chosen,
            version=version or "1.0",
            tags=list(dict.fromkeys(tags)),
            agent_roles=list(dict.fromkeys(agent_roles)),
            pipeline_stages=list(dict.fromkeys(pipeline_stages)),
            description=description,
            source="distilled",
            created_at=self.now(),
            status="draft",
            body=body,
        )
        return PutSkill(skill, extra), skill

    def put_draft(self, name: str, body: str, **fields: Any) -> Skill:
        """Store a distilled skill as a draft (status draft, source distilled); see draft_mutation.

        Run it as the tier's owner, e.g. `await actor.run_internal(lambda s: s.put_draft(...))`,
        which journals the change before it answers."""
        mutation, skill = self.draft_mutation(name, body, **fields)
        if mutation is not None:
            self.commit(mutation)
        return skill

    # --- search --------------------------------------------------------------------------------------

    def prepare(self, calls: list[Any]) -> None:
        """Embed, in one batch, the queries this batch's searches need (none while no skill has a
        vector). Runs where the batch runs (a worker thread); a failure is kept for the searches."""
        self._queries = {}
        self.embed_error = None
        if not len(self.vectors):
            return
        queries = list(dict.fromkeys(q for q in map(query_of, calls) if q is not None))
        if not queries:
            return
        try:
            self._queries = dict(zip(queries, self.embedder.embed_queries(queries)))
        except Exception as exc:  # every search of the batch answers without its dense side, and says why
            log.error("skills: embedding a query failed: %s", exc)
            self.embed_error = f"the embedder {self.model} failed: {exc}"

    def search(self, query: str, k: int, names: list[str], mode: str) -> list[tuple[str, float, dict[str, Any]]]:
        """The best of `names` for `query`: (name, score in 0..1, why), by the fusion tier 4 uses."""
        if not names:
            return []
        allowed = np.sort(np.fromiter((self._label[name] for name in names), dtype=np.int64, count=len(names)))
        fusion = RRF_FUSION.get(self.model, DEFAULT_RRF_FUSION)
        table = fusion if mode == "hybrid" else {"dense": 1.0, "lexical": 1.0}
        rankings: dict[str, list[int]] = {}
        raw: dict[str, dict[int, float]] = {"dense": {}, "lexical": {}}
        dense_error = None
        if mode in ("hybrid", "dense") and len(self.vectors):
            vector = self._queries.get(query)
            if vector is None:
                dense_error = self.embed_error or "the query was not embedded"
                if mode == "dense":
                    raise ProtocolError("unavailable", dense_error, model=self.model)
            else:
                labels, scores = self.vectors.search(vector, FETCH, allowed)
                floor = self.embedder.thresholds.floor if mode == "hybrid" and fusion["floor"] else -1.0
                kept = [(label, score) for label, score in zip(labels.tolist(), scores.tolist()) if score >= floor]
                rankings["dense"] = [label for label, _ in kept]
                raw["dense"] = dict(kept)
        if mode in ("hybrid", "lexical"):
            labels, scores = self.lexical.search(query, FETCH, allowed)
            rankings["lexical"] = labels.tolist()
            raw["lexical"] = dict(zip(rankings["lexical"], scores.tolist()))
        weights = {name: table[name] for name in rankings}
        if not weights:
            return []
        best = sum(weights.values()) / (RRF_K + 1)
        out = []
        for label, score, ranks in fuse(rankings, weights, k=RRF_K, limit=k):
            why: dict[str, Any] = {
                "dense_rank": ranks.get("dense"),
                "lexical_rank": ranks.get("lexical"),
                "dense_score": round(raw["dense"][label], 6) if label in raw["dense"] else None,
                "lexical_score": round(raw["lexical"][label], 6) if label in raw["lexical"] else None,
            }
            if dense_error:
                why["dense_error"] = dense_error
            out.append((self._name_of[label], round(score / best, 6), why))
        return out

    def missing_vectors(self, limit: int) -> list[tuple[str, str]]:
        """(name, text to embed) of up to `limit` skills without a vector of their current text."""
        out = []
        for name in self._unembedded:
            out.append((name, embed_text(self.skills[name])))
            if len(out) >= limit:
                break
        return out

    def set_vectors(self, items: list[tuple[str, str]], vectors: np.ndarray) -> int:
        """Store vectors computed for missing_vectors' items whose text has not changed since."""
        done = 0
        for (name, text), vector in zip(items, vectors):
            skill = self.skills.get(name)
            if skill is not None and name in self._unembedded and embed_text(skill) == text:
                row = np.asarray(vector, dtype=np.float32)[None, :]
                self.vectors.add(np.asarray([self._label[name]], dtype=np.int64), row)
                del self._unembedded[name]
                done += 1
        return done

    # --- mutations -------------------------------------------------------------------------------------

    def apply(self, mutation: Any) -> Undo:
        if isinstance(mutation, RemoveSkill):
            return self._remove(mutation.name, mutation.discard)
        if not isinstance(mutation, PutSkill):
            raise TypeError(f"not a skills mutation: {mutation!r}")
        name = mutation.skill.name
        before = self.skills.get(name), self.extra.get(name, ""), self.files.get(name)
        owed = name in self.dirty, name in self.seed_stats_dirty
        self._put(mutation.skill, mutation.extra)
        if mutation.from_file:  # the file shows it: nothing owed for it
            if not owed[0]:
                self.dirty.pop(name, None)
            if not owed[1]:
                self.seed_stats_dirty.pop(name, None)
        return lambda: self._restore(name, *before)

    def _remove(self, name: str, discard: bool = False) -> Undo:
        old = self.skills.get(name)
        if old is None:  # replayed after the file's removal was already in a snapshot
            return lambda: None
        extra, path = self.extra.get(name, ""), self.files.get(name)
        owed = name in self.dirty, name in self.seed_stats_dirty
        stale = path is not None and path in self.stale_files
        self._forget(name)
        if discard and path is not None:  # the draft's file goes too (after a restart: the file read at start)
            self.stale_files[path] = None

        def undo() -> None:
            if discard and path is not None and not stale:
                self.stale_files.pop(path, None)
            self._put(old, extra, path)
            if not owed[0]:
                self.dirty.pop(name, None)
            if not owed[1]:
                self.seed_stats_dirty.pop(name, None)

        return undo

    def load(self, skill: Skill, extra: str, relative: str) -> None:
        """A skill read from its file at start: in the state, nothing owed to the files."""
        self._put(skill, extra, relative)
        self.dirty.pop(skill.name, None)
        self.seed_stats_dirty.pop(skill.name, None)

    def _put(self, skill: Skill, extra: str, path: str | None = None) -> None:
        name = skill.name
        old = self.skills.get(name)
        old_path = self.files.get(name)
        if path is None:
            # a skill stays where its file is until its status changes (a draft confirmed)
            same_place = old is not None and old.status == skill.status and old_path is not None
            path = old_path if same_place and old_path is not None else skill_file(name, skill.status)
        if old_path is not None and old_path != path:
            self.stale_files[old_path] = None
        label = self._label.get(name)
        if label is None:
            label = self._label[name] = self._next_label
            self._next_label += 1
            self._name_of[label] = name
        self._drafts += (skill.status == "draft") - (old is not None and old.status == "draft")
        self.skills[name] = skill
        self.extra[name] = extra
        self.files[name] = path
        if old is None or lexical_text(old) != lexical_text(skill):
            self.lexical.add(label, lexical_text(skill))
        if old is None or embed_text(old) != embed_text(skill):
            self.vectors.remove(label)
            self._unembedded[name] = None
        usage = (skill.usage_count, skill.success_rate)
        if skill.source == "seed" and (old is None or (old.usage_count, old.success_rate) != usage):
            self.seed_stats_dirty[name] = None
            if old is not None and old.source == "seed" and old == only_usage(skill, old) and old_path == path:
                return  # a seed skill's use: seed_skill_stats.json only, its SKILL.md never rewritten for it
        self.dirty[name] = None

    def _restore(self, name: str, old: Skill | None, extra: str, path: str | None) -> None:
        if old is not None:
            self._put(old, extra, path)
            return
        # undo of a new skill, in the batch that made it: nothing was written for it yet
        self._forget(name)

    def _forget(self, name: str) -> None:
        """The skill out of the state and its indexes; its file is not the state's to remove."""
        label = self._label.pop(name)
        del self._name_of[label]
        self._drafts -= self.skills.pop(name).status == "draft"
        self.extra.pop(name, None)
        self.files.pop(name, None)
        self.lexical.remove(label)
        self.vectors.remove(label)
        self._unembedded.pop(name, None)
        self.dirty.pop(name, None)
        self.seed_stats_dirty.pop(name, None)
        self.keep_original.pop(name, None)

    # --- the files ---------------------------------------------------------------------------------

    def take_projection(self) -> Projection:
        """What the file projector owes, handed over (put back with `redirty` if it cannot be written)."""
        live = set(self.files.values())
        writes = [(name, self.files[name], render_skill(self.skills[name], self.extra[name])) for name in self.dirty]
        projection = Projection(
            writes=writes,
            removes=[path for path in self.stale_files if path not in live],
            seed_stats={
                name: {"usage_count": self.skills[name].usage_count, "success_rate": self.skills[name].success_rate}
                for name in self.seed_stats_dirty
                if name in self.skills and self.skills[name].source == "seed"
            },
            keep_originals=[self.files[name] for name in self.dirty if name in self.keep_original],
        )
        for name in self.dirty:
            self.keep_original.pop(name, None)
        self.dirty.clear()
        self.stale_files.clear()
        self.seed_stats_dirty.clear()
        return projection

    def redirty(self, projection: Projection) -> None:
        for name, _, _ in projection.writes:
            if name in self.skills:
                self.dirty[name] = None
        for path in projection.removes:
            self.stale_files[path] = None
        for name in projection.seed_stats:
            self.seed_stats_dirty[name] = None
        for path in projection.keep_originals:
            for name, file in self.files.items():
                if file == path:
                    self.keep_original[name] = None

    def rewrite(self, names: list[str]) -> None:
        """skills/ was removed: these skills' files are written again (a folder gone is no removal)."""
        for name in names:
            if name in self.skills and self.files.get(name, "").startswith(f"{SKILLS_FOLDER}/"):
                self.dirty[name] = None

    def owes_files(self) -> bool:
        return bool(self.dirty or self.stale_files or self.seed_stats_dirty)

    # --- helpers ---------------------------------------------------------------------------------------

    def _get(self, name: str) -> Skill:
        skill = self.skills.get(name)
        if skill is None:
            check_name(name)
            raise ProtocolError("not_found", f"no skill named {name!r}", name=name)
        return skill

    def counts(self) -> dict[str, int]:
        """Sizes only (no walk over the skills): the actor publishes them after every batch."""
        return {
            "skills": len(self.skills),
            "active": len(self.skills) - self._drafts,
            "drafts": self._drafts,
            "vectors": len(self.vectors),
            "unembedded": len(self._unembedded),
        }


def query_of(call: Any) -> str | None:
    """The query a call needs embedded (a search that is not lexical-only, an injection with one)."""
    name, p = call.spec.name, call.params
    if name == "skills.search" and p.mode != "lexical":
        return str(p.query)
    if name == "skills.inject" and p.query is not None:
        return str(p.query)
    return None
