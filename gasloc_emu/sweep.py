"""Experiment sweeps: run every arm of a preset over seeds, with a hyper-parameter search on the
first seed (the same for every arm, or each arm's own), and write one table, one plot and a
results section per experiment.

A preset in runs/ is an ordinary config file plus a ``[sweep]`` table::

    [sweep]
    title = "..."                 # what the experiment shows
    claim = "..."                 # the paper's claim it checks
    mode = "simulate"             # or "run" (real processes, shaped network)
    seeds = [0, 1, 2]
    tune_key = "algo.inner.lr"    # searched on seed 0 for every arm, best kept for all seeds
    tune_values = [1e-3, 3e-3]
    # or a joint search over several keys (their product), instead of tune_key/tune_values:
    # tune = { "algo.outer_lr" = [0.5, 1.0], "algo.momentum" = [0.0, "auto"] }
    target_loss = 3.0             # for time/rounds to target
    verdict = "beats"             # how the verdict is computed (see ``verdict``)
    equal_budget = false          # true: refuse arms whose searches have different sizes
    [[sweep.arm]]
    name = "gasloc-ring"
    group = "ring"                # arms of one group are compared with each other
    set = { "algo.name" = "gasloc", "topology.name" = "ring" }
    tune = { "algo.inner.lr" = [1e-3, 2e-3] }  # optional: this arm's own grid, instead of the
                                               # sweep-wide one

``gasloc-emu run --config runs/<preset>.toml`` ignores ``[sweep]`` and runs the base config.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import config as C
from . import exitcodes
from .compare import load_run, matplotlib_figure, time_to_target
from .records import new_run_dir


@dataclass(frozen=True)
class Arm:
    name: str
    sets: dict
    group: str = ""
    role: str = ""  # "candidate" (GASLoC) or "baseline"; drives the verdict
    tune: tuple = ()  # ((key, values), ...): the arm's own grid; () means the sweep-wide one


@dataclass(frozen=True)
class SweepSpec:
    title: str
    claim: str
    mode: str
    seeds: tuple
    arms: tuple
    tune_key: str = ""
    tune_values: tuple = ()
    target_loss: float | None = None
    verdict: str = "beats"
    tolerance: float = 0.02
    x_axis: str = "round"  # "both": also plot and tabulate against seconds
    tune: tuple = ()  # ((key, values), ...): the searched grid, tune_key/values or [sweep.tune]
    equal_budget: bool = False  # every arm's search has as many points (checked by load_spec)

    @property
    def tune_keys(self) -> tuple[str, ...]:
        """The sweep-wide grid's keys (an arm with its own grid: ``arm_keys``)."""
        return tuple(k for k, _ in self.tune)

    @property
    def per_arm(self) -> bool:
        """Whether some arm searches its own grid instead of the sweep-wide one."""
        return any(a.tune for a in self.arms)

    def tune_of(self, arm: Arm | None = None) -> tuple:
        """The grid this arm searches: its own, else the sweep-wide one."""
        return arm.tune if arm is not None and arm.tune else self.tune

    def arm_keys(self, arm: Arm | None = None) -> tuple[str, ...]:
        return tuple(k for k, _ in self.tune_of(arm))

    def grid(self, arm: Arm | None = None) -> list[tuple]:
        """Every point of the arm's search (the sweep-wide one without an arm), as a tuple of
        values in ``arm_keys`` order; [()] when nothing is searched."""
        return list(itertools.product(*(values for _, values in self.tune_of(arm))))

    def settings(self, point: tuple, arm: Arm | None = None) -> dict:
        return dict(zip(self.arm_keys(arm), point, strict=True))


_SPEC_KEYS = {"title", "claim", "mode", "seeds", "arm", "tune_key", "tune_values", "target_loss",
              "verdict", "tolerance", "x_axis", "tune", "equal_budget"}
_ARM_KEYS = {"name", "group", "role", "set", "tune"}


