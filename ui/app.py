"""The pages of `eurekamem ui`: a Starlette app whose every read and change is a daemon call through
the AsyncClient it is given (the UI keeps no memory of its own), rendered by Jinja2 on the server.

Rules kept here: templates autoescape, so every stored text (which agents and users wrote) is shown
as text; a change is a POST of one of these pages' forms (the guard in front checks its CSRF token)
answered by a redirect back (303), so a reload never repeats it; the daemon's errors become an
error page with the daemon's message, never a crash of the server; lists are paged (PAGE rows).
"""

from __future__ import annotations

import datetime as _dt
import getpass
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..client import AsyncClient, EurekamemError, NotFound
from ..protocol import ASSISTANT_CATEGORIES, RESEARCH_CATEGORIES, domain_slug
from . import graph_svg
from .guard import CSRF_KEY, FORM_KEY, Guard, guarded

HERE = Path(__file__).resolve().parent
PAGE = 50  # memories per page
MESSAGES = 200  # a group's messages on its page
MAX_SCAN = 10_000  # a source message is looked for among the group's last this many (conversation.get's most)
LISTED = 200  # requests on a page of the review queue, jobs on the jobs page (the newest: jobs.list has no offset)
GROUPS_SEARCHED = 20  # conversation groups a search looks in (the page says which it left out)
SECTION = 10  # memories of each category on a domain's page (MEMORY.md's layout); the category's own page has them all
CATEGORIES = [*RESEARCH_CATEGORIES, *ASSISTANT_CATEGORIES]  # MEMORY.md's order
DONE = {  # the notes a change leaves on the page it returns to (?done=...): fixed texts, never echoed input
    "updated": "Saved.", "pinned": "Pinned: it never fades.", "unpinned": "Unpinned.",
    "closed": "Closed: it stopped being true now.", "reopened": "Reopened: true again.",
    "forgotten": "Forgotten (archived): restore brings it back.", "restored": "Restored.",
    "purged": "Purged: erased from everything the daemon keeps.", "used": "Counted as used.",
    "wrong": "Counted as wrong.", "promoted": "Asked for it to be shared (see Review).",
    "approved": "Approved: the memory is global now.", "rejected": "Rejected.",
    "retried": "Queued again.", "cancelled": "Cancelled.", "confirmed": "Confirmed: the skill is active.",
    "discarded": "Discarded: the draft and its file are deleted.",
}
STATUS_CODES = {"not_found": 404, "invalid_params": 400, "too_large": 413, "overloaded": 503, "unavailable": 503,
                "read_only": 503}

Handler = Callable[[Request], Awaitable[Response]]


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True,
    )
    env.filters["when"] = _when
    env.filters["query"] = lambda params: urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return env


def _when(value: str | None) -> str:
    """An RFC 3339 time as people read it (UTC, to the second); "" for none."""
    if not value:
        return ""
    try:
        moment = _dt.datetime.fromisoformat(value).astimezone(_dt.UTC)
    except ValueError:
        return value
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat()


def _span(seconds: float) -> str:
    """A stretch of time as people say it, roughly: "~40 days", "~5 months", "~2 years"."""
    days = seconds / 86400
    if days < 1:
        return "less than a day"
    if days < 61:
        return f"~{round(days)} day{'s' if round(days) != 1 else ''}"
    if days < 548:  # up to a year and a half
        return f"~{round(days / 30.44)} months"
    return f"~{round(days / 365.25)} years"


def strength_words(outlook: dict[str, Any], status: str, now: _dt.datetime | None = None) -> str:
    """A memory's strength (memory.strength's answer) in words: how strong, and when it fades
    (falls under the archive floor, after which maintenance archives it unless it is used)."""
    now = now or _dt.datetime.now(_dt.UTC)
    value = outlook["strength"]
    level = "strong" if value >= 0.7 else "fair" if value >= 0.35 else "weak"
    if status != "active":
        return f"{level} ({value:.2f}); archived: restore brings it back"
    if outlook["pinned"]:
        return f"{level} ({value:.2f}), pinned: never fades"
    if outlook["fades_at"] is None:
        return f"{level} ({value:.2f}); never archived (archive_floor is 0)"
    fades = _dt.datetime.fromisoformat(outlook["fades_at"])
    archivable = _dt.datetime.fromisoformat(outlook["archivable_at"])
    if fades > now:
        return f"{level} ({value:.2f}), fades in {_span((fades - now).total_seconds())}"
    if archivable > now:
        return f"faded ({value:.2f}); archived in {_span((archivable - now).total_seconds())} unless it is used"
    return f"faded ({value:.2f}); the next maintenance archives it unless it is used"


