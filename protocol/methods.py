"""Every method's params as a msgspec Struct, and the table that names them.

Rule kept here: a method exists on the wire if and only if it is in METHODS; its params Struct
forbids unknown fields and carries every bound (lengths, ranges), so that a request which decodes
is a request the daemon can run. Bounds on string and list lengths are reported as `too_large`.

What decodes is also what the daemon can keep exactly: every integer lies in MessagePack's range
(the journal's encoding), every stored float is finite, and a free-form (`Any`) value is JSON's
data model only (`value_problem`: no bin, no extension, no timestamp, no non-string key, bounded
nesting), checked as it decodes, before anything is acknowledged. A conversation group, which
names its memories' domain, is refused when it could name a folder outside its own
(`group_problem`: what the extraction's domain check refuses).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .categories import MemoryCategory, ResearchCategory

# Field limits. A frame is bounded separately (max_frame_bytes, 16 MiB by default).
MAX_ID = 256  # session ids, roles, node ids, tags
MAX_KEY = 1024  # persistent keys, theorem names, prefixes
MAX_TEXT = 1 << 20  # content, formal statements: 1 Mi characters
MAX_TAGS = 256
MAX_RECENT = 500  # the episodic ring size
MAX_DEPTH = 16
MAX_LIMIT = 10_000

Ident = Annotated[str, Meta(min_length=1, max_length=MAX_ID)]
Key = Annotated[str, Meta(min_length=1, max_length=MAX_KEY)]
Text = Annotated[str, Meta(max_length=MAX_TEXT)]
Tag = Annotated[str, Meta(min_length=1, max_length=MAX_ID)]
Tags = Annotated[list[Tag], Meta(max_length=MAX_TAGS)]
Relation = Literal["uses", "generalizes", "specializes", "contradicts"]
RELATIONS: tuple[str, ...] = ("uses", "generalizes", "specializes", "contradicts")

# MessagePack's integers: what the journal (and a binary client) can carry, in free-form values;
# an integer field is an int64 (msgspec bounds no wider).
MIN_INT = -(2**63)
MAX_INT = 2**64 - 1
Int = Annotated[int, Meta(ge=MIN_INT, le=2**63 - 1)]
Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]
# A finite float: NaN and the infinities fail these bounds (JSON has neither; a snapshot would write null).
Finite = Annotated[float, Meta(ge=-1.7976931348623157e308, le=1.7976931348623157e308)]
MAX_VALUE_DEPTH = 64  # arrays and objects nested in one free-form value


# --- free-form values ---------------------------------------------------------------------------


def _path_key(key: str) -> str:
    """An object key in a field path: `.name`, or `["..."]` for any other key (cut at 64 characters)."""
    if key.isidentifier():
        return "." + key
    shown = key if len(key) <= 64 else key[:64] + "…"
    return "[" + msgspec.json.encode(shown).decode() + "]"


def _kind(value: object) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "binary data (MessagePack bin; send text as str)"
    if isinstance(value, msgspec.msgpack.Ext):
        return f"a MessagePack extension (type {value.code})"
    if hasattr(value, "isoformat"):
        return "a MessagePack timestamp (send an RFC 3339 string)"
    names = {tuple: "an array", int: "an integer", float: "a float", bool: "a boolean", type(None): "null"}
    return names.get(type(value), f"a value of type {type(value).__name__}")


def _problem(value: Any, depth: int) -> tuple[str, list[str]] | None:
    """Why the list or dict `value` (at nesting level `depth`) is not JSON's data model, and the
    path to what is wrong (its steps innermost first), or None."""
    if type(value) is dict:
        for key in value:
            if type(key) is not str:
                return f"Expected an object key of type `str`, got {_kind(key)}", []
    found: tuple[str, list[str]] | None
    for step, item in value.items() if type(value) is dict else enumerate(value):
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if MIN_INT <= item <= MAX_INT:
                continue
            found = "Integer out of range (-2**63 to 2**64-1, what MessagePack carries)", []
        elif kind is float:
            if math.isfinite(item):
                continue
            found = f"Float {item} is not a JSON number (NaN and the infinities are not)", []
        elif kind is list or kind is dict:
            if depth >= MAX_VALUE_DEPTH:
                found = f"{_TOO_DEEP} than {MAX_VALUE_DEPTH} levels of arrays and objects", []
            else:
                found = _problem(item, depth + 1)
                if found is None:
                    continue
        else:
            found = f"Expected a JSON value, got {_kind(item)}", []
        found[1].append(_path_key(step) if type(step) is str else f"[{step}]")
        return found
    return None


_TOO_DEEP = "Nesting deeper"
_SCALARS = frozenset((str, bool, type(None)))


def _dict_ok(value: dict[Any, Any], depth: int, keys: bool) -> bool:
    """The fast yes of `_problem` for a dict (its keys not checked when `keys` is false); it builds
    no path, for a request's decode is the hot path."""
    if keys:
        for key in value:
            if type(key) is not str:
                return False
    for item in value.values():
        kind = type(item)
        if kind in _SCALARS or kind is int and MIN_INT <= item <= MAX_INT or kind is float and item - item == 0.0:
            continue  # (x - x is NaN for NaN and the infinities)
        if kind is dict:
            if depth < MAX_VALUE_DEPTH and _dict_ok(item, depth + 1, True):
                continue
        elif kind is list and depth < MAX_VALUE_DEPTH and _list_ok(item, depth + 1):
            continue
        return False
    return True


