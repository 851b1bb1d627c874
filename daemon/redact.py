"""Redaction: secrets (and, when a policy asks, e-mail addresses, phone numbers and payment card
numbers) are replaced by `[redacted:<kind>]` before anything is stored.

Rules kept here:
- One choke point. Every request reaches its tier through Daemon.dispatch, and dispatch passes the
  params of every method in the plan below through `Redactor.call` first, so the journal, the
  snapshots, the .md files, runs/ and the logs only ever see redacted text. The plan is derived
  from protocol/methods.py: FREE_TEXT names the free-text fields of each params Struct, KEPT the
  fields stored as sent (ids, keys, names, enums: what lookups match on), and tests/test_redact.py
  fails when a method that stores anything has a text field in neither. Work that writes without
  a request (the learning loop's jobs) calls `Redactor.value` on what it stores.
- Cheap when there is nothing to find, which is almost always: a text is searched once for every
  detector's hints (Aho-Corasick) and a pattern runs only where its hint and gate are present; a
  request's free-text fields are first tested whole, on their JSON bytes (`Redactor._surely_clean`),
  and only a request that holds a hint somewhere is redacted field by field.
- Redaction is idempotent: no placeholder matches a detector, so redacting twice equals redacting
  once, and a replay or a retried job changes nothing more.
- Detectors look for the shapes providers give their keys (a fixed prefix, a length, random
  characters) and refuse text that only resembles one: a match must not continue a longer run of
  token characters (base64, hex) — though a key right after `=`, `-`, `_`, `/` or `+` that ends an
  assignment, a label or a path's part is found (GITHUB_TOKEN=ghp_..., --token=..., ?access_token=,
  Cookie: session=eyJ..., /run/secrets/...: `_starts_token`) — and the looser shapes must also
  look random (upper and lower case and digits). A label's value is found quoted or not (.env,
  export, a URL query, a header, --flag=, JSON, YAML), unquoted only when it holds letters and
  digits and is no template, path or call. Hex digests, UUIDs, git SHAs and ordinary words are
  never touched. Card numbers are Luhn-checked, with a network's prefix and length.
- Ids, keys and names are stored as sent, but one holding a secret becomes no path and reaches no
  log line as it is (`folder_name`, `shown`).
- A policy per domain (daemon/config.py: `redact`, `redact_emails`, `redact_phones`, and
  overrides under `[domains.<name>]`): a write that names its domain gets that domain's policy;
  one that does not (memory.update, persistent.*, episodic.log, skills.put...) gets every kind that
  any policy redacts, so no override can let text through where its domain is not known.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import logging
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgspec
from ahocorasick_rs import AhoCorasick, BytesAhoCorasick

from ..protocol import METHODS, Call, CrossRunRecord, KnowledgeNode, domain_slug
from ..protocol import methods as m

log = logging.getLogger("eurekamem.redact")


# --- detectors ------------------------------------------------------------------------------------


def _random_looking(token: str) -> bool:
    """Upper case, lower case and digits all present: a generated key, not a word or a slug."""
    return any(c.isdigit() for c in token) and any(c.islower() for c in token) and any(c.isupper() for c in token)


def _letters_and_digits(token: str) -> bool:
    return any(c.isdigit() for c in token) and any(c.isalpha() for c in token)


_PHONE_RUN = re.compile(r"[ .-]?\(?[0-9]+\)?")


def _phone_length(token: str) -> int:
    """How much of an international number to keep: its runs of digits while they hold at most 15
    digits, up to a parenthesised group after a complete number ("+44 20 7946 0958 (415) 555-0132"
    is two numbers); 0 when fewer than 8 digits remain."""
    at = keep = digits = 0
    while at < len(token):
        run = _PHONE_RUN.match(token, 1 if at == 0 else at)  # the first run follows the "+"
        if run is None:
            break
        count = sum(c.isdigit() for c in run.group())
        if digits + count > 15 or (digits >= 8 and run.group().lstrip(" .-").startswith("(")):
            break
        digits += count
        at = keep = run.end()
    return keep if digits >= 8 else 0


def _card_length(token: str) -> int:
    """How much of a run of digit groups is a payment card's number: the whole run, or it without
    its last groups ("4111 1111 1111 1111 123", a CVV after the number); 0: none of it."""
    end = len(token)
    while end > 0:
        if _card_number(token[:end]):
            return end
        cut = max(token.rfind(" ", 0, end), token.rfind("-", 0, end))
        if cut < 0:
            return 0
        end = cut
    return 0


def _card_number(token: str) -> bool:
    """A payment card's number: 13 to 19 digits, written whole or in groups split by one kind of
    separator (a space or a dash: fours and a shorter last group, 4111 1111 1111 1111; or 4-6-5 and
    4-6-4, 3782-822463-10005),
    a length its network issues after a prefix it issues (Visa 4: 13, 16 or 19; Mastercard
    51-55 and 2221-2720: 16; Amex 34, 37: 15; Diners 300-305, 36, 38, 39, JCB 3528-3589, Mir
    2200-2204, Maestro 50, 56-69 (Discover 6011, 65, UnionPay 62 among them): 14 to 19), and
    the Luhn checksum. What is left looking like one: 1 number in 10 of those shapes by chance."""
    groups = re.split(r"[ -]", token)
    if len(groups) > 1:
        sizes = [len(g) for g in groups]
        fours = all(size == 4 for size in sizes[:-1]) and sizes[-1] <= 4
        if len(set(re.findall(r"[ -]", token))) > 1 or not (fours or sizes in ([4, 6, 5], [4, 6, 4])):
            return False
    digits = "".join(groups)
    n, two, four = len(digits), int(digits[:2]), int(digits[:4])
    if digits[0] == "4":
        lengths: tuple[int, ...] = (13, 16, 19)
    elif 51 <= two <= 55 or 2221 <= four <= 2720:
        lengths = (16,)
    elif two in (34, 37):
        lengths = (15,)
    elif 300 <= four // 10 <= 305 or two in (36, 38, 39) or 3528 <= four <= 3589 or 2200 <= four <= 2204:
        lengths = (14, 15, 16, 17, 18, 19)
    elif two == 50 or 56 <= two <= 69:
        lengths = (14, 15, 16, 17, 18, 19)
    else:
        return False
    if n not in lengths:
        return False
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = int(c) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


# the characters of a longer token (base64, base64url, hex, words): a key never continues one
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+/=-")
ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
WORD = ALNUM | {"_"}
EMAIL_LOCAL = ALNUM | frozenset("._%+-")
LABEL_UP_TO = 64  # characters: a run of token characters before a key longer than this is no label


def _starts_token(text: str, at: int) -> bool:
    """May a key start at `at`? Not inside a run of letters and digits (`xghp_...` is a longer
    word or a base64 blob). Right after one of `= - _ / +` (GITHUB_TOKEN=ghp_..., --token=...,
    token_ghp_..., /run/secrets/ghp_..., Bearer+eyJ...) only when the run of token characters that
    separator ends is an assignment (it holds "=": base64 has "=" only at its end) or a label or a
    path's part (at most LABEL_UP_TO characters, not upper case, lower case and digits at once),
    not the body of a longer random token the match would only continue: a base64url blob holds
    "-sk-" or "_xoxb-" now and then, after random characters."""
    if at == 0:
        return True
    before = text[at - 1]
    if before not in TOKEN_CHARS:
        return True
    if before in ALNUM:
        return False
    start, floor = at - 1, max(0, at - LABEL_UP_TO)
    while start > floor and text[start - 1] in TOKEN_CHARS:
        start -= 1
    if start == floor and start > 0 and text[start - 1] in TOKEN_CHARS:
        return False  # longer than any label
    run = text[start:at]
    return "=" in run or not _random_looking(run)


@dataclasses.dataclass(frozen=True)
class Detector:
    """One shape of secret. Patterns start with a literal where they can (the regex engine then
    skips through text fast); what must not come before a match is checked after it."""

    kind: str  # the placeholder's name: [redacted:<kind>]
    pattern: re.Pattern[str]
    hints: tuple[str, ...]  # one of these must be in the lower-cased text for the pattern to run
    group: int = 0  # the part replaced (0: the whole match; a URL keeps its user, a header its name)
    check: Callable[[str], bool] | None = None  # the replaced part must pass it
    trim: Callable[[str], int] | None = None  # how much of the match is the secret (0: none of it)
    left: frozenset[str] = frozenset()  # the character before the match must not be one of these
    token_start: bool = False  # the match must start a token: not continue a longer one (_starts_token)
    fold: bool = False  # the pattern is lower case and runs on the lower-cased text (labels: Password, Bearer)
    local_part: bool = False  # an e-mail address: the match starts at "@", the span extends over the name before it
    personal: bool = False  # e-mail, phone: redacted only where a policy asks; always refused for promotion
    gate: str = ""  # one of these characters must be in the text (checked before the hints: cheaper)


def _d(kind: str, pattern: str, hints: tuple[str, ...], **options: Any) -> Detector:
    return Detector(kind, re.compile(pattern), hints, **options)


_QUOTED = r"[\"']?\s*[:=]\s*[\"']([^\"'\s]{{{0},512}})[\"']"  # the value of a quoted assignment, at least {0} long
# the value of an unquoted one (.env, export, a URL query, a header, --flag=, YAML): up to a space,
# a quote, or what ends a query parameter or a cookie (& ; ,), none of the brackets of a template
# or a call (${VAR}, <your key>, {{ vault }}, f(x)), not a path (PWD=/home/...)
_UNQUOTED = r"[\"']?\s*[:=][ \t]*([^\s\"'`&;,$<>{{}}()\[\]/~][^\s\"'`&;,<>{{}}()\[\]]{{{0},511}})"

DIGIT = "<digit>"  # a hint: the text holds a digit

_KEY_BLOCK = r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----"

DETECTORS: tuple[Detector, ...] = (
    # private key blocks first: they are long and hold base64 that nothing else may split
    _d(
        "private-key", _KEY_BLOCK + r"[\s\S]{0,65536}?" + _KEY_BLOCK.replace("BEGIN", "END"), ("private key",), gate="-"
    ),
    _d(  # a block cut off before its END line (a pasted fragment): the header lines and the base64 lines
        "private-key",
        _KEY_BLOCK
        + r"(?:(?:\s{0,2}[ \t]{0,16}|(?:\\[rn]){1,2})(?:(?:Proc-Type|DEK-Info|Comment|Version):[^\r\n]{0,200}|[A-Za-z0-9+/=]{8,200})){0,2000}",
        ("private key",),
        gate="-",
    ),
    _d("anthropic-key", r"sk-ant-[A-Za-z0-9_-]{20,512}", ("sk-ant-",), token_start=True, gate="-"),
    _d(
        "openai-key",
        r"sk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{32,512}",
        ("sk-",),
        check=_random_looking,
        token_start=True,
        gate="-",
    ),
    _d(
        "github-token",
        r"gh[pousr]_[A-Za-z0-9]{36,255}(?![A-Za-z0-9_+/=-])",
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
        token_start=True,
        gate="_",
    ),
    _d(
        "github-token",
        r"github_pat_[A-Za-z0-9_]{22,255}(?![A-Za-z0-9_+/=-])",
        ("github_pat_",),
        token_start=True,
        gate="_",
    ),
    _d("aws-key", r"A(?:KIA|SIA|BIA|CCA)[A-Z0-9]{16}(?![A-Za-z0-9])", ("akia", "asia", "abia", "acca"), left=ALNUM),
    _d(  # the secret access key: 40 base64 characters after its label (aws_secret_access_key, SecretAccessKey)
        "aws-secret",
        r"secret(?:[ _-]?access)?[ _-]?key[\"']?\s*[:=]\s*[\"']?([a-z0-9/+=]{40})(?![a-z0-9/+=])",
        ("secret",),
        group=1,
        fold=True,
        check=_letters_and_digits,
        gate=":=",
    ),
    _d("google-key", r"AIza[0-9A-Za-z_-]{35}(?![A-Za-z0-9_+/=-])", ("aiza",), token_start=True),
    _d("slack-token", r"xox[abprse]-[A-Za-z0-9-]{10,255}", ("xox",), token_start=True, gate="-"),
    _d("slack-webhook", r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]{20,255}", ("hooks.slack.com",), gate="/"),
    _d("stripe-key", r"sk_(?:live|test)_[A-Za-z0-9]{16,255}", ("sk_live_", "sk_test_"), token_start=True, gate="_"),
    _d("stripe-key", r"rk_(?:live|test)_[A-Za-z0-9]{16,255}", ("rk_live_", "rk_test_"), token_start=True, gate="_"),
    _d(
        "jwt",
        r"eyJ[A-Za-z0-9_-]{10,4096}\.eyJ[A-Za-z0-9_-]{10,8192}\.[A-Za-z0-9_-]{10,4096}",
        ("eyj",),
        token_start=True,
        gate=".",
    ),
    _d(  # Authorization: Bearer / Basic / token <credential>
        "bearer-token",
        r"authorization[\"']?\s*[:=]\s*[\"']?(?:bearer|basic|token)(?:\s+|%20|\+)([a-z0-9._~+/-]{8,4096}=*)",
        ("authorization",),
        group=1,
        fold=True,
        gate=":=",
    ),
    _d(  # a bare "Bearer <token>" (curl lines, logs), when the token looks generated
        "bearer-token",
        r"bearer(?:\s+|%20|\+)([a-z0-9._~+/-]{20,4096}=*)",
        ("bearer",),
        group=1,
        fold=True,
        left=ALNUM,
        check=_random_looking,
    ),
    _d(  # scheme://user:password@host: the password goes, the user and the host stay
        "url-password",
        r"://[^\s:/?#@\[\]]{1,256}:([^\s/?#]{1,256})@",
        ("://",),
        group=1,
        gate="@",
    ),
    *(  # password = "..." / "password": "..." in code and config; DB_PASSWORD=..., --password=..., password: ...
        _d("password", label + value, (hint,), group=1, fold=True, left=ALNUM | {"/"}, gate=":=", check=check)
        for label, hint in ((r"pass(?:word|wd|phrase)", "pass"), (r"pwd", "pwd"))  # not /etc/passwd
        for value, check in ((_QUOTED.format(6), None), (_UNQUOTED.format(5), _letters_and_digits))
    ),
    *(  # api_key = "...", "client_secret": "...", ACCESS_TOKEN='...'
        _d(
            "secret",
            label + value,
            (hint,),
            group=1,
            fold=True,
            left=ALNUM,
            check=_letters_and_digits,
            gate=":=",
        )
        for value in (_QUOTED.format(12), _UNQUOTED.format(11))
        for label, hint in (
            (r"api[_-]?key", "api"),
            (r"secret[_-]?key", "secret"),
            (r"client[_-]?secret", "client"),
            (r"access[_-]?token", "access"),
            (r"auth[_-]?token", "auth"),
            (r"private[_-]?token", "private"),
        )
    ),
    _d(
        # not git@github.com:org/repo (an scp-style remote: a path follows the colon)
        "email",
        r"@(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,24}(?![a-z0-9-])(?!:[\w/~.])",
        ("@",),
        fold=True,
        local_part=True,
        personal=True,
        gate="@",
    ),
    _d(  # +<country code> and more digits in groups: 8 to 15 digits in all
        "phone",
        r"\+[1-9][0-9]{0,2}(?:[ .-]?\(?[0-9]{1,4}\)?){2,6}(?![\w-]|\.[0-9])",
        ("+",),
        left=WORD | {"+"},
        trim=_phone_length,
        personal=True,
        gate="+",
    ),
    _d(  # a payment card's number (Luhn-checked, a network's prefix and length): personal, as a phone
        "credit-card",
        r"(?<![\w.,+-])[2-6][0-9]{3}(?:[ -]?[0-9]){9,15}(?![\w-]|[.,][0-9])",
        (DIGIT,),
        trim=_card_length,
        personal=True,
    ),
    _d(  # North American: (415) 555-0132, 415-555-0132, 415.555.0132
        "phone",
        r"(?:\([2-9][0-9]{2}\) ?|[2-9][0-9]{2}[ .-])[0-9]{3}[ .-][0-9]{4}(?![\w-]|\.[0-9])",
        (DIGIT,),
        left=WORD | frozenset(".+-"),
        personal=True,
    ),
)


_DIGIT = re.compile(r"[0-9]")
_DIGIT_BYTES = re.compile(rb"[0-9]")
# the characters other than A-Z whose lower case holds an ASCII character (found by a scan of every
# code point: tests/test_redact.py does it again): "İ" -> "i̇", the Kelvin sign -> "k"
LOWER_TO_ASCII: tuple[str, ...] = ("\u0130", "\u212a")
HINTS_UP_TO = 16384  # characters

SECRET_KINDS: frozenset[str] = frozenset(d.kind for d in DETECTORS if not d.personal)
PERSONAL_KINDS: frozenset[str] = frozenset(d.kind for d in DETECTORS if d.personal)
ALL_KINDS: frozenset[str] = SECRET_KINDS | PERSONAL_KINDS


PLACEHOLDER_START = "[redacted:"


def placeholder(kind: str) -> str:
    return f"{PLACEHOLDER_START}{kind}]"


@dataclasses.dataclass(frozen=True)
class Finding:
    kind: str
    start: int
    end: int


def find(text: str, kinds: frozenset[str] = ALL_KINDS) -> list[Finding]:
    """The spans to replace in `text`, in order, none overlapping (secrets before personal data, then
    the earlier, then the longer)."""
    lower = text.lower()
    # lower-casing keeps every index only when no character changes length (most texts; not "İ")
    aligned = len(lower) == len(text)
    plan = _plan(kinds)
    if len(text) <= HINTS_UP_TO:  # one search for every hint saves most patterns from running at all
        present = plan.hints_in(lower)
        if not present and not (plan.digits and _DIGIT.search(text) is not None):
            return []  # the common case: no hint, no digit a detector needs; no pattern runs
        candidates, hints, digits = plan.candidates("".join(filter(text.__contains__, plan.gates)))
        present.intersection_update(hints)
        if digits and _DIGIT.search(text) is not None:
            present.add(DIGIT)
        if not present:
            return []
        detectors: Iterable[Detector] = [d for d in candidates if not present.isdisjoint(d.hints)]
    else:  # past that the tests cost more than the patterns, which skip to their literal start at once
        detectors = plan.detectors
    found: list[Finding] = []
    for detector in detectors:
        if detector.fold:
            pattern, subject = (detector.pattern, lower) if aligned else (_folded(detector), text)
        else:
            pattern, subject = detector.pattern, text
        pos = 0
        while (match := pattern.search(subject, pos)) is not None:
            pos = max(match.end(), match.start() + 1)
            start, end = match.span(detector.group)
            if start < 0 or start == end:
                continue
            at = match.start()
            if detector.local_part:
                name = at
                while name > 0 and at - name < 64 and text[name - 1] in EMAIL_LOCAL:
                    name -= 1
                while name < at and text[name] not in ALNUM:  # a name starts with a letter or digit
                    name += 1
                if name == at:
                    continue
                start = at = name
            if detector.left and at > 0 and text[at - 1] in detector.left:
                continue
            if detector.token_start and not _starts_token(text, at):
                continue
            if detector.check is not None and not detector.check(text[start:end]):
                continue
            if detector.trim is not None:
                end = start + detector.trim(text[start:end])
                pos = max(end, match.start() + 1)  # what the trim let go is searched again (two numbers side by side)
                if end == start:
                    continue
            if text.startswith(PLACEHOLDER_START, start):  # redacted already (password = "[redacted:password]")
                continue
            found.append(Finding(detector.kind, start, end))
    if "aws-secret" in kinds and any(f.kind == "aws-key" for f in found):
        found.extend(_aws_secrets_near_keys(text, found))
    if len(found) < 2:
        return found
    # secrets win over personal data (a URL's password is not an e-mail address), then the earlier, then the longer
    secrets = _non_overlapping([f for f in found if f.kind not in PERSONAL_KINDS])
    personal = _non_overlapping([f for f in found if f.kind in PERSONAL_KINDS])
    if not (secrets and personal):
        return secrets or personal
    ends = [f.end for f in secrets]  # ascending, as the spans do not overlap
    kept = list(secrets)
    for finding in personal:
        i = bisect.bisect_right(ends, finding.start)  # the first secret that ends after this starts
        if i == len(secrets) or secrets[i].start >= finding.end:
            kept.append(finding)
    kept.sort(key=lambda f: f.start)
    return kept


class _Plan:
    """The detectors of a set of kinds, and what a text must hold for each to run: one of its gate
    characters, then one of its hints. Made once per set of kinds (policies are few), and the
    candidates once per set of gate characters present (at most 2^8)."""

    def __init__(self, kinds: frozenset[str]) -> None:
        self.detectors = tuple(d for d in DETECTORS if d.kind in kinds)
        self.gates = "".join(sorted({c for d in self.detectors for c in d.gate}))
        self._by_gates: dict[str, tuple[tuple[Detector, ...], tuple[str, ...], bool]] = {}
        # every hint, found in one pass over a text (Aho-Corasick: 32 substring tests cost 8x as much)
        self.hints = tuple(sorted({hint for d in self.detectors for hint in d.hints} - {DIGIT}))
        self.digits = any(DIGIT in d.hints for d in self.detectors)
        self._matcher = AhoCorasick(list(self.hints)) if self.hints else None
        # the same over UTF-8 bytes lower-cased byte by byte (ASCII only), with the characters whose
        # lower case holds ASCII letters as patterns too: bytes.lower() leaves them as they are
        self._byte_matcher = BytesAhoCorasick([t.encode() for t in self.hints + LOWER_TO_ASCII])

    def hints_in(self, lower: str) -> set[str]:
        """The hints the (lower-cased) text holds, overlapping ones included."""
        if self._matcher is None:
            return set()
        hints = self.hints
        return {hints[at] for at, _, _ in self._matcher.find_matches_as_indexes(lower, overlapping=True)}

    def surely_clean_utf8(self, raw: bytes) -> bool:
        """True when find() is sure to find nothing in any string these UTF-8 bytes (a JSON encoding)
        hold, without running a pattern: no hint in them lower-cased, nor a digit where a detector
        needs one. bytes.lower() changes only ASCII letters, as str.lower() does but for the
        characters of LOWER_TO_ASCII, which are patterns here too (then: False). Monotone: bytes
        that hold a string's encoding are never judged cleaner than the string."""
        if len(raw) > HINTS_UP_TO or self._byte_matcher.find_matches_as_indexes(raw.lower()):
            return False
        return not (self.digits and _DIGIT_BYTES.search(raw) is not None)

    def candidates(self, gates: str) -> tuple[tuple[Detector, ...], tuple[str, ...], bool]:
        """The detectors whose gate is open, their hints, and whether one needs a digit."""
        found = self._by_gates.get(gates)
        if found is None:
            detectors = tuple(d for d in self.detectors if not d.gate or any(c in gates for c in d.gate))
            hints = tuple(sorted({hint for d in detectors for hint in d.hints} - {DIGIT}))
            found = self._by_gates[gates] = (detectors, hints, any(DIGIT in d.hints for d in detectors))
        return found


