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
import json
import math
import os
import platform
import shutil
import time
from pathlib import Path

import numpy as np

from gasloc_emu import config as C
from gasloc_emu import exitcodes
from gasloc_emu.experiments.plots import plot_sweep, plot_tuning
from gasloc_emu.experiments.spec import (
    Arm,
    ArmResult,
    SweepSpec,
    arm_config,
    load_spec,
    point_label,
    point_tag,
    point_value,
)
from gasloc_emu.report.compare import load_run, time_to_target
from gasloc_emu.report.records import new_run_dir


def run_one(cfg: C.Config, out: Path, mode: str) -> Path:
    """One run of the sweep, in the simulator or the emulator; returns its record folder."""
    if (out / "summary.json").exists():
        return out  # resumable: a finished run is not repeated
    if out.exists():
        shutil.rmtree(out)  # a run cut short: start it again from nothing
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
    return f"{arm.name}-s{seed}" + point_tag(point, keys)


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
            "tuned": {point_label(k): v for k, v in res.tuned.items()},
            "tune_keys": list(spec.arm_keys(res.arm)),  # what "tuned" and "best" are values of
            "best": point_value(res.best),
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
