"""The compute model: how fast each worker computes, and how many inner steps fit in a round.

Pure rules, no torch: the worker (both in the simulator and in an emulator process), the
virtual clock's callers, ``compute show`` and the DiLoCo weighting all read them from here, so
they cannot disagree.

- ``speeds(cfg)``: one speed per worker in (0, 1] from ``compute.profile`` (named, or a TOML file
  ``[default] speed = 1.0`` / ``[[worker]] id = 3, speed = 0.25``).
- ``ComputeModel``: one worker's step time (``step_s``: nominal ``step_time_s``, or the measured
  time, divided by its speed) and its budget rule (``fits``: take another step only while it
  still fits in ``inner_budget_s``; the first step is always taken).
- ``InnerPhase``: one inner phase on an injected clock: how many steps, their emulated time,
  the sleeps that pace them in an emulator process, and the steps that overran.
- ``ComputePlan``: every worker's model and H_i, built once by the run plan (``plan``);
  its ``step_counts()`` are known before the run (fixed H, or a budget with a nominal step
  time), or None when they depend on measured times.
"""
from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gasloc_emu.config import ComputeConfig, Config, ConfigError
from netem.profiles import check_keys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on 3.10
    import tomli as tomllib

NAMED = ("uniform", "straggler", "two-speed", "lognormal")
# a step "fits" when it ends within this relative tolerance of the budget: 10 steps of 0.05 s
# add up to 0.49999999999999994 or 0.5000000000000001 depending on the order of the sums
FIT_TOLERANCE = 1e-9
_FILE_KEYS = {"default", "worker"}
_DEFAULT_KEYS = {"speed"}
_WORKER_KEYS = {"id", "speed"}


class ComputeError(ConfigError):
    """A compute profile or setting that cannot be used (the CLI maps it to exit 2)."""


# ---------------------------------------------------------------- one worker's model

@dataclass(frozen=True)
class ComputeModel:
    """One worker's compute: nominal step time at full speed (0: measured), its speed, and the
    compute seconds per round (0: a fixed number of steps)."""

    step_time_s: float = 0.0
    speed: float = 1.0
    inner_budget_s: float = 0.0

    def __post_init__(self) -> None:
        _check_speed("speed", self.speed)
        for name in ("step_time_s", "inner_budget_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ComputeError(f"{name} = {value!r} is out of range; expected a finite "
                                   "number >= 0")

    @property
    def nominal(self) -> bool:
        """Steps take a fixed time (independent of this machine)."""
        return self.step_time_s > 0

    @property
    def budgeted(self) -> bool:
        return self.inner_budget_s > 0

    @property
    def at_host_speed(self) -> bool:
        """Every step takes as long as it takes here and H is fixed: nothing needs step times."""
        return not (self.nominal or self.budgeted or self.speed < 1)

    def step_s(self, measured_s: float = 0.0) -> float:
        """Emulated seconds of one step: nominal (or ``measured_s``) divided by the speed."""
        return (self.step_time_s if self.nominal else measured_s) / self.speed

    def fits(self, used_s: float, next_s: float) -> bool:
        """Whether a step of ``next_s`` still fits after ``used_s`` of this round's budget."""
        return used_s + next_s <= self.inner_budget_s * (1.0 + FIT_TOLERANCE)

    def steps_in_budget(self) -> int:
        """Steps per round under the budget with the nominal step time: at least one."""
        if not (self.nominal and self.budgeted):
            raise ComputeError("steps_in_budget needs compute.step_time_s > 0 and "
                               "compute.inner_budget_s > 0")
        step = used = self.step_s()
        steps = 1
        while self.fits(used, step):  # the same rule the worker applies step by step
            used, steps = used + step, steps + 1
        return steps


