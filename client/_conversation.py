"""ConversationMemory: an agent loop's conversation memory on top of Client (AsyncConversationMemory:
the same on AsyncClient).

    memory = ConversationMemory(client, "family-chat")
    memory.user("I moved to Lisbon in March.")           # conversation.append, one message
    block = memory.inject("where do I live?")           # before each model call: memories + summary
    ...                                                 # the model answers
    memory.assistant(answer)
    memory.flush()                                      # on compaction / at the end of a task

Rules kept here: every turn gets its id when it is added (the caller's, else one derived from the
group, the session, the turn's number in this helper and its content), and keeps it until the daemon
has acknowledged it: a turn whose send failed (the daemon restarting, a timeout) stays pending and is
sent again, with the same id and timestamp, before the next call, so a resend is never stored twice
(conversation.append ignores ids it has). Replaying the same conversation through a new helper gives
the same ids. What `inject` returns is never appended as a turn: the daemon would not extract from
it anyway, and it is not the conversation. Until the group's first extraction has run (its
conversation.summary has no `updated_at`) the group has no memories of its own yet, so `inject`
also asks for the group's raw messages most relevant to the query (without one, to the newest
turn): a new chat is not blind for the first extraction's 600 s. Once an extraction is seen, the
helper stops asking (and stops reading the summary for it).
"""

from __future__ import annotations

import datetime
import hashlib
from typing import TYPE_CHECKING, Any

from ..protocol import Injection, Job
from ._errors import NotFound

if TYPE_CHECKING:
    from ._async import AsyncClient
    from ._sync import Client

__all__ = ["AsyncConversationMemory", "ConversationMemory", "turn_id"]

ROLES = ("user", "assistant", "system", "tool")
FLUSH_TIMEOUT = 60.0  # seconds flush() waits for the extraction job by default
MAX_QUERY = 4096  # characters of memory.inject's query


def turn_id(group: str, session: str | None, number: int, role: str, sender: str | None, text: str) -> str:
    """The id of a turn the caller gave none: the same for the same turn of the same conversation."""
    basis = "\x1f".join((group, session or "", str(number), role, sender or "", text))
    return "t" + str(number) + "-" + hashlib.blake2b(basis.encode(), digest_size=8).hexdigest()


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


class _Turns:
    """The turns added and not yet acknowledged, and how a turn becomes a message."""

    def __init__(
        self,
        group: str,
        *,
        domain: str | None,
        session: str | None,
        k: int,
        token_budget: int | None,
        include_summary: bool,
        first_turn: int,
        min_score: float | None = None,
    ) -> None:
        if not group:
            raise ValueError("a conversation needs a group")
        self.group = group
        self.domain = domain or group  # a group's memories live in the tier-4 domain of its name
        self.session = session
        self.k = k
        self.token_budget = token_budget
        self.include_summary = include_summary
        self.min_score = min_score
        self.turns = first_turn  # turns added so far (the number of the next)
        self.pending: list[dict[str, Any]] = []  # added, not yet acknowledged, in order
        self.last_injection: Injection | None = None
        self.extracted = False  # an extraction of the group has been seen (its summary has a time)
        self.newest_text: str | None = None  # the newest turn's text: the raw messages' query without one

    def add(self, role: str, text: str, id: str | None, sender: str | None, timestamp: str | float | None) -> str:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
        ident = id or turn_id(self.group, self.session, self.turns, role, sender, text)
        message: dict[str, Any] = {"id": ident, "role": role, "text": text, "timestamp": timestamp or _now()}
        if sender is not None:
            message["sender"] = sender
        if self.session is not None:
            message["session"] = self.session
        self.pending.append(message)
        self.turns += 1
        if text.strip():
            self.newest_text = text.strip()[:MAX_QUERY]
        return ident

    def acknowledge(self, batch: list[dict[str, Any]]) -> None:
        """The daemon has `batch`: drop it from pending (by id: under an AsyncClient another task may
        have sent or added turns meanwhile)."""
        sent = {m["id"] for m in batch}
        self.pending = [m for m in self.pending if m["id"] not in sent]

    def wants_messages(self, summary: dict[str, Any]) -> bool:
        """Whether inject should add raw messages, from the group's conversation.summary: until the
        group's first extraction (no `updated_at`), and never again once one is seen."""
        if summary.get("updated_at") is not None:
            self.extracted = True
        return not self.extracted

    def inject_params(self, query: str | None, messages: bool = False) -> dict[str, Any]:
        params = {"domain": self.domain, "k": self.k, "query": query, "token_budget": self.token_budget,
                  "include_summary": self.include_summary}
        wanted = query or self.newest_text
        if messages and wanted:  # before the first extraction: the group's messages nearest to it
            params.update(query=wanted, group=self.group, messages=self.k)
        if self.min_score is not None and params["query"]:  # a floor needs a query's scores
            params["min_score"] = self.min_score
        return params


