"""A memory's strength: what it is worth keeping and showing, from its importance and its use.

Rule kept here: strength is a pure function of the memory's journaled fields and the time, so it
is never stored (it would go stale by the hour) and replay cannot disagree with run time:

    strength   = importance × decay                                        (0..1)
    importance = confidence × importance[category]
    decay      = 1 for a pinned memory, else 0.5 ** (age_days / half_life_days)
    age        = now − last_used (the last `used` feedback), else now − created_at
    half_life  = half_life_days[category] × (1 + reinforcement × log2(1 + used_count))

so each reported use starts the clock again and lengthens the half-life (one use doubles it with
the default reinforcement 1, three uses triple it). Strength is rounded to 3 decimals (STEP), so
that memories of the same importance made moments apart are equals (then the newest goes first),
not ordered by a difference of 1e-9. Search and injection rank by

    score = relevance × (1 − strength_weight + strength_weight × strength)

relevance first: with the default weight 0.1 strength moves a result by at most a tenth of its
relevance. The per-category tables and the weights come from the daemon's Config
(daemon/config.py) and are documented in PROTOCOL.md ("Strength and forgetting").
"""

from __future__ import annotations

import datetime as _dt
import math
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np

from ...protocol import MEMORY_CATEGORIES, Memory

DAY = 86400.0


STEP = 1000  # strength is rounded to 1 / STEP
# the Config fields StrengthSettings is made of
_CONFIG_FIELDS = (
    "memory_half_life_days", "memory_importance", "strength_weight", "reinforcement", "wrong_penalty",
    "archive_floor", "archive_idle_days",
)


class StrengthSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The Config settings the formula reads; no defaults here: they are Config's (defaults())."""

    half_life_days: dict[str, float]
    importance: dict[str, float]
    weight: float  # strength_weight
    reinforcement: float
    wrong_penalty: float
    archive_floor: float
    archive_idle_days: float

    @classmethod
    def from_config(cls, config: Any) -> StrengthSettings:
        """The settings of `config` (a Config, or anything with its fields _CONFIG_FIELDS)."""
        return cls(
            half_life_days=dict(config.memory_half_life_days),
            importance=dict(config.memory_importance),
            weight=config.strength_weight,
            reinforcement=config.reinforcement,
            wrong_penalty=config.wrong_penalty,
            archive_floor=config.archive_floor,
            archive_idle_days=config.archive_idle_days,
        )

    @classmethod
    def defaults(cls) -> StrengthSettings:
        """The settings of a Config left at its defaults (until the daemon hands its own)."""
        from ..config import config_default

        return cls.from_config(SimpleNamespace(**{name: config_default(name) for name in _CONFIG_FIELDS}))

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """(half-life in seconds, importance) per category index (MEMORY_CATEGORIES' order)."""
        half = np.asarray([self.half_life_days[c] * DAY for c in MEMORY_CATEGORIES], dtype=np.float64)
        weight = np.asarray([self.importance[c] for c in MEMORY_CATEGORIES], dtype=np.float64)
        return half, weight


def epoch(timestamp: str) -> float:
    """Seconds since 1970 of an RFC 3339 timestamp (naive means UTC, as everywhere in the daemon)."""
    text = timestamp[:-1] + "+00:00" if timestamp.endswith(("Z", "z")) else timestamp
    parsed = _dt.datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=_dt.UTC)
    return parsed.timestamp()


def rfc3339(seconds: float) -> str:
    return _dt.datetime.fromtimestamp(seconds, _dt.UTC).isoformat()


def reference_time(memory: Memory) -> float:
    """When the memory's clock started: its last reported use, else its creation."""
    return epoch(memory.last_used or memory.created_at)


def strength(memory: Memory, now: float, settings: StrengthSettings) -> float:
    """One memory's strength at `now` (seconds since 1970); see the module docstring. The same
    arithmetic as strengths() (it is strengths() of one row), so both agree to the last digit."""
    row = strengths(
        np.asarray([memory.confidence], dtype=np.float64),
        np.asarray([_CATEGORY.get(memory.category, 0)], dtype=np.int8),
        np.asarray([memory.pinned]),
        np.asarray([reference_time(memory)], dtype=np.float64),
        np.asarray([memory.used_count], dtype=np.int64),
        now,
        settings,
    )
    return float(row[0])


_CATEGORY = {name: i for i, name in enumerate(MEMORY_CATEGORIES)}


def outlook(memory: Memory, value: float, settings: StrengthSettings) -> dict[str, Any]:
    """memory.strength's answer for one memory: its strength now (`value`, strength() at now: the
    caller computes a page's at once, over the columns), what it is made of, and when it
    fades: `fades_at`, when its strength (rounded, as maintenance compares it) falls under
    archive_floor (the formula solved for the age: half_life × log2(importance / (floor − 0.0005))
    after its reference time), and `archivable_at`, the first time maintenance may archive it (faded
    and not used for archive_idle_days). Both null for a pinned memory, and when no rounded strength
    can fall under the floor (archive_floor 0: nothing is ever archived)."""
    category = memory.category if memory.category in settings.half_life_days else MEMORY_CATEGORIES[0]
    importance = memory.confidence * settings.importance[category]
    half_life = settings.half_life_days[category] * (1.0 + settings.reinforcement * math.log2(1.0 + memory.used_count))
    reference = reference_time(memory)
    fades_at = archivable_at = None
    under = settings.archive_floor - 0.5 / STEP  # the rounded strength is under the floor below this
    if not memory.pinned and under > 0:
        age = half_life * DAY * math.log2(importance / under) if importance > under else 0.0
        fades_at = rfc3339(reference + age)
        archivable_at = rfc3339(reference + max(age, settings.archive_idle_days * DAY))
    return {
        "id": memory.id,
        "strength": value,
        "importance": round(importance, 6),
        "half_life_days": round(half_life, 3),
        "since": rfc3339(reference),
        "pinned": memory.pinned,
        "fades_at": fades_at,
        "archivable_at": archivable_at,
    }


def strengths(
    confidence: np.ndarray,
    category: np.ndarray,
    pinned: np.ndarray,
    reference: np.ndarray,
    used: np.ndarray,
    now: float,
    settings: StrengthSettings,
) -> np.ndarray:
    """strength() over columns (one row per memory), vectorised: the same formula."""
    half, weight = settings.tables()
    cat = category.astype(np.int64)
    importance = confidence.astype(np.float64) * weight[cat]
    half_life = half[cat] * (1.0 + settings.reinforcement * np.log2(1.0 + used.astype(np.float64)))
    age = np.maximum(0.0, now - reference)
    decay = np.where(pinned, 1.0, np.power(0.5, age / half_life))
    result: np.ndarray = np.round(importance * decay * STEP) / STEP
    return result


def rank_factor(strength_value: np.ndarray | float, settings: StrengthSettings) -> Any:
    """What a result's relevance is multiplied by: 1 − w + w × strength."""
    return 1.0 - settings.weight + settings.weight * strength_value
