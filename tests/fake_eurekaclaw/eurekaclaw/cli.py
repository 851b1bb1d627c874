"""eurekaclaw.cli:main, EurekaClaw's console script (the stand-in's one command: `run SESSION DOMAIN
QUERY`, which prints what the run saw as one JSON line)."""

from __future__ import annotations

import asyncio
import json
import sys


def main() -> int:
    from eurekaclaw.knowledge_bus.bus import KnowledgeBus
    from eurekaclaw.orchestrator.meta_orchestrator import MetaOrchestrator
    from eurekaclaw.types.tasks import InputSpec

    command, session_id, domain, query = sys.argv[1:5]
    if command != "run":
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    bus = KnowledgeBus(session_id)
    orchestrator = MetaOrchestrator(bus)
    result = asyncio.run(orchestrator.run(InputSpec(domain=domain, query=query)))
    print(json.dumps({
        "memory": type(orchestrator.memory).__module__,
        "registry": type(orchestrator.skill_registry).__module__,
        "extraction": bus.get("eurekamem_extraction"),
        "system_prompt": bus.get("system_prompt"),
        "recent": result.output["recent"],
    }))
    return 0
