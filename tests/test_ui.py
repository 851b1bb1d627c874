"""`eurekamem ui`: its pages through an ASGI client (httpx's ASGITransport, in this test's trio run)
against one real daemon for the module; the guard's refusals; stored markup shown as text; and the
command itself as a subprocess serving real HTTP on 127.0.0.1."""

from __future__ import annotations

import datetime
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from daemon_process import DaemonProcess, shared_daemon
from eurekamem.client import AsyncClient, Client, NotFound
from eurekamem.ui import Guard, make_app
from eurekamem.ui.app import CATEGORIES

PORT = 8123  # the port the ASGI tests' guard believes it serves (no socket is bound for them)
BASE = f"http://127.0.0.1:{PORT}"
MARKUP = '<script>alert("x")</script><img src=x onerror=alert(1)><b>bold</b>'


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    # usem3: the module writes a few hundred memories, which it embeds ~5x as fast as e5-small
    with shared_daemon("em-ui-", "--embedder", "usem3") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[Client]:
    with Client(str(daemon.socket_path)) as c:
        yield c


@asynccontextmanager
async def browser(daemon: DaemonProcess, login: bool = True) -> AsyncIterator[tuple[httpx.AsyncClient, Guard]]:
    """An httpx client on the app (a fresh guard and token), logged in with the printed link's token;
    the whole test within 60 s."""
    guard = Guard(port=PORT)
    with trio.fail_after(60):
        async with AsyncClient(str(daemon.socket_path), timeout=30) as daemon_client:
            app = make_app(daemon_client, guard, by="tester")
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as web:
                if login:
                    answer = await web.get(guard.url().removeprefix(BASE))
                    assert answer.status_code == 200 and guard.cookie in answer.headers["set-cookie"]
                yield web, guard


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


async def post(web: httpx.AsyncClient, path: str, page: str, **fields: str) -> httpx.Response:
    """A form of `page` sent as a browser sends it (its CSRF token, this page as Origin)."""
    return await web.post(path, data={"csrf": csrf_of(page), **fields}, headers={"origin": BASE})


