"""eurekamem's access to an LLM: one structured-output call, made robust, for the job queue to use.

Rule kept here: this package is library code with no daemon state; it imports no other daemon
module. The job queue resolves the configuration once (`resolve(config, os.environ)`), keeps one
`LLM` open, and calls `complete_structured(system, prompt, OutputStruct, name=...)`, which returns
a validated `StructuredResult` or raises `LLMUnavailable` (keep the job queued, back off) or
`LLMFailed` (fail the job with the reason). `LLM.statistics()` feeds sys.stats; `report_waits`
tells a task's caller why its call waits (the budget, a back-off).
"""

from ._budget import Budget
from ._client import LLM, StructuredResult, make_provider, report_waits
from ._config import (
    DEFAULT_ANTHROPIC_MODEL,
    LLMConfig,
    LLMConfigError,
    ResolvedLLM,
    Secret,
    parse_config,
    resolve,
)
from ._errors import FAILED_KINDS, UNAVAILABLE_KINDS, LLMError, LLMFailed, LLMUnavailable, Usage
from ._provider import Completion, CompletionRequest, Correction, Provider
from ._schema import ToolSpec, tool_spec

__all__ = [
    "DEFAULT_ANTHROPIC_MODEL",
    "FAILED_KINDS",
    "LLM",
    "UNAVAILABLE_KINDS",
    "Budget",
    "Completion",
    "CompletionRequest",
    "Correction",
    "LLMConfig",
    "LLMConfigError",
    "LLMError",
    "LLMFailed",
    "LLMUnavailable",
    "Provider",
    "ResolvedLLM",
    "Secret",
    "StructuredResult",
    "ToolSpec",
    "Usage",
    "make_provider",
    "parse_config",
    "report_waits",
    "resolve",
    "tool_spec",
]
