"""Tier 4 maintenance: archive what faded, consolidate near duplicates that slipped through, report.

Rules kept here:
- Every run is a `memory.maintain` job of the job queue (daemon/jobs): sys.maintain, the nightly
  schedule and a catch-up after a start ask for one (Maintenance.request; while one is queued or
  running, asking again answers its id), and its report is the job's result (jobs.get). The kind
  needs no LLM: the queue runs it while none is usable, and the rule decides.
- Several nodes on one database (the team's job queue, daemon/postgres/jobqueue.py): every
  request of every node names one key (TEAM_KEY), and the queue decides under that key's advisory
  lock, on the committed rows, whether the key's newest job covers it (queued or running, or it
  started since the request: since the run became due, for the schedule's): so one run at a time
  for the team, on whichever node claims it, and requests made together (sys.maintain on two
  nodes, the same night, a catch-up on each after a restart) run it once. No node is named for it
  in the configuration.
- Nothing is deleted. A faded memory (strength under `archive_floor` and not used for
  `archive_idle_days`; never a pinned one) is archived: status `archived`, its file in
  `_archive/`, the reason in `archived_reason`; `memory.restore` brings it back. A merged
  duplicate is archived the same way with `superseded_by` naming the memory it was merged into.
- The job plans by reading the memory actor a chunk at a time (CHUNK memories a read), so requests
  interleave with a long plan; then the memory actor's stage applies the plan, each change only to
  a memory whose revision is still the one planned for (one used, edited or archived meanwhile is
  left alone, counted in `skipped`), with the MaintenanceRecord (how the next start knows when it
  last ran): all of it one journal record with the job's completion (the queue's rule).
- Consolidation: within a domain, category and scope, active memories valid now that were not
  stored raw (dedup false) and whose vectors have cosine at or above the model's calibrated
  duplicate threshold form clusters; the survivor (pinned first, then the longest content, as
  memory.add's merge keeps the longer text, then the strongest, then the oldest) takes the others'
  tags, the highest confidence and their use counts, and the others whose cosine to it reaches the
  threshold are archived into it. Only memories changed since the last run are compared (with
  everything), so a run costs what changed, not the whole store. With a usable LLM the learning
  loop's judge (daemon/jobs/judge.py) decides each member first: SKIP (merged as by the rule),
  MERGE (the survivor rewritten to hold both), CREATE (a different facet: left alone); without
  one, or when it fails, the rule decides, and the report says which did.
"""

from __future__ import annotations

import datetime as _dt
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import numpy as np
import trio

from ...protocol import Memory, new_id
from .strength import DAY, rfc3339

log = logging.getLogger("eurekamem.memory")


CHUNK = 256  # memories planned or changed per call into the actor
NEIGHBOURS = 8  # nearest memories looked at for each one compared
LISTED = 100  # ids listed in a report (the counts are always complete)


class ArchivePlan(msgspec.Struct, frozen=True):
    id: str
    revision: int
    strength: float
    idle_days: float


class MergePlan(msgspec.Struct, frozen=True):
    survivor: str
    survivor_revision: int
    members: list[tuple[str, int, float]]  # (id, revision, cosine to the survivor)


# --- planning (each runs inside the memory actor, on its state) -----------------------------------


def plan_archives(state: Any, now: float) -> list[ArchivePlan]:
    """Active, unpinned memories whose strength is under the floor and that were not used for
    archive_idle_days (strength's reference time: the last use, else the creation)."""
    settings = state.settings
    cols = state.columns
    labels = cols.labels()
    labels = labels[~cols.pinned[labels]]
    if not len(labels):
        return []
    power = cols.strengths(labels, now, settings)
    idle = (now - cols.reference[labels]) / DAY
    chosen = np.flatnonzero((power < settings.archive_floor) & (idle >= settings.archive_idle_days))
    out = []
    for i in chosen.tolist():
        memory_id = state.id_at(int(labels[i]))
        out.append(ArchivePlan(memory_id, state.revision(memory_id), float(power[i]), float(idle[i])))
    return out


def comparable(state: Any, now: float, since: float | None) -> list[int]:
    """Labels of the memories to compare with the others: active, valid now, not raw, with a
    vector of the current model, and changed since `since` (every one when None)."""
    cols = state.columns
    labels = cols.labels(valid_at=now)
    labels = labels[~cols.raw[labels]]
    if since is not None:
        labels = labels[cols.updated[labels] >= since]
    return [label for label in labels.tolist() if label in state.vectors]