def add(client: Client, domain: str, title: str, content: str, **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = client.call("memory.add", domain=domain, category="pitfalls", title=title,
                                         content=content, dedup=False, **extra)["memory"]
    return result


async def test_the_guard_refuses_what_is_not_this_users_page(daemon: DaemonProcess, client: Client) -> None:
    memory = add(client, "guard", "Guarded memory", "Nothing may change it without the form's token.")
    async with browser(daemon, login=False) as (web, guard):
        token = guard.token
        no_cookie = await web.get("/")
        assert no_cookie.status_code == 403 and "one-time token" in no_cookie.text
        assert no_cookie.headers["content-security-policy"].startswith("default-src 'self'")
        # a DNS-rebinding page names its own host (or another port): refused before anything else
        for host in ("evil.example", f"evil.example:{PORT}", f"127.0.0.1:{PORT + 1}", "127.0.0.1"):
            wrong = await web.get(f"/?token={token}", headers={"host": host})
            assert wrong.status_code == 400, host
        assert guard.token == token  # not spent by the refused requests
        login = await web.get(f"/?token={token}")
        assert login.status_code == 200
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
        page = await web.get(f"/memory/{memory['id']}")
        assert page.status_code == 200 and "Guarded memory" in page.text
        for header in ("content-security-policy", "x-content-type-options", "x-frame-options", "referrer-policy"):
            assert header in page.headers
        # state changes: no CSRF token, a wrong one, another Origin, another content type: refused, nothing changed
        path = f"/memory/{memory['id']}/forget"
        assert (await web.post(path, data={"reason": ""}, headers={"origin": BASE})).status_code == 403
        assert (await web.post(path, data={"csrf": "wrong"}, headers={"origin": BASE})).status_code == 403
        assert (await web.post(path, data={"csrf": csrf_of(page.text)}, headers={"origin": "http://evil.example"})).status_code == 403
        assert (await web.post(path, json={"csrf": csrf_of(page.text)})).status_code == 415
        assert (await web.put(path, data={"csrf": csrf_of(page.text)})).status_code == 405
        assert client.call("memory.get", id=memory["id"])["status"] == "active"
        # the token works once: another browser with the same link is refused
        async with httpx.AsyncClient(transport=web._transport, base_url=BASE) as other:
            again = await other.get(f"/?token={token}")
            assert again.status_code == 403 and "used already" in again.text
            assert (await other.get("/")).status_code == 403
        # with the token and the right Origin (or none, as some browsers send), the same form works
        done = await web.post(path, data={"csrf": csrf_of(page.text)})
        assert done.status_code == 303
    assert client.call("memory.get", id=memory["id"])["status"] == "archived"


async def test_stored_markup_is_shown_as_text_on_every_page(daemon: DaemonProcess, client: Client) -> None:
    memory = add(client, "markup <b>domain</b>", f"Title {MARKUP}", f"Content {MARKUP}", tags=["<i>tag</i>"])
    review = client.call("memory.promote", id=memory["id"], reason=f"share {MARKUP}")
    node = client.call("graph.add_theorem", theorem_name=f"Lemma {MARKUP}", formal_statement=f"x {MARKUP}", domain="markup")
    client.call("conversation.append", group="markup chat", messages=[{"id": "m1", "role": "user", "sender": "<u>eve</u>", "text": f"hello {MARKUP}"}])
    client.call("episodic.log", session_id="markup-session", agent_role="theory", content=f"tried {MARKUP}")
    pages = [
        "/", "/domain?name=markup+%3Cb%3Edomain%3C%2Fb%3E", f"/memory/{memory['id']}", f"/memory/{memory['id']}/edit",
        f"/memory/{memory['id']}/purge", "/search?q=Title+alert", "/review", "/graph?domain=markup",
        f"/graph/node/{node['node_id']}", "/group?name=markup+chat", "/session?id=markup-session", "/readable?domain=markup+%3Cb%3Edomain%3C%2Fb%3E",
    ]
    async with browser(daemon) as (web, _):
        for path in pages:
            answer = await web.get(path)
            assert answer.status_code == 200, (path, answer.text[-500:])
            html = answer.text
            assert "<script>alert" not in html and "<img src=x" not in html and "<b>bold" not in html, path
            assert "&lt;script&gt;alert" in html or "&lt;b&gt;" in html, path  # it is there, as text
            # the only scripts are our own file, loaded from 'self'
            assert re.findall(r"<script[^>]*>", html) == ['<script src="/static/ui.js" defer>'], path
    assert review["state"] == "pending"


async def test_a_memorys_page_and_its_actions(daemon: DaemonProcess, client: Client) -> None:
    memory = add(client, "actions", "Median of means", "Hoeffding needs bounded rewards; use median of means instead.")
    mid = memory["id"]
    async with browser(daemon) as (web, _):
        page = (await web.get(f"/memory/{mid}")).text
        for shown in ("L0 · abstract", "L1 · overview", "L2 · content", memory["file"], "still true", "created"):
            assert shown in page
        # strength in words: a new pitfall (half-life 180 days) is strong and fades in about two years
        outlook = client.call("memory.strength", ids=[mid])[0]
        assert outlook["half_life_days"] == 180 and outlook["fades_at"] is not None
        assert re.search(r'id="strength"><strong>strong \(0\.\d\d\), fades in ~\d years</strong>', page), page
        assert "halved every 180 days" in page and "each use restarts the clock" in page
        edit = (await web.get(f"/memory/{mid}/edit")).text
        answer = await post(web, f"/memory/{mid}/edit", edit, title="Median of means, heavy tails",
                            content=memory["content"], category="proof_strategy", confidence="0.9", tags="robust, bandits")
        assert answer.status_code == 303 and answer.headers["location"].endswith("done=updated")
        now = client.call("memory.get", id=mid)
        assert (now["title"], now["category"], now["confidence"], now["tags"]) == (
            "Median of means, heavy tails", "proof_strategy", 0.9, ["robust", "bandits"])
        for action, check in [
            ("pin", lambda m: m["pinned"]), ("unpin", lambda m: not m["pinned"]),
            ("close", lambda m: m["valid_until"] is not None), ("reopen", lambda m: m["valid_until"] is None),
            ("used", lambda m: m["used_count"] == 1), ("forget", lambda m: m["status"] == "archived"),
            ("restore", lambda m: m["status"] == "active"),
        ]:
            page = (await web.get(f"/memory/{mid}")).text
            assert f'action="/memory/{mid}/{action}"' in page, action
            if action == "unpin":
                assert "pinned: never fades" in page
            answer = await post(web, f"/memory/{mid}/{action}", page)
            assert answer.status_code == 303, (action, answer.text)
            assert check(client.call("memory.get", id=mid)), action
        shown = await web.get(answer.headers["location"].removeprefix(BASE))
        assert "Restored." in shown.text
        history = [v["decision"] for v in client.call("memory.history", id=mid)]
        assert history[0] == "created" and "archived" in history and history[-1] == "restored"
        assert "<strong>restored</strong>" in shown.text and "<strong>archived</strong>" in shown.text
        # purge asks first, says it cannot be undone, and erases
        confirm = (await web.get(f"/memory/{mid}/purge")).text
        assert "cannot be undone" in confirm
        not_confirmed = await post(web, f"/memory/{mid}/purge", confirm)
        assert not_confirmed.status_code == 303 and client.call("memory.get", id=mid)["status"] == "active"
        purged = await post(web, f"/memory/{mid}/purge", confirm, confirm="purge")
        assert purged.status_code == 303 and "done=purged" in purged.headers["location"]
        with pytest.raises(NotFound):
            client.call("memory.get", id=mid)
        gone = await web.get(f"/memory/{mid}")
        assert gone.status_code == 404 and "no memory" in gone.text
        # a refused edit (a title of two lines) shows the daemon's reason and changes nothing
        other = add(client, "actions", "Kept as it was", "An edit the daemon refuses leaves it whole.")
        edit = (await web.get(f"/memory/{other['id']}/edit")).text
        refused = await post(web, f"/memory/{other['id']}/edit", edit, title="two\nlines", content=other["content"])
        assert refused.status_code == 400 and "title" in refused.text
        assert client.call("memory.get", id=other["id"])["title"] == "Kept as it was"


async def test_a_memory_links_to_the_session_it_came_from(daemon: DaemonProcess, client: Client) -> None:
    client.call("episodic.log", session_id="sess-open", agent_role="theory", content="Tried Hoeffding; rewards are heavy-tailed.")
    memory = add(client, "sessions", "Heavy tails", "Hoeffding fails for heavy-tailed rewards.", source_session="sess-open")
    async with browser(daemon) as (web, _):
        page = (await web.get(f"/memory/{memory['id']}")).text
        assert '<a href="/session?id=sess-open" id="session">sess-open</a>' in page
        session = (await web.get("/session?id=sess-open")).text
        assert "The session is open" in session and "Tried Hoeffding; rewards are heavy-tailed." in session
        client.call("session.close", session_id="sess-open", extract=False)
        ended = (await web.get("/session?id=sess-open")).text
        assert 'id="ended"' in ended and "runs/sess-open/episodic.json" in ended
        assert (await web.get("/session?id=")).status_code == 400  # no session named: the daemon refuses, a page says why


async def test_a_source_message_is_shown_in_its_place_among_the_groups_messages(daemon: DaemonProcess, client: Client) -> None:
    client.call("conversation.append", group="long chat", messages=[
        {"id": f"old-{i}", "role": "user", "sender": "ann", "text": f"Message number {i} of a long chat."} for i in range(260)])
    async with browser(daemon) as (web, _):
        last = (await web.get("/group?name=long+chat")).text
        assert 'id="message-old-5"' not in last and 'id="message-old-259"' in last  # the last 200 only
        around = (await web.get("/group?name=long+chat&message=old-5")).text
        assert 'id="message-old-5" class="wanted"' in around and "around the source message" in around
        assert around.count('<li id="message-') == 200 and 'id="message-old-0"' in around
        lost = (await web.get("/group?name=long+chat&message=nowhere")).text
        assert 'id="not-found"' in lost and 'id="message-old-259"' in lost


def test_strength_in_words() -> None:
    from eurekamem.ui.app import strength_words

    now = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)

    def at(days: float) -> str:
        return (now + datetime.timedelta(days=days)).isoformat()

    def words(value: float, fades: float | None, archivable: float | None = None, pinned: bool = False, status: str = "active") -> str:
        outlook = {"strength": value, "pinned": pinned, "fades_at": None if fades is None else at(fades),
                   "archivable_at": None if fades is None else at(archivable if archivable is not None else fades)}
        return strength_words(outlook, status, now)

    assert words(0.92, 40.2) == "strong (0.92), fades in ~40 days"
    assert words(0.5, 200) == "fair (0.50), fades in ~7 months"
    assert words(0.2, 800) == "weak (0.20), fades in ~2 years"
    assert words(0.1, 0.5) == "weak (0.10), fades in less than a day"
    assert words(0.04, -3, 12) == "faded (0.04); archived in ~12 days unless it is used"
    assert words(0.04, -30, -1) == "faded (0.04); the next maintenance archives it unless it is used"
    assert words(1.0, None, pinned=True) == "strong (1.00), pinned: never fades"
    assert words(0.8, None) == "strong (0.80); never archived (archive_floor is 0)"
    assert words(0.3, 10, status="archived") == "weak (0.30); archived: restore brings it back"