def _list_ok(value: list[Any], depth: int) -> bool:
    for item in value:
        kind = type(item)
        if kind in _SCALARS or kind is int and MIN_INT <= item <= MAX_INT or kind is float and item - item == 0.0:
            continue
        if kind is dict:
            if depth < MAX_VALUE_DEPTH and _dict_ok(item, depth + 1, True):
                continue
        elif kind is list and depth < MAX_VALUE_DEPTH and _list_ok(item, depth + 1):
            continue
        return False
    return True


def value_problem(value: Any, field: str) -> str | None:
    """Why a free-form value cannot be kept exactly, or None when it can: JSON's data model only
    (null, true/false, an integer in MIN_INT..MAX_INT, a finite float, a string, an array, an
    object with string keys, at most MAX_VALUE_DEPTH arrays and objects deep). Said in msgspec's
    words, with the path from the params (`... - at `$.value[3].x``)."""
    found = _problem({field: value}, 0)
    if found is None:
        return None
    problem, steps = found
    return f"{problem} - at `${''.join(reversed(steps))}`"


def value_ok(value: Any) -> bool:
    """`value_problem(value, ...) is None`, fast (the codec's check of a request's free-form field)."""
    return _dict_ok(value, 1, True) if type(value) is dict else _list_ok([value], 0)


def free_form_problem(params: Any) -> str | None:
    """value_problem of a params Struct's free-form field (its class's `free_form`), if it has one."""
    field = params.free_form
    if not field:
        return None
    value = getattr(params, field)
    return None if value_ok(value) else value_problem(value, field)


# --- conversation groups ------------------------------------------------------------------------


def group_problem(group: str) -> str | None:
    """Why `group` cannot be a conversation group, or None: a group names its memories' domain,
    and a domain with a NUL or a `.` or `..` path segment (`/` and `\\` separate them) would name a
    folder outside its own; the memory tier refuses such a domain (daemon/memory/params.py,
    validate_domain), so a group's extraction could never keep anything."""
    if "\x00" in group:
        return "has a NUL character"
    if any(part in (".", "..") for part in group.replace("\\", "/").split("/")):
        return "has a `.` or `..` path segment (`/` and `\\` separate them)"
    return None


def check_group(group: str | None) -> None:
    if group is not None:
        problem = group_problem(group)
        if problem is not None:
            raise ValueError(f"Group {group!r} cannot be a conversation group: it {problem} - at `$.group`")


