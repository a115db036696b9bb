"""Experiment sweeps: run every arm of a preset over seeds, with the same learning-rate search for
every arm, and write one table, one plot and a results section per experiment.

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
    [[sweep.arm]]
    name = "gasloc-ring"
    group = "ring"                # arms of one group are compared with each other
    set = { "algo.name" = "gasloc", "topology.name" = "ring" }

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
from .netplan import sim_link_model
from .records import new_run_dir


@dataclass(frozen=True)
class Arm:
    name: str
    sets: dict
    group: str = ""
    role: str = ""  # "candidate" (GASLoC) or "baseline"; drives the verdict


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

    @property
    def tune_keys(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.tune)

    def grid(self) -> list[tuple]:
        """Every point of the search, as a tuple of values in ``tune_keys`` order; [()] when
        nothing is searched."""
        return list(itertools.product(*(values for _, values in self.tune)))

    def settings(self, point: tuple) -> dict:
        return dict(zip(self.tune_keys, point, strict=True))


_SPEC_KEYS = {"title", "claim", "mode", "seeds", "arm", "tune_key", "tune_values", "target_loss",
              "verdict", "tolerance", "x_axis", "tune"}


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
    arms = tuple(Arm(a["name"], dict(a.get("set", {})), a.get("group", ""), a.get("role", ""))
                 for a in raw["arm"])
    return SweepSpec(raw.get("title", Path(path).stem), raw.get("claim", ""),
                     raw.get("mode", "simulate"), tuple(raw.get("seeds", [0, 1, 2])), arms,
                     raw.get("tune_key", ""), tuple(raw.get("tune_values", ())),
                     raw.get("target_loss"), raw.get("verdict", "beats"),
                     float(raw.get("tolerance", 0.02)), raw.get("x_axis", "round"),
                     _tune(path, raw))


def _tune(path, raw: dict) -> tuple:
    """The searched grid: [sweep.tune] (several keys), or tune_key with tune_values (one)."""
    table = raw.get("tune")
    if table is not None and raw.get("tune_key"):
        raise C.ConfigError(f"{path}: give either [sweep.tune] or tune_key/tune_values, not both")
    if table is None:
        key, values = raw.get("tune_key", ""), tuple(raw.get("tune_values", ()))
        return ((key, values),) if key and values else ()
    if not isinstance(table, dict) or not table:
        raise C.ConfigError(f"{path}: sweep.tune must be a table of key = [values]")
    for key, values in table.items():
        if not isinstance(values, list) or not values:
            raise C.ConfigError(f"{path}: sweep.tune.{key} = {values!r}; expected a non-empty "
                                "list of values")
    return tuple((k, tuple(v)) for k, v in table.items())


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
    from .preflight import preflight
    from .worker import Diverged
    pre = preflight(cfg)
    if mode == "simulate":
        from .simulate import simulate
        # a tuning value can diverge: its record says so, and it counts as failed
        with contextlib.suppress(Diverged):
            simulate(cfg, out, link_model=sim_link_model(cfg), corpus=pre.corpus)
    else:
        from .launcher import launch
        result = launch(C.replace(cfg, **{"run.dashboard": "off"}), pre,
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
    for point in spec.grid():
        tag = f"{arm.name}-s{first}" + _point_tag(point)
        d = run_one(arm_config(preset, arm, first, spec.settings(point)), out / tag, spec.mode)
        res.tuning_runs.append(d)
        res.tuned[point] = final_loss(d)
        log(f"  {tag}: final eval loss {res.tuned[point]:.4f}")
    res.best = min(res.tuned, key=lambda p: res.tuned[p])
    for seed in spec.seeds:
        tag = f"{arm.name}-s{seed}" + _point_tag(res.best)
        res.runs.append(run_one(arm_config(preset, arm, seed, spec.settings(res.best)),
                                out / tag, spec.mode))
        log(f"  {tag}: final eval loss {final_loss(res.runs[-1]):.4f}")
    return res


def _point_tag(point: tuple) -> str:
    """A grid point in a run folder's name: '-0.001' (one key, as before grids), '-0.5-auto'."""
    return "".join(f"-{_fmt_val(v)}" for v in point)


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
    for a in chosen:  # every arm's config must resolve before anything runs
        arm_config(preset, a, spec.seeds[0])
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
    if len(spec.tune) >= 2:
        plot_tuning(spec, results, out / "tuning.png")
        report["tuning_plot"] = str(out / "tuning.png")
    return report