async def test_domains_list_memories_by_category_strongest_first_paged(daemon: DaemonProcess, client: Client) -> None:
    items = [{"domain": "paged", "category": "fact" if i % 3 else "goal", "title": f"Fact number {i}",
              "content": f"The value of item {i} is {i * 7}.", "confidence": 0.3 + (i % 7) / 10, "dedup": False} for i in range(120)]
    client.call("memory.add_many", items=items)

    def confidences(page: str) -> list[float]:
        return [float(c) for c in re.findall(r'<td class="strength">[^<]*</td><td>([\d.]+)</td>', page)]

    async with browser(daemon) as (web, _):
        assert "paged" in (await web.get("/")).text
        every = (await web.get("/domain?name=paged")).text  # as MEMORY.md: by category, each strongest first
        assert every.count('<a href="/memory/') == 20 and "120 memories by category" in every
        assert re.search(r">fact</a> 80<", every) and re.search(r">goal</a> 40<", every)
        order = [c for c in CATEGORIES if f'id="category-{c}"' in every]
        assert order == [c for c in CATEGORIES if c in ("fact", "goal")]
        assert "all 80 fact memories" in every and "all 40 goal memories" in every
        assert confidences(every)[:10] == sorted(confidences(every)[:10], reverse=True) and confidences(every)[0] == 0.9
        first = (await web.get("/domain?name=paged&category=fact")).text
        assert first.count('<a href="/memory/') == 50 and "80 memories" in first and "page 1 of 2" in first
        second = (await web.get("/domain?name=paged&category=fact&page=2")).text
        assert second.count('<a href="/memory/') == 30 and 'id="next"' not in second
        ranked = confidences(first) + confidences(second)  # equal half-lives and ages: confidence decides
        assert len(ranked) == 80 and ranked == sorted(ranked, reverse=True)
        assert "fades in ~" in first and "strong (0.90)" in first
        readable = (await web.get("/readable?domain=paged")).text
        assert "# " in readable and "Fact number 1" in readable