class Params(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every params Struct."""

    # The free-form (Any) field, if any: the codec checks it as the request decodes (value_problem;
    # there, not in a __post_init__, which would cost every episodic.log a Python call).
    free_form: ClassVar[str] = ""


class Empty(Params):
    pass


# --- tier 1: episodic ---------------------------------------------------------------------------


class EpisodicLog(Params):
    session_id: Ident
    agent_role: Ident
    content: Text
    metadata: dict[str, Any] = {}  # JSON's data model (free_form: value_problem)
    # A client that buffered the event while the daemon was away names it and says when it happened;
    # logging an entry_id the session already holds answers that entry again (a retry adds nothing).
    entry_id: Ident | None = None
    timestamp: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    free_form: ClassVar[str] = "metadata"


class EpisodicRecent(Params):
    session_id: Ident
    n: Annotated[int, Meta(ge=1, le=MAX_RECENT)] = 20
    agent_role: Ident | None = None


class EpisodicSearch(Params):
    session_id: Ident
    query: Annotated[str, Meta(min_length=1, max_length=MAX_KEY)]
    n: Annotated[int, Meta(ge=1, le=MAX_RECENT)] = 20


LemmaId = Annotated[str, Meta(max_length=MAX_ID)]
MAX_LEMMAS = 10_000


class LemmaNode(msgspec.Struct, kw_only=True):
    """EurekaClaw's LemmaNode (one entry of TheoryState.lemma_dag); unknown fields are ignored."""

    lemma_id: LemmaId = ""  # "" = the lemma_dag key names it
    statement: Text
    informal: Text = ""
    dependencies: Annotated[list[LemmaId], Meta(max_length=MAX_LEMMAS)] = []
    verified: bool | None = None
    confidence_score: Finite | None = None
    verification_method: str | None = None


class ProofRecord(msgspec.Struct, kw_only=True):
    """EurekaClaw's ProofRecord (one entry of TheoryState.proven_lemmas); unknown fields are ignored."""

    lemma_id: LemmaId = ""  # "" = the proven_lemmas key names it
    proof_text: Text
    lean4_proof: Text = ""
    verification_method: str = ""
    verified: bool = False
    verifier_notes: Text = ""
    proved_at: str | None = None


class FailedAttempt(msgspec.Struct, kw_only=True):
    """EurekaClaw's FailedAttempt (one entry of TheoryState.failed_attempts); unknown fields ignored."""

    lemma_id: LemmaId
    attempt_text: Text = ""
    failure_reason: Text
    iteration: Int = 0
    timestamp: str | None = None


class TheoryState(msgspec.Struct, kw_only=True):
    """EurekaClaw's TheoryState as JSON (`model_dump(mode="json")`); unknown fields are ignored,
    the fields read must have EurekaClaw's types (PROTOCOL.md, session.close)."""

    informal_statement: Text = ""
    formal_statement: Text = ""
    status: Annotated[str, Meta(max_length=MAX_ID)] = ""
    proven_lemmas: Annotated[dict[LemmaId, ProofRecord], Meta(max_length=MAX_LEMMAS)] = {}
    failed_attempts: Annotated[list[FailedAttempt], Meta(max_length=MAX_LEMMAS)] = []
    lemma_dag: Annotated[dict[LemmaId, LemmaNode], Meta(max_length=MAX_LEMMAS)] = {}

    def is_empty(self) -> bool:
        """Nothing a session extraction could learn from."""
        statement = self.informal_statement.strip() or self.formal_statement.strip()
        return not (statement or self.proven_lemmas or self.failed_attempts)


class SessionClose(Params):
    session_id: Ident
    domain: Annotated[str, Meta(max_length=MAX_KEY)] | None = None
    theory_state: TheoryState | None = None
    extract: bool = True


# --- tier 2: persistent -------------------------------------------------------------------------


class PersistentRemember(Params):
    key: Key
    value: Any  # JSON's data model (free_form: value_problem)
    tags: Tags = []
    source_session: Annotated[str, Meta(max_length=MAX_ID)] = ""
    # an import's history (eurekamem import): the record's own id and times, for a key not held yet
    record_id: Ident | None = None
    created_at: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    updated_at: Annotated[str, Meta(min_length=1, max_length=64)] | None = None
    free_form: ClassVar[str] = "value"


class PersistentKey(Params):
    key: Key


class PersistentByTag(Params):
    tag: Tag


class PersistentKeys(Params):
    prefix: Annotated[str, Meta(max_length=MAX_KEY)] = ""
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT)] = 1000


# --- tier 3: knowledge graph --------------------------------------------------------------------