def neighbours(state: Any, labels: list[int], now: float) -> list[tuple[int, int, float]]:
    """(label, other label, cosine) for each of `labels` and its near duplicates: the same domain,
    category and scope, cosine at or above the duplicate threshold."""
    cols = state.columns
    threshold = state.thresholds.duplicate
    groups: dict[tuple[int, int, bool], np.ndarray] = {}
    pairs: list[tuple[int, int, float]] = []
    for label in labels:
        if label not in state.vectors or not cols.live[label] or not cols.active[label] or cols.raw[label]:
            continue  # changed since it was chosen
        key = _group(cols, label)
        group = groups.get(key)
        if group is None:
            memory = state.memory_at(label)
            group = cols.labels(slug=state.slug_of(memory), categories=[memory.category],
                                scope=memory.scope, valid_at=now)
            group = groups[key] = group[~cols.raw[group]]
        if len(group) < 2:
            continue
        found, scores = state.vectors.search(state.vectors.get(label), NEIGHBOURS, group)
        for other, score in zip(found.tolist(), scores.tolist()):
            if other != label and score >= threshold:
                pairs.append((label, int(other), float(score)))
    return pairs


def plan_merges(state: Any, pairs: list[tuple[int, int, float]], now: float) -> list[MergePlan]:
    """Clusters of the pairs (connected components), each with its survivor and the members
    close enough to the survivor itself (a chain A~B~C does not merge A and C unless C ~ A)."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b, _ in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    clusters: dict[int, list[int]] = {}
    for label in list(parent):
        clusters.setdefault(find(label), []).append(label)
    threshold = state.thresholds.duplicate
    plans = []
    cols = state.columns
    for members in clusters.values():
        # checked again here: between the calls a label may have been freed by a purge and reused
        live = [label for label in members if label in state.vectors and cols.live[label] and cols.active[label]
                and not cols.raw[label] and cols.valid_from[label] <= now < cols.valid_until[label]]
        if len(live) < 2:
            continue
        memories = {label: state.memory_at(label) for label in live}
        survivor = min(live, key=lambda label: _survivor_key(memories[label], state.strength_of(memories[label], now)))
        group = _group(cols, survivor)
        centre = state.vectors.get(survivor)
        joined = []
        for label in sorted(live):
            if label == survivor or _group(cols, label) != group:
                continue
            cosine = float(np.dot(state.vectors.get(label), centre))
            if cosine >= threshold:
                joined.append((memories[label].id, state.revision(memories[label].id), round(cosine, 4)))
        if joined:
            plans.append(MergePlan(memories[survivor].id, state.revision(memories[survivor].id), joined))
    return plans


def _group(cols: Any, label: int) -> tuple[int, int, bool]:
    """What consolidation keeps apart: the domain (slug), the category and the scope."""
    return int(cols.domain[label]), int(cols.category[label]), bool(cols.is_global[label])


def _survivor_key(memory: Memory, power: float) -> tuple[Any, ...]:
    """Smallest first: pinned, then the longest content, then the strongest, then the oldest."""
    return (not memory.pinned, -len(memory.content), -power, memory.created_at, memory.id)


# --- applying (inside the memory actor; each change journaled by it) ------------------------------


def apply_archives(state: Any, plans: list[ArchivePlan]) -> tuple[list[str], int]:
    """Archive the planned memories still as planned: (ids archived, how many were skipped)."""
    done, skipped = [], 0
    floor, idle_days = state.settings.archive_floor, state.settings.archive_idle_days
    for plan in plans:
        memory = state.memories.get(plan.id)
        if memory is None or memory.status != "active" or memory.pinned or state.revision(plan.id) != plan.revision:
            skipped += 1
            continue
        state.archive(
            memory,
            f"maintenance: faded (strength {plan.strength:.3f} under {floor}, not used for {plan.idle_days:.0f} days, "
            f"at least {idle_days:g})",
        )
        done.append(plan.id)
    return done, skipped


def apply_merges(state: Any, plans: list[MergePlan], judged: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], int, int]:
    """Merge each planned cluster whose survivor is unchanged; a member that changed stays. With the
    judge's decisions (by member id): SKIP merges as the rule does, MERGE first rewrites the survivor
    to hold both (one rewrite per survivor a run: a second MERGE waits for the next run, against the
    new text), CREATE leaves the member alone. Returns (merges, members kept apart, skipped)."""
    done: list[dict[str, Any]] = []
    skipped = kept_apart = 0
    for plan in plans:
        survivor = state.memories.get(plan.survivor)
        if survivor is None or survivor.status != "active" or state.revision(plan.survivor) != plan.survivor_revision:
            skipped += len(plan.members) + 1
            continue
        members = []
        rewritten = False
        for memory_id, revision, cosine in plan.members:
            memory = state.memories.get(memory_id)
            if memory is None or memory.status != "active" or state.revision(memory_id) != revision:
                skipped += 1
                continue
            verdict = judged.get(memory_id) if judged is not None else None
            if verdict is not None and (verdict.decision == "CREATE" or (verdict.decision == "MERGE" and rewritten)):
                kept_apart += 1
                continue
            if verdict is not None and verdict.decision == "MERGE":
                if verdict.target is None or verdict.target.version != state.version_of(survivor.id):
                    skipped += 1
                    continue
                survivor = _rewrite(state, survivor, memory, verdict)
                rewritten = True
            members.append((memory, cosine, f"judge: {verdict.reason}" if verdict is not None else ""))
        if not members:
            continue
        everyone = [survivor] + [memory for memory, _, _ in members]
        last_used = [memory.last_used for memory in everyone if memory.last_used]
        merged = msgspec.structs.replace(
            survivor,
            tags=list(dict.fromkeys(tag for memory in everyone for tag in memory.tags)),
            confidence=max(memory.confidence for memory in everyone),
            used_count=sum(memory.used_count for memory in everyone),
            ignored_count=sum(memory.ignored_count for memory in everyone),
            wrong_count=sum(memory.wrong_count for memory in everyone),
            last_used=max(last_used, key=_when) if last_used else None,
            pinned=any(memory.pinned for memory in everyone),
            updated_at=state.stamp(),
        )
        state.keep(merged, survivor, "merged", "maintenance: near duplicates merged into it: " + ", ".join(m.id for m, _, _ in members))
        for memory, cosine, why in members:
            state.archive(
                memory,
                f"maintenance: merged into {survivor.id} (near duplicate: cosine {cosine:.3f} >= "
                f"{state.thresholds.duplicate} ({state.model}))" + (f"; {why}" if why else ""),
                superseded_by=survivor.id,
            )
        done.append({"into": survivor.id, "ids": [memory.id for memory, _, _ in members],
                     "cosine": min(cosine for _, cosine, _ in members), "by": "judge" if judged is not None else "rules"})
    return done, kept_apart, skipped


def _rewrite(state: Any, survivor: Memory, member: Memory, verdict: Any) -> Memory:
    """The judge's MERGE: the survivor's text rewritten to hold the member's too (merge_rewritten)."""
    from ...protocol import methods as m

    p = msgspec.convert({"domain": member.domain, "category": member.category, "title": member.title,
                         "content": member.content, "confidence": member.confidence, "tags": list(member.tags),
                         "scope": member.scope}, m.MemoryAdd)
    result: Memory = state.merge_rewritten(survivor.id, verdict.text, p, verdict.vector, f"judge (maintenance): {verdict.reason}")
    return result