class _Memory:
    """What both helpers share: the settings, the turns and their read-only views."""

    def __init__(
        self,
        client: Any,
        group: str,
        *,
        domain: str | None = None,
        session: str | None = None,
        k: int = 8,
        token_budget: int | None = 1500,
        include_summary: bool = True,
        first_turn: int = 0,
        min_score: float | None = None,
    ) -> None:
        self.client = client
        self._turns = _Turns(
            group, domain=domain, session=session, k=k, token_budget=token_budget,
            include_summary=include_summary, first_turn=first_turn, min_score=min_score,
        )

    @property
    def group(self) -> str:
        return self._turns.group

    @property
    def pending(self) -> list[dict[str, Any]]:
        """The turns not yet acknowledged by the daemon (a copy)."""
        return list(self._turns.pending)

    @property
    def last_injection(self) -> Injection | None:
        """The last inject's answer (its memory `ids`, for memory.feedback, and `tokens`)."""
        return self._turns.last_injection


class ConversationMemory(_Memory):
    """One conversation group's memory for an agent loop, over a Client.

    `append` (or `user` / `assistant`) each turn; `inject(query)` before each model call gives the
    block to put ahead of the prompt (the group's memories for the query, with its rolling summary
    and predicted intents); `flush()` when the agent compacts its context or finishes a task runs
    extraction now. `domain`: where the group's memories are (default: the group's own domain);
    `session`: the client's session name for every turn (default: the daemon's, by time gaps);
    `k`, `token_budget`, `min_score`: memory.inject's (with `min_score`, an inject with a query
    gives only the memories at least that relevant, fewer than k if so); `first_turn`: the number of the first turn (for ids).
    """

    client: Client

    def append(
        self,
        role: str,
        text: str,
        *,
        id: str | None = None,
        sender: str | None = None,
        timestamp: str | float | None = None,
    ) -> str:
        """Store one turn (and any still pending); its message id. A failed send raises, and the turns
        stay pending: the next call sends them again with the same ids."""
        ident = self._turns.add(role, text, id, sender, timestamp)
        self.send()
        return ident

    def user(self, text: str, **fields: Any) -> str:
        return self.append("user", text, **fields)

    def assistant(self, text: str, **fields: Any) -> str:
        return self.append("assistant", text, **fields)

    def send(self) -> int:
        """Send the pending turns (conversation.append); how many the daemon stored (resent ones it
        already had are not counted)."""
        if not self._turns.pending:
            return 0
        batch = list(self._turns.pending)
        result = self.client.append_messages(self.group, batch)
        self._turns.acknowledge(batch)
        return int(result.get("appended", 0))

    def inject(self, query: str | None = None) -> str:
        """The block to put before the next model call: the group's summary and intents and its
        memories best for `query` (the newest without one), within the token budget; before the
        group's first extraction, also its raw messages nearest to `query` (or to the newest turn);
        "" when there is nothing yet. Pending turns are sent first."""
        self.send()
        messages = not self._turns.extracted and self._turns.wants_messages(self.client.summary(self.group))
        self._turns.last_injection = self.client.inject(**self._turns.inject_params(query, messages))
        return self._turns.last_injection.text

    def flush(self, wait: bool = True, timeout: float = FLUSH_TIMEOUT) -> Job | str | None:
        """Extract the group's new turns now (conversation.flush), after sending the pending ones.
        With `wait` (the default): the finished Job (or as it is after `timeout` seconds); without:
        the job's id. None when there was nothing new (or no turn at all yet)."""
        self.send()
        try:
            if not wait:
                return self.client.flush(self.group)
            return self.client.flush(self.group, wait=True, timeout=timeout)
        except NotFound:  # the group has no message yet: nothing to extract
            return None

    def summary(self) -> dict[str, Any]:
        """conversation.summary: {"summary", "intents", "updated_at"}."""
        return self.client.summary(self.group)


class AsyncConversationMemory(_Memory):
    """ConversationMemory over an AsyncClient: the same calls as coroutines (asyncio or trio)."""

    client: AsyncClient

    async def append(
        self,
        role: str,
        text: str,
        *,
        id: str | None = None,
        sender: str | None = None,
        timestamp: str | float | None = None,
    ) -> str:
        ident = self._turns.add(role, text, id, sender, timestamp)
        await self.send()
        return ident

    async def user(self, text: str, **fields: Any) -> str:
        return await self.append("user", text, **fields)

    async def assistant(self, text: str, **fields: Any) -> str:
        return await self.append("assistant", text, **fields)

    async def send(self) -> int:
        if not self._turns.pending:
            return 0
        batch = list(self._turns.pending)
        result = await self.client.append_messages(self.group, batch)
        self._turns.acknowledge(batch)
        return int(result.get("appended", 0))

    async def inject(self, query: str | None = None) -> str:
        await self.send()
        messages = not self._turns.extracted and self._turns.wants_messages(await self.client.summary(self.group))
        self._turns.last_injection = await self.client.inject(**self._turns.inject_params(query, messages))
        return self._turns.last_injection.text

    async def flush(self, wait: bool = True, timeout: float = FLUSH_TIMEOUT) -> Job | str | None:
        await self.send()
        try:
            if not wait:
                return await self.client.flush(self.group)
            return await self.client.flush(self.group, wait=True, timeout=timeout)
        except NotFound:  # the group has no message yet: nothing to extract
            return None

    async def summary(self) -> dict[str, Any]:
        return await self.client.summary(self.group)