def load_spec(path: str | Path) -> SweepSpec:
    tree = C.load_toml(path)
    raw = tree.get("sweep")
    if not isinstance(raw, dict) or not raw.get("arm"):
        raise C.ConfigError(f"{path}: no [sweep] table with [[sweep.arm]] entries")
    unknown = set(raw) - _SPEC_KEYS
    if unknown:
        raise C.ConfigError(f"{path}: unknown sweep keys {sorted(unknown)}; "
                            f"known: {sorted(_SPEC_KEYS)}")
    if raw.get("mode", "simulate") not in ("simulate", "run"):
        raise C.ConfigError(f"sweep.mode = {raw['mode']!r}; expected 'simulate' or 'run'")
    if not isinstance(raw.get("equal_budget", False), bool):
        raise C.ConfigError(f"{path}: sweep.equal_budget = {raw['equal_budget']!r}; expected "
                            "true or false")
    spec = SweepSpec(raw.get("title", Path(path).stem), raw.get("claim", ""),
                     raw.get("mode", "simulate"), tuple(raw.get("seeds", [0, 1, 2])),
                     tuple(_arm(path, a) for a in raw["arm"]),
                     raw.get("tune_key", ""), tuple(raw.get("tune_values", ())),
                     raw.get("target_loss"), raw.get("verdict", "beats"),
                     float(raw.get("tolerance", 0.02)), raw.get("x_axis", "round"),
                     _tune(path, raw), raw.get("equal_budget", False))
    if spec.equal_budget:
        _check_equal_budget(path, spec)
    return spec


def _arm(path, raw: dict) -> Arm:
    unknown = set(raw) - _ARM_KEYS
    if unknown:  # a misspelt 'tune' would otherwise quietly fall back to the sweep-wide grid
        raise C.ConfigError(f"{path}: sweep.arm {raw.get('name')!r}: unknown keys "
                            f"{sorted(unknown)}; known: {sorted(_ARM_KEYS)}")
    arm = Arm(raw["name"], dict(raw.get("set", {})), raw.get("group", ""), raw.get("role", ""),
              _grid_table(path, f"sweep.arm {raw['name']!r} tune", raw["tune"])
              if "tune" in raw else ())
    both = sorted(set(arm.sets) & {k for k, _ in arm.tune})
    if both:  # the searched value would silently override the set one
        raise C.ConfigError(f"{path}: sweep.arm {arm.name!r} both sets and searches {both}")
    return arm


def _tune(path, raw: dict) -> tuple:
    """The searched grid: [sweep.tune] (several keys), or tune_key with tune_values (one)."""
    table = raw.get("tune")
    if table is not None and raw.get("tune_key"):
        raise C.ConfigError(f"{path}: give either [sweep.tune] or tune_key/tune_values, not both")
    if table is None:
        key, values = raw.get("tune_key", ""), tuple(raw.get("tune_values", ()))
        return ((key, values),) if key and values else ()
    return _grid_table(path, "sweep.tune", table)


def _grid_table(path, where: str, table) -> tuple:
    """A ``{ key = [values], ... }`` table as ((key, values), ...), in the table's order."""
    if not isinstance(table, dict) or not table:
        raise C.ConfigError(f"{path}: {where} must be a table of key = [values]")
    for key, values in table.items():
        if not isinstance(values, list) or not values:
            raise C.ConfigError(f"{path}: {where}.{key} = {values!r}; expected a non-empty "
                                "list of values")
    return tuple((k, tuple(v)) for k, v in table.items())


def _check_equal_budget(path, spec: SweepSpec) -> None:
    """equal_budget: a search with more points is a better-tuned arm, so the comparison would
    be unfair; every arm's seed-0 search must have as many runs."""
    sizes = {a.name: len(spec.grid(a)) for a in spec.arms}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{name} {n}" for name, n in sizes.items())
        raise C.ConfigError(f"{path}: sweep.equal_budget = true but the arms' searches differ "
                            f"in size (grid points: {listed})")


def arm_config(preset: str | Path, arm: Arm, seed: int, extra: dict | None = None) -> C.Config:
    """The preset's config with the arm's settings, the seed and tuned values applied."""
    overrides = dict(arm.sets) | {"seed": seed} | (extra or {})
    return C.resolve(preset, overrides)