class GraphAddTheorem(Params):
    theorem_name: Key
    formal_statement: Text
    domain: Annotated[str, Meta(max_length=MAX_KEY)] = ""
    session_id: Annotated[str, Meta(max_length=MAX_ID)] = ""
    tags: Tags = []
    # an import's history (eurekamem import): the node's own id (not held yet) and time
    node_id: Ident | None = None
    created_at: Annotated[str, Meta(min_length=1, max_length=64)] | None = None


class GraphLink(Params):
    from_id: Ident
    to_id: Ident
    relation: Relation = "uses"


class GraphNodeRef(Params):
    node_id: Ident


class GraphRelated(Params):
    node_id: Ident
    depth: Annotated[int, Meta(ge=0, le=MAX_DEPTH)] = 2


class GraphSearch(Params):
    query: Annotated[str, Meta(max_length=MAX_KEY)] = ""
    domain: Annotated[str, Meta(max_length=MAX_KEY)] | None = None
    tag: Tag | None = None
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT)] = 50


class GraphExport(Params):
    format: Literal["node_link", "graphml"] = "node_link"


# --- tier 4: domain memories -------------------------------------------------------------------

Category = MemoryCategory
Scope = Literal["local", "global"]
Confidence = Annotated[float, Meta(ge=0.0, le=1.0)]
Domain = Annotated[str, Meta(max_length=MAX_KEY)]
Title = Annotated[str, Meta(min_length=1, max_length=MAX_KEY)]
Content = Annotated[str, Meta(min_length=1, max_length=MAX_TEXT)]
MAX_K = 100
MAX_BATCH_ITEMS = 10_000
MAX_FEEDBACK_IDS = 1000
MAX_SOURCE_IDS = 256  # a memory's source_message_ids
# An RFC 3339 timestamp of tier 4's lifecycle ("2026-12-01T08:00:00+00:00"; "Z" and a missing offset,
# meaning UTC, are accepted); the handler parses it and answers invalid_params, naming the field.
Instant = Annotated[str, Meta(min_length=1, max_length=64)]
Signal = Literal["used", "ignored", "wrong"]


class MemoryAdd(Params):
    domain: Domain
    category: Category
    title: Title
    content: Content
    confidence: Confidence = 0.8
    tags: Tags = []
    source_session: Annotated[str, Meta(max_length=MAX_ID)] = ""
    scope: Scope = "local"
    abstract: Annotated[str, Meta(max_length=MAX_KEY)] | None = None
    overview: Annotated[str, Meta(max_length=MAX_TEXT)] | None = None
    dedup: bool = True
    # raw material (maintenance never merges it); null: raw exactly when dedup is off. An import
    # passes the memory's own flag, so a curated memory stays curated whatever dedup it was added with
    raw: bool | None = None
    valid_from: Instant | None = None  # null: from now (the memory's created_at)
    valid_until: Instant | None = None  # null: still true
    pinned: bool = False
    attributed_to: Annotated[str, Meta(min_length=1, max_length=MAX_ID)] | None = None  # the person it is about
    # where it came from in a conversation (the extraction sets them; a client may too)
    source_message_ids: Annotated[list[Ident], Meta(max_length=MAX_SOURCE_IDS)] = []
    refers_to: Instant | None = None  # the time it is about (RFC 3339), when it names one
    # an import's history (eurekamem import): the memory's own id (not held yet) and times; its
    # file is named by created_at's date
    id: Ident | None = None
    created_at: Instant | None = None
    updated_at: Instant | None = None


class MemoryAddMany(Params):
    items: Annotated[list[MemoryAdd], Meta(min_length=1, max_length=MAX_BATCH_ITEMS)]


class MemorySearch(Params):
    query: Annotated[str, Meta(min_length=1, max_length=MAX_KEY * 4)]
    domain: Domain | None = None
    k: Annotated[int, Meta(ge=1, le=MAX_K)] = 10
    categories: Annotated[list[Category], Meta(max_length=16)] | None = None
    scope: Scope | None = None
    status: Literal["active", "archived", "any"] = "active"
    min_confidence: Confidence = 0.0
    min_score: Confidence | None = None  # a floor on the fused score (0..1, as the score; NaN refused)
    mode: Literal["hybrid", "dense", "lexical"] = "hybrid"
    include_global: bool = True
    as_of: Instant | None = None  # null: now; only memories valid at that time
    include_expired: bool = False  # also memories whose validity ended at or before as_of
    ranker: Literal["fusion", "learned"] | None = None  # hybrid only; None: learned with the weights' embedder, else fusion