class InnerPhase:
    """One worker's inner phase as time sees it: how many steps it takes and how long they last.

    The worker calls ``another()`` before each step and ``step_done()`` after it. The clock is
    injected (``clock()`` in seconds); so is ``sleep``: in an emulator process it sleeps, so
    that the phase keeps the model's schedule (step k ends no earlier than the phase start plus
    the emulated time of steps 1..k: a step slower than nominal is an overrun, and the steps
    after it catch up where they can); in the simulator it is None, the phase only counts, and
    the virtual clock is told ``emulated_s``.
    """

    def __init__(self, model: ComputeModel, fixed_steps: int, clock: Callable[[], float],
                 sleep: Callable[[float], None] | None):
        if type(fixed_steps) is not int or fixed_steps < 0:
            raise ComputeError(f"fixed_steps = {fixed_steps!r} is out of range; expected an "
                               "int >= 0")
        self.model, self.fixed_steps, self.clock, self.sleep = model, fixed_steps, clock, sleep
        self.start_s = self.step_start_s = clock()
        self.steps, self.emulated_s, self.last_step_s = 0, 0.0, 0.0
        self.overruns, self.worst_ratio = 0, 0.0

    def another(self) -> bool:
        """Whether to take another step: H of them, or while the next fits in the budget."""
        if not self.model.budgeted:
            return self.steps < self.fixed_steps
        # the next step is predicted to take as long as the last one (nominal: always does)
        return self.steps == 0 or self.model.fits(self.emulated_s, self.last_step_s)

    def step_done(self) -> None:
        """Account for the step that just ended; pace it when sleeping is allowed."""
        real_s = self.clock() - self.step_start_s
        self.last_step_s = self.model.step_s(real_s)
        self.steps, self.emulated_s = self.steps + 1, self.emulated_s + self.last_step_s
        if self.model.nominal:
            ratio = real_s / self.last_step_s
            self.worst_ratio = max(self.worst_ratio, ratio)
            # only a paced step can be late; the simulator's clock takes the nominal time
            self.overruns += ratio > 1.0 and self.sleep is not None
        self._pace()
        self.step_start_s = self.clock()

    def _pace(self) -> None:
        if self.sleep is None:
            return
        wait_s = self.start_s + self.emulated_s - self.clock()
        if wait_s > 0:
            self.sleep(wait_s)

    def elapsed_s(self) -> float:
        """The phase's compute time: on the clock when paced, else the emulated sum."""
        return self.clock() - self.start_s if self.sleep is not None else self.emulated_s


@dataclass(frozen=True)
class ComputePlan:
    """Every worker's compute under one config, built once by the run plan (``plan``):
    their models in rank order, their fixed H_i, and whether the pseudo-gradient mean weights
    workers by their steps (an algorithm's trait)."""

    models: tuple[ComputeModel, ...]
    fixed_steps: tuple[int, ...]
    weighted: bool = False
    profile: str = "uniform"   # compute.profile's name, for the record

    def step_counts(self) -> tuple[int, ...] | None:
        """Each worker's inner steps per round when known before the run, else None (a budget
        filled with measured step times)."""
        first = self.models[0]
        if not first.budgeted:
            return self.fixed_steps
        if not first.nominal:
            return None
        return tuple(m.steps_in_budget() for m in self.models)

    def pseudo_grad_weight(self, rank: int) -> float:
        """What worker ``rank`` multiplies its pseudo-gradient by before the mean: 1 for the
        plain mean, n * H_rank / sum_j H_j for the mean weighted by steps."""
        if not self.weighted:
            return 1.0
        counts = self.step_counts()
        return len(counts) * counts[rank] / sum(counts)

    def record(self, overruns: list[int] | None = None) -> dict:
        """summary.json's ``compute`` block."""
        first = self.models[0]
        return {"profile": self.profile, "step_time_s": first.step_time_s,
                "inner_budget_s": first.inner_budget_s,
                "speeds": [m.speed for m in self.models],
                "steps_per_round": None if (s := self.step_counts()) is None else list(s),
                "overruns": overruns}


def plan(cfg: Config, default_steps: int, weighted: bool = False) -> ComputePlan:
    """The compute of a run (the run plan calls this once): the profile read and checked,
    H_i from ``algo.local_steps`` or the algorithm's ``default_steps``. ``weighted``: the
    algorithm weights pseudo-gradients by steps, which needs every H_i before the run."""
    c = cfg.compute
    models = tuple(ComputeModel(c.step_time_s, v, c.inner_budget_s) for v in speeds(cfg))
    fixed = tuple(cfg.algo.steps_for(r, default_steps) for r in range(cfg.workers))
    out = ComputePlan(models, fixed, weighted, c.profile or "uniform")
    if weighted and out.step_counts() is None:
        # the weights need every worker's H_i; the wire schema has no message to share them
        raise ComputeError("algo.pseudo_grad_mean = 'steps' with compute.inner_budget_s needs "
                           "compute.step_time_s > 0, so that every worker knows every step "
                           "count; with measured step times use pseudo_grad_mean = 'plain'")
    return out


# ---------------------------------------------------------------- profiles

