"""What a job's run ends in: an Outcome to commit, or JobFailed.

Rule kept here: this module is a leaf of the jobs package (it imports nothing of the daemon), so
that a job kind living outside daemon/jobs/ (memory maintenance) can name its outcome without
importing the package that in turn lists that kind among its defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

COMMIT_ORDER = ("memory", "graph", "persistent", "skills", "conversation")


class JobFailed(Exception):
    """The job cannot succeed as it is (an answer that passed the schema but not our checks)."""


class Outcome:
    """What a job's run produced: a function per tier that applies its part to that tier's state
    (through state.commit, inside the tier's actor) and returns a summary, and a function that
    builds the job's result from those summaries."""

    def __init__(self, stages: dict[str, Callable[[Any], Any]], result: Callable[[dict[str, Any]], Any]) -> None:
        unknown = set(stages) - set(COMMIT_ORDER)
        if unknown:
            raise ValueError(f"no tier {sorted(unknown)} to commit to")
        self.stages = stages
        self.result = result