# ------------------------------------------------------------------ summarising

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
    """Seed-0 final eval loss over the first two searched keys (rows: the second key's values,
    columns: the first's), each cell the best over the other keys; NaN where every run
    diverged or failed."""
    v0, v1 = spec.tune[0][1], spec.tune[1][1]
    cells = np.full((len(v1), len(v0)), np.inf)
    for point, loss in res.tuned.items():
        i, j = v1.index(point[1]), v0.index(point[0])
        cells[i, j] = min(cells[i, j], loss)
    cells[~np.isfinite(cells)] = np.nan
    return cells


def plot_tuning(spec: SweepSpec, results: list[ArmResult], path: Path) -> None:
    """One heat map per arm of the joint search (seed 0): the whole grid, not only its best."""
    Figure, FigureCanvasAgg = matplotlib_figure()
    cols = min(len(results), 3)
    rows = math.ceil(len(results) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.8 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    (k0, v0), (k1, v1) = spec.tune[0], spec.tune[1]
    for ax, res in zip(axes, results, strict=False):
        cells = tuning_grid(spec, res)
        image = ax.imshow(cells, cmap="viridis_r", aspect="auto", origin="lower")
        for (i, j), loss in np.ndenumerate(cells):   # white on the dark (high-loss) cells
            dark = np.isnan(loss) or image.norm(loss) > 0.5
            ax.text(j, i, "div" if np.isnan(loss) else f"{loss:.3f}", ha="center",
                    va="center", fontsize=7, color="white" if dark else "black")
        ax.set_xticks(range(len(v0)), [_fmt_val(v) for v in v0])
        ax.set_yticks(range(len(v1)), [_fmt_val(v) for v in v1])
        ax.set_xlabel(k0)
        ax.set_ylabel(k1)
        ax.set_title(res.arm.name, fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    for ax in axes[len(results):]:
        ax.set_visible(False)
    rest = ", ".join(k for k, _ in spec.tune[2:])
    fig.suptitle(f"{spec.title}: seed-{spec.seeds[0]} final eval loss"
                 + (f", best over {rest}" if rest else ""), fontsize=10)
    fig.savefig(path, dpi=110)


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
    lines = [f"## {spec['title']}", "", f"Claim: {spec['claim']}.", "",
             f"Command: `{command}`", "",
             f"Mode: {spec['mode']} ({_mode_words(emulated, timed)}); "
             f"seeds {list(spec['seeds'])}; the same search over {_search_words(spec)} "
             f"on seed {spec['seeds'][0]} for every arm, best value "
             "kept for all seeds. Mean ± standard deviation over seeds. Final eval loss is that of "
             "the average of the workers' models; consensus distance is the RMS distance of the "
             "workers' parameters to that average.", "",
             f"| arm | best {', '.join(k for k, _ in spec.get('tune', ()))} | final eval loss | "
             "consensus distance | "
             + (f"time to eval loss {spec['target_loss']} (s) | {clock} | " if timed else "")
             + "MB sent |",
             "| --- | --- | --- | --- | " + ("--- | --- | " if timed else "") + "--- |"]
    for r in report["rows"]:
        mb = r["bytes_sent_total"]
        lines.append(f"| {r['arm']} | {_best_words(r['best'])} | "
                     f"{_pm(r['final_eval_loss'])} | {_pm(r['consensus_distance'], '{:.3f}')} | "
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


def _search_words(spec: dict) -> str:
    """'algo.inner.lr [0.001, 0.003]', or the grid 'algo.outer_lr [0.5, 1.0] x algo.momentum
    [0.0, 'auto']' (every combination), or 'nothing'."""
    tune = spec.get("tune") or ()
    if not tune:
        return "nothing"
    words = " x ".join(f"{k} {list(v)}" for k, v in tune)
    return words if len(tune) == 1 else f"the grid {words} (every combination)"


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