async def test_search_explains_each_hit_and_filters(daemon: DaemonProcess, client: Client) -> None:
    add(client, "searching", "Peeling for anytime bounds", "A peeling argument over doubling epochs gives anytime regret bounds.")
    client.call("memory.add", domain="searching", category="fact", title="Peeling potatoes",
                content="Peeling potatoes is easier after boiling them.", dedup=False)
    client.call("conversation.append", group="searching", messages=[
        {"id": "s1", "role": "user", "sender": "ann", "text": "Did the peeling argument give anytime bounds?"}])
    async with browser(daemon) as (web, _):
        both = (await web.get("/search?q=peeling&domain=searching")).text
        assert "Peeling for anytime bounds" in both and "Peeling potatoes" in both
        for explained in ("(calibrated)", "cosine", "BM25", "lexical rank", "fused", "strength"):
            assert explained in both
        assert "Did the peeling argument" in both  # the group's messages too, linked and explained
        assert 'href="/group?name=searching#message-s1" class="message-hit"' in both
        conversations = both[both.index("<h2>Conversations</h2>"):]
        assert re.search(r"score -?[\d.]+ \((zscore|learned)\) ·\s+cosine", conversations) and "lexical rank 1" in conversations
        pitfalls = (await web.get("/search?q=peeling&domain=searching&category=pitfalls")).text
        assert "Peeling for anytime bounds" in pitfalls and "Peeling potatoes" not in pitfalls
        past = (await web.get("/search?q=peeling&domain=searching&as_of=2000-01-01T00:00:00Z")).text
        assert "No memory matches." in past
        bad = await web.get("/search?q=peeling&as_of=yesterday")
        assert bad.status_code == 400
        client.call_many([("conversation.append", {"group": f"zz group {i:02d}", "messages": [
            {"id": "z1", "role": "user", "sender": "zed", "text": "peeling again"}]}) for i in range(21)])
        many = (await web.get("/search?q=peeling")).text  # more groups than a search looks in: the page says which
        assert 'id="unsearched"' in many and "zz group 20" in many
        assert 'id="unsearched"' not in (await web.get("/search?q=peeling&domain=searching")).text


