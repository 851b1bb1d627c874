"""Which LLM the daemon talks to, and with what limits: `LLMConfig` as written, `resolve()` to use.

Rule kept here: the choice is made once, from the configuration and the environment given (never
from os.environ behind the caller's back), and the result says plainly whether a provider is
usable and, if not, why. With nothing configured the daemon uses Anthropic when ANTHROPIC_API_KEY
is set (as EurekaClaw does) and no provider otherwise. The model is the configured one, else
EurekaClaw's EUREKACLAW_FAST_MODEL, else a small fast default (Anthropic only: an
OpenAI-compatible server has no model everybody has, so there it must be named). The key is read
here and kept in a `Secret`, whose repr and str never show it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "DEFAULT_ANTHROPIC_MODEL",
    "LLMConfig",
    "LLMConfigError",
    "ResolvedLLM",
    "Secret",
    "parse_config",
    "resolve",
]

DEFAULT_ANTHROPIC_MODEL = "claude-haiku-4-5"
DEFAULT_ANTHROPIC_URL = "https://api.anthropic.com"
DEFAULT_OPENAI_URL = "https://api.openai.com/v1"
DEFAULT_KEY_VARIABLES = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
BASE_URL_VARIABLES = {"anthropic": "ANTHROPIC_BASE_URL", "openai": "OPENAI_BASE_URL"}
FAST_MODEL_VARIABLE = "EUREKACLAW_FAST_MODEL"

ProviderName = Literal["anthropic", "openai", "none"]
PositiveInt = Annotated[int, Meta(gt=0)]


class LLMConfigError(ValueError):
    """The LLM configuration cannot be used; the message names the setting."""


class LLMConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `[llm]` settings as a user writes them. Empty strings and `provider = None` mean "not set":
    `resolve()` fills them from the environment and the defaults.

    `base_url` is the API root: for Anthropic without `/v1` (the SDK adds it), for an
    OpenAI-compatible server with it (`http://localhost:11434/v1`; `/chat/completions` is added).
    """

    provider: ProviderName | None = None
    model: str = ""
    base_url: str = ""
    api_key_env: str = ""  # the variable holding the key; "" = ANTHROPIC_API_KEY / OPENAI_API_KEY
    timeout: Annotated[float, Meta(gt=0)] = 60.0  # seconds, for each request
    max_attempts: PositiveInt = 4  # requests per answer, retries of 429 / 5xx / timeouts included
    requests_per_minute: PositiveInt = 50
    tokens_per_minute: PositiveInt = 200_000
    max_output_tokens: PositiveInt = 4096


class Secret:
    """A value that must not be printed: repr and str show `<redacted>`; `reveal()` gives it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('<redacted>')"

    __str__ = __repr__


@dataclasses.dataclass(frozen=True)
class ResolvedLLM:
    """The provider to use, every setting filled in. `unavailable_kind` / `unavailable_reason` are
    set ("not_configured", "no_key") when no call can succeed until the configuration changes."""

    provider: ProviderName
    model: str
    base_url: str
    api_key_env: str
    api_key: Secret
    timeout: float
    max_attempts: int
    requests_per_minute: int
    tokens_per_minute: int
    max_output_tokens: int
    unavailable_kind: str = ""
    unavailable_reason: str = ""

    @property
    def available(self) -> bool:
        return not self.unavailable_kind


def parse_config(settings: Mapping[str, Any]) -> LLMConfig:
    """The `[llm]` table of a config file (or any mapping) as an LLMConfig, strictly typed."""
    try:
        return msgspec.convert(dict(settings), LLMConfig, strict=True)
    except msgspec.ValidationError as e:
        raise LLMConfigError(f"llm: {e}") from None


def resolve(config: LLMConfig | None, environ: Mapping[str, str]) -> ResolvedLLM:
    """Decide the provider, model, URL and key from `config` (None = nothing configured) and `environ`."""
    config = _checked(config if config is not None else LLMConfig())
    provider: ProviderName
    if config.provider is None:
        provider = "anthropic" if environ.get(config.api_key_env or DEFAULT_KEY_VARIABLES["anthropic"]) else "none"
    else:
        provider = config.provider
    limits: dict[str, Any] = {
        "timeout": config.timeout,
        "max_attempts": config.max_attempts,
        "requests_per_minute": config.requests_per_minute,
        "tokens_per_minute": config.tokens_per_minute,
        "max_output_tokens": config.max_output_tokens,
    }
    if provider == "none":
        reason = (
            "no LLM provider configured (set llm_provider in the config file or EUREKAMEM_LLM_PROVIDER, or ANTHROPIC_API_KEY for Anthropic)"
            if config.provider is None
            else "the LLM provider is configured as none"
        )
        return ResolvedLLM(
            "none", "", "", "", Secret(""), **limits, unavailable_kind="not_configured", unavailable_reason=reason
        )
    model = config.model or environ.get(FAST_MODEL_VARIABLE, "")
    if not model:
        if provider != "anthropic":
            raise LLMConfigError(f"llm: provider {provider} needs a model (llm_model in the config file, EUREKAMEM_LLM_MODEL or {FAST_MODEL_VARIABLE})")
        model = DEFAULT_ANTHROPIC_MODEL
    default_url = DEFAULT_ANTHROPIC_URL if provider == "anthropic" else DEFAULT_OPENAI_URL
    base_url = (config.base_url or environ.get(BASE_URL_VARIABLES[provider], "") or default_url).rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise LLMConfigError(f"llm: base_url must start with http:// or https://, got {base_url!r}")
    key_variable = config.api_key_env or DEFAULT_KEY_VARIABLES[provider]
    key = environ.get(key_variable, "")
    # A local OpenAI-compatible server needs no key; a key variable named explicitly must be set.
    key_required = provider == "anthropic" or bool(config.api_key_env)
    kind, reason = "", ""
    if key_required and not key:
        kind, reason = "no_key", f"{key_variable} is not set in the daemon's environment"
    return ResolvedLLM(
        provider, model, base_url, key_variable, Secret(key), **limits, unavailable_kind=kind, unavailable_reason=reason
    )


def _checked(config: LLMConfig) -> LLMConfig:
    """Constructing a Struct does not check its constraints; a round trip through convert does."""
    try:
        return msgspec.convert(msgspec.to_builtins(config), LLMConfig, strict=True)
    except msgspec.ValidationError as e:
        raise LLMConfigError(f"llm: {e}") from None
