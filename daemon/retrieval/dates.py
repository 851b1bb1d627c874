"""Dates and relative times in text, for the learned rankers' temporal signals (issue 31).

Rules kept here:
- Pure functions of text and days (days since 1970-01-01, UTC, as floats); no clock is read. What
  "now" is for a relative time is always given: a message's or a memory's own date for its text
  ("I went there yesterday", said on 8 May 2023, is about 7 May 2023), and for a query the date it
  names itself ("last Friday, on 23 January 2022") or else the newest date of what it searches.
- Every date is an interval [first day, last day + 1): a day, a week, a month, a year. Two dates are
  as close as the gap between their intervals (0 when they overlap or touch: a day and the next,
  a month and its last day's morrow, are not told apart).
- English only, and only plain forms ("yesterday", "two days ago", "last week", "in May 2023");
  a text naming none gives no date, never a guess.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Sequence

import numpy as np

__all__ = ["DATE_SCALE_DAYS", "Interval", "closeness", "day_of", "named_dates", "query_dates", "query_intervals",
           "relative_intervals", "text_days", "mentions_time", "asks_when"]

Interval = tuple[float, float]  # [first day, last day + 1), days since the epoch

DATE_SCALE_DAYS = 14.0  # closeness = exp(-gap / this)

_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_MONTH = "(" + "|".join(_MONTHS) + ")"
_DATE_PATTERNS = (  # (pattern, which groups are day / month / year)
    (re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH},?\s+(\d{{4}})\b", re.I), (1, 2, 3)),
    (re.compile(rf"\b{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", re.I), (2, 1, 3)),
    (re.compile(rf"\b{_MONTH},?\s+(\d{{4}})\b", re.I), (0, 1, 2)),
    (re.compile(r"\b(" + "|".join(m.capitalize() for m in _MONTHS) + r")\b"), (0, 1, 0)),  # "may" alone is a verb
    (re.compile(r"\b((?:19|20)\d{2})\b"), (0, 0, 1)),
)
_EPOCH_DATE = _dt.date(1970, 1, 1)

_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
            "nine": 9, "ten": 10, "a couple of": 2, "couple of": 2, "a few": 3, "few": 3, "several": 4}
_UNITS = {"day": 1.0, "week": 7.0, "month": 30.0, "year": 365.0}
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_COUNT = r"(\d{1,2}|" + "|".join(sorted(_NUMBERS, key=len, reverse=True)) + ")"
_AGO = re.compile(rf"\b{_COUNT}\s+(day|week|month|year)s?\s+ago\b", re.I)
_LAST = re.compile(r"\b(last|past|previous|this|next|coming)\s+(week(?:end)?|month|year|night|summer|winter|spring|fall|"
                   r"autumn|" + "|".join(_WEEKDAYS) + r")\b", re.I)
_DAYS = re.compile(r"\b(the day before yesterday|yesterday|today|tonight|this (?:morning|afternoon|evening)|tomorrow)\b",
                   re.I)
_WHEN = re.compile(r"\b(when|what (?:date|day|month|year|time|week)|how long ago|which (?:day|month|year|week))\b", re.I)


def day_of(date: _dt.date) -> float:
    return float((date - _EPOCH_DATE).days)


def query_dates(text: str) -> list[tuple[int | None, int | None, int | None]]:
    """The (day, month, year) a text names, most precise first; a part it does not name is None.
    Each span of the text counts once (a full date is not also read as its month and its year)."""
    out: list[tuple[int | None, int | None, int | None]] = []
    taken: list[tuple[int, int]] = []
    for pattern, (d, mo, y) in _DATE_PATTERNS:
        for found in pattern.finditer(text):
            if any(a < found.end() and found.start() < b for a, b in taken):
                continue
            day = int(found.group(d)) if d else None
            month = _MONTHS.index(found.group(mo).lower()) + 1 if mo else None
            year = int(found.group(y)) if y else None
            if (day is None or 1 <= day <= 31) and (year is None or 1900 <= year <= 2100):
                out.append((day, month, year))
                taken.append(found.span())
    return out


def named_dates(text: str, year_of: int) -> list[Interval]:
    """The intervals of the dates `text` names; a month without a year is taken in `year_of`, the
    year before and the year after (three intervals); an impossible date (31 June) is left out."""
    out: list[Interval] = []
    for day, month, year in query_dates(text):
        for y in (year,) if year is not None else (year_of - 1, year_of, year_of + 1):
            try:
                first = _dt.date(y, month or 1, day or 1)
            except ValueError:
                continue
            if day is not None:
                last = first
            elif month is not None:
                last = _dt.date(y + (month == 12), month % 12 + 1, 1) - _dt.timedelta(days=1)
            else:
                last = _dt.date(y, 12, 31)
            out.append((day_of(first), day_of(last) + 1.0))
    return out


def relative_intervals(text: str, now: float) -> list[Interval]:
    """The intervals of the relative times `text` names ("yesterday", "two weeks ago", "last
    month", "next Friday"), `now` (a day) being when it was said."""
    today = float(np.floor(now))
    out: list[Interval] = []
    for found in _DAYS.finditer(text):
        word = found.group(1).lower()
        shift = -2.0 if word.startswith("the day") else -1.0 if word == "yesterday" else 1.0 if word == "tomorrow" else 0.0
        out.append((today + shift, today + shift + 1.0))
    for found in _AGO.finditer(text):
        count = found.group(1).lower()
        n = float(count) if count.isdigit() else float(_NUMBERS[count])
        unit = _UNITS[found.group(2).lower()]
        out.append((today - n * unit, today - n * unit + unit))  # "two weeks ago": that week
    weekday = _dt.date.fromordinal(int(today) + _EPOCH_DATE.toordinal()).weekday()
    for found in _LAST.finditer(text):
        which, what = found.group(1).lower(), found.group(2).lower()
        sign = -1.0 if which in ("last", "past", "previous") else 1.0 if which in ("next", "coming") else 0.0
        if what == "night":
            out.append((today - 1.0, today + 1.0) if sign <= 0 else (today, today + 2.0))
        elif what in _WEEKDAYS:  # "last Friday": the one before today; "next Friday": the one after
            back = (weekday - _WEEKDAYS.index(what)) % 7 or 7
            at = today - back if sign <= 0 else today + (7 - back if back < 7 else 7)
            out.append((at, at + 1.0))
        elif what == "weekend":
            saturday = today - ((weekday - 5) % 7)  # the latest Saturday (today on a Saturday)
            # in a weekend: last, this, next = the one before, this one, the one after; on a weekday:
            # last = the latest, this and next = the coming one
            at = saturday + 7.0 * sign if weekday >= 5 else saturday + (0.0 if sign < 0 else 7.0)
            out.append((at, at + 2.0))
        elif what in ("summer", "winter", "spring", "fall", "autumn"):
            out.append((today - 183.0, today + 1.0) if sign <= 0 else (today, today + 183.0))
        else:  # last / this / next week, month, year
            unit = _UNITS[what]
            start = {-1.0: today - unit, 0.0: today - unit / 2, 1.0: today + 1.0}[sign]
            out.append((start, start + unit))
    return out


def text_days(text: str, now: float, relative: list[Interval] | None = None) -> list[Interval]:
    """What a text (said on day `now`) is about in time: the dates it names (a month without a year
    in `now`'s year or next to it) and its relative times resolved against `now` (`relative`: those,
    when the caller has them already)."""
    return named_dates(text, _year(now)) + (relative_intervals(text, now) if relative is None else relative)


def query_intervals(query: str, now: float) -> list[Interval]:
    """The dates a query names (a month without a year in the year of `now` or next to it); its
    relative times resolved against the first full date it names, else against `now` (the newest
    date of what it searches)."""
    full = [(d, mo, y) for d, mo, y in query_dates(query) if d and mo and y and _valid((d, mo, y))]
    anchor = day_of(_dt.date(full[0][2], full[0][1], full[0][0])) if full else now
    return named_dates(query, _year(now)) + relative_intervals(query, anchor)


def _valid(date: tuple[int | None, int | None, int | None]) -> bool:
    day, month, year = date
    try:
        _dt.date(year or 1, month or 1, day or 1)
    except ValueError:
        return False
    return True


def _year(day: float) -> int:
    return _dt.date.fromordinal(int(np.floor(day)) + _EPOCH_DATE.toordinal()).year


def closeness(wanted: Sequence[Interval], have: Sequence[Sequence[Interval]]) -> np.ndarray:
    """exp(-gap / DATE_SCALE_DAYS) of each candidate's nearest interval (`have`: its intervals) to
    the nearest of `wanted`; 0 for a candidate with none, and everywhere when `wanted` is empty."""
    out = np.zeros(len(have))
    if not wanted:
        return out
    lo = np.array([a for a, _ in wanted])
    hi = np.array([b for _, b in wanted])
    for i, intervals in enumerate(have):
        if intervals:
            a = np.array([s for s, _ in intervals])[:, None]
            b = np.array([e for _, e in intervals])[:, None]
            gap = np.maximum(0.0, np.maximum(lo - b, a - hi)).min()
            out[i] = np.exp(-gap / DATE_SCALE_DAYS)
    return out


def mentions_time(text: str) -> bool:
    """The text names a date, a month, a year or a relative time."""
    return bool(query_dates(text) or _DAYS.search(text) or _AGO.search(text) or _LAST.search(text))


def asks_when(query: str) -> bool:
    """The query asks for a time ("When did ...", "What year ...", "How long ago ...")."""
    return _WHEN.search(query) is not None
