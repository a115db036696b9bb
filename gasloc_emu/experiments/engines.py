"""Where an experiment's runs are made: one interface (``Engine.run``), the engines in one
registry (``ENGINES``), picked by ``engine.name`` (``config.EngineConfig``).

local     each run in this process, one after another (what sweeps have always done);
submitit  each run one job of a job array through submitit, the client the field uses for
          Slurm job arrays (https://github.com/facebookincubator/submitit): ``sbatch --array``
          on Slurm, or one process per job on this machine (its local executor). We write no
          scheduler: submitit submits and waits, Slurm schedules.

Every engine runs the same function, ``run_one``, so a run's record is the same wherever it
was made, and a finished run (``reusable``) is reused, never made again nor submitted.
"""
from __future__ import annotations

import contextlib
import dataclasses
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gasloc_emu import config as C
from gasloc_emu import exitcodes
from gasloc_emu.config import to_toml
from gasloc_emu.experiments import data
from gasloc_emu.report.records import new_run_dir


@dataclass(frozen=True)
class Point:
    """One run of an experiment: its resolved config, its record folder, and whether it is
    simulated or run in the emulator ("simulate" or "run")."""

    cfg: C.Config
    out: Path
    mode: str


def _as_made(cfg: C.Config, mode: str) -> C.Config:
    """The config a run is made with: the emulator's runs without their live dashboard."""
    return C.replace(cfg, **{"run.dashboard": "off"}) if mode == "run" else cfg


def reusable(point: Point) -> bool:
    """Whether the point's folder holds a run that ended by itself with the same resolved
    config (``data.finished_record``): such a run is reused, not made again."""
    return data.finished_record(point.out) and \
        _recorded_config(point.out) == to_toml(_as_made(point.cfg, point.mode))


def run_one(cfg: C.Config, out: Path, mode: str) -> Path:
    """One run of an experiment, in the simulator or the emulator; returns its record folder.
    A finished run of the same resolved config is reused; any other is made again. What every
    engine runs for a point, in this process or as a job."""
    if reusable(Point(cfg, out, mode)):
        return out  # resumable: a finished run is not repeated
    cfg = _as_made(cfg, mode)
    if out.exists():
        shutil.rmtree(out)  # cut short, failed, or made with other settings: start afresh
    # these load torch, which reading and reporting results does not need
    from gasloc_emu.plan import build_plan
    from gasloc_emu.training.worker import Diverged
    if mode == "simulate":
        from gasloc_emu.simulator.simulate import simulate
        # a tuning value can diverge: its record says so, and it counts as failed
        with contextlib.suppress(Diverged):
            simulate(build_plan(cfg), out)
    else:
        from gasloc_emu.emulator.launcher import launch
        result = launch(build_plan(cfg), new_run_dir(cfg, out, overwrite=True))
        if result.code not in (exitcodes.OK, exitcodes.DIVERGED):
            raise RuntimeError(f"run failed ({result.error}): see {out}/summary.json")
    return out


def _recorded_config(out: Path) -> str | None:
    try:
        return (out / "config.toml").read_text()
    except OSError:
        return None


class EngineError(RuntimeError):
    """Runs an engine could not make: one line per point, naming its folder and its log."""

    def __init__(self, failures: list[str]):
        self.failures = failures
        super().__init__(f"{len(failures)} run(s) failed:\n" + "\n".join(failures))


class Engine(ABC):
    """Makes the runs of a batch of points, which do not depend on each other."""

    # the engine.* settings this engine reads besides its name; giving it another is refused
    settings: tuple[str, ...] = ()

    def __init__(self, cfg: C.EngineConfig, folder: Path):
        self.cfg, self.folder = cfg, Path(folder)

    @abstractmethod
    def run(self, points: Sequence[Point], log: Callable[[str], object] = print
            ) -> Iterator[Path]:
        """Each point's record folder, in the points' order, made or reused; a run that could
        not be made raises (``EngineError`` for jobs) rather than being skipped."""

    @abstractmethod
    def describe(self) -> str:
        """How the runs were made, in words that follow "the runs took N min of wall-clock,"
        (a data file's header keeps them for its section)."""


# how the local engine makes runs; also what a data file from before engines means
LOCAL_WORDS = "one after another"


class LocalEngine(Engine):
    """Each run in this process, one after another, as it is asked for: a run's line can be
    printed before the next one starts."""

    def run(self, points, log=print):
        for p in points:
            yield run_one(p.cfg, p.out, p.mode)

    def describe(self) -> str:
        return LOCAL_WORDS