def _int(value: str | None, default: int, low: int, high: int) -> int:
    try:
        return max(low, min(high, int(value))) if value not in (None, "") else default
    except ValueError:
        return default


class UI:
    """The pages, over one daemon client. `by` is the name the review decisions carry (the daemon
    adds the uid of this process, its peer on the socket)."""

    def __init__(self, client: AsyncClient, guard: Guard, by: str | None = None) -> None:
        self.client = client
        self.guard = guard
        self.uid = os.getuid()
        self.by = by or f"ui:{getpass.getuser()}"
        self.env = _environment()
        self.pictures = graph_svg.Pictures()

    # --- the frame: every page's status strip and the rendering ---------------------------------

    async def call(self, method: str, **params: Any) -> Any:
        return await self.client.call(method, params)

    async def calls(self, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
        """Several daemon calls sent at once (pipelined); their results in order, or the first error raised."""
        answers = await self.client.call_many(calls)
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        return answers

    async def render(self, request: Request, template: str, code: int = 200, **context: Any) -> HTMLResponse:
        stats = await self.client.call("sys.stats")
        done = request.query_params.get("done")
        page = self.env.get_template(template).render(
            request=request, csrf=request.scope.get(CSRF_KEY, ""), strip=_strip(stats), note=DONE.get(done or ""),
            categories=CATEGORIES, **context,
        )
        return HTMLResponse(page, status_code=code)

    def form(self, request: Request) -> dict[str, str]:
        form: dict[str, str] = request.scope.get(FORM_KEY, {})
        return form

    @staticmethod
    def back(url: str, done: str) -> RedirectResponse:
        sep = "&" if "?" in url else "?"
        return RedirectResponse(f"{url}{sep}done={done}", status_code=303)

    async def failed(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EurekamemError)
        status = STATUS_CODES.get(exc.kind, 502)
        try:
            return await self.render(request, "error.html", code=status, error=exc)
        except EurekamemError:  # the daemon is away: a page without the strip
            page = self.env.get_template("error.html").render(
                request=request, csrf="", strip=None, note=None, categories=CATEGORIES, error=exc)
            return HTMLResponse(page, status_code=status)

    # --- domains and memories -------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        groups = await self.call("conversation.groups")
        overview = await self.call("memory.domains")  # every domain's counts, without listing memories
        counted = {d["slug"]: d for d in overview["domains"]}
        named = {d["domain"]: d for d in overview["domains"]}
        for g in groups:  # a group's domain that holds no memory yet
            if domain_slug(g["domain"]) not in counted:
                named.setdefault(g["domain"], None)
        domains = sorted(named.items(), key=lambda item: item[0].lower())
        return await self.render(request, "index.html", domains=domains, groups=groups, total=overview["total"])

    async def domain(self, request: Request) -> Response:
        q = request.query_params
        name = q.get("name", "")
        category = q.get("category") or None
        status = q.get("status") if q.get("status") in ("active", "archived", "any") else "active"
        page = _int(q.get("page"), 1, 1, 10**6)
        found = (await self.call("memory.domains", domain=name))["domains"]
        by_category = found[0]["categories"] if found else {}
        counts = {c: sum(n for s, n in by_category.get(c, {}).items() if status in ("any", s)) for c in CATEGORIES}
        # as MEMORY.md shows them: by category, each strongest first; one category's memories paged
        wanted = [category] if category else [c for c in CATEGORIES if counts[c]]
        limit, offset = (PAGE, (page - 1) * PAGE) if category else (SECTION, 0)
        answers = await self.calls([
            ("memory.list", {"domain": name, "category": c, "status": status, "limit": limit, "offset": offset,
                             "order": "strongest"}) for c in wanted
        ])
        sections = list(zip(wanted, answers))
        shown = [memory for _, listing in sections for memory in listing["memories"]]
        outlooks = await self.call("memory.strength", ids=[m["id"] for m in shown]) if shown else []
        strengths = {o["id"]: strength_words(o, memory["status"]) for o, memory in zip(outlooks, shown)}
        total = sections[0][1]["total"] if category else sum(counts.values())
        return await self.render(
            request, "domain.html", name=name, category=category, status=status, page=page,
            counts=counts, sections=sections, strengths=strengths, total=total, section=SECTION,
            pages=max(1, -(-total // PAGE)) if category else 1,
        )

    async def readable(self, request: Request) -> Response:
        name = request.query_params.get("domain") or None
        text = (await self.call("memory.list", domain=name, limit=1, readable=True))["readable"]
        return await self.render(request, "readable.html", name=name, text=text)

    async def memory(self, request: Request) -> Response:
        memory_id = request.path_params["id"]
        memory, history, outlooks = await self.calls([
            ("memory.get", {"id": memory_id}), ("memory.history", {"id": memory_id}), ("memory.strength", {"ids": [memory_id]})])
        outlook = outlooks[0]
        return await self.render(
            request, "memory.html", m=memory, history=list(reversed(history)), outlook=outlook,
            strength=strength_words(outlook, memory["status"]),
        )

    async def edit_form(self, request: Request) -> Response:
        memory = await self.call("memory.get", id=request.path_params["id"])
        return await self.render(request, "edit.html", m=memory)

    async def edit(self, request: Request) -> Response:
        memory_id = request.path_params["id"]
        form = self.form(request)
        old = await self.call("memory.get", id=memory_id)
        changes: dict[str, Any] = {}
        for field in ("title", "content", "category", "abstract", "overview"):
            if field in form and form[field].replace("\r\n", "\n") != old[field]:
                changes[field] = form[field].replace("\r\n", "\n")
        if "confidence" in form:
            try:
                confidence = float(form["confidence"])
            except ValueError:
                confidence = old["confidence"]
            if confidence != old["confidence"]:
                changes["confidence"] = confidence
        if "tags" in form:
            tags = [t.strip() for t in form["tags"].split(",") if t.strip()]
            if tags != old["tags"]:
                changes["tags"] = tags
        if changes:
            await self.call("memory.update", id=memory_id, **changes)
        return self.back(f"/memory/{memory_id}", "updated")

    async def act(self, request: Request) -> Response:
        """pin, unpin, close, reopen, forget, restore, used, wrong, promote: one daemon call each."""
        memory_id, action = request.path_params["id"], request.path_params["action"]
        calls: dict[str, tuple[str, dict[str, Any]]] = {
            "pin": ("memory.update", {"pinned": True}),
            "unpin": ("memory.update", {"pinned": False}),
            "close": ("memory.update", {"valid_until": _now()}),
            "reopen": ("memory.update", {"valid_until": None}),
            "forget": ("memory.delete", {}),
            "restore": ("memory.restore", {}),
            "promote": ("memory.promote", {"by": self.by, "reason": self.form(request).get("reason") or None}),
        }
        done = {"pin": "pinned", "unpin": "unpinned", "close": "closed", "reopen": "reopened", "forget": "forgotten",
                "restore": "restored", "promote": "promoted", "used": "used", "wrong": "wrong"}
        if action in ("used", "wrong"):
            await self.call("memory.feedback", ids=[memory_id], signal=action)
        elif action in calls:
            method, params = calls[action]
            await self.call(method, id=memory_id, **params)
        else:
            raise NotFound(f"no action {action!r}")
        return self.back(f"/memory/{memory_id}", done[action])

    async def purge_form(self, request: Request) -> Response:
        memory = await self.call("memory.get", id=request.path_params["id"])
        return await self.render(request, "purge.html", m=memory)

    async def purge(self, request: Request) -> Response:
        memory_id = request.path_params["id"]
        memory = await self.call("memory.get", id=memory_id)
        if self.form(request).get("confirm") != "purge":
            return self.back(f"/memory/{memory_id}/purge", "")
        await self.call("memory.delete", id=memory_id, purge=True)
        return self.back(f"/domain?{urlencode({'name': memory['domain']})}", "purged")

    # --- search ---------------------------------------------------------------------------------

    async def search(self, request: Request) -> Response:
        q = request.query_params
        query = q.get("q", "").strip()
        filters = {
            "domain": q.get("domain") or None,
            "categories": [q["category"]] if q.get("category") else None,
            "scope": q.get("scope") or None,
            "as_of": q.get("as_of") or None,
            "status": q.get("status") or "active",
            "mode": q.get("mode") or "hybrid",
        }
        hits: list[Any] = []
        messages: list[tuple[str, list[Any]]] = []  # (group, its best hits): scores compare within one group only
        unsearched: list[Any] = []
        if query:
            hits = await self.call("memory.search", query=query, k=20, **{k: v for k, v in filters.items() if v is not None})
            groups = await self.call("conversation.groups")
            if filters["domain"]:
                groups = [g for g in groups if g["domain"] == filters["domain"] or g["group"] == filters["domain"]]
            answers = await self.calls(
                [("conversation.search", {"group": g["group"], "query": query, "k": 5}) for g in groups[:GROUPS_SEARCHED]])
            messages = [(group["group"], answer) for group, answer in zip(groups, answers) if answer]
            unsearched = groups[GROUPS_SEARCHED:]
        return await self.render(request, "search.html", query=query, filters=q, hits=hits, messages=messages,
                                 unsearched=unsearched)

    # --- review ---------------------------------------------------------------------------------

    async def review(self, request: Request) -> Response:
        state = request.query_params.get("state") or "pending"
        state = state if state in ("pending", "approved", "refused", "any") else "pending"
        page = _int(request.query_params.get("page"), 1, 1, 10**6)
        items = await self.call("review.list", state=state, limit=LISTED + 1, offset=(page - 1) * LISTED)
        return await self.render(request, "review.html", state=state, items=items[:LISTED], more=len(items) > LISTED,
                                 page=page, by=self.by, uid=self.uid)

    async def decide(self, request: Request) -> Response:
        review_id, decision = request.path_params["id"], request.path_params["decision"]
        if decision not in ("approve", "reject"):
            raise NotFound(f"no decision {decision!r}")
        if decision == "approve":
            await self.call("review.approve", id=review_id, by=self.by)
            return self.back("/review", "approved")
        await self.call("review.reject", id=review_id, by=self.by, reason=self.form(request).get("reason") or None)
        return self.back("/review", "rejected")

    # --- jobs -----------------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        state = request.query_params.get("state") or None
        state = state if state in ("queued", "running", "done", "failed", "cancelled") else None
        jobs = await self.call("jobs.list", state=state, limit=LISTED + 1)
        return await self.render(request, "jobs.html", state=state, jobs=jobs[:LISTED], more=len(jobs) > LISTED)

    async def job_action(self, request: Request) -> Response:
        job_id, action = request.path_params["id"], request.path_params["action"]
        if action not in ("retry", "cancel"):
            raise NotFound(f"no action {action!r}")
        await self.call("jobs.retry" if action == "retry" else "jobs.cancel", id=job_id)
        return self.back("/jobs", "retried" if action == "retry" else "cancelled")

    # --- the knowledge graph --------------------------------------------------------------------

    async def graph(self, request: Request) -> Response:
        q = request.query_params
        domain = q.get("domain", "")
        centre = q.get("node") or None
        depth = _int(q.get("depth"), 1, 1, 3)
        find = q.get("find", "").strip()
        found = await self.call("graph.search", query=find, limit=50) if find else []
        export = (await self.call("graph.export", format="node_link"))["data"]
        whole = graph_svg.build(export)
        part = graph_svg.select(whole, domain, centre, depth)
        # the layout is quadratic in the nodes: in a worker thread, so the other pages go on meanwhile
        picture = await trio.to_thread.run_sync(self.pictures.get, part.graph, centre)
        stats = await self.call("graph.stats")
        return await self.render(
            request, "graph.html", domain=domain, centre=centre, depth=depth, picture=picture, stats=stats,
            part=part, cap=graph_svg.MAX_NODES, domains=graph_svg.domains(whole), find=find, found=found,
            centre_name=whole.name(centre) if centre is not None and centre in whole else None,
            unknown_centre=centre is not None and centre not in whole,
        )

    async def node(self, request: Request) -> Response:
        node = await self.call("graph.get", node_id=request.path_params["id"])
        related = await self.call("graph.related", node_id=node["node_id"], depth=1)
        return await self.render(request, "node.html", node=node, related=related)

    # --- skills and conversation groups ---------------------------------------------------------

    async def skills(self, request: Request) -> Response:
        skills = await self.call("skills.list", status="any")
        return await self.render(request, "skills.html", skills=skills)

    async def skill_action(self, request: Request) -> Response:
        """confirm (the draft becomes active) or discard (the draft and its file are deleted)."""
        action = request.path_params["action"]
        if action not in ("confirm", "discard"):
            raise NotFound(f"no action {action!r}")
        await self.call(f"skills.{action}", name=request.path_params["name"])
        return self.back("/skills", "confirmed" if action == "confirm" else "discarded")

    async def session(self, request: Request) -> Response:
        """Where a memory came from: its session's events while the session is open (the daemon keeps
        them until it ends), else where the session's end wrote them."""
        session_id = request.query_params.get("id", "")
        events = await self.call("episodic.recent", session_id=session_id, n=500)
        return await self.render(request, "session.html", session_id=session_id, events=events)

    async def groups(self, request: Request) -> Response:
        return await self.render(request, "groups.html", groups=await self.call("conversation.groups"))

    async def group(self, request: Request) -> Response:
        """A group's summary and its last MESSAGES messages; with `message` (a memory's source), the
        MESSAGES around that one, found among the group's last MAX_SCAN."""
        name = request.query_params.get("name", "")
        wanted = request.query_params.get("message") or None
        summary = await self.call("conversation.summary", group=name)
        if wanted is None:
            messages = await self.call("conversation.get", group=name, limit=MESSAGES)
            return await self.render(request, "group.html", name=name, summary=summary, messages=messages, wanted=None,
                                     found=False)
        every = await self.call("conversation.get", group=name, limit=MAX_SCAN)
        at = next((i for i, message in enumerate(every) if message["id"] == wanted), None)
        start = max(0, (at if at is not None else len(every)) - MESSAGES // 2)
        window = every[start : start + MESSAGES] if at is not None else every[-MESSAGES:]
        return await self.render(request, "group.html", name=name, summary=summary, messages=window, wanted=wanted,
                                 found=at is not None)


def _strip(stats: dict[str, Any]) -> dict[str, Any]:
    """The status strip: what the daemon is and runs on, and whether an LLM can be used."""
    llm = stats.get("jobs", {}).get("llm", {})
    usable = [f"{v.get('provider')}{':' + v['model'] if v.get('model') else ''}" for v in llm.values() if v.get("available")]
    journal = stats.get("journal", {})
    return {
        "version": stats.get("version"),
        "data_dir": stats.get("data_dir"),
        "store": stats.get("store", {}).get("store", "journal"),
        "model": stats.get("memory", {}).get("model"),
        "journal": f"fsync {journal.get('fsync')}, {journal.get('segments')} segments, {journal.get('bytes', 0):,} bytes"
        + (f", FAILED: {journal['failed']}" if journal.get("failed") else ""),
        "read_only": stats.get("read_only"),
        "llm": ", ".join(usable) if usable else None,
        "llm_why": stats.get("jobs", {}).get("waiting_reason"),
        "memories": stats.get("tiers", {}).get("memory", {}).get("active"),
        "pending": stats.get("tiers", {}).get("memory", {}).get("reviews_pending"),
    }


def make_app(client: AsyncClient, guard: Guard, by: str | None = None) -> Any:
    """The ASGI app: the pages behind the guard."""
    ui = UI(client, guard, by)
    routes = [
        Route("/", ui.index),
        Route("/domain", ui.domain),
        Route("/readable", ui.readable),
        Route("/memory/{id}", ui.memory),
        Route("/memory/{id}/edit", ui.edit_form, methods=["GET"]),
        Route("/memory/{id}/edit", ui.edit, methods=["POST"]),
        Route("/memory/{id}/purge", ui.purge_form, methods=["GET"]),
        Route("/memory/{id}/purge", ui.purge, methods=["POST"]),
        Route("/memory/{id}/{action}", ui.act, methods=["POST"]),
        Route("/search", ui.search),
        Route("/review", ui.review),
        Route("/review/{id}/{decision}", ui.decide, methods=["POST"]),
        Route("/jobs", ui.jobs),
        Route("/jobs/{id}/{action}", ui.job_action, methods=["POST"]),
        Route("/graph", ui.graph),
        Route("/graph/node/{id}", ui.node),
        Route("/skills", ui.skills),
        Route("/skills/{name}/{action}", ui.skill_action, methods=["POST"]),
        Route("/session", ui.session),
        Route("/groups", ui.groups),
        Route("/group", ui.group),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, exception_handlers={EurekamemError: ui.failed})
    return guarded(app, guard)