_PLANS: dict[frozenset[str], _Plan] = {}


def _plan(kinds: frozenset[str]) -> _Plan:
    plan = _PLANS.get(kinds)
    if plan is None:
        plan = _PLANS[kinds] = _Plan(kinds)
    return plan


_FOLDED: dict[str, re.Pattern[str]] = {}


def _folded(detector: Detector) -> re.Pattern[str]:
    """A folding detector's pattern, case-insensitive, for the rare text whose lower case changes its length."""
    pattern = _FOLDED.get(detector.pattern.pattern)
    if pattern is None:
        pattern = _FOLDED[detector.pattern.pattern] = re.compile(detector.pattern.pattern, re.IGNORECASE)
    return pattern


def _non_overlapping(found: list[Finding]) -> list[Finding]:
    found.sort(key=lambda f: (f.start, -(f.end - f.start)))
    kept: list[Finding] = []
    for finding in found:
        if not kept or finding.start >= kept[-1].end:
            kept.append(finding)
    return kept


_AWS_SECRET_SHAPE = re.compile(r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])")
AWS_SECRET_WINDOW = 300  # characters after an access key id in which an unlabelled secret key is looked for


def _aws_secrets_near_keys(text: str, found: list[Finding]) -> list[Finding]:
    """A 40-character secret access key a little after an access key id, even without its label."""
    out: list[Finding] = []
    for key in [f for f in found if f.kind == "aws-key"]:
        for match in _AWS_SECRET_SHAPE.finditer(text, key.end, min(len(text), key.end + AWS_SECRET_WINDOW)):
            if _random_looking(match.group()):
                out.append(Finding("aws-secret", match.start(), match.end()))
    return out