class SubmititEngine(Engine):
    """The points not finished yet as one job array (``executor.map_array``); waits for every
    job, then hands the folders over in order, or raises naming each failed job's point and
    log. A Ctrl-C while it waits cancels the jobs still running."""

    settings = ("cluster", "partition", "time_limit_min", "cpus_per_task", "gpus_per_task",
                "mem_gb", "array_parallelism", "log_dir")

    def __init__(self, cfg: C.EngineConfig, folder: Path):
        super().__init__(cfg, folder)
        try:
            import submitit
        except ImportError:
            raise C.ConfigError("engine.name = 'submitit' needs the submitit package: pip "
                                "install 'gasloc-emu[cluster]'") from None
        self.logs = self.folder / cfg.log_dir
        self.submitted = 0   # jobs submitted by this engine, for its caller to report
        try:
            self.executor = submitit.AutoExecutor(folder=self.logs, cluster=cfg.cluster)
        except RuntimeError as exc:   # no srun on this machine: not a Slurm cluster's node
            raise C.ConfigError(f"engine.cluster = {cfg.cluster!r}: {exc} (submit from a "
                                "machine that has it, or try --cluster local)") from None
        self.executor.update_parameters(**self.parameters())

    def parameters(self) -> dict:
        """submitit's AutoExecutor parameters: the shared ones, which submitit translates for
        the chosen cluster, and slurm_ ones, which only a Slurm cluster reads."""
        cfg = self.cfg
        out = {"name": "gasloc-emu", "timeout_min": cfg.time_limit_min,
               "cpus_per_task": cfg.cpus_per_task,
               "slurm_array_parallelism": cfg.array_parallelism}
        # unset rather than 0 or empty: the cluster's default, and no `--gpus-per-node=0`
        # for a Slurm without GPUs to refuse (the local cluster hides GPUs either way)
        optional = {"gpus_per_node": cfg.gpus_per_task, "slurm_partition": cfg.partition,
                    "mem_gb": cfg.mem_gb}
        return out | {k: v for k, v in optional.items() if v}

    def run(self, points, log=print):
        todo = [p for p in points if not reusable(p)]
        reused = len(points) - len(todo)
        if not todo:
            if points:
                log(f"  {reused} finished runs reused, no job submitted")
            yield from (p.out for p in points)
            return
        jobs = self.executor.map_array(run_one, [p.cfg for p in todo],
                                       [p.out for p in todo], [p.mode for p in todo])
        self.submitted += len(jobs)
        log(f"  {len(jobs)} runs submitted {self.describe()} (first job {jobs[0].job_id}), "
            f"{reused} finished runs reused; logs in {self.logs}")
        failures = wait_for(todo, jobs)
        if failures:
            raise EngineError(failures)
        log(f"  {len(jobs)} jobs done")
        yield from (p.out for p in points)

    def describe(self) -> str:
        where = f", partition {self.cfg.partition}" if self.cfg.partition else ""
        return f"as jobs of submitit on {self.cfg.cluster}{where}"


def wait_for(points: list[Point], jobs: list) -> list[str]:
    """Every job's outcome, waiting for each: a line for each that failed (its point, why, its
    log). Interrupted (Ctrl-C), it cancels every job first: nothing is left running."""
    try:
        return [line for p, job in zip(points, jobs, strict=True)
                if (line := _failure(p, job)) is not None]
    except BaseException:
        for job in jobs:
            with contextlib.suppress(Exception):
                job.cancel(check=False)
        raise


def _failure(point: Point, job) -> str | None:
    """Why a job did not make its point's record, in one line with its log; None if it did."""
    error = job.exception()   # waits for the job
    if error is None:
        return None
    return (f"{point.out} ({point.mode}): job {job.job_id}: {_last_line(str(error))}; "
            f"log: {job.paths.stderr}")


def _last_line(message: str) -> str:
    """The exception a failed job's trace ends on (submitit puts the trace between rules of
    dashes), else the message's first line."""
    parts = message.split("-" * 22)
    trace = parts[1] if len(parts) >= 3 else ""
    lines = [ln.strip() for ln in trace.splitlines() if ln.strip()]
    return lines[-1] if lines else message.strip().splitlines()[0]


ENGINES: dict[str, type[Engine]] = {"local": LocalEngine, "submitit": SubmititEngine}


def make_engine(cfg: C.EngineConfig, folder: Path) -> Engine:
    """The engine ``cfg.name`` names, for an experiment whose runs go under ``folder``; a
    setting the engine does not read, given a value, is refused rather than ignored."""
    cls = ENGINES[cfg.name]
    default = C.EngineConfig()
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name != "name" and f.name not in cls.settings and value != getattr(default, f.name):
            raise C.ConfigError(f"{C.ENGINE_SECTION}{f.name} = {value!r} is not read by "
                                f"engine.name = {cfg.name!r}; it is a setting of "
                                + ", ".join(repr(n) for n, e in ENGINES.items()
                                            if f.name in e.settings))
    return cls(cfg, folder)
