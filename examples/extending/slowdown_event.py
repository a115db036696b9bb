"""A scenario event kind in one file: several workers slow down at once (a rack whose GPUs
throttle together), as one ``[[event]]`` table instead of one speed event per worker.

Register it under the entry-point group ``gasloc_emu.scenario_events`` in your package's
pyproject.toml, then use ``type = "slowdown"`` in a scenario file (or name it by path:
``type = "slowdown_event:Slowdown"``, with this file's folder importable)::

    [project.entry-points."gasloc_emu.scenario_events"]
    slowdown = "slowdown_event:Slowdown"

    # scenario.toml
    [[event]]
    type = "slowdown"
    round = 1
    workers = [0, 2]
    speed = 0.5
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gasloc_emu.scenario.events import (
    CompositeEvent,
    ScenarioError,
    SpeedEvent,
    check_int,
    check_number,
)


@dataclass(frozen=True, kw_only=True)
class Slowdown(CompositeEvent):
    """The compute speed of ``workers`` from now on, in (0, 1] (1 = full speed)."""

    kind: ClassVar[str] = "slowdown"
    workers: tuple[int, ...]
    speed: float

    def _check(self) -> None:
        if not isinstance(self.workers, (list, tuple)) or not self.workers:
            raise ScenarioError(f"workers = {self.workers!r} is not a non-empty list of workers")
        workers = tuple(check_int("workers", w) for w in self.workers)
        if len(set(workers)) < len(workers):
            raise ScenarioError(f"workers = {list(workers)} names a worker twice")
        self._set("workers", workers)
        self._set("speed", check_number("speed", self.speed, 0.0, 1.0, open_lo=True))

    def expand(self) -> tuple[SpeedEvent, ...]:
        return tuple(SpeedEvent(worker=w, speed=self.speed, round=self.round, at_s=self.at_s)
                     for w in self.workers)