# What a JSON encoding changes in a string: these characters are escaped (everything else, non-ASCII
# too, is written as it is). No hint holds one, so every hint in a string is in the encoding of any
# value that holds the string (Redactor._surely_clean's one test for a whole request rests on this).
JSON_ESCAPED = frozenset('"\\') | frozenset(chr(c) for c in range(0x20)) | {"\x7f"}
if any(JSON_ESCAPED.intersection(hint) for d in DETECTORS for hint in d.hints):
    raise RuntimeError("a redaction hint holds a character JSON escapes: Redactor._surely_clean would be unsound")


def redact_text(text: str, kinds: frozenset[str] = SECRET_KINDS) -> tuple[str, list[str]]:
    """`text` with every finding of `kinds` replaced by its placeholder, and the kinds replaced."""
    findings = find(text, kinds)
    if not findings:
        return text, []
    parts: list[str] = []
    at = 0
    for finding in findings:
        parts.append(text[at : finding.start])
        parts.append(placeholder(finding.kind))
        at = finding.end
    parts.append(text[at:])
    return "".join(parts), [f.kind for f in findings]


def detect(texts: Iterable[str], kinds: frozenset[str] = ALL_KINDS) -> list[str]:
    """The kinds found in any of `texts`, sorted (for promotion's automatic check: every kind)."""
    seen: set[str] = set()
    for text in texts:
        if text:
            seen.update(f.kind for f in find(text, kinds))
    return sorted(seen)