# ------------------------------------------------------------------ running

@dataclass
class ArmResult:
    arm: Arm
    tuned: dict = field(default_factory=dict)       # tune value -> seed-0 final eval loss
    best: object = None
    runs: list = field(default_factory=list)        # run directories, one per seed
    tuning_runs: list = field(default_factory=list)  # seed-0 runs of every tuned value


def run_one(cfg: C.Config, out: Path, mode: str) -> Path:
    """One run of the sweep, in the simulator or the emulator; returns its record folder."""
    if (out / "summary.json").exists():
        return out  # resumable: a finished run is not repeated
    if out.exists():
        shutil.rmtree(out)  # a run cut short: start it again from nothing
    # these load torch, which reading and reporting results does not need
    from .plan import build_plan
    from .worker import Diverged
    if mode == "simulate":
        from .simulate import simulate
        # a tuning value can diverge: its record says so, and it counts as failed
        with contextlib.suppress(Diverged):
            simulate(build_plan(cfg), out)
    else:
        from .launcher import launch
        result = launch(build_plan(C.replace(cfg, **{"run.dashboard": "off"})),
                        new_run_dir(cfg, out, overwrite=True))
        if result.code not in (exitcodes.OK, exitcodes.DIVERGED):
            raise RuntimeError(f"run failed ({result.error}): see {out}/summary.json")
    return out


def final_loss(run_dir: Path) -> float:
    """The run's final eval loss; infinite for a run that failed or diverged (never the best)."""
    s = json.loads((run_dir / "summary.json").read_text())
    v = s.get("final_eval_loss")
    if s.get("status", "ok") != "ok" or v is None or not math.isfinite(v):
        return math.inf
    return float(v)


def failed_runs(run_dirs: list[Path]) -> int:
    """How many of these runs did not end with status ok (diverged, failed, stopped)."""
    return sum(json.loads((d / "summary.json").read_text()).get("status", "ok") != "ok"
               for d in run_dirs)


def run_arm(preset: Path, spec: SweepSpec, arm: Arm, out: Path, log) -> ArmResult:
    res = ArmResult(arm)
    first = spec.seeds[0]
    for point in spec.grid(arm):
        tag = _run_tag(arm, first, point)
        d = run_one(arm_config(preset, arm, first, spec.settings(point, arm)), out / tag,
                    spec.mode)
        res.tuning_runs.append(d)
        res.tuned[point] = final_loss(d)
        log(f"  {tag}: final eval loss {res.tuned[point]:.4f}")
    res.best = min(res.tuned, key=lambda p: res.tuned[p])
    for seed in spec.seeds:
        tag = _run_tag(arm, seed, res.best)
        res.runs.append(run_one(arm_config(preset, arm, seed, spec.settings(res.best, arm)),
                                out / tag, spec.mode))
        log(f"  {tag}: final eval loss {final_loss(res.runs[-1]):.4f}")
    return res


def _run_tag(arm: Arm, seed: int, point: tuple) -> str:
    """A run's folder name. An arm with its own grid names its keys: its grid can change (or
    differ from another arm's) and a folder holding another key's value must not be reused as
    this one's; arms on the sweep-wide grid keep the folder names finished sweeps have."""
    keys = tuple(k for k, _ in arm.tune) if arm.tune else ()
    return f"{arm.name}-s{seed}" + _point_tag(point, keys)


def _point_tag(point: tuple, keys: tuple = ()) -> str:
    """A grid point in a run folder's name: '-0.001' (one key, as before grids), '-0.5-auto';
    with keys (an arm's own grid) '-outer_lr=0.5-lr=0.002'."""
    if not keys:
        return "".join(f"-{_fmt_val(v)}" for v in point)
    names = _short_names(keys)
    return "".join(f"-{names[k]}={_fmt_val(v)}" for k, v in zip(keys, point, strict=True))


