"""How a run ends badly, as the launcher raises it and ``launcher.outcome`` maps it to an exit
code: a worker that failed, a run that diverged, an interrupt."""
from __future__ import annotations


class RunFailed(RuntimeError):
    """A worker died, reported an error or went silent."""


class Interrupted(RuntimeError):
    """Ctrl-C or SIGTERM on the launcher."""


class RunDiverged(RunFailed):
    """A worker saw non-finite parameters or losses; ``where`` = {"worker", "round"}."""

    def __init__(self, message: str, where: dict):
        super().__init__(message)
        self.where = where