class MemoryInject(Params):
    domain: Domain
    k: Annotated[int, Meta(ge=1, le=MAX_K)] = 4
    query: Annotated[str, Meta(min_length=1, max_length=MAX_KEY * 4)] | None = None
    token_budget: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
    # the best `messages` raw messages of conversation `group` for the query (conversation.search), after the memories
    group: Annotated[str, Meta(min_length=1, max_length=MAX_ID)] | None = None
    messages: Annotated[int, Meta(ge=0, le=MAX_K)] = 0
    include_summary: bool = False  # the domain's conversation group summary and intents head the block
    # with a query: only the search's hits of at least this score (as memory.search's), no fallback to the strongest
    min_score: Confidence | None = None

    def __post_init__(self) -> None:
        check_group(self.group)


class MemoryRef(Params):
    id: Ident


class MemoryGet(MemoryRef):
    # given: the memory as seen from that domain (a local memory of another domain is not_found)
    domain: Domain | None = None


class MemoryList(Params):
    domain: Domain | None = None
    category: Category | None = None
    status: Literal["active", "archived", "any"] = "active"
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT)] = 50
    offset: Count = 0
    include_global: bool = False  # with a domain: every domain's global memories too
    readable: bool = False  # also the readable projection's text: the domain's MEMORY.md (no domain: GLOBAL.md)
    order: Literal["newest", "strongest"] = "newest"  # strongest: MEMORY.md's order (strength, then newest)


class MemoryDomains(Params):
    domain: Domain | None = None  # given: that domain's counts only


class MemoryUpdate(Params):
    id: Ident
    title: Title | None = None
    content: Content | None = None
    category: Category | None = None
    confidence: Confidence | None = None
    tags: Tags | None = None
    scope: Scope | None = None
    abstract: Annotated[str, Meta(max_length=MAX_KEY)] | None = None
    overview: Annotated[str, Meta(max_length=MAX_TEXT)] | None = None
    pinned: bool | None = None
    # left out: unchanged; null: cleared (valid from created_at on / still true); else RFC 3339
    valid_from: Instant | None | UnsetType = UNSET
    valid_until: Instant | None | UnsetType = UNSET
    attributed_to: Annotated[str, Meta(min_length=1, max_length=MAX_ID)] | None | UnsetType = UNSET  # null: nobody


class MemoryFeedback(Params):
    ids: Annotated[list[Ident], Meta(min_length=1, max_length=MAX_FEEDBACK_IDS)]
    signal: Signal


class MemoryStrength(Params):
    ids: Annotated[list[Ident], Meta(min_length=1, max_length=MAX_FEEDBACK_IDS)]


class MemoryDelete(Params):
    id: Ident
    purge: bool = False


# --- skills: EurekaClaw's skills/<name>/SKILL.md -----------------------------------------------

# A skill's name is also its folder: the daemon refuses (invalid_params) any name that could leave
# skills/ or hide there (see daemon/skills/format.py: name_problem); these bounds are the lengths.
SkillName = Annotated[str, Meta(min_length=1, max_length=MAX_ID)]
SkillBody = Annotated[str, Meta(min_length=1, max_length=MAX_TEXT)]
MAX_SKILL_DESCRIPTION = 16 * MAX_KEY
SkillDescription = Annotated[str, Meta(max_length=MAX_SKILL_DESCRIPTION)]
SkillSource = Literal["seed", "distilled", "manual"]
SkillStatus = Literal["draft", "active"]
SkillStatusFilter = Literal["draft", "active", "any"]
SKILLS_INJECT_K = 5  # EurekaClaw's BaseAgent.build_system_prompt injects at most 5 skills


class SkillsList(Params):
    agent_role: Ident | None = None
    tag: Tag | None = None
    status: SkillStatusFilter = "any"


class SkillRef(Params):
    name: SkillName