# --- identifiers in paths and log lines --------------------------------------------------------------

# Ids, keys and names are kept as sent in the records (lookups match them), but one that holds a
# secret never becomes a path or reaches a log line as it is.

REDACTED_FOLDER_PREFIX = "redacted-"


def shown(ident: str) -> str:
    """An identifier as a log line shows it: redacted (every kind) when something in it is found."""
    return redact_text(ident, ALL_KINDS)[0] if ident else ident


def folder_name(ident: str) -> str:
    """The folder an identifier names (runs/<session id>/): the id as sent, byte for byte, unless it
    holds a secret; then "redacted-" and the first 16 hex digits of the id's SHA-256, the same for
    the same id on every start (a session that ends twice merges into one folder, as any does)."""
    if not find(ident, SECRET_KINDS):
        return ident
    return REDACTED_FOLDER_PREFIX + hashlib.sha256(ident.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# --- which params fields are free text --------------------------------------------------------------

# The free-text fields of each params Struct that a storing method takes. A field's value is
# redacted wherever it holds a string: nested lists, dicts (keys and values) and Structs included.
FREE_TEXT: dict[type, tuple[str, ...]] = {
    m.EpisodicLog: ("content", "metadata"),
    m.SessionClose: ("theory_state",),
    m.PersistentRemember: ("value", "tags"),
    m.GraphAddTheorem: ("theorem_name", "formal_statement", "tags"),
    m.MemoryAdd: ("title", "content", "abstract", "overview", "tags", "attributed_to"),  # a name, as a sender is
    m.MemoryAddMany: ("items",),
    m.MemoryUpdate: ("title", "content", "abstract", "overview", "tags", "attributed_to"),
    m.SkillsPut: ("body", "description", "tags"),
    m.MemoryPromote: ("reason",),
    m.ReviewReject: ("reason",),
    m.ConversationAppend: ("messages",),
    m.ConversationMessage: ("text", "sender"),  # nested in ConversationAppend.messages
    m.SessionLearned: ("items",),  # the insights a client extracted: memories once the job commits
    m.LearnedItem: ("title", "content", "abstract", "overview"),  # nested in SessionLearned.items
}

# The records an existing root's files hold, imported at the first start without a request: the
# fields their storing methods redact (persistent.remember, graph.add_theorem).
IMPORTED_TEXT: dict[type, tuple[str, ...]] = {
    CrossRunRecord: ("value", "tags"),
    KnowledgeNode: ("theorem_name", "formal_statement", "tags"),
}

_ID = "an identifier: lookups match it as sent"
_ENUM = "one of a fixed set of values"
_TIME = "a timestamp"
_WHO = "who did it: kept as the record of who"

# The string-holding fields of those Structs that are stored as sent, and why.
KEPT: dict[type, dict[str, str]] = {
    m.EpisodicLog: {"session_id": _ID, "agent_role": _ID, "entry_id": _ID, "timestamp": _TIME},
    m.SessionClose: {"session_id": _ID, "domain": _ID},
    m.PersistentRemember: {"key": _ID, "source_session": _ID, "record_id": _ID, "created_at": _TIME, "updated_at": _TIME},
    m.PersistentKey: {"key": _ID},
    m.GraphAddTheorem: {"domain": _ID, "session_id": _ID, "node_id": _ID, "created_at": _TIME},
    m.GraphLink: {"from_id": _ID, "to_id": _ID, "relation": _ENUM},
    m.MemoryAdd: {
        "domain": _ID,
        "category": _ENUM,
        "source_session": _ID,
        "scope": _ENUM,
        "valid_from": _TIME,
        "valid_until": _TIME,
        "source_message_ids": _ID,
        "refers_to": _TIME,
        "id": _ID,  # with created_at and updated_at: an import's (cli/transfer.py), kept as its history
        "created_at": _TIME,
        "updated_at": _TIME,
    },
    m.MemoryUpdate: {"id": _ID, "category": _ENUM, "scope": _ENUM, "valid_from": _TIME, "valid_until": _TIME},
    m.MemoryDelete: {"id": _ID},
    m.MemoryRef: {"id": _ID},  # memory.restore
    m.MemoryFeedback: {"ids": _ID, "signal": _ENUM},
    m.SkillsPut: {
        "name": _ID,
        "version": _ID,
        "agent_roles": _ID,
        "pipeline_stages": _ID,
        "source": _ENUM,
        "status": _ENUM,
        "created_at": _TIME,
    },
    m.SkillsRecordUse: {"name": _ID},
    m.SkillRef: {"name": _ID},
    m.MemoryPromote: {"id": _ID, "by": _WHO},
    m.ReviewDecide: {"id": _ID, "by": _WHO},
    m.ReviewReject: {"id": _ID, "by": _WHO},
    m.ConversationAppend: {"group": _ID},
    m.ConversationGroupRef: {"group": _ID},  # conversation.flush journals a job naming the group
    m.ConversationMessage: {"id": _ID, "role": _ENUM, "timestamp": _TIME, "session": _ID},
    m.JobRef: {"id": _ID},  # jobs.cancel and jobs.retry store nothing of the client's but the state
    m.SessionLearned: {"job_id": _ID},
    m.LearnedItem: {"category": _ENUM},
}

# Methods that store text without journaling it in their own tier: tier 1 keeps events in RAM and
# writes them to runs/<session>/episodic.json; session.close and conversation.flush have the job
# queue journal a job, session.learned a job's commit. Every other storing method is `writes` in METHODS.
UNJOURNALED_STORES: frozenset[str] = frozenset({"episodic.log", "session.close", "conversation.flush", "session.learned"})


def storing_methods() -> list[str]:
    return sorted(name for name, spec in METHODS.items() if spec.writes or name in UNJOURNALED_STORES)


def _holds_text(t: Any) -> bool:
    """Can a value of this msgspec type (msgspec.inspect) hold a string anywhere?"""
    mi = msgspec.inspect
    if isinstance(t, (mi.StrType, mi.AnyType, mi.LiteralType)):
        return True
    if isinstance(t, mi.Metadata):
        return _holds_text(t.type)
    if isinstance(t, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
        return _holds_text(t.item_type)
    if isinstance(t, mi.TupleType):
        return any(_holds_text(item) for item in t.item_types)
    if isinstance(t, mi.DictType):
        return _holds_text(t.key_type) or _holds_text(t.value_type)
    if isinstance(t, mi.UnionType):
        return any(_holds_text(member) for member in t.types)
    if isinstance(t, mi.StructType):
        return any(_holds_text(f.type) for f in t.fields)
    return False


def _params_structs(t: Any) -> list[type]:
    """The params Structs nested in a field's type (memory.add_many's items are memory.add params)."""
    mi = msgspec.inspect
    if isinstance(t, mi.StructType):
        return [t.cls] if issubclass(t.cls, m.Params) else []
    inner = getattr(t, "item_type", None) or getattr(t, "type", None) or getattr(t, "value_type", None)
    members = list(getattr(t, "types", ())) + ([inner] if inner is not None else [])
    return [cls for member in members for cls in _params_structs(member)]


def unclassified(params_type: type) -> list[str]:
    """Fields of a storing method's params that can hold text and are in neither FREE_TEXT nor KEPT
    (nested params Structs included, as `items[].title`): what tests/test_redact.py refuses."""
    free = set(FREE_TEXT.get(params_type, ()))
    kept = set(KEPT.get(params_type, {}))
    out: list[str] = []
    info = msgspec.inspect.type_info(params_type)
    assert isinstance(info, msgspec.inspect.StructType), params_type
    for field in info.fields:
        if not _holds_text(field.type):
            continue
        if field.name not in free | kept:
            out.append(field.name)
        elif field.name in free:
            out += [f"{field.name}[].{name}" for nested in _params_structs(field.type) for name in unclassified(nested)]
    return out


# --- policies ---------------------------------------------------------------------------------------


class Policy(msgspec.Struct, frozen=True):
    """What one domain redacts: secrets, and optionally e-mail addresses, phone numbers and payment
    card numbers."""

    secrets: bool = True
    emails: bool = False
    phones: bool = False
    cards: bool = False

    def kinds(self) -> frozenset[str]:
        out: set[str] = set(SECRET_KINDS) if self.secrets else set()
        if self.emails:
            out.add("email")
        if self.phones:
            out.add("phone")
        if self.cards:
            out.add("credit-card")
        return frozenset(out)


_json_encode = msgspec.json.Encoder().encode

CLEAN_MEMO_CHARS = 64  # texts up to this long that held nothing are remembered (Redactor._clean)
CLEAN_MEMO_SIZE = 8192  # per set of kinds, at most


class Redactor:
    """The daemon's redaction: a default policy, per-domain overrides, counts of what was replaced."""

    def __init__(self, default: Policy | None = None, overrides: Mapping[str, Policy] | None = None) -> None:
        self.default = default or Policy()
        self.overrides = {domain_slug(name): policy for name, policy in (overrides or {}).items()}
        everything = [self.default, *self.overrides.values()]
        # a write that does not name its domain: what any policy would redact
        self.unknown_domain = frozenset().union(*(p.kinds() for p in everything))
        self._kinds: dict[str, frozenset[str]] = {slug: p.kinds() for slug, p in self.overrides.items()}
        self._default_kinds = self.default.kinds()
        self.by_kind: dict[str, int] = {}
        self.requests = 0  # requests in which something was replaced
        # short texts in which a set of kinds found nothing (JSON keys, tags, enum-like values recur in
        # every request): a memo of a pure function, so it changes no result; cleared when full
        self._clean: dict[frozenset[str], set[str]] = {}
        self.plan: dict[str, type] = {
            name: METHODS[name].params for name in storing_methods() if METHODS[name].params in FREE_TEXT
        }
        # each planned method's free-text fields at once (one value, or a tuple of them): what
        # _surely_clean tests before any field is redacted on its own
        self._free_text = {name: operator.attrgetter(*FREE_TEXT[params]) for name, params in self.plan.items()}

    @classmethod
    def from_config(cls, config: Any) -> Redactor:
        default = Policy(config.redact, config.redact_emails, config.redact_phones, config.redact_cards)
        overrides = {
            name: Policy(
                default.secrets if o.redact is None else o.redact,
                default.emails if o.redact_emails is None else o.redact_emails,
                default.phones if o.redact_phones is None else o.redact_phones,
                default.cards if o.redact_cards is None else o.redact_cards,
            )
            for name, o in config.domains.items()
        }
        return cls(default, overrides)

    def kinds_for(self, domain: str | None) -> frozenset[str]:
        if domain is None:
            return self.unknown_domain
        return self._kinds.get(domain_slug(domain), self._default_kinds)

    # -- the choke point --

    def call(self, call: Call) -> None:
        """Redact a request's params in place (Daemon.dispatch calls this for every request)."""
        free_text = self._free_text.get(call.spec.name)
        if free_text is None or self._surely_clean(free_text(call.params)):
            return
        replaced: list[str] = []
        params = self._struct(call.params, self.unknown_domain, replaced)
        if replaced:
            call.params = params
            self._count(replaced)
            log.debug("redacted %d item(s) (%s) in %s", len(replaced), ", ".join(sorted(set(replaced))), call.spec.name)

    def value(self, value: Any, domain: str | None = None) -> Any:
        """Any value (a string, JSON, a Struct) with every string in it redacted under `domain`'s policy;
        for work that stores without a request (the learning loop's jobs)."""
        if not isinstance(value, str) and self._surely_clean(value):
            return value
        replaced: list[str] = []
        out = self._value(value, self.kinds_for(domain), replaced)
        if replaced:
            self._count(replaced)
        return out

    def text(self, text: str, domain: str | None = None) -> str:
        result: str = self.value(text, domain)
        return result

    def imported(self, record: Any, replaced: list[str]) -> Any:
        """A record or theorem read from files another program wrote (the first start's import of an
        existing root): its free text redacted as the write that stores it would be (IMPORTED_TEXT
        names the fields), under its domain's policy, the rest kept. What was replaced is added to
        `replaced`, not counted: this runs in recovery's worker thread, and the daemon counts the
        list (Redactor.counted) once recovery has handed it back."""
        fields = IMPORTED_TEXT.get(type(record))
        return record if fields is None else self._struct(record, self.unknown_domain, replaced, fields)

    def counted(self, replaced: list[str]) -> None:
        """Count what was replaced elsewhere with redact_text (the scans of memories/, in a worker thread)."""
        if replaced:
            self._count(replaced)

    def statistics(self) -> dict[str, Any]:
        return {
            "secrets": self.default.secrets,
            "emails": self.default.emails,
            "phones": self.default.phones,
            "cards": self.default.cards,
            "domain_overrides": len(self.overrides),
            "requests": self.requests,
            "by_kind": dict(sorted(self.by_kind.items())),
        }

    def _count(self, replaced: list[str]) -> None:
        self.requests += 1
        for kind in replaced:
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1

    def _struct(
        self, struct: Any, kinds: frozenset[str], replaced: list[str], fields: tuple[str, ...] | None = None
    ) -> Any:
        domain = getattr(struct, "domain", None)
        if isinstance(domain, str) and domain:  # "" (graph: no domain) is a domain not known
            kinds = self.kinds_for(domain)
        fields = fields or FREE_TEXT.get(type(struct))
        if fields is None:  # a nested record (TheoryState): every field is text
            fields = tuple(f.name for f in msgspec.structs.fields(struct))
        changes = {}
        for name in fields:
            old = getattr(struct, name)
            new = self._value(old, kinds, replaced)
            if new is not old:
                changes[name] = new
        return msgspec.structs.replace(struct, **changes) if changes else struct

    def _surely_clean(self, value: Any) -> bool:
        """True when no string anywhere in `value` (a request's free-text fields, a list, a dict,
        their keys, nested Structs) could hold anything that any policy redacts: one
        `_Plan.surely_clean_utf8` test on the value's JSON encoding, which holds every one of those
        strings with only JSON_ESCAPED characters changed, under `unknown_domain` (every kind of
        every policy, so also under a nested Struct's own domain). A nested Struct is encoded whole,
        fields kept as sent included, so it may say False where there is nothing to redact: then
        every field is tested on its own. False as well when the encoding is past HINTS_UP_TO or the
        value has no JSON form."""
        try:
            flat = _json_encode(value)
        except (TypeError, ValueError, msgspec.EncodeError):
            return False  # not JSON (a float key, say): the strings are tested one by one
        return _plan(self.unknown_domain).surely_clean_utf8(flat)

    def _value(self, value: Any, kinds: frozenset[str], replaced: list[str]) -> Any:
        if isinstance(value, str):
            if not kinds:
                return value
            clean = self._clean.get(kinds) if len(value) <= CLEAN_MEMO_CHARS else None
            if clean is not None and value in clean:
                return value
            text, hits = redact_text(value, kinds)
            if hits:
                replaced.extend(hits)
                return text
            if len(value) <= CLEAN_MEMO_CHARS:
                if clean is None:
                    clean = self._clean[kinds] = set()
                elif len(clean) >= CLEAN_MEMO_SIZE:
                    clean.clear()
                clean.add(value)
            return value
        if isinstance(value, list):
            items = [self._value(item, kinds, replaced) for item in value]
            return items if any(a is not b for a, b in zip(items, value, strict=True)) else value
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            changed = False
            for key, item in value.items():
                new_key = self._value(key, kinds, replaced) if isinstance(key, str) else key
                new_item = self._value(item, kinds, replaced)
                changed = changed or new_key is not key or new_item is not item
                while new_key in out:  # two keys redacted alike: both kept
                    new_key = f"{new_key}#"
                out[new_key] = new_item
            return out if changed else value
        if isinstance(value, msgspec.Struct):
            return self._struct(value, kinds, replaced)
        return value