def _when(timestamp: str) -> float:
    from .strength import epoch

    return epoch(timestamp)


# --- the job, and when it runs -----------------------------------------------------------------------


KIND = "memory.maintain"


class MemoryMaintenance:
    """The job kind (daemon/jobs): plans by reading the memory actor a chunk at a time, asks the
    judge about the clusters when an LLM is usable, and commits everything in the memory actor's
    stage: the merges, the archives and the MaintenanceRecord, one journal record with the job's
    completion. It needs no LLM (the rule decides without one)."""

    kind = KIND
    needs_llm = False

    async def run(self, ctx: Any) -> Any:
        from ..jobs.outcome import Outcome

        job_id = ctx.record.id
        clock = time.perf_counter()
        started: float = await ctx.read("memory", lambda state: state.wall())
        since = await ctx.read("memory", _last_started)
        # 1. near duplicates: those changed since the last run, each against everything
        todo: list[int] = await ctx.read("memory", lambda state: comparable(state, started, since))
        pairs: list[tuple[int, int, float]] = []
        for at in range(0, len(todo), CHUNK):
            part = todo[at : at + CHUNK]
            pairs += await ctx.read("memory", lambda state, part=part: neighbours(state, part, started))
        plans: list[MergePlan] = await ctx.read("memory", lambda state: plan_merges(state, pairs, started))
        judged, judge_note = await _judge(ctx, plans)
        # 2. what faded (applied after the merges, in the same stage)
        fading: list[ArchivePlan] = await ctx.read("memory", lambda state: plan_archives(state, started))

        def stage(state: Any) -> dict[str, Any]:
            merges, kept_apart, missed = apply_merges(state, plans, judged)
            archived, also_missed = apply_archives(state, fading)
            merged_away = sum(len(merge["ids"]) for merge in merges)
            report: dict[str, Any] = {
                "job_id": job_id,
                "kind": KIND,
                "trigger": getattr(ctx.input, "trigger", ""),
                "started_at": rfc3339(started),
                "finished_at": state.stamp(),
                "started": started,  # seconds since 1970: the next run compares what changed since
                "seconds": round(time.perf_counter() - clock, 3),
                "compared": len(todo),
                "archived": len(archived),
                "merged": merged_away,
                "clusters": len(merges),
                "kept_apart": kept_apart,
                "skipped": missed + also_missed,
                "judge": judge_note,
                "archived_ids": archived[:LISTED],
                "merges": merges[:LISTED],
            }
            state.commit(_record(job_id, report))
            state.mark_readable_dirty()
            log.info(
                "tier 4 maintenance %s: archived %d faded, merged %d duplicates into %d memories, compared %d, "
                "skipped %d (changed meanwhile), judge: %s, %.3f s",
                job_id, len(archived), merged_away, len(merges), len(todo), report["skipped"], judge_note,
                report["seconds"], extra={"maintenance": {k: v for k, v in report.items() if k not in ("archived_ids", "merges")}},
            )
            return report

        return Outcome({"memory": stage}, lambda done: done["memory"])