class SkillsSearch(Params):
    query: Annotated[str, Meta(min_length=1, max_length=MAX_KEY * 4)]
    k: Annotated[int, Meta(ge=1, le=MAX_K)] = 10
    status: SkillStatusFilter = "active"
    mode: Literal["hybrid", "dense", "lexical"] = "hybrid"


class SkillsPut(Params):
    """A field left out (or null) keeps the skill's current value, or takes the default for a new skill."""

    name: SkillName
    body: SkillBody
    version: Ident | None = None
    tags: Tags | None = None
    agent_roles: Tags | None = None
    pipeline_stages: Tags | None = None
    description: SkillDescription | None = None
    source: SkillSource | None = None
    status: SkillStatus | None = None
    created_at: Annotated[str, Meta(min_length=1, max_length=MAX_ID)] | None = None
    usage_count: Annotated[int, Meta(ge=0, le=2**53)] | None = None
    success_rate: Confidence | None = None


class SkillsRecordUse(Params):
    name: SkillName
    success: bool


class SkillsInject(Params):
    agent_role: Ident
    pipeline_stage: Ident | None = None
    query: Annotated[str, Meta(min_length=1, max_length=MAX_KEY * 4)] | None = None
    k: Annotated[int, Meta(ge=1, le=MAX_K)] = SKILLS_INJECT_K
    token_budget: Annotated[int, Meta(ge=1, le=1_000_000)] | None = None
# --- conversations -------------------------------------------------------------------------------

Role = Literal["user", "assistant", "system", "tool"]
ROLES: tuple[str, ...] = ("user", "assistant", "system", "tool")
Group = Annotated[str, Meta(min_length=1, max_length=MAX_ID)]  # and no `group_problem` (checked as it decodes)
Timestamp = Annotated[str, Meta(max_length=64)]


class ConversationMessage(Params):
    """One message of conversation.append; `timestamp` is RFC 3339 (or seconds since the epoch)."""

    id: Ident
    role: Role
    text: Text
    sender: Annotated[str, Meta(max_length=MAX_ID)] | None = None
    timestamp: Timestamp | float | None = None
    session: Ident | None = None


class ConversationAppend(Params):
    group: Group
    messages: Annotated[list[ConversationMessage], Meta(max_length=MAX_BATCH_ITEMS)]

    def __post_init__(self) -> None:
        check_group(self.group)


class ConversationGet(Params):
    group: Group
    since: Timestamp | None = None
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT)] = 1000

    def __post_init__(self) -> None:
        check_group(self.group)


class ConversationGroupRef(Params):
    group: Group

    def __post_init__(self) -> None:
        check_group(self.group)


class ConversationSearch(Params):
    group: Group
    query: Annotated[str, Meta(min_length=1, max_length=MAX_KEY * 4)]
    k: Annotated[int, Meta(ge=1, le=MAX_K)] = 10
    since: Timestamp | None = None
    until: Timestamp | None = None
    ranker: Literal["fusion", "learned"] | None = None  # None: learned with the weights' embedder, else fusion

    def __post_init__(self) -> None:
        check_group(self.group)


# --- scopes and review: promotion of local memories to global ----------------------------------

ReviewState = Literal["pending", "approved", "refused"]
By = Annotated[str, Meta(min_length=1, max_length=MAX_ID)]
Reason = Annotated[str, Meta(max_length=MAX_KEY * 4)]


class MemoryPromote(Params):
    id: Ident
    reason: Reason | None = None
    by: By | None = None  # who asks, as the client names them
    peer_uid: Int | None = None  # set by the daemon from the connection (SO_PEERCRED); a value sent is replaced


class ReviewList(Params):
    state: Literal["pending", "approved", "refused", "any"] = "pending"
    domain: Domain | None = None
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT)] = 100
    offset: Count = 0


class ReviewDecide(Params):
    id: Ident
    by: By | None = None
    peer_uid: Int | None = None  # set by the daemon, as in MemoryPromote


class ReviewReject(ReviewDecide):
    reason: Reason | None = None


class MemoryHistory(Params):
    id: Ident


# --- jobs ---------------------------------------------------------------------------------------

JobState = Literal["queued", "running", "done", "failed", "cancelled"]
MAX_WAIT = 3600.0


