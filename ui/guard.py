"""What keeps the page the user's own: the Host check, the one-time token, the session cookie, the
CSRF token and the headers every answer carries, as one ASGI middleware in front of the pages.

Rules kept here (a web page on 127.0.0.1 is reachable by every other page the user's browser runs):
- a request whose Host is not 127.0.0.1:PORT or localhost:PORT is refused (a DNS-rebinding page
  names its own host);
- the URL the command prints holds a token that works once: it becomes a random session id in an
  HttpOnly, SameSite=Strict cookie (named after the port: cookies do not tell ports apart), and
  every other request without that cookie is refused;
- every POST (the only method that changes anything; others but GET and HEAD are refused) carries
  the session's CSRF token as a form field, and an Origin, when the browser sends one, of this
  very page; its urlencoded body is read and parsed here, bounded, and handed to the page in the
  scope, so no page can forget the check;
- every answer says `Content-Security-Policy: default-src 'self'` (with no framing, no base, forms
  only to self), `nosniff`, the referrer only to itself, no caching.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY = 16 * 1024 * 1024  # a memory's content is at most 1 Mi characters: 4 MiB of UTF-8, urlencoded up to 3x
MAX_FIELDS = 64
FORM_KEY = "eurekamem.form"  # the scope's key for a POST's parsed form (field -> its last value)
CSRF_KEY = "eurekamem.csrf"  # the scope's key for the session's CSRF token (the pages put it in each form)
CSRF_FIELD = "csrf"
HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),  # not no-referrer: Chromium then sends `Origin: null` with a form
    (b"cache-control", b"no-store"),
]


class Guard:
    """The UI's secrets: the one-time token, the sessions it opened and each one's CSRF token, and
    the port the server listens on (known once it is bound: until then every request is refused)."""

    def __init__(self, port: int | None = None) -> None:
        self.token: str | None = secrets.token_urlsafe(32)
        self.sessions: dict[str, str] = {}  # session id -> its CSRF token
        self.port = port

    def url(self, path: str = "/") -> str:
        """The URL to print: the page, with the token while it is unspent."""
        query = f"?{urlencode({'token': self.token})}" if self.token else ""
        return f"http://127.0.0.1:{self.port}{path}{query}"

    @property
    def cookie(self) -> str:
        return f"eurekamem_ui_{self.port}"

    def host_ok(self, host: str | None) -> bool:
        return self.port is not None and host in (f"127.0.0.1:{self.port}", f"localhost:{self.port}")

    def spend(self, token: str) -> str | None:
        """A new session id for the unspent token, else None; the token works once."""
        if self.token is None or not hmac.compare_digest(token.encode(), self.token.encode()):
            return None
        self.token = None
        session = secrets.token_urlsafe(32)
        self.sessions[session] = secrets.token_urlsafe(32)
        return session

    def csrf_of(self, session: str | None) -> str | None:
        if not session:
            return None
        for known, csrf in self.sessions.items():
            if hmac.compare_digest(known.encode(), session.encode()):
                return csrf
        return None


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _cookies(header: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            out.setdefault(name, value)
    return out


async def _answer(send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """A small page of plain text (or the given headers' answer): the refusals and the token's exchange."""
    body = text.encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"text/html; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                    *HEADERS, *(extra or [])],
    })
    await send({"type": "http.response.body", "body": body})


def _refusal(why: str) -> str:
    from html import escape

    return f"<!doctype html><title>eurekamem: refused</title><p>{escape(why)}</p>"


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None past MAX_BODY."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def guarded(app: ASGIApp, guard: Guard) -> ASGIApp:
    """`app` behind the guard (see the module's rules)."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await app(scope, receive, send)
            return  # no websockets
        headers = _headers(scope)
        if not guard.host_ok(headers.get("host")):
            await _answer(send, 400, _refusal("This page answers only as 127.0.0.1 or localhost with its own port."))
            return
        session = _cookies(headers.get("cookie", "")).get(guard.cookie)
        csrf = guard.csrf_of(session)
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "token" in query and scope["method"] == "GET":
            await _exchange(send, guard, scope["path"], query["token"][-1], known=csrf is not None)
            return
        if csrf is None:
            await _answer(send, 403, _refusal(
                "Open the link `eurekamem ui` printed (it holds a one-time token); run it again for a new one."))
            return
        method = scope["method"]
        if method not in ("GET", "HEAD", "POST"):
            await _answer(send, 405, _refusal(f"{method} is not used here."))
            return
        if method == "POST":
            origin = headers.get("origin")
            if origin is not None and origin != f"http://{headers['host']}":
                await _answer(send, 403, _refusal("A form of another page was refused (its Origin is not this page)."))
                return
            if headers.get("content-type", "").split(";")[0].strip() != "application/x-www-form-urlencoded":
                await _answer(send, 415, _refusal("Only this page's own forms are accepted."))
                return
            body = await _read_body(receive)
            if body is None:
                await _answer(send, 413, _refusal("The form is too large."))
                return
            try:
                fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, max_num_fields=MAX_FIELDS, strict_parsing=False)
            except (UnicodeDecodeError, ValueError):
                await _answer(send, 400, _refusal("The form could not be read."))
                return
            form = {name: values[-1] for name, values in fields.items()}
            sent = form.pop(CSRF_FIELD, "")
            if not hmac.compare_digest(sent.encode(), csrf.encode()):
                await _answer(send, 403, _refusal("The form's CSRF token is missing or wrong: reload the page and try again."))
                return
            scope[FORM_KEY] = form
        scope[CSRF_KEY] = csrf

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await app(scope, receive, send_with_headers)

    return wrapped


async def _exchange(send: Send, guard: Guard, path: str, token: str, known: bool) -> None:
    """The printed link: the token becomes the session cookie, and the page loads without it in the
    address (a page of its own that refreshes: a redirect from another site would lose a Strict cookie)."""
    from html import escape

    target = escape(path if path.startswith("/") else "/")
    page = (
        f'<!doctype html><meta http-equiv="refresh" content="0;url={target}"><title>eurekamem</title>'
        f'<p><a href="{target}">Continue</a></p>'
    )
    session = guard.spend(token)
    if session is not None:
        cookie = f"{guard.cookie}={session}; HttpOnly; SameSite=Strict; Path=/".encode()
        await _answer(send, 200, page, [(b"set-cookie", cookie)])
    elif known:  # the same browser opening the link again
        await _answer(send, 200, page)
    else:
        await _answer(send, 403, _refusal("This link was used already (its token works once): run `eurekamem ui` again."))
