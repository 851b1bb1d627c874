"""Conversation extraction (job kind `conversation.extract`): a group's new messages, kept as memories,
a rolling summary and predicted intents. And its triggers: conversation.flush and the periodic one.

Rules kept here:
- A job reads, when it runs, the group's window: its newest messages past the high-water mark that
  fit the token budget (ConversationState.window: never a head-cut), with the group's summary, and
  the memories of the group's domain nearest to the window as context. It does not capture them at
  acceptance: the messages are journaled already, and the mark moves only in the job's commit, so
  a failed or interrupted job reads the same window again (and any message that came since).
- The model never sees text the service injected, nor system or tool messages, nor harness and
  channel metadata (daemon/conversation/clean.py); a window with nothing left after that moves the
  mark without asking the LLM.
- One LLM call gives ConversationInsights (daemon/jobs/conversation_schema.py). Messages are shown
  as local ids M1, M2, ...; an answer naming an id it was not shown, or a `when` that does not
  parse, is refused and asked once more with the problem, then the job fails with it. Memories
  under confidence 0.5 are dropped and listed. Every kept memory goes through the dedup rules and
  the CREATE/MERGE/SKIP judge (daemon/jobs/judge.py), in the group's domain (the group's name).
- Everything lands in one commit (daemon/jobs/actor.py): the memories, the group's new mark and its
  summary and intents, and the job's completion, in one journal record; the conversation stage
  refuses a mark that moved since the window was taken. So a window is never extracted twice and
  never half. What the LLM wrote is redacted first (the domain's policy).
- Jobs of one group run one at a time (the kind's lane is the group). A request (flush or periodic)
  joins the group's newest job when that one is queued, or running on a window that covers every
  message the request saw, or done with such a window; else it makes a new job, or none when
  nothing is past the mark. The check and the accept are one internal call of the jobs actor, so a
  burst of flushes makes one job.
- The intents pre-warm search: their query embeddings are put in the memory actor's bounded query
  cache (MemoryActor.warm_queries), so an inject or search for one of them embeds nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

from ...protocol import ProtocolError, normalize_timestamp, now_rfc3339
from ...protocol import methods as m
from ..conversation.clean import Stripped, usable_text
from ..conversation.state import ConversationState, Message, Pending, Summary, Window
from ..conversation.text import date_text
from ..memory.params import MIN_CONFIDENCE, validate_domain
from ..memory.state import MemoryState
from ..memory.strength import epoch
from ..redact import shown as shown_id
from .actor import JobContext
from .conversation_schema import ConversationInsights, ExtractedMemory
from .extract import apply_memories, embed_planned, judge_planned
from .outcome import JobFailed, Outcome
from .state import ConversationInput, JobRecord

log = logging.getLogger("eurekamem.jobs")

KIND = "conversation.extract"
CONTEXT_MEMORIES = 8  # nearest kept memories shown to the model
CONTEXT_QUERY_CHARS = 2000  # of the window's newest text, embedded to find them
SHOWN_MEMORY_CHARS = 400

SYSTEM = (
    "You maintain the long-term memory of an assistant that takes part in a group conversation. From "
    "the conversation's new messages you record what will still matter in later conversations, keep a "
    "short rolling summary of the group, and predict what the group will most likely ask next. You "
    "are precise and brief, you never invent what the messages do not say, and you answer only "
    "through the tool you are given."
)


def key_of(group: str) -> str:
    """Every job of a group has this key: the jobs state's by_key names the group's newest one."""
    return f"{KIND}:{group}"


def _time(msg: Message) -> str:
    try:
        return f"{date_text(msg.timestamp)} {msg.timestamp[11:16]}"
    except (TypeError, IndexError):
        return msg.timestamp


class Shown(msgspec.Struct):
    """The window as the model saw it: local id -> message, and what cleaning removed."""

    messages: dict[str, Message]
    lines: list[str]
    stripped: dict[str, int]


def show(window: Window) -> Shown:
    counts = Stripped()
    shown: dict[str, Message] = {}
    lines = []
    for msg in window.messages:
        text = usable_text(msg.role, msg.text, counts)
        if not text:
            continue
        local = f"M{len(shown) + 1}"
        shown[local] = msg
        who = msg.sender or msg.role
        lines.append(f"[{local}] {who} ({msg.role}, {_time(msg)}): {text}")
    return Shown(shown, lines, counts.as_dict())


def build_prompt(group: str, summary: Summary, shown: Shown, context: list[dict[str, Any]], window: Window) -> str:
    first = next(iter(shown.messages.values()))
    last = list(shown.messages.values())[-1]
    lines = [f"Group: {group}", ""]
    lines.append("The group's summary so far:" if summary.summary else "The group has no summary yet.")
    if summary.summary:
        lines.append(summary.summary)
    if context:
        lines += [
            "",
            "Memories already kept for this group (do not record them again unless the messages change them):",
        ]
        for memory in context:
            content = " ".join(memory["content"].split())
            if len(content) > SHOWN_MEMORY_CHARS:
                content = content[: SHOWN_MEMORY_CHARS - 1] + "…"
            lines.append(f"- {memory['category']}: {memory['title']}: {content}")
    earlier = f" ({window.skipped} older ones did not fit and are left out)" if window.skipped else ""
    lines += [
        "",
        f"New messages, oldest first, from {date_text(first.timestamp)} to {date_text(last.timestamp)}{earlier}:",
        *shown.lines,
        "",
        "Record what a later conversation with this group should know, as memories of five types:",
        "- fact: something true about a participant, the group or the world they live in;",
        "- preference: what someone likes, dislikes or wants done a certain way;",
        "- skill: how to do something, as the group worked it out or taught the assistant;",
        "- goal: what someone intends or plans to do, with its time when given;",
        "- context: an ongoing situation or project that explains later messages.",
        "Only what lasts beyond this exchange; skip small talk, greetings and what the kept memories say.",
        "Each memory: type; title (a few words); abstract (one line, at most 20 words); overview (two to four "
        "sentences that stand alone); content (the full statement, self-contained: names, not pronouns, and "
        "dates, not 'yesterday'); confidence (0 to 1; below 0.5 it is not kept); source_messages (the M ids "
        "of the messages it comes from); attributed_to (the participant it is about, as the messages name "
        "them; empty for the group as a whole); when (the date or time it refers to, resolved against the "
        "messages' dates, never today's: 'last Sunday' in a message of 8 May 2023 is 2023-05-07; null if it "
        "names no time).",
        "Then summary: the group's rolling summary, updated with the new messages (at most 150 words), and "
        "intents: at most 3 short phrases, what the group will most likely ask the assistant next.",
    ]
    return "\n".join(lines)


def check(answer: ConversationInsights, shown: Shown) -> str:
    """What is wrong with the answer that its schema could not say ("" when nothing is)."""
    for index, memory in enumerate(answer.memories, 1):
        unknown = [local for local in memory.source_messages if local not in shown.messages]
        if unknown:
            return f"memory {index} ({memory.title!r}) names messages {unknown} that were not shown (use M1..M{len(shown.messages)})"
        if memory.when is not None:
            try:
                when_of(memory.when)
            except ValueError:
                return f"memory {index} ({memory.title!r}): when {memory.when!r} is not a date (YYYY-MM-DD) or RFC 3339 time"
    return ""


def when_of(text: str) -> str:
    """The time a memory refers to as RFC 3339: a timestamp, a date (its midnight, UTC), or a month
    or year alone (its first day), as a model may give them ("2023-05", "2023"). ValueError else."""
    text = text.strip()
    if len(text) == 4 and text.isdigit():
        text += "-01-01"
    elif len(text) == 7 and text[:4].isdigit() and text[4] == "-" and text[5:].isdigit():
        text += "-01"
    return normalize_timestamp(text)


class Planned(msgspec.Struct):
    """One extracted memory to add, and what became of it before the commit (as extract.Planned)."""

    item: ExtractedMemory
    vector: Any = None  # the memory's vector (its windows' pooled), as memory.add computes it
    passages: dict[str, Any] = {}  # each window's text -> its vector: what memory.add would embed
    judged: Any = None


def add_params(group: str, item: ExtractedMemory, shown: Shown) -> m.MemoryAdd:
    """The memory.add of one extracted memory (PROTOCOL.md, conversation.flush, step 4)."""
    order = {local: index for index, local in enumerate(shown.messages)}  # conversation order
    locals_ = sorted(dict.fromkeys(item.source_messages), key=order.__getitem__)
    sources = [shown.messages[local] for local in locals_]
    newest = sources[-1]
    now = now_rfc3339()
    valid_from = newest.timestamp if epoch(newest.timestamp) <= epoch(now) else now  # never in the future
    return m.MemoryAdd(
        domain=group,
        category=item.type,
        title=" ".join(item.title.split()),
        content=item.content.strip(),
        confidence=round(item.confidence, 4),
        tags=["extracted", "conversation"],
        source_session=newest.session,
        abstract=item.abstract.strip()[: m.MAX_KEY],
        overview=item.overview.strip(),
        valid_from=valid_from,
        source_message_ids=[msg.id for msg in sources][: m.MAX_SOURCE_IDS],
        attributed_to=item.attributed_to.strip() or None,
        refers_to=when_of(item.when) if item.when is not None else None,
    )


class ConversationExtraction:
    kind = KIND
    needs_llm = True

    def __init__(self, token_budget: int) -> None:
        self.token_budget = token_budget

    def lane(self, job_input: Any) -> str | None:
        return f"{KIND}:{job_input.group}" if isinstance(job_input, ConversationInput) else None

    async def run(self, ctx: JobContext) -> Outcome:
        job_input = ctx.input
        assert isinstance(job_input, ConversationInput)  # this kind's input
        group, job_id = job_input.group, ctx.record.id
        window, summary = await ctx.read(
            "conversation", lambda state: state.take_window(group, self.token_budget, job_id)
        )
        base = {"group": group, "mark_from": window.mark_from, "mark_to": window.mark_to, "skipped": window.skipped}
        if window.mark_to <= window.mark_from:  # nothing new (or no such group)
            return Outcome({}, lambda done: {**base, "messages": 0, "memories": [], "llm_calls": 0})
        try:
            validate_domain(group)
        except ProtocolError as exc:
            raise JobFailed(f"the group {group!r} cannot name its memories' domain: {exc.message}") from None
        shown = show(window)
        if not shown.messages:  # only injected text, system or tool messages: nothing to learn, the mark moves
            return Outcome(
                {"conversation": lambda s: commit_window(s, group, window, None, [])},
                lambda done: {
                    **base,
                    "messages": len(window.messages),
                    "shown": 0,
                    "stripped": shown.stripped,
                    "memories": [],
                    "dropped": [],
                    "llm_calls": 0,
                },
            )
        context = await self.context(ctx, group, shown)
        prompt = build_prompt(group, summary, shown, context, window)
        problem = ""
        for _ in range(2):
            asked = prompt if not problem else f"{prompt}\n\nYour previous answer was refused: {problem}. Answer again."
            answer = await ctx.ask(SYSTEM, asked, ConversationInsights, name="conversation_memories")
            problem = check(answer, shown)
            if not problem:
                break
        else:
            raise JobFailed(f"the answer was refused twice; last: {problem}")
        insights: ConversationInsights = ctx.redact(answer, group)  # before anything of it is stored
        planned: list[Planned] = []
        dropped: list[dict[str, Any]] = []
        for item in insights.memories:
            if item.confidence < MIN_CONFIDENCE or not item.title.strip() or not item.content.strip():
                reason = (
                    f"confidence {item.confidence:.2f} is below {MIN_CONFIDENCE}"
                    if item.title.strip() and item.content.strip()
                    else "blank text"
                )
                dropped.append(
                    {"title": item.title, "type": item.type, "confidence": item.confidence, "reason": reason}
                )
            else:
                planned.append(Planned(item))
        adds = [add_params(group, plan.item, shown) for plan in planned]
        await embed_planned(ctx, planned, adds)  # the texts memory.add embeds: the commit embeds nothing
        if planned:
            await judge_planned(ctx, group, planned, adds)
        intents = [" ".join(intent.split()) for intent in insights.intents if intent.strip()][:3]
        new_summary = insights.summary.strip() or summary.summary  # an empty answer keeps the old summary
        await self.warm(ctx, intents)
        stages: dict[str, Callable[[Any], Any]] = {
            "conversation": lambda s: commit_window(s, group, window, new_summary, intents),
        }
        if planned:
            stages["memory"] = lambda s: apply_memories(s, planned, adds)

        def result(done: dict[str, Any]) -> dict[str, Any]:
            return {
                **base,
                "messages": len(window.messages),
                "shown": len(shown.messages),
                "stripped": shown.stripped,
                "memories": done.get("memory", []),
                "dropped": dropped,
                "summary": new_summary,
                "intents": intents,
                "llm_calls": ctx.llm_calls,
            }

        return Outcome(stages, result)

    async def context(self, ctx: JobContext, group: str, shown: Shown) -> list[dict[str, Any]]:
        """The kept memories of the group's domain nearest to the window's newest text. A domain
        that holds no memory yet (a group's first extraction) has none to show: its query, one long
        text and the dearest embedding of the job, is not embedded then."""
        if not await ctx.read("memory", lambda state: state.holds_domain(group)):
            return []
        text = "\n".join(shown.lines)[-CONTEXT_QUERY_CHARS:]
        embedder = ctx.actor.embedder
        try:
            vector = (await trio.to_thread.run_sync(embedder.embed_queries, [text]))[0]
        except Exception as exc:  # the context is a help, not a need: lexical alone then
            log.warning("conversation extraction of %r: the context query could not be embedded: %s", shown_id(group), exc)
            vector = None

        def nearest(state: MemoryState) -> list[dict[str, Any]]:
            return state.nearest_for_context(text, vector, group, CONTEXT_MEMORIES)

        return list(await ctx.read("memory", nearest))

    async def warm(self, ctx: JobContext, intents: list[str]) -> None:
        memory = ctx.actor.tiers.get("memory")
        warm = getattr(memory, "warm_queries", None)
        if intents and warm is not None:
            try:
                await warm(intents)
            except Exception as exc:  # a cache: the search embeds the query itself then
                log.warning("pre-warming the intents' query embeddings failed: %s", exc)


def commit_window(
    state: ConversationState, group: str, window: Window, summary: str | None, intents: list[str]
) -> dict[str, Any]:
    """Run by the conversation actor inside the commit (ConversationState.commit_extraction)."""
    mark = state.commit_extraction(group, window.mark_from, window.mark_to, summary, intents)
    return {"mark": mark}


# --- triggers --------------------------------------------------------------------------------------


class ConversationTrigger:
    """Asks the job queue for conversation extractions: conversation.flush and the periodic trigger."""

    def __init__(self, jobs: Any, conversation: Any) -> None:
        self.jobs = jobs  # the JobsActor
        self.conversation = conversation  # the ConversationActor
        self.requested = 0
        self.periodic_runs = 0
        self.last_periodic: str | None = None

    async def request(self, group: str, trigger: str) -> str | None:
        """The id of the job that extracts every message of the group stored so far (an existing one
        when it covers them: the module's rule), or None when nothing is past the mark. Raises
        ProtocolError not_found for an unknown group; JournalUnavailable when the job cannot be journaled."""
        pending: Pending | None = await self.conversation.run_internal(lambda s: s.extraction_pending(group))
        if pending is None:
            raise ProtocolError("not_found", f"no conversation group {group!r}", field="group")
        job_input = (
            ConversationInput(group=group, trigger=trigger, requested_at=now_rfc3339())
            if pending.newest > pending.mark
            else None
        )

        def covers(record: JobRecord) -> bool:
            if record.state == "running":
                taken = pending.taken
                # not yet read its window: it will read after this request's look (one actor, in order)
                return taken is None or taken[0] != record.id or pending.newest <= taken[1]
            if record.state == "done" and isinstance(record.result, dict):
                return pending.newest <= int(record.result.get("mark_to", -1))
            return False

        self.requested += 1
        job_id: str | None = await self.jobs.accept_coalesced(KIND, key_of(group), job_input, covers)
        return job_id

    async def periodic(self, interval: float, min_chars: int) -> None:
        """Every `interval` seconds, a job for each group with at least min_chars of new text."""
        if interval <= 0:
            return
        while True:
            await trio.sleep(interval)
            await self.run_periodic(min_chars)

    async def run_periodic(self, min_chars: int) -> list[str]:
        groups: list[str] = await self.conversation.run_internal(lambda s: s.groups_with_new_text(min_chars))
        started = []
        for group in groups:
            try:
                job_id = await self.request(group, "periodic")
            except Exception as exc:  # one group's failure (a read-only journal) is logged; the others go on
                log.error("periodic conversation extraction of %r could not be queued: %s", shown_id(group), exc)
                continue
            if job_id is not None:
                started.append(job_id)
        self.periodic_runs += 1
        self.last_periodic = now_rfc3339()
        return started

    def statistics(self) -> dict[str, Any]:
        return {"requested": self.requested, "periodic_runs": self.periodic_runs, "last_periodic": self.last_periodic}


FlushFn = Callable[[str], Awaitable[str | None]]  # what the conversation actor calls for conversation.flush