def _last_started(state: Any) -> float | None:
    """When the last run started (its report's `started`), or None."""
    if not state.maintenance_runs:
        return None
    started = state.maintenance_runs[-1].report.get("started")
    return float(started) if isinstance(started, (int, float)) else None


async def _judge(ctx: Any, plans: list[MergePlan]) -> tuple[dict[str, Any] | None, str]:
    """The learning loop's judge on each cluster's members against their survivor, when an LLM is
    usable: SKIP (a duplicate: merged as by the rule), MERGE (the survivor rewritten to hold both),
    CREATE (a different facet: left alone). Without one, or when it fails, the rule decides."""
    if not plans:
        return None, "rules"
    if not ctx.llm.available:
        return None, f"rules (no LLM: {ctx.llm.unavailable_reason})"
    from ..jobs.judge import Candidate, judge
    from ..jobs.outcome import JobFailed
    from ..llm import LLMError

    def gather(state: Any) -> list[tuple[Memory, int, list[Memory]]]:
        out = []
        for plan in plans:
            survivor = state.memories.get(plan.survivor)
            members = [state.memories[i] for i, _, _ in plan.members if i in state.memories]
            if survivor is not None and members:
                out.append((survivor, state.version_of(survivor.id), members))
        return out

    clusters = await ctx.read("memory", gather)
    by_domain: dict[str, list[tuple[Memory, int, Memory]]] = {}
    for survivor, version, members in clusters:
        for member in members:
            by_domain.setdefault(survivor.domain, []).append((survivor, version, member))
    judged: dict[str, Any] = {}
    try:
        for domain, rows in by_domain.items():
            items = [(member.category, member.title, member.content) for _, _, member in rows]
            candidates = [[Candidate(survivor, version, "near duplicate (maintenance)")] for survivor, version, _ in rows]
            for (_, _, member), decision in zip(rows, await judge(ctx, domain, items, candidates), strict=True):
                judged[member.id] = decision
    except (LLMError, JobFailed) as exc:
        log.warning("tier 4 maintenance: the judge failed (%s); the rule decides", exc)
        return None, f"rules (the judge failed: {exc})"
    return judged, "llm"


def _record(job_id: str, report: dict[str, Any]) -> Any:
    from .records import MaintenanceRecord

    return MaintenanceRecord(job_id=job_id, started_at=report["started_at"], finished_at=report["finished_at"], report=report)


class Internals(Protocol):
    """An actor's internal call: fn(state) between its batches (daemon/tier.py)."""

    async def run_internal(self, fn: Callable[[Any], Any]) -> Any: ...


class JobQueue(Internals, Protocol):
    """What maintenance asks of the job queue (the JobsActor): a look at its jobs, a new job, the
    team's accept by key (its `queue`: the team's, or None)."""

    async def accept(self, kind: str, key: str, job_input: Any) -> str: ...

    async def accept_coalesced(self, kind: str, key: str, job_input: Any, covers: Callable[[Any], bool]) -> str | None: ...


TEAM_KEY = KIND  # every maintenance request's key on several nodes (the module's rule)


def _covers(since: float, record: Any) -> bool:
    """Whether the key's newest job covers a request: queued or running, or started at or after `since`."""
    from ..jobs.state import ACTIVE
    from .strength import epoch

    if record.state in ACTIVE:
        return True
    return record.started_at is not None and epoch(record.started_at) >= since