def _short_names(keys) -> dict[str, str]:
    """Keys without their 'algo.inner.'/'algo.' prefix ('algo.inner.lr' -> 'lr'), except where
    two keys would then read the same: those keep their full names."""
    short = {k: k.removeprefix("algo.inner.").removeprefix("algo.") for k in keys}
    clashes = {s for s in short.values() if list(short.values()).count(s) > 1}
    return {k: k if s in clashes else s for k, s in short.items()}


def _point_label(point: tuple) -> str:
    """A grid point in tables and results.json: '0.001', or '0.5, auto' for several keys."""
    return ", ".join(_fmt_val(v) for v in point) if point else "-"


def _point_value(point: tuple):
    """What results.json keeps as the best: the value itself for one key, a list for several."""
    if not point:
        return None
    return point[0] if len(point) == 1 else list(point)


def _fmt_val(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def run_sweep(preset: str | Path, out: str | Path, log=print, arms: tuple[str, ...] = ()) -> dict:
    preset, out = Path(preset), Path(out)
    spec = load_spec(preset)
    chosen = [a for a in spec.arms if not arms or a.name in arms]
    for a in chosen:  # every arm's config, at every grid point, must resolve before anything runs
        for point in spec.grid(a):
            arm_config(preset, a, spec.seeds[0], spec.settings(point, a))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results = []
    for a in chosen:
        log(f"arm {a.name}")
        results.append(run_arm(preset, spec, a, out, log))
    table = summarize(spec, results)
    report = {"preset": str(preset), "spec": _spec_dict(spec), "rows": table,
              "verdict": verdict(spec, table), "machine": machine(),
              "seconds": time.time() - t0, "run_seconds": _run_seconds(results),
              "runs": len(_all_runs(results))}
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_sweep(spec, results, out / "plot.png")
    if _wants_tuning_plot(spec, results):
        plot_tuning(spec, results, out / "tuning.png")
        report["tuning_plot"] = str(out / "tuning.png")
    return report


# ------------------------------------------------------------------ summarising

def _wants_tuning_plot(spec: SweepSpec, results: list[ArmResult]) -> bool:
    """Heat maps show a grid's shape: worth drawing for a joint search or per-arm searches
    (their own one-row maps included), when some arm searched anything at all."""
    return (spec.per_arm or len(spec.tune) >= 2) and any(spec.tune_of(r.arm) for r in results)


def _all_runs(results: list[ArmResult]) -> set[Path]:
    """Every run the sweep needed, tuning included."""
    return {d for res in results for d in res.tuning_runs + res.runs}


def _run_seconds(results: list[ArmResult]) -> float:
    return sum(json.loads((d / "summary.json").read_text()).get("wall_s") or 0.0
               for d in _all_runs(results))


def _curve(run_dir: Path, x_axis: str) -> tuple[np.ndarray, np.ndarray]:
    """Mean eval loss over workers per evaluated round, against rounds or the run clock."""
    pts = load_run(run_dir).series("eval_loss")
    x = [p.round if x_axis == "round" else (p.time_s or 0.0) for p in pts]
    return np.array(x, dtype=float), np.array([p.value for p in pts], dtype=float)


def _stats(values: list) -> tuple[float | None, float | None, int]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None, None, 0
    return float(np.mean(vals)), float(np.std(vals)), len(vals)


def summarize(spec: SweepSpec, results: list[ArmResult]) -> list[dict]:
    rows = []
    for res in results:
        sums = [json.loads((d / "summary.json").read_text()) for d in res.runs]
        # the emulator's wall-clock; the simulator's own (virtual) clock at its last round
        clocks = [s.get("wall_s") for s in sums] if spec.mode == "run" else \
            [load_run(d).clock_s for d in res.runs]
        rows.append({
            "arm": res.arm.name, "group": res.arm.group, "role": res.arm.role,
            "tuned": {_point_label(k): v for k, v in res.tuned.items()},
            "tune_keys": list(spec.arm_keys(res.arm)),  # what "tuned" and "best" are values of
            "best": _point_value(res.best),
            "final_eval_loss": _stats([s.get("final_eval_loss") for s in sums]),
            "consensus_distance": _stats([s.get("consensus_distance") for s in sums]),
            "wall_s": _stats(clocks),
            "time_to_target_s": _stats([time_to_target(load_run(d), spec.target_loss)
                                        if spec.target_loss is not None else None
                                        for d in res.runs]),
            "bytes_sent_total": _stats([s.get("bytes_sent_total") for s in sums]),
            "rounds": sums[0].get("rounds"), "runs": [str(d) for d in res.runs],
            "failed_runs": failed_runs(res.runs),
        })
    return rows


def verdict(spec: SweepSpec, rows: list[dict]) -> dict:
    """Per group: does the candidate (GASLoC) arm do what the claim says against each baseline?

    beats:       candidate's mean final eval loss below every baseline's in its group
    competitive: candidate within ``tolerance`` (relative) of the best baseline
    faster:      candidate reaches target_loss in less time than every baseline
    """
    out = {}
    for group in sorted({r["group"] for r in rows}):
        members = [r for r in rows if r["group"] == group]
        cands = [r for r in members if r["role"] == "candidate"]
        bases = [r for r in members if r["role"] == "baseline"]
        if cands and bases:
            out[group or "all"] = [_judge(spec, c, bases) for c in cands]
    return out


def _judge(spec: SweepSpec, cand: dict, bases: list[dict]) -> dict:
    key = "time_to_target_s" if spec.verdict == "faster" else "final_eval_loss"
    if cand.get("failed_runs"):
        return {"arm": cand["arm"], "holds": False,
                "why": f"{cand['arm']} failed or diverged in {cand['failed_runs']} runs"}
    mine = cand[key][0]
    theirs = {b["arm"]: b[key][0] for b in bases}
    if mine is None:
        return {"arm": cand["arm"], "holds": False, "why": f"{cand['arm']} has no {key}"}
    known = {k: v for k, v in theirs.items() if v is not None}
    if spec.verdict == "competitive":
        best = min(known.values()) if known else math.inf
        holds = mine <= best * (1 + spec.tolerance)
    else:  # beats / faster; a baseline that never reached the target counts as slower
        holds = all(mine < v for v in known.values())
    # the mean time covers only the seeds that reached the target: one that missed it on some
    # seeds is not faster, whatever its mean over the others
    missed = len(cand["runs"]) - cand[key][2] if spec.verdict == "faster" else 0
    return {"arm": cand["arm"], "holds": bool(holds) and not missed, "key": key, "value": mine,
            "baselines": theirs, "missed": missed, "seeds": len(cand["runs"])}


def machine() -> dict:
    import torch  # only when a sweep has run, so it is loaded already
    return {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def _spec_dict(spec: SweepSpec) -> dict:
    d = dict(spec.__dict__)
    d["arms"] = [a.__dict__ for a in spec.arms]
    return d


# ------------------------------------------------------------------ plotting and reporting

def plot_sweep(spec: SweepSpec, results: list[ArmResult], path: Path) -> None:
    """Mean eval loss (band: min..max over seeds) per arm, against rounds and run-clock seconds."""
    Figure, FigureCanvasAgg = matplotlib_figure()
    axes_wanted = ("round", "time") if spec.x_axis == "both" else ("round",)
    fig = Figure(figsize=(6.5 * len(axes_wanted), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(1, len(axes_wanted))) if len(axes_wanted) > 1 else [fig.subplots()]
    for res in results:
        for ax, axis in zip(axes, axes_wanted, strict=True):
            curves = [_curve(d, axis) for d in res.runs]
            n = min(len(c[0]) for c in curves)
            if n == 0:
                continue
            x = np.mean([c[0][:n] for c in curves], axis=0)
            ys = np.array([c[1][:n] for c in curves])
            line, = ax.plot(x, ys.mean(0), label=res.arm.name,
                            linestyle="-" if res.arm.role == "candidate" else "--")
            ax.fill_between(x, ys.min(0), ys.max(0), color=line.get_color(), alpha=0.15)
    axes[0].set_xlabel("outer round")
    if len(axes) > 1:
        axes[1].set_xlabel("seconds" + (" (predicted by the simulator)" if spec.mode == "simulate"
                                        else " (wall-clock, emulator)"))
    for ax in axes:
        ax.set_ylabel("eval loss (mean over workers)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(spec.title)
    fig.savefig(path, dpi=110)


def tuning_grid(spec: SweepSpec, res: ArmResult) -> np.ndarray:
    """Seed-0 final eval loss over the first two keys of the arm's search (rows: the second
    key's values, columns: the first's), each cell the best over the other keys; one row when
    the arm searched one key; NaN where every run diverged or failed."""
    tune = spec.tune_of(res.arm)
    v0 = tune[0][1]
    v1 = tune[1][1] if len(tune) > 1 else (None,)
    cells = np.full((len(v1), len(v0)), np.inf)
    for point, loss in res.tuned.items():
        i, j = (v1.index(point[1]) if len(tune) > 1 else 0), v0.index(point[0])
        cells[i, j] = min(cells[i, j], loss)
    cells[~np.isfinite(cells)] = np.nan
    return cells


def plot_tuning(spec: SweepSpec, results: list[ArmResult], path: Path) -> None:
    """One heat map per arm that searched anything (seed 0): the whole grid, not only its
    best."""
    panels = [res for res in results if spec.tune_of(res.arm)]
    Figure, FigureCanvasAgg = matplotlib_figure()
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax, res in zip(axes, panels, strict=False):
        _heat_map(fig, ax, spec, res)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    # one sweep-wide grid: what each cell is the best over is the same for all, said once
    rest = "" if spec.per_arm else ", ".join(k for k, _ in spec.tune[2:])
    fig.suptitle(f"{spec.title}: seed-{spec.seeds[0]} final eval loss"
                 + (f", best over {rest}" if rest else ""), fontsize=10)
    fig.savefig(path, dpi=110)


def _heat_map(fig, ax, spec: SweepSpec, res: ArmResult) -> None:
    """One arm's panel: its first key along x, its second (if any) along y."""
    tune = spec.tune_of(res.arm)
    cells = tuning_grid(spec, res)
    from matplotlib import colormaps  # loaded already by matplotlib_figure
    # grey, not the blank background, where every run diverged: its white 'div' must show
    cmap = colormaps["viridis_r"].with_extremes(bad="0.55")
    image = ax.imshow(cells, cmap=cmap, aspect="auto", origin="lower")
    for (i, j), loss in np.ndenumerate(cells):   # white on the dark (high-loss) cells
        dark = np.isnan(loss) or image.norm(loss) > 0.5
        ax.text(j, i, "div" if np.isnan(loss) else f"{loss:.3f}", ha="center", va="center",
                fontsize=7 if len(tune[0][1]) <= 6 else 6, color="white" if dark else "black",
                rotation=0 if len(tune[0][1]) <= 6 else 90)  # many columns: narrow cells
    (k0, v0) = tune[0]
    ax.set_xticks(range(len(v0)), [_fmt_val(v) for v in v0],
                  rotation=0 if len(v0) <= 6 else 45, fontsize=8)
    ax.set_xlabel(k0)
    if len(tune) > 1:
        (k1, v1) = tune[1]
        ax.set_yticks(range(len(v1)), [_fmt_val(v) for v in v1])
        ax.set_ylabel(k1)
    else:
        ax.set_yticks([])
    rest = ", ".join(_short_names(spec.arm_keys(res.arm))[k] for k, _ in tune[2:]) \
        if spec.per_arm else ""
    ax.set_title(res.arm.name + (f"\nbest over {rest}" if rest else ""), fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8)


def _pm(stat, fmt: str = "{:.4f}") -> str:
    mean, std, n = stat
    if mean is None:
        return "-"
    return f"{fmt.format(mean)} ± {fmt.format(std)}" + (f" (n={n})" if n else "")


def markdown_section(name: str, report: dict, command: str, plot_rel: str) -> str:
    spec = report["spec"]
    emulated = spec["mode"] == "run"
    timed = spec["x_axis"] == "both"
    clock = "wall-clock s (emulator)" if emulated else "predicted s (simulator)"
    grids = _arm_grids(spec, report["rows"])
    own = len(set(grids.values())) > 1   # the arms did not all search the same grid
    searched = any(grids.values())   # without any search there is no "best" to report
    tuning = f"{_search_sentence(spec, grids)}, best value kept for all seeds" if searched \
        else "no search: each arm runs the settings the preset gives it"
    lines = [f"## {spec['title']}", "", f"Claim: {spec['claim']}.", "",
             f"Command: `{command}`", "",
             f"Mode: {spec['mode']} ({_mode_words(emulated, timed)}); "
             f"seeds {list(spec['seeds'])}; {tuning}. Mean ± standard deviation over seeds. "
             "Final eval loss is that of the average of the workers' models; consensus distance "
             "is the RMS distance of the workers' parameters to that average.", ""]
    if own:
        lines += [f"Each arm's search on seed {spec['seeds'][0]}:", ""]
        lines += [f"- {arm}: {_search_words(tune)}, {_grid_size(tune)} runs"
                  for arm, tune in grids.items()]
        lines += [""]
    # arms that searched different keys: each cell names its keys; otherwise the header does
    keyed = len({tuple(k for k, _ in tune) for tune in grids.values()}) > 1
    names = _short_names(dict.fromkeys(k for tune in grids.values() for k, _ in tune))
    common = next(iter(grids.values()), ())  # every arm's keys, when they all searched the same
    best_head = "best" if keyed else f"best {', '.join(k for k, _ in common)}"
    lines += ["| arm | " + (f"{best_head} | " if searched else "") + "final eval loss | "
              "consensus distance | "
              + (f"time to eval loss {spec['target_loss']} (s) | {clock} | " if timed else "")
              + "MB sent |",
              "| --- | --- | --- | " + ("--- | " if searched else "")
              + ("--- | --- | " if timed else "") + "--- |"]
    for r in report["rows"]:
        mb = r["bytes_sent_total"]
        best = _best_pairs(r["best"], grids[r["arm"]], names) if keyed else \
            _best_words(r["best"])
        lines.append(f"| {r['arm']} | " + (f"{best} | " if searched else "")
                     + f"{_pm(r['final_eval_loss'])} | {_pm(r['consensus_distance'], '{:.3f}')} | "
                     + (f"{_pm(r['time_to_target_s'], '{:.1f}')} | {_pm(r['wall_s'], '{:.1f}')} | "
                        if timed else "")
                     + f"{'-' if mb[0] is None else f'{mb[0] / 1e6:.1f}'} |")
    lines += ["", f"![{name}]({plot_rel})"]
    if report.get("tuning_plot"):
        lines += ["", f"The whole search, seed {spec['seeds'][0]}, one heat map per arm:", "",
                  f"![{name} search]({plot_rel.removesuffix('.png')}-tuning.png)"]
    lines += ["", "Verdict, computed from the table "
              f"(rule: {spec['verdict']}):", ""]
    lines += [_verdict_line(group, j, spec) for group, judged in report["verdict"].items()
              for j in judged]
    m = report["machine"]
    lines += ["", f"Machine: {m['platform']}, {m['cpus']} CPUs, Python {m['python']}, torch "
              f"{m['torch']}, GPU {m['gpu'] or 'none'}; its {report.get('runs', '')} runs took "
              f"{report.get('run_seconds', report['seconds']) / 60:.1f} min of wall-clock.", ""]
    return "\n".join(lines)


def _arm_grids(spec: dict, rows: list[dict]) -> dict[str, tuple]:
    """Each reported arm's grid, ((key, (values...)), ...): its own or the sweep-wide one
    (hashable, so that arms' grids can be compared; results.json gives lists)."""
    def frozen(tune) -> tuple:
        return tuple((k, tuple(v)) for k, v in tune or ())
    own = {a["name"]: a.get("tune") for a in spec.get("arms", ())}
    return {r["arm"]: frozen(own.get(r["arm"]) or spec.get("tune")) for r in rows}


def _grid_size(tune: tuple) -> int:
    return math.prod(len(v) for _, v in tune)


def _search_sentence(spec: dict, grids: dict[str, tuple]) -> str:
    """How the arms were tuned, for the Mode paragraph: one search for all, or each its own
    (listed after the paragraph); and the equal budget when the preset asks for one."""
    first = spec["seeds"][0]
    sizes = sorted({_grid_size(t) for t in grids.values()})
    if len(set(grids.values())) <= 1:
        tune = next(iter(grids.values()), spec.get("tune") or ())
        words = f"the same search over {_search_words(tune)} on seed {first} for every arm"
    elif len(sizes) == 1 and not spec.get("equal_budget"):
        words = f"each arm's own search (below), {sizes[0]} runs each on seed {first}"
    elif len(sizes) == 1:
        words = f"each arm's own search (below) on seed {first}"
    else:
        words = (f"each arm's own search (below) on seed {first}, from {sizes[0]} to "
                 f"{sizes[-1]} runs per arm")
    if spec.get("equal_budget") and len(sizes) == 1:
        words += f"; every arm had the same budget of {sizes[0]} seed-{first} runs"
    return words


def _search_words(tune) -> str:
    """'algo.inner.lr [0.001, 0.003]', or the grid 'algo.outer_lr [0.5, 1.0] x algo.momentum
    [0.0, 'auto']' (every combination), or 'nothing'."""
    if not tune:
        return "nothing"
    words = " x ".join(f"{k} {list(v)}" for k, v in tune)
    return words if len(tune) == 1 else f"the grid {words} (every combination)"


def _best_pairs(best, tune: tuple, names: dict[str, str]) -> str:
    """results.json's best as 'outer_lr 0.5, momentum auto, lr 0.002': for a table whose arms
    searched different keys, so a bare value would not say what it is."""
    if best is None:
        return "-"
    point = tuple(best) if isinstance(best, list) else (best,)
    return ", ".join(f"{names[k]} {_fmt_val(v)}" for (k, _), v in zip(tune, point, strict=True))


def _best_words(best) -> str:
    """results.json's best (``_point_value``) as ``_point_label`` writes the point."""
    if best is None:
        return "-"
    return _point_label(tuple(best) if isinstance(best, list) else (best,))


def _mode_words(emulated: bool, timed: bool) -> str:
    if emulated:
        return "real worker processes over the shaped network"
    if timed:  # time is the point: the compute model's nominal step times make it meaningful
        return ("in-process simulator; its clock is the compute model's time (nominal step "
                "times where compute.step_time_s is set) plus modelled transfers")
    return ("in-process simulator: only rounds matter here; its clock is compute time plus "
            "modelled transfers")


def _verdict_line(group: str, j: dict, spec: dict) -> str:
    if "value" not in j:
        return f"- {group}: {j['arm']}: not judged ({j['why']})"
    fmt = (lambda v: "never" if v is None else f"{v:.1f} s") if j["key"] == "time_to_target_s" \
        else (lambda v: "-" if v is None else f"{v:.4f}")
    others = ", ".join(f"{k} {fmt(v)}" for k, v in j["baselines"].items())
    rule = {"beats": "lower final eval loss than", "faster": "reaches the target sooner than",
            "competitive": f"within {spec['tolerance']:.0%} of the best of"}[spec["verdict"]]
    missed = f" (it missed the target on {j['missed']} of {j['seeds']} seeds)" \
        if j.get("missed") else ""
    return (f"- {group}: {j['arm']} ({fmt(j['value'])}) {rule} {others}: "
            f"**{'yes' if j['holds'] else 'no'}**{missed}")


def update_results_page(page: Path, name: str, section: str) -> None:
    """Replace (or append) the section between this experiment's markers."""
    begin, end = f"<!-- begin {name} -->", f"<!-- end {name} -->"
    text = page.read_text() if page.exists() else "# Results\n"
    block = f"{begin}\n{section}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(text)