class JobsList(Params):
    state: JobState | None = None
    kind: Annotated[str, Meta(max_length=MAX_ID)] | None = None
    limit: Annotated[int, Meta(ge=1, le=MAX_LIMIT)] = 100


class JobRef(Params):
    id: Ident


class JobsWait(Params):
    id: Ident
    timeout: Annotated[float, Meta(ge=0.0, le=MAX_WAIT)] = 30.0


MAX_LEARNED = 48  # items one session.learned delivers (the extraction's 12 per category)
LearnedCategory = ResearchCategory


class LearnedItem(msgspec.Struct, forbid_unknown_fields=True):
    """One insight the agent's own LLM extracted from a session (session.learned)."""

    category: LearnedCategory
    title: Annotated[str, Meta(max_length=200)]
    content: Annotated[str, Meta(max_length=4000)]
    confidence: Confidence = 0.8  # EurekaClaw's default for an item without one
    abstract: Annotated[str, Meta(max_length=400)] = ""  # L0; "": derived as memory.add derives it
    overview: Annotated[str, Meta(max_length=2000)] = ""  # L1; "": none
    general: bool = False


class SessionLearned(Params):
    """The insights of a session.extract job, extracted by the client: they complete the job (once)."""

    job_id: Ident
    items: Annotated[list[LearnedItem], Meta(max_length=MAX_LEARNED)] = []


# --- the table ----------------------------------------------------------------------------------


class MethodSpec(msgspec.Struct, frozen=True):
    name: str
    params: type
    tier: str  # which actor answers: sys, episodic, persistent, graph, memory, jobs
    writes: bool  # changes durable state (journaled)
    doc: str


def _spec(name: str, params: type, tier: str, writes: bool, doc: str) -> tuple[str, MethodSpec]:
    return name, MethodSpec(name, params, tier, writes, doc)