async def test_review_approve_and_reject_as_the_daemons_peer(daemon: DaemonProcess, client: Client) -> None:
    shared = add(client, "reviewing", "Share me", "Doubling trick: restart with twice the horizon.")
    kept = add(client, "reviewing", "Keep me local", "A local convention of this project only.")
    first = client.call("memory.promote", id=shared["id"], by="alice", reason="general")["review_id"]
    second = client.call("memory.promote", id=kept["id"], by="alice")["review_id"]
    async with browser(daemon) as (web, _):
        page = (await web.get("/review")).text
        assert "Share me" in page and "Keep me local" in page and f"uid {os.getuid()}" in page and "tester" in page
        assert (await post(web, f"/review/{first}/approve", page)).status_code == 303
        assert (await post(web, f"/review/{second}/reject", page, reason="too local")).status_code == 303
        assert (await post(web, f"/review/{second}/maybe", page)).status_code == 404
        decided = (await web.get("/review?state=any")).text
        assert "approved by tester" in decided and "refused by tester" in decided and "too local" in decided
    items = {r["id"]: r for r in client.call("review.list", state="any")}
    assert items[first]["state"] == "approved" and items[first]["decided_by"] == "tester"
    assert items[first]["decided_uid"] == os.getuid()
    assert client.call("memory.get", id=shared["id"])["scope"] == "global"
    assert items[second]["state"] == "refused" and items[second]["decision_reason"] == "too local"