def speeds(cfg: Config) -> tuple[float, ...]:
    """One speed per worker (1 = full speed) from ``compute.profile``."""
    c, n = cfg.compute, cfg.workers
    name = c.profile
    if name in ("", "uniform"):
        return (1.0,) * n
    if name == "straggler":
        return (1.0,) * (n - 1) + (c.slow_speed,)
    if name == "two-speed":
        return (1.0,) * (n // 2) + (c.slow_speed,) * (n - n // 2)
    if name == "lognormal":
        return lognormal_speeds(c, n, cfg.seed)
    if name.endswith(".toml"):
        return file_speeds(Path(name), n)
    raise ComputeError(f"compute.profile = {name!r} is not a profile; expected one of "
                       f"{', '.join(NAMED)}, or a path to a .toml file")


def lognormal_speeds(c: ComputeConfig, workers: int, seed: int) -> tuple[float, ...]:
    """exp(sigma * z) per worker (z standard normal from the run's seed), scaled so that the
    fastest worker has speed 1."""
    import numpy as np  # only this profile needs it
    z = np.random.default_rng(seed).standard_normal(workers)
    raw = np.exp(c.sigma * z)
    return tuple(float(v) for v in raw / raw.max())


def file_speeds(path: Path, workers: int) -> tuple[float, ...]:
    """Speeds from a profile file: ``[default] speed``, then ``[[worker]]`` entries by id."""
    where = f"compute profile {str(path)!r}"
    data = check_keys(where, _read(path, where), _FILE_KEYS, ComputeError)
    default = check_keys(f"{where} [default]", data.get("default", {}), _DEFAULT_KEYS,
                         ComputeError)
    base = _check_speed(f"{where} [default] speed", default.get("speed", 1.0))
    out = [base] * workers
    seen: set[int] = set()
    entries = data.get("worker", [])
    if not isinstance(entries, list):
        raise ComputeError(f"{where}: worker must be a list of tables ([[worker]] in TOML)")
    for k, entry in enumerate(entries):
        rank, speed = _worker_entry(f"{where} [[worker]] #{k + 1}", entry, workers, seen)
        out[rank] = speed
    return tuple(out)


def _read(path: Path, where: str) -> dict:
    if not path.is_file():
        raise ComputeError(f"{where} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ComputeError(f"{where} cannot be parsed: {exc}") from None


def _worker_entry(where: str, entry, workers: int, seen: set[int]) -> tuple[int, float]:
    entry = check_keys(where, entry, _WORKER_KEYS, ComputeError)
    for key in ("id", "speed"):
        if key not in entry:
            raise ComputeError(f"{where}: missing {key!r}")
    rank = entry["id"]
    if type(rank) is not int or not 0 <= rank < workers:
        raise ComputeError(f"{where}: id = {rank!r} is out of range; expected a worker in "
                           f"[0, {workers - 1}]")
    if rank in seen:
        raise ComputeError(f"{where}: worker {rank} is listed twice")
    seen.add(rank)
    return rank, _check_speed(f"{where} speed", entry["speed"])


def _check_speed(what: str, value) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and 0 < value <= 1
    if not ok:
        raise ComputeError(f"{what} = {value!r} is out of range; expected a value in (0, 1]")
    return float(value)


# ---------------------------------------------------------------- record and display

def profile_lines(cfg: Config, cp: ComputePlan) -> list[str]:
    """What ``gasloc-emu compute show`` prints: a header, then one line per worker."""
    c = cfg.compute
    head = f"compute profile {c.profile or 'uniform'!r}, {cfg.workers} workers, step time " \
        + (f"{c.step_time_s:g} s at speed 1" if c.step_time_s > 0 else "as measured") \
        + (f", budget {c.inner_budget_s:g} s per round" if c.inner_budget_s > 0 else "")
    return [head] + [_worker_line(r, m, h) for r, (m, h) in
                      enumerate(zip(cp.models, cp.fixed_steps, strict=True))]


def _worker_line(rank: int, m: ComputeModel, fixed_steps: int) -> str:
    parts = [f"worker {rank:3d}: speed {m.speed:.3f}"]
    if m.nominal:
        parts.append(f"step {m.step_s():.4g} s")
    if m.budgeted:
        parts.append(_steps(m.steps_in_budget()) if m.nominal
                     else "as many measured steps as fit per round")
    else:
        parts.append(_steps(fixed_steps) + " (H)")
    return "  ".join(parts)


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'} per round"