METHODS: dict[str, MethodSpec] = dict(
    [
        _spec("sys.hello", Empty, "sys", False, "server name, version, protocol, methods, limits"),
        _spec("sys.ping", Empty, "sys", False, '{"pong": true}'),
        _spec("sys.stats", Empty, "sys", False, "counts per tier, journal, requests, latencies"),
        _spec("sys.digest", Empty, "sys", False, "per kind of durable record: how many this daemon holds, and a checksum"),
        _spec("sys.snapshot", Empty, "sys", False, "write every snapshot file now"),
        _spec("sys.resume", Empty, "sys", False, "after a journal failure: try writing again, leave read-only mode"),
        _spec("sys.maintain", Empty, "sys", False, "start tier 4's maintenance now (archive the faded, merge duplicates)"),
        _spec("episodic.log", EpisodicLog, "episodic", False, "append an event to a session"),
        _spec("episodic.recent", EpisodicRecent, "episodic", False, "last n events, oldest first"),
        _spec("episodic.search", EpisodicSearch, "episodic", False, "events whose content has the keyword"),
        _spec(
            "session.close", SessionClose, "episodic", False,
            "write the session's events to runs/, free it, queue its extraction job",
        ),
        _spec("persistent.remember", PersistentRemember, "persistent", True, "store a record under a key"),
        _spec("persistent.recall", PersistentKey, "persistent", False, "the record, or null"),
        _spec("persistent.by_tag", PersistentByTag, "persistent", False, "records carrying a tag"),
        _spec("persistent.forget", PersistentKey, "persistent", True, "delete a key"),
        _spec("persistent.keys", PersistentKeys, "persistent", False, "keys starting with a prefix, sorted"),
        _spec("graph.add_theorem", GraphAddTheorem, "graph", True, "add a theorem node"),
        _spec("graph.link", GraphLink, "graph", True, "add a directed relation between two nodes"),
        _spec("graph.get", GraphNodeRef, "graph", False, "one node"),
        _spec("graph.related", GraphRelated, "graph", False, "nodes within depth hops, either direction"),
        _spec("graph.search", GraphSearch, "graph", False, "nodes by text, domain, tag"),
        _spec("graph.stats", Empty, "graph", False, "node, edge and relation counts"),
        _spec("graph.export", GraphExport, "graph", False, "node-link JSON or GraphML"),
        _spec("memory.add", MemoryAdd, "memory", True, "add a memory: created, merged into a near duplicate, or skipped"),
        _spec("memory.add_many", MemoryAddMany, "memory", True, "memory.add for many items in one journal write"),
        _spec("memory.search", MemorySearch, "memory", False, "hybrid (dense + BM25) search, best first"),
        _spec("memory.inject", MemoryInject, "memory", False, "EurekaClaw's <memories> block for a prompt"),
        _spec("memory.get", MemoryGet, "memory", False, "one memory"),
        _spec("memory.list", MemoryList, "memory", False, "memories newest first, paged"),
        _spec("memory.domains", MemoryDomains, "memory", False, "each domain's memory counts by category and status, and the global ones'"),
        _spec("memory.strength", MemoryStrength, "memory", False, "each memory's strength now and when it fades"),
        _spec("memory.update", MemoryUpdate, "memory", True, "change fields; re-fingerprints and re-embeds"),
        _spec("memory.delete", MemoryDelete, "memory", True, "archive a memory, or purge it for good"),
        _spec("memory.restore", MemoryRef, "memory", True, "make an archived memory active again"),
        _spec("memory.feedback", MemoryFeedback, "memory", True, "report injected memories used, ignored or wrong"),
        _spec("skills.list", SkillsList, "skills", False, "skills by agent role, tag and status, by name"),
        _spec("skills.get", SkillRef, "skills", False, "one skill"),
        _spec("skills.search", SkillsSearch, "skills", False, "hybrid (dense + BM25) search of the skills, best first"),
        _spec("skills.put", SkillsPut, "skills", True, "create or change a skill (skills/<name>/SKILL.md)"),
        _spec("skills.record_use", SkillsRecordUse, "skills", True, "count a use; success rate as EurekaClaw's EMA"),
        _spec("skills.confirm", SkillRef, "skills", True, "make a draft skill active"),
        _spec("skills.discard", SkillRef, "skills", True, "delete a draft skill and its file (never an active one)"),
        _spec("skills.inject", SkillsInject, "skills", False, "EurekaClaw's <skills> block for an agent's prompt"),
        _spec("skills.scan", Empty, "sys", False, "read skills/ now: SKILL.md files others wrote, changed or removed"),
        _spec("memory.promote", MemoryPromote, "memory", True, "ask for a local memory to become global (a review request)"),
        _spec("review.list", ReviewList, "memory", False, "promotion requests by state, oldest first"),
        _spec("review.approve", ReviewDecide, "memory", True, "approve a pending request: its memory becomes global"),
        _spec("review.reject", ReviewReject, "memory", True, "refuse a pending request"),
        _spec("conversation.append", ConversationAppend, "conversation", True, "store a group's messages (resent ids ignored)"),
        _spec("conversation.get", ConversationGet, "conversation", False, "a group's messages in conversation order"),
        _spec("conversation.groups", Empty, "conversation", False, "every group: counts, high-water mark, sessions, times"),
        _spec("conversation.summary", ConversationGroupRef, "conversation", False, "a group's rolling summary and intents"),
        _spec("conversation.search", ConversationSearch, "conversation", False, "a group's best messages for a query, with context"),
        _spec(
            "conversation.flush", ConversationGroupRef, "conversation", False,
            "extract the group's new messages now (or join the job that will): the job's id",
        ),


        _spec("memory.history", MemoryHistory, "memory", False, "a memory's versions, oldest first, with decisions"),
        _spec("jobs.get", JobRef, "jobs", False, "one job"),
        _spec("jobs.list", JobsList, "jobs", False, "jobs newest first, by state and kind"),
        _spec("jobs.wait", JobsWait, "jobs", False, "the job once it is no longer queued or running, or at timeout"),
        _spec("jobs.cancel", JobRef, "jobs", True, "cancel a queued or running job"),
        _spec("jobs.retry", JobRef, "jobs", True, "queue a failed or cancelled job again"),
        _spec(
            "session.learned", SessionLearned, "jobs", False,  # journaled by the job's commit, as session.close's job
            "a session.extract job's insights, extracted by the client: they complete the job, once",
        ),
    ]
)
