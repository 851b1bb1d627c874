"""Tier 4 maintenance: archive what faded, consolidate near duplicates that slipped through, report.

Rules kept here:
- Nothing is deleted. A faded memory (strength under `archive_floor` and not used for
  `archive_idle_days`; never a pinned one) is archived: status `archived`, its file in
  `_archive/`, the reason in `archived_reason`; `memory.restore` brings it back. A merged
  duplicate is archived the same way with `superseded_by` naming the memory it was merged into.
- The state is read and changed only inside the memory actor (`run_internal`), a chunk at a time
  (CHUNK memories), so requests interleave with a long run. A plan is applied only to memories
  whose revision is still the one planned for: one used, edited or archived meanwhile is left
  alone (counted in `skipped`).
- Every change is a PutMemory journaled by the actor like any write; the run's report is
  journaled last (MaintenanceRecord), which is also how the next start knows when it last ran.
- Consolidation is rule-based: within a domain, category and scope, active memories valid now
  that were not stored raw (dedup false) and whose vectors have cosine at or above the model's
  calibrated duplicate threshold form clusters; the survivor (pinned first, then the longest
  content, as memory.add's merge keeps the longer text, then the strongest, then the oldest)
  takes the others' tags, the highest confidence and their use counts, and the others whose
  cosine to it reaches the threshold are archived into it. Only memories changed since the last
  run are compared (with everything), so a run costs what changed, not the whole store.
- The seam for the job queue and its LLM judge (not on this branch): `Maintenance.run` is what a
  `memory.maintain` job kind calls, and `judge`, when set, decides a cluster's merge instead of
  the rule (it is None today: with no judge the rule decides; no LLM path is implemented here).
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import numpy as np
import trio
from eurekamem.daemon.memory.strength import DAY, rfc3339
from eurekamem.protocol import Memory, new_id

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


def apply_merges(state: Any, plans: list[MergePlan]) -> tuple[list[dict[str, Any]], int]:
    """Merge each planned cluster whose survivor is unchanged; a member that changed stays."""
    done: list[dict[str, Any]] = []
    skipped = 0
    for plan in plans:
        survivor = state.memories.get(plan.survivor)
        if survivor is None or survivor.status != "active" or state.revision(plan.survivor) != plan.survivor_revision:
            skipped += len(plan.members) + 1
            continue
        members = []
        for memory_id, revision, cosine in plan.members:
            memory = state.memories.get(memory_id)
            if memory is None or memory.status != "active" or state.revision(memory_id) != revision:
                skipped += 1
                continue
            members.append((memory, cosine))
        if not members:
            continue
        everyone = [survivor] + [memory for memory, _ in members]
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
        state.keep(merged, survivor, "merged", "maintenance: near duplicates merged into it: " + ", ".join(m.id for m, _ in members))
        for memory, cosine in members:
            state.archive(
                memory,
                f"maintenance: merged into {survivor.id} (near duplicate: cosine {cosine:.3f} >= "
                f"{state.thresholds.duplicate} ({state.model}))",
                superseded_by=survivor.id,
            )
        done.append({"into": survivor.id, "ids": [memory.id for memory, _ in members],
                     "cosine": min(cosine for _, cosine in members)})
    return done, skipped


def _when(timestamp: str) -> float:
    from eurekamem.daemon.memory.strength import epoch

    return epoch(timestamp)


# --- the run, and when it runs ----------------------------------------------------------------------


Judge = Callable[[list[Memory]], Awaitable[Any]]


class Maintenance:
    """Runs maintenance on a memory actor, one run at a time; keeps the last report."""

    def __init__(self, actor: Any, *, wall: Callable[[], float] = time.time, judge: Judge | None = None) -> None:
        self.actor = actor
        self.wall = wall
        self.judge = judge  # see the module docstring: None, the rule decides
        self.running: str | None = None
        self.last: dict[str, Any] | None = None
        self.next_at: float | None = None  # when the schedule runs it next (seconds since 1970)
        self.finished_at: float | None = None  # when the last run finished (the journal's, at start)
        self.runs = 0
        self._finished = trio.Event()

    def start(self, nursery: trio.Nursery) -> str:
        """sys.maintain: start a run in the background and return its job id (the running one's
        id if a run is already under way)."""
        if self.running is not None:
            return self.running
        job_id = new_id()
        self.running = job_id  # at once: a second sys.maintain before the task starts gets this id
        nursery.start_soon(self._run_logged, job_id)
        return job_id

    async def wait(self) -> dict[str, Any] | None:
        """Until the run under way (if any) is over; the last report."""
        if self.running is not None:
            await self._finished.wait()
        return self.last

    async def run(self) -> dict[str, Any]:
        """One run now (waiting for one under way first); its report."""
        while self.running is not None:
            await self._finished.wait()
        job_id = new_id()
        self.running = job_id
        return await self._run_logged(job_id)

    async def _run_logged(self, job_id: str) -> dict[str, Any]:
        self._finished = trio.Event()
        try:
            report = await self._run(job_id)
        except Exception as exc:  # the journal turned read-only, or a bug: reported, and run again next time
            log.exception("tier 4 maintenance %s failed", job_id)
            report = {"job_id": job_id, "kind": "memory.maintain", "state": "failed",
                      "error": f"{type(exc).__name__}: {exc}", "finished_at": rfc3339(self.wall())}
        finally:
            self.running = None
            self._finished.set()
        if report.get("state") == "done":
            self.finished_at = self.wall()
        self.last = report
        self.runs += 1
        return report

    async def _run(self, job_id: str) -> dict[str, Any]:
        actor = self.actor
        started = self.wall()
        clock = time.perf_counter()
        last = await actor.run_internal(lambda state: state.maintenance_runs[-1] if state.maintenance_runs else None)
        since = None
        if last is not None and "started" in last.report:
            since = float(last.report["started"])
        # 1. near duplicates: those changed since the last run, each against everything
        todo = await actor.run_internal(lambda state: comparable(state, started, since))
        pairs: list[tuple[int, int, float]] = []
        for at in range(0, len(todo), CHUNK):
            part = todo[at : at + CHUNK]
            pairs += await actor.run_internal(lambda state, part=part: neighbours(state, part, started))
        plans = await actor.run_internal(lambda state: plan_merges(state, pairs, started))
        merges: list[dict[str, Any]] = []
        skipped = 0
        for at in range(0, len(plans), CHUNK):
            part = plans[at : at + CHUNK]
            done, missed = await actor.run_internal(lambda state, part=part: apply_merges(state, part))
            merges += done
            skipped += missed
        # 2. what faded
        fading = await actor.run_internal(lambda state: plan_archives(state, started))
        archived: list[str] = []
        for at in range(0, len(fading), CHUNK):
            part = fading[at : at + CHUNK]
            done, missed = await actor.run_internal(lambda state, part=part: apply_archives(state, part))
            archived += done
            skipped += missed
        finished = self.wall()
        merged_away = sum(len(merge["ids"]) for merge in merges)
        report: dict[str, Any] = {
            "job_id": job_id,
            "kind": "memory.maintain",
            "state": "done",
            "started_at": rfc3339(started),
            "finished_at": rfc3339(finished),
            "started": started,  # seconds since 1970: the next run compares what changed since
            "seconds": round(time.perf_counter() - clock, 3),
            "compared": len(todo),
            "archived": len(archived),
            "merged": merged_away,
            "clusters": len(merges),
            "skipped": skipped,
            "judge": "rules" if self.judge is None else "judge",
            "archived_ids": archived[:LISTED],
            "merges": merges[:LISTED],
        }
        record = _record(job_id, report)
        await actor.run_internal(lambda state: state.commit(record))
        await actor.run_internal(lambda state: state.mark_readable_dirty())
        log.info(
            "tier 4 maintenance %s: archived %d faded, merged %d duplicates into %d memories, compared %d, skipped %d "
            "(changed meanwhile), %.3f s",
            job_id, len(archived), merged_away, len(merges), len(todo), skipped, report["seconds"],
            extra={"maintenance": {k: v for k, v in report.items() if k not in ("archived_ids", "merges")}},
        )
        return report

    def statistics(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "runs": self.runs,
            "next_at": rfc3339(self.next_at) if self.next_at is not None else None,
            "last": self.last,
        }


def _record(job_id: str, report: dict[str, Any]) -> Any:
    from eurekamem.daemon.memory.state import MaintenanceRecord

    return MaintenanceRecord(job_id=job_id, started_at=report["started_at"], finished_at=report["finished_at"], report=report)


def next_nightly(now: float, at: str) -> float:
    """The next moment (seconds since 1970, after `now`) at which the local clock reads `at` (HH:MM)."""
    hour, minute = (int(part) for part in at.split(":"))
    local = _dt.datetime.fromtimestamp(now).astimezone()
    candidate = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if candidate.timestamp() <= now:
        candidate = (candidate + _dt.timedelta(days=1)).replace(hour=hour, minute=minute)
    return candidate.timestamp()


async def schedule(maintenance: Maintenance, at: str, catchup: float) -> None:
    """Run maintenance every night at `at` (local time; "off": never on its own). A run missed
    while the daemon was down (the last one, `maintenance.finished_at`, over a day ago, or none
    yet) runs `catchup` seconds after the start instead (0: not at all), unless the night comes
    first or a run (sys.maintain) happened meanwhile."""
    if at == "off":
        return
    wall = maintenance.wall
    now = wall()
    due = next_nightly(now, at)
    catching_up = catchup > 0 and (maintenance.finished_at is None or now - maintenance.finished_at > DAY) and now + catchup < due
    if catching_up:
        due = now + catchup
    while True:
        maintenance.next_at = due
        await trio.sleep(max(0.0, due - wall()))
        if wall() + 1e-6 < due:  # woken early (the clock was set back): wait again
            continue
        recent = maintenance.finished_at is not None and wall() - maintenance.finished_at < DAY
        if not (catching_up and recent):
            await maintenance.run()
        catching_up = False
        due = next_nightly(max(wall(), due), at)


def last_run_time(state: Any) -> float | None:
    """When the last maintenance run finished (seconds since 1970), from the journaled records."""
    if not state.maintenance_runs:
        return None
    from eurekamem.daemon.memory.strength import epoch

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