async def test_long_lists_say_there_is_more(daemon: DaemonProcess, client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    from eurekamem.ui import app as ui_app

    monkeypatch.setattr(ui_app, "LISTED", 2)  # what 201 requests would show, with 3
    for i in range(3):
        memory = add(client, "long queue", f"Proposal {i}", f"Shared technique number {i}.")
        client.call("memory.promote", id=memory["id"], by="alice")
    for group in ("queue chat a", "queue chat b", "queue chat c"):  # three extraction jobs (queued: no LLM)
        client.call("conversation.append", group=group, messages=[{"id": "q1", "role": "user", "text": "Remember this."}])
        client.call("conversation.flush", group=group)
    async with browser(daemon) as (web, _):
        first = (await web.get("/review")).text
        assert first.count('class="review"') == 2 and 'id="next"' in first and "previous" not in first
        second = (await web.get("/review?page=2")).text
        assert ">previous</a>" in second and second.count('class="review"') >= 1
        titles = lambda page: set(re.findall(r'<a href="/memory/[^"]+">([^<]+)</a>', page))  # noqa: E731
        assert not titles(first) & titles(second)
        jobs = (await web.get("/jobs")).text
        assert jobs.count('<tr id="job-') == 2 and 'id="more"' in jobs


async def test_jobs_cancel_and_retry(daemon: DaemonProcess, client: Client) -> None:
    client.call("conversation.append", group="jobs chat", messages=[
        {"id": "j1", "role": "user", "sender": "bob", "text": "Remember that the deadline moved to Friday."}])
    job_id = client.call("conversation.flush", group="jobs chat")["job_id"]
    async with browser(daemon) as (web, _):
        page = (await web.get("/jobs?state=queued")).text
        assert "conversation.extract" in page and "no LLM" in page  # queued, and why
        assert (await post(web, f"/jobs/{job_id}/cancel", page)).status_code == 303
        assert client.call("jobs.get", id=job_id)["state"] == "cancelled"
        page = (await web.get("/jobs?state=cancelled")).text
        assert f'action="/jobs/{job_id}/retry"' in page
        assert (await post(web, f"/jobs/{job_id}/retry", page)).status_code == 303
        assert client.call("jobs.get", id=job_id)["state"] == "queued"
        client.call("jobs.cancel", id=job_id)
        maintained = client.call("sys.maintain")["job_id"]  # needs no LLM: it runs, and its report is shown
        assert client.call("jobs.wait", id=maintained, timeout=30)["state"] == "done"
        done = (await web.get("/jobs?state=done")).text
        assert f'id="job-{maintained}"' in done and "<summary>result</summary>" in done


async def test_the_graph_is_an_svg_with_neighbourhoods(daemon: DaemonProcess, client: Client) -> None:
    names = ["Hoeffding", "Azuma", "Freedman", "Bernstein"]
    ids = [client.call("graph.add_theorem", theorem_name=n, formal_statement=f"{n}'s inequality", domain="concentration")["node_id"] for n in names]
    client.call("graph.link", from_id=ids[1], to_id=ids[0], relation="generalizes")
    client.call("graph.link", from_id=ids[2], to_id=ids[1], relation="generalizes")
    client.call("graph.link", from_id=ids[3], to_id=ids[2], relation="contradicts")
    async with browser(daemon) as (web, _):
        whole = (await web.get("/graph?domain=concentration")).text
        assert "<svg" in whole and all(f'href="/graph/node/{i}"' in whole for i in ids)
        assert whole.count('class="edge"') == 3 and 'stroke-dasharray' in whole
        near = (await web.get(f"/graph?node={ids[0]}&depth=1")).text
        assert near.count('class="node"') == 2
        wider = (await web.get(f"/graph?node={ids[0]}&depth=3")).text
        assert wider.count('class="node"') == 4
        statement = (await web.get(f"/graph/node/{ids[1]}")).text
        assert "Azuma&#39;s inequality" in statement and "Hoeffding" in statement and "Freedman" in statement


async def test_a_big_graph_is_cut_to_its_cap_and_the_page_says_what_it_left_out(daemon: DaemonProcess, client: Client) -> None:
    # 330 theorems: a hub in "big hubs" used by 329 others in "big leaves"; 20 of them also in "big other"
    hub = client.call("graph.add_theorem", theorem_name="Hub lemma", formal_statement="everything uses it", domain="big hubs")["node_id"]
    made = client.call_many([("graph.add_theorem", {"theorem_name": f"Leaf {i:03d}", "formal_statement": f"leaf {i}",
                                                    "domain": "big other" if i < 20 else "big leaves"}) for i in range(329)])
    leaves = [node["node_id"] for node in made]
    client.call_many([("graph.link", {"from_id": leaf, "to_id": hub, "relation": "uses"}) for leaf in leaves])
    client.call("graph.link", from_id=leaves[0], to_id=leaves[1], relation="contradicts")
    async with browser(daemon) as (web, _):
        page = (await web.get("/graph?domain=big")).text
        assert page.count('class="node"') == 300
        assert "30 of the 330 theorems of these domains are left out" in page and "the most connected" in page
        assert f'href="/graph/node/{hub}"' in page  # the hub, the most connected, is drawn
        cut = page[page.index('id="cut"'):page.index("</div>", page.index('id="cut"'))]
        left = dict(re.findall(r'<a href="/graph\?domain=big\+\w+">(big \w+)</a> (\d+)', cut))  # what was left out, by domain
        assert set(left) <= {"big leaves", "big other"} and sum(map(int, left.values())) == 30, cut
        assert "find a theorem by name" in page
        narrowed = (await web.get("/graph?domain=big+other")).text
        assert narrowed.count('class="node"') == 20 and 'id="cut"' not in narrowed
        near = (await web.get(f"/graph?node={hub}&depth=1")).text
        assert near.count('class="node"') == 300 and "30 of the 330 theorems in this neighbourhood are left out" in near
        assert "at depth 1 and beyond" in near and "lower the depth" in near
        assert f'href="/graph?node={hub}&amp;depth=2"' in near and f'href="/graph?node={hub}&amp;depth=1"' not in near
        found = (await web.get("/graph?find=Leaf+007")).text
        assert f'href="/graph?node={leaves[7]}&amp;depth=2"' in found and "No theorem" not in found
        assert "No theorem's name or statement contains" in (await web.get("/graph?find=nothing+like+it")).text
        unknown = (await web.get("/graph?node=unknown")).text
        assert "No theorem has the id unknown" in unknown


def test_a_picture_is_laid_out_once_while_its_graph_is_unchanged() -> None:
    from eurekamem.ui import graph_svg

    export = {"nodes": [{"id": f"n{i}", "theorem_name": f"T{i}", "domain": "d"} for i in range(4)],
              "edges": [{"source": "n0", "target": "n1", "key": "uses"}, {"source": "n2", "target": "n3", "key": "contradicts"}]}
    pictures = graph_svg.Pictures(size=2)

    def part(data: dict[str, Any]) -> Any:
        return graph_svg.select(graph_svg.build(data)).graph

    whole = part(export)
    first = pictures.get(whole, None)
    assert pictures.get(part(export), None) is first  # the same graph again: not drawn again
    assert first == graph_svg.svg(whole)  # seeded: the same picture as a fresh layout
    renamed = part({**export, "nodes": [{**export["nodes"][0], "theorem_name": "Renamed"}, *export["nodes"][1:]]})
    assert "Renamed" in pictures.get(renamed, None)  # a change is a new picture
    centred = pictures.get(whole, "n0")
    assert centred is not first and 'fill="#f4d03f"' in centred  # the centre is marked: another picture
    assert pictures.get(whole, None) is not first  # the oldest of three was let go (size 2)


async def test_skills_and_conversation_groups(daemon: DaemonProcess, client: Client) -> None:
    client.call("skills.put", name="ucb_regret", body="# UCB\nSplit the regret.", status="draft", description="UCB1 regret")
    client.call("skills.put", name="used_skill", body="# Used\nA skill in use.")
    client.call("skills.record_use", name="used_skill", success=True)
    client.call("conversation.append", group="team chat", messages=[
        {"id": "t1", "role": "user", "sender": "carol", "text": "We ship on Monday."}])
    async with browser(daemon) as (web, _):
        page = (await web.get("/skills")).text
        assert "ucb_regret" in page and "draft" in page and "100%" in page
        assert (await post(web, "/skills/ucb_regret/confirm", page)).status_code == 303
        assert client.call("skills.get", name="ucb_regret")["status"] == "active"
        # discard: a draft and its file are deleted; an active skill is refused; never without the form's token
        client.call("skills.put", name="bad_draft", body="# Bad\nA wrong lesson.", status="draft", source="distilled")
        client.call("sys.snapshot")
        draft_file = daemon.data_dir / "memory" / "skill_drafts" / "bad_draft" / "SKILL.md"
        assert draft_file.is_file()
        page = (await web.get("/skills")).text
        assert 'action="/skills/bad_draft/discard"' in page and 'action="/skills/ucb_regret/discard"' not in page
        forged = await web.post("/skills/bad_draft/discard", data={"csrf": "forged"}, headers={"origin": BASE})
        assert forged.status_code == 403 and client.call("skills.get", name="bad_draft")["status"] == "draft"
        refused = await post(web, "/skills/ucb_regret/discard", page)
        assert refused.status_code == 400 and "only a draft can be discarded" in refused.text
        discarded = await post(web, "/skills/bad_draft/discard", page)
        assert discarded.status_code == 303 and discarded.headers["location"].endswith("done=discarded")
        with pytest.raises(NotFound):
            client.call("skills.get", name="bad_draft")
        client.call("sys.snapshot")  # the projector has removed the file by then
        assert not draft_file.exists() and client.call("skills.get", name="ucb_regret")["status"] == "active"
        assert "Discarded" in (await web.get(discarded.headers["location"].removeprefix(BASE))).text
        groups = (await web.get("/groups")).text
        assert "team chat" in groups
        group = (await web.get("/group?name=team+chat")).text
        assert "We ship on Monday." in group and "carol" in group and "No summary yet" in group
        assert 'id="message-t1"' in group
        # a memory extracted from the group links to its source messages
        extracted = client.call("memory.add", domain="team chat", category="fact", title="Shipping day",
                                content="The team ships on Monday.", source_message_ids=["t1"])["memory"]
        page = (await web.get(f"/memory/{extracted['id']}")).text
        assert 'href="/group?name=team+chat&amp;message=t1#message-t1"' in page
        strip = (await web.get("/")).text
        assert 'id="strip"' in strip and "store: journal" in strip and "model: usem3" in strip and "no LLM usable" in strip


def test_the_command_serves_real_http_on_loopback_only(daemon: DaemonProcess) -> None:
    """`eurekamem ui` as users run it: hypercorn on 127.0.0.1, the printed link, the Host check."""
    env = {k: v for k, v in os.environ.items() if k not in ("EUREKAMEM_SOCKET", "EUREKACLAW_DIR")}
    env["EUREKAMEM_NO_AUTOSTART"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "eurekamem.cli.main", "ui", "--socket", str(daemon.socket_path),
         "--data-dir", str(daemon.data_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"(http://127\.0\.0\.1:(\d+)/)\?token=\S+", line)
        assert found, line + (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
        with httpx.Client(timeout=30) as web:
            assert web.get(found.group(1)).status_code == 403  # no cookie yet
            assert web.get(found.group(0)).status_code == 200
            home = web.get(found.group(1))
            assert home.status_code == 200 and "Domains" in home.text
            rebound = web.get(found.group(1), headers={"host": f"attacker.example:{found.group(2)}"})
            assert rebound.status_code == 400
        proc.send_signal(signal.SIGINT)  # Ctrl-C: a quiet end
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def test_the_command_names_the_extra_it_needs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Without the web libraries, `eurekamem ui` says which extra installs them (and starts nothing)."""
    import importlib.util

    from eurekamem.cli import ui as command
    from eurekamem.cli.main import build_parser

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "hypercorn" else found(name, *a))
    args = build_parser("ui").parse_args(["ui", "--port", "0"])
    assert command.cmd_ui(args) == 1
    assert "needs hypercorn: pip install 'eurekamem[ui]'" in capsys.readouterr().err


async def test_a_daemon_that_does_not_answer_is_a_page_not_a_crash(tmp_path: Path) -> None:
    guard = Guard(port=PORT)
    with trio.fail_after(30):
        async with AsyncClient(str(tmp_path / "nobody.sock"), timeout=5) as away:
            app = make_app(away, guard)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as web:
                assert (await web.get(guard.url().removeprefix(BASE))).status_code == 200
                for path in ("/", "/search?q=x", "/graph"):
                    answer = await web.get(path)
                    assert answer.status_code == 502 and "The daemon did not answer" in answer.text, path


@pytest.mark.postgres
async def test_the_pages_work_on_the_postgres_store(postgres_dsn: str, sock_dir: Path) -> None:
    """The UI speaks only the protocol: the same pages and forms over a daemon whose store is PostgreSQL."""
    proc = DaemonProcess(sock_dir / "data", sock_dir / "s.sock", "--store", "postgres", "--postgres-dsn", postgres_dsn).start()
    try:
        with Client(str(proc.socket_path)) as c:
            memory = add(c, "pg", "Kept in PostgreSQL", "The store is a database; the page does not care.")
            async with browser(proc) as (web, _):
                home = (await web.get("/")).text
                assert "store: postgres" in home and ">pg</a>" in home
                assert 'id="empty"' in (await web.get("/graph")).text  # no theorem yet: said, not an empty picture
                page = (await web.get(f"/memory/{memory['id']}")).text
                assert "fades in ~" in page and "fades in ~" in (await web.get("/domain?name=pg")).text
                assert (await post(web, f"/memory/{memory['id']}/forget", page)).status_code == 303
            assert c.call("memory.get", id=memory["id"])["status"] == "archived"
    finally:
        proc.terminate()


async def test_bad_input_is_a_clear_error_page_never_a_crash(daemon: DaemonProcess, client: Client) -> None:
    memory = add(client, "odd input", "Left alone", "Odd requests change nothing.")
    async with browser(daemon) as (web, _):
        for path, status in [
            ("/domain?name=../etc", 400), ("/domain?name=x&page=abc&status=weird", 200), ("/search?q=" + "x" * 5000, 413),
            ("/search?q=x&category=nonsense", 400), ("/graph?depth=99&node=unknown", 200), ("/graph/node/unknown", 404),
            ("/memory/unknown", 404), ("/review?state=bogus", 200), ("/jobs?state=bogus", 200), ("/group?name=", 400),
            ("/readable?domain=a/../b", 400), ("/nowhere", 404),
        ]:
            answer = await web.get(path)
            assert answer.status_code == status, (path, answer.status_code, answer.text[-300:])
        page = (await web.get(f"/memory/{memory['id']}/edit")).text
        for fields in ({"confidence": "5"}, {"category": "nonsense"}, {"content": "   "}):
            answer = await post(web, f"/memory/{memory['id']}/edit", page, title="Left alone", **fields)
            assert answer.status_code == 400, (fields, answer.text[-300:])
        for path in ("/jobs/unknown/retry", "/skills/unknown/confirm", "/skills/unknown/discard", "/skills/x/drop", "/review/unknown/approve", "/memory/unknown/pin"):
            assert (await post(web, path, page)).status_code == 404, path
    after = client.call("memory.get", id=memory["id"])
    assert (after["title"], after["content"], after["confidence"], after["category"]) == (
        "Left alone", "Odd requests change nothing.", memory["confidence"], memory["category"])
