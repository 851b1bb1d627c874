"""A loopback LLM: an HTTP server on 127.0.0.1 speaking OpenAI's /v1/chat/completions (and
Anthropic's /v1/messages) that answers every structured-output request at once, deterministically,
from the request alone. For the README's example, CI's smoke runs and the benchmarks: no model, no
network, no key.

    python -m eurekamem.daemon.llm.loopback --port 8765      # then: eurekamem serve --llm-provider openai \\
                                                             #   --llm-base-url http://127.0.0.1:8765/v1 --llm-model loopback

Rules kept here: the answer depends only on the request (the schema's name, the schema and the
prompt), never on earlier requests or the clock, and it always validates against the schema sent
(every required field filled within its bounds); nothing is kept but the requests' count and tokens.
What it answers, by the schema's name:

- conversation extraction (a schema with `memories`, `summary` and `intents`): each message line
  of the window (`[M3] Sender (user, 8 May 2023 10:00): text`) said by a user that states
  something in the first person ("I", "my", "we", ...; not a question) becomes one memory citing
  that line's local id, attributed to its sender, dated with the message's date, its statement
  told in the third person ("I'm a developer" -> "Lena is a developer", "I love tea" -> "Lena
  loves tea", "my" and "our" -> "Lena's", "we" -> "Lena and the group"); what the
  assistant, the system or a tool said, and lines inside a `<memories>` block, are passed over;
  the summary is the previous one (when the prompt shows it) plus the new memories' abstracts, cut
  to its bound; the intents are the window's last questions;
- `session_insights` (session extraction): each proven lemma a domain_knowledge insight, each
  failed attempt a pitfall;
- `merge_decisions` (the judge): SKIP onto the first memory listed for a new item that holds 80 %
  of its words, else CREATE;
- `qa_answer` (bench/locomo_e2e.py): the line of the prompt's memories that shares the most words
  with the question;
- `qa_grade`: CORRECT when the generated answer holds at least half of the gold answer's words;
- anything else: the smallest answer the schema allows.

`LLMServer` is the HTTP plumbing alone (a threaded stdlib server); the tests' scripted stub builds
on it too.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["LLMServer", "LoopbackLLM", "Reply", "answer_for", "fill_schema"]

Reply = tuple[int, Any, dict[str, str]]  # status, JSON body (or bytes), headers
HANG = object()  # what respond() returns to leave a request unanswered (until close)
MODEL = "loopback"


class LLMServer:
    """A loopback HTTP server for LLM requests: each POST is answered by `respond(path, headers, body)`
    (run in the request's own thread; a Reply, or HANG: no answer until close()). On a free port
    unless given one."""

    def __init__(self, port: int = 0, *, answer_timeout: float = 60.0) -> None:
        self.release = threading.Event()  # lets hanging handlers go at close
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                """No access log: the server's users print what they need."""

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                action = server.respond(self.path, dict(self.headers.items()), body)
                if action is HANG:
                    server.release.wait(answer_timeout)
                    return
                status, payload, extra = action
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                """A client that timed out and hung up: expected, not an error of the server."""

        self.httpd = Server(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def respond(self, path: str, headers: dict[str, str], body: Any) -> Any:
        raise NotImplementedError

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def url(self, provider: str = "openai") -> str:
        """The base URL to configure (`llm_base_url`): with /v1 for an OpenAI-compatible client,
        without for Anthropic's SDK (which adds it)."""
        root = f"http://127.0.0.1:{self.port}"
        return root if provider == "anthropic" else root + "/v1"

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> LLMServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- what is asked -------------------------------------------------------------------------------


def _request_parts(path: str, body: Any) -> tuple[str, Any, str, str]:
    """(provider, schema, name, prompt) of an OpenAI or Anthropic structured-output request."""
    if not isinstance(body, dict):
        return "openai", {}, "", ""
    messages = body.get("messages") or []
    if path.rstrip("/").endswith("/messages"):  # Anthropic: a forced tool
        tool = (body.get("tools") or [{}])[0]
        first = messages[0].get("content", "") if messages else ""
        return "anthropic", tool.get("input_schema") or {}, str(tool.get("name", "")), _text(first)
    spec = ((body.get("response_format") or {}).get("json_schema")) or {}
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return "openai", spec.get("schema") or {}, str(spec.get("name", "")), _text(users[0]["content"] if users else "")


def _text(content: Any) -> str:
    if isinstance(content, list):  # content blocks
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return str(content)


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def completion(provider: str, name: str, data: Any, prompt_tokens: int) -> Reply:
    """The provider's success answer carrying `data` as the structured output."""
    out = json.dumps(data, ensure_ascii=False)
    if provider == "anthropic":
        body = {
            "id": "msg_loopback",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [{"type": "tool_use", "id": "toolu_loopback", "name": name, "input": data}],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": _tokens(out)},
        }
        return 200, body, {}
    body = {
        "id": "chatcmpl-loopback",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": out}}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": _tokens(out),
                  "total_tokens": prompt_tokens + _tokens(out)},
    }
    return 200, body, {}


# --- the schema, filled ----------------------------------------------------------------------------


def _bounded_text(text: str | None, schema: dict[str, Any]) -> str:
    """`text` within the schema's length bounds ("loopback" when none was given)."""
    low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
    text = (text or "").strip() if text is not None else "loopback"
    if not text and low:
        text = "loopback"
    if high is not None and len(text) > int(high):
        text = text[: max(int(high) - 1, 0)].rstrip() + "…" if int(high) > 1 else text[: int(high)]
    while len(text) < low:
        text += "."
    return text


def _choose(schema: dict[str, Any]) -> dict[str, Any]:
    """The first non-null branch of an anyOf / oneOf, else the schema itself."""
    for key in ("anyOf", "oneOf"):
        if key in schema:
            branches = [b for b in schema[key] if isinstance(b, dict) and b.get("type") != "null"]
            return branches[0] if branches else {"type": "null"}
    return schema


def _nullable(schema: dict[str, Any]) -> bool:
    for key in ("anyOf", "oneOf"):
        if any(isinstance(b, dict) and b.get("type") == "null" for b in schema.get(key, [])):
            return True
    kind = schema.get("type")
    return isinstance(kind, list) and "null" in kind


def fill_schema(schema: Any, hints: dict[str, Any] | None = None, field: str = "") -> Any:
    """A value valid under `schema`: for each field the hint of its name when it fits, else the
    smallest value the schema allows (optional fields null when they may be)."""
    hints = hints or {}
    if not isinstance(schema, dict):
        return None
    hint = hints.get(field, _MISSING) if field else _MISSING
    if hint is None and _nullable(schema):
        return None
    if hint is _MISSING and field and _nullable(schema):
        return None
    schema = _choose(schema)
    kind = _kind(schema)
    if kind == "object":
        props = schema.get("properties") or {}
        required = schema.get("required", list(props))
        nested = hint if isinstance(hint, dict) else hints
        wanted = [name for name in props if name in required or (name in nested and nested[name] is not None)]
        return {name: fill_schema(props[name], nested, name) for name in wanted}
    if kind == "array":
        items = schema.get("items") or {}
        values = list(hint) if isinstance(hint, list | tuple) else []
        high = schema.get("maxItems")
        if high is not None:
            values = values[: int(high)]
        out = [fill_schema(items, value) if isinstance(value, dict) else _scalar(items, value) for value in values]
        while len(out) < int(schema.get("minItems", 0)):
            out.append(fill_schema(items))
        return out
    return _scalar(schema, hint)


_MISSING: Any = object()


def _kind(schema: dict[str, Any]) -> str:
    """The schema's type ("enum" and "const" for those), the first non-null one of a list."""
    if "const" in schema or "enum" in schema:
        return "const" if "const" in schema else "enum"
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return str(kind)


def _scalar(schema: dict[str, Any], value: Any) -> Any:
    schema = _choose(schema)
    kind = _kind(schema)
    if kind == "const":
        return schema["const"]
    if kind == "enum":
        return value if value in schema["enum"] else schema["enum"][0]
    if kind == "string":
        return _bounded_text(value if isinstance(value, str) else None, schema)
    if kind in ("number", "integer"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        high = schema.get("maximum", schema.get("exclusiveMaximum"))
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else low
        number = max(number, low)
        if high is not None:
            number = min(number, high)
        return int(number) if kind == "integer" else float(number)
    if kind == "boolean":
        return bool(value)
    if kind == "null":
        return None
    if kind == "object" or kind == "array":
        return fill_schema(schema, {})
    return value if value is not None else "loopback"


# --- the rules ---------------------------------------------------------------------------------------

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_STOP = frozenset(
    "a an the and or but of to in on at for with by from as is are was were be been being do does did what "
    "when where who whom which why how that this these those it its i me my we our you your he she him her "
    "his they them their there here have has had will would can could should not no yes so if then than "
    "about into over after before up down out any some all".split()
)
_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|i'll|me|my|mine|we|we're|we've|our|ours)\b", re.IGNORECASE)
# a message line of a conversation-extraction prompt (daemon/jobs/conversation.py's show()):
# "[M3] <sender> (<role>, <date> <time>): <text>", the role optional
_MESSAGE = re.compile(
    r"^\s*\[(?P<id>[^\]\s]+)\]\s*(?P<who>[^:\n(]{1,80}?)\s*"
    r"\((?:(?P<role>user|assistant|system|tool),\s*)?(?P<when>[^)\n]{0,60})\)\s*:\s*(?P<text>.+)$"
)
_PREVIOUS_SUMMARY = re.compile(r"summary so far:\s*\n(?P<text>[^\n]+)", re.IGNORECASE)


def words(text: str) -> list[str]:
    return [w for w in (m.group(0).lower() for m in _WORD.finditer(text)) if w not in _STOP]


# --- the third-person rewrite of a statement -------------------------------------------------------

_CONTRACTED = {"'m": "is", "'ve": "has", "'ll": "will", "'d": "would"}  # after "I"
_WE_CONTRACTED = {"'re": "are", "'ve": "have", "'ll": "will", "'d": "would"}  # after "we"
_AS_IS = frozenset(  # verbs whose form is the same after "she": modals, pasts that do not end in -ed
    "can could will would shall should may might must was had did went got made took saw came said felt "
    "found bought left met ran began thought knew grew became gave wrote sent spent built lost won told "
    "heard kept read put set paid sold brought taught caught fell drove rode flew ate drank sang swam "
    "slept stood sat understood broke chose forgot spoke woke wore used".split()
)
_ADVERBS = frozenset("also just often always never still really usually sometimes already only even "
                     "mostly rarely actually finally recently mainly".split())
_IRREGULAR = {"am": "is", "are": "is", "have": "has", "do": "does", "go": "goes", "'m": "is"}
_SUBJECT = re.compile(r"\b(?P<who>I|[Ww]e)(?P<tail>'m|'ve|'ll|'d|'re)?\b(?P<rest>(?:\s+(?!I\b|I')[A-Za-z']+){0,2})")
_POSSESSIVE = re.compile(r"\b(?:[Mm]y|[Mm]ine|[Oo]ur|[Oo]urs)\b")
_OBJECT = re.compile(r"\b(?:me|myself)\b")
_US = re.compile(r"\b(?:us|ourselves)\b")


def _third_person_verb(verb: str) -> str:
    """The form a verb takes after "she": "love" -> "loves", "study" -> "studies", "watch" ->
    "watches", "am" -> "is"; modals, past tenses and what is not a plain verb stay."""
    low = verb.lower()
    if low in _IRREGULAR:
        return _IRREGULAR[low]
    if low in _AS_IS or low.endswith(("ed", "s", "ing")) or not low.isalpha() or verb != low:
        return verb
    if low.endswith(("sh", "ch", "x", "z", "o")):
        return verb + "es"
    if len(low) > 1 and low.endswith("y") and low[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _subject(found: re.Match[str], about: str) -> str:
    """"I" or "we" and the verb after it, told of `about`: "I'm" -> "Lena is", "I really like" ->
    "Lena really likes", "we're" -> "Lena and the group are" (a plural: its verb stays)."""
    tail, rest = found.group("tail"), found.group("rest") or ""
    if found.group("who").lower() == "we":
        return f"{about} and the group" + (f" {_WE_CONTRACTED[tail]}" if tail in _WE_CONTRACTED else tail or "") + rest
    if tail:
        return f"{about} {_CONTRACTED.get(tail, tail)}{rest}"
    words_after = rest.split()
    for index, word in enumerate(words_after):  # the first word that is not an adverb is the verb
        if word.lower() not in _ADVERBS:
            words_after[index] = _third_person_verb(word)
            break
    return " ".join([about, *words_after])


def third_person(statement: str, about: str) -> str:
    """A first-person statement as said of `about` ("I'm a backend developer and my team ships on
    Fridays" -> "Lena is a backend developer and Lena's team ships on Fridays")."""
    out = _SUBJECT.sub(lambda found: _subject(found, about), statement)
    out = _POSSESSIVE.sub(f"{about}'s", out)
    out = _OBJECT.sub(about, out)
    return _US.sub(f"{about} and the group", out)


def _kind_of(text: str) -> str:
    low = text.lower()
    if re.search(r"\b(love|like|prefer|favou?rite|enjoy|hate|can't stand)\b", low):
        return "preference"
    if re.search(r"\b(want to|plan to|planning|going to|hope to|goal|aim to|will)\b", low):
        return "goal"
    if re.search(r"\b(i can|know how|learned to|good at|skilled)\b", low):
        return "skill"
    if re.search(r"\b(today|right now|this week|currently|at the moment)\b", low):
        return "context"
    return "fact"


def _first_sentence(text: str, limit: int = 120) -> str:
    sentence = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]
    return sentence if len(sentence) <= limit else sentence[: limit - 1].rstrip() + "…"


def _sentences(text: str) -> list[str]:
    return [x for x in re.split(r"(?<=[.!?])\s+", text.strip()) if x]


def _title(text: str) -> str:
    kept = [w for w in _WORD.findall(text) if w.lower() not in _STOP][:8]
    return " ".join(kept) or _first_sentence(text, 60)


_MONTHS = {m: i for i, m in enumerate(
    "january february march april may june july august september october november december".split(), 1)}


def _iso_date(text: str) -> str | None:
    """'8 May 2023', '8 May, 2023' or a leading ISO date as YYYY-MM-DD; None when it is neither."""
    iso = re.search(r"\d{4}-\d{2}-\d{2}", text)
    if iso:
        return iso.group(0)
    spelled = re.search(r"(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})", text)
    if spelled and spelled.group(2).lower() in _MONTHS:
        return f"{int(spelled.group(3)):04d}-{_MONTHS[spelled.group(2).lower()]:02d}-{int(spelled.group(1)):02d}"
    return None


def conversation_answer(prompt: str) -> dict[str, Any]:
    """The hints of a conversation extraction: memories, summary, intents."""
    memories: list[dict[str, Any]] = []
    questions: list[str] = []
    in_injected = False
    for line in prompt.splitlines():
        if "<memories>" in line:
            in_injected = True
        if in_injected:
            in_injected = "</memories>" not in line
            continue
        found = _MESSAGE.match(line)
        if not found:
            continue
        text, who = found.group("text").strip(), found.group("who").strip()
        if found.group("role") not in (None, "user"):  # what the assistant, the system or a tool said
            continue
        if text.endswith("?"):
            questions.append(text)
            continue
        if not _FIRST_PERSON.search(text):
            continue
        sentence = _first_sentence(next(x for x in _sentences(text) if _FIRST_PERSON.search(x)), 300)
        when = found.group("when") or ""
        about = "" if who.lower() in ("user", "assistant") else who
        statement = sentence
        if about:
            statement = third_person(statement, about)
        memories.append({
            "type": _kind_of(text),
            "title": _title(text),
            "abstract": _first_sentence(statement, 110),
            "overview": statement,
            "content": statement,
            "confidence": 0.8,
            "source_messages": [found.group("id")],
            "attributed_to": about,
            "when": _iso_date(when),
        })
    previous = ""
    match = _PREVIOUS_SUMMARY.search(prompt)
    if match:
        previous = match.group("text").strip()
    added = " ".join(str(m["abstract"]) for m in memories[:6])
    summary = " ".join(x for x in (previous, added) if x) or "Nothing lasting was said yet."
    return {"memories": memories, "summary": summary, "intents": questions[-3:]}


def session_answer(prompt: str) -> dict[str, Any]:
    out: dict[str, list[dict[str, Any]]] = {"domain_knowledge": [], "pitfalls": []}
    for found in re.finditer(r"^- \[(?P<id>[^\]]+)\] \((?:not )?verified\) statement: (?P<s>[^;\n]+)", prompt, re.M):
        text = found.group("s").strip()
        out["domain_knowledge"].append(_insight(text, f"Lemma {found.group('id')}: {text}."))
    for found in re.finditer(r"^- \[(?P<id>[^\]]+)\] why it failed: (?P<s>[^;\n]+)", prompt, re.M):
        text = found.group("s").strip()
        out["pitfalls"].append(_insight(text, f"An attempt at {found.group('id')} failed: {text}."))
    return out


def _insight(title: str, content: str) -> dict[str, Any]:
    return {"title": _title(title), "content": content, "confidence": 0.8,
            "abstract": _first_sentence(content, 110), "overview": content}


def judge_answer(prompt: str) -> dict[str, Any]:
    """SKIP onto the first listed memory that already holds 80 % of the new item's words, else CREATE."""
    kept = {m.group(1): set(words(m.group(2))) for m in re.finditer(r"^\[(E\d+)\] ([^\n]*\n[^\n]*)", prompt, re.M)}
    decisions = []
    for found in re.finditer(r"^\[(N\d+)\] ([^\n]*\n(?:[^\n]*\n)*?)  may duplicate: ?([^\n]*)$", prompt, re.M):
        new = set(words(found.group(2)))
        targets = [t.strip() for t in found.group(3).split(",") if t.strip()]
        same = next((t for t in targets if new and len(new & kept.get(t, set())) >= 0.8 * len(new)), None)
        if same is not None:
            decisions.append({"item": found.group(1), "decision": "SKIP", "target": same,
                              "reason": "the memory already says it"})
        else:
            decisions.append({"item": found.group(1), "decision": "CREATE", "reason": "it says something new"})
    return {"decisions": decisions}


def _stems(text: str) -> set[str]:
    """Words cut to their first four letters: "moved" and "move" meet, as a stemmer would have them."""
    return {w[:4] for w in words(text)}


def qa_answer(prompt: str) -> dict[str, Any]:
    """The memory line sharing the most word stems with the question, shorter lines first on a tie
    (the summary and the intents are passed over: they mix everything)."""
    found = re.search(r"^Question:\s*(.+)$", prompt, re.M)
    wanted = _stems(found.group(1)) if found else set()
    best, best_score = "", 0.0
    in_summary = False
    for line in prompt.splitlines():
        stripped = line.strip()
        if stripped.startswith("# "):
            in_summary = stripped.lower() == "# conversation summary"
            continue
        if in_summary or not stripped or stripped.startswith(("Question:", "<", "Memories")):
            continue
        have = _stems(stripped)
        score = len(wanted & have) / (1 + 0.05 * len(have))
        if score > best_score:
            best, best_score = stripped.lstrip("-* ").strip(), score
    return {"answer": best or "I do not know."}


def qa_grade(prompt: str) -> dict[str, Any]:
    gold = re.search(r"^Gold answer:\s*(.+)$", prompt, re.M)
    given = re.search(r"^Generated answer:\s*(.+)$", prompt, re.M)
    gold_words = set(words(gold.group(1))) if gold else set()
    given_words = set(words(given.group(1))) if given else set()
    share = len(gold_words & given_words) / len(gold_words) if gold_words else 0.0
    label = "CORRECT" if share >= 0.5 else "WRONG"
    return {"label": label, "reason": f"{share:.0%} of the gold answer's words are in the answer"}


def _is_conversation(schema: Any) -> bool:
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    return "summary" in props and "intents" in props


def answer_for(name: str, schema: Any, prompt: str) -> Any:
    """The structured output the loopback LLM gives for a request: valid under `schema`."""
    if _is_conversation(schema):
        hints: dict[str, Any] = conversation_answer(prompt)
    elif name == "session_insights":
        hints = session_answer(prompt)
    elif name == "merge_decisions":
        hints = judge_answer(prompt)
    elif name == "qa_answer":
        hints = qa_answer(prompt)
    elif name == "qa_grade":
        hints = qa_grade(prompt)
    else:
        hints = {}
    return fill_schema(schema, hints)


class LoopbackLLM(LLMServer):
    """The rule-based loopback LLM (module docstring). `tokens` counts what it was sent and answered
    (characters / 4), as a provider's usage would."""

    def __init__(self, port: int = 0) -> None:
        self.requests = 0
        self.tokens = {"input": 0, "output": 0}
        super().__init__(port)

    def respond(self, path: str, headers: dict[str, str], body: Any) -> Any:
        if not path.rstrip("/").endswith(("/chat/completions", "/messages")):
            return 404, {"error": {"type": "not_found", "message": f"no such endpoint: {path}"}}, {}
        provider, schema, name, prompt = _request_parts(path, body)
        data = answer_for(name, schema, prompt)
        sent = _tokens(json.dumps(body))
        reply = completion(provider, name, data, sent)
        with self.lock:
            self.requests += 1
            self.tokens["input"] += sent
            self.tokens["output"] += _tokens(json.dumps(data))
        return reply


def serve_forever(port: int, out: Callable[[str], None] = print) -> None:
    """Run the loopback LLM until SIGINT or SIGTERM."""
    stop = threading.Event()
    with LoopbackLLM(port) as llm:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        out(f"loopback LLM listening: --llm-provider openai --llm-base-url {llm.url()} --llm-model {MODEL}")
        stop.wait()


def main(argv: Iterator[str] | list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eurekamem.daemon.llm.loopback", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one, printed)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    serve_forever(args.port, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