class Maintenance:
    """When tier 4's maintenance runs: every run is a `memory.maintain` job of the job queue
    (daemon/jobs), asked for by sys.maintain, the nightly schedule or a catch-up after a start;
    while one is queued or running, asking again answers its id. Tier 4's actor makes it."""

    def __init__(self, jobs: JobQueue, memory: Internals, *, wall: Callable[[], float] = time.time) -> None:
        self.jobs = jobs
        self.memory = memory  # the MemoryActor (when the last run finished)
        self.wall = wall
        self.next_at: float | None = None  # when the schedule asks next (seconds since 1970)
        self.last_job_id: str | None = None

    async def request(self, trigger: str, key: str | None = None, since: float | None = None) -> str:
        """The id of the maintenance job under way, else of a new one (journaled before this returns).
        `key` makes a request once only (a night's run across restarts); on several nodes, the team's
        one key instead, and a run started at or after `since` (default: now) covers the request (the
        module's rule)."""
        from ..jobs.state import ACTIVE, MaintainInput

        def active(state: Any) -> str | None:
            return next((r.id for r in reversed(state.jobs.values()) if r.kind == KIND and r.state in ACTIVE), None)

        now = self.wall()
        job_input = MaintainInput(trigger=trigger, requested_at=rfc3339(now))
        if getattr(self.jobs, "queue", None) is not None:  # the team's queue
            covers = functools.partial(_covers, now if since is None else since)
            job_id = await self.jobs.accept_coalesced(KIND, TEAM_KEY, job_input, covers)
        else:
            job_id = await self.jobs.run_internal(active)
        if job_id is None:
            job_id = await self.jobs.accept(KIND, key or f"{KIND}:{trigger}:{new_id()}", job_input)
        self.last_job_id = job_id
        return str(job_id)

    async def last_finished(self) -> float | None:
        result: float | None = await self.memory.run_internal(last_run_time)
        return result

    def statistics(self) -> dict[str, Any]:
        return {"next_at": rfc3339(self.next_at) if self.next_at is not None else None, "last_job_id": self.last_job_id}


def next_nightly(now: float, at: str) -> float:
    """The next moment (seconds since 1970, after `now`) at which the local clock reads `at` (HH:MM)."""
    hour, minute = (int(part) for part in at.split(":"))
    local = _dt.datetime.fromtimestamp(now).astimezone()
    candidate = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if candidate.timestamp() <= now:
        candidate = (candidate + _dt.timedelta(days=1)).replace(hour=hour, minute=minute)
    return candidate.timestamp()


async def schedule(maintenance: Maintenance, at: str, catchup: float) -> None:
    """Ask for maintenance every night at `at` (local time; "off": never on its own), once a night
    (the job's key is the night's date). A run missed while the daemon was down (the last one over
    a day ago, or none yet) is asked for `catchup` seconds after the start instead (0: not at all),
    unless the night comes first or a run (sys.maintain) finished meanwhile."""
    if at == "off":
        return
    wall = maintenance.wall
    now = wall()
    due = next_nightly(now, at)
    last = await maintenance.last_finished()
    catching_up = catchup > 0 and (last is None or now - last > DAY) and now + catchup < due
    if catching_up:
        due = now + catchup
    while True:
        maintenance.next_at = due
        await trio.sleep(max(0.0, due - wall()))
        if wall() + 1e-6 < due:  # woken early (the clock was set back): wait again
            continue
        night = _dt.datetime.fromtimestamp(due).astimezone().date().isoformat()
        try:
            if not catching_up:
                await maintenance.request("nightly", f"{KIND}:nightly:{night}", since=due)
            else:
                last = await maintenance.last_finished()
                if last is None or wall() - last >= DAY:
                    await maintenance.request("catch-up", f"{KIND}:catch-up:{night}", since=wall() - DAY)
        except Exception:  # the journal is read-only, or the daemon stops: asked again the next night
            log.exception("tier 4 maintenance: could not queue the %s run", "catch-up" if catching_up else "nightly")
        catching_up = False
        due = next_nightly(max(wall(), due), at)


def last_run_time(state: Any) -> float | None:
    """When the last maintenance run finished (seconds since 1970), from the journaled records."""
    if not state.maintenance_runs:
        return None
    from .strength import epoch

    try:
        return epoch(state.maintenance_runs[-1].finished_at)
    except ValueError:
        return None


__all__ = [
    "ArchivePlan",
    "Maintenance",
    "MergePlan",
    "apply_archives",
    "apply_merges",
    "comparable",
    "last_run_time",
    "neighbours",
    "next_nightly",
    "plan_archives",
    "plan_merges",
    "schedule",
]
