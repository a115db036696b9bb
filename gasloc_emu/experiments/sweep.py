"""Experiment sweeps: run every arm of a preset over seeds, with a hyper-parameter search on
seeds that are never reported (the same grid for every arm, or each arm's own), and write one
data file (``experiments.data``), one table, one plot and a results section per experiment.
The report is computed from the data file alone, so ``sweep --from-data`` rebuilds it.

A preset in runs/ is an ordinary config file plus a ``[sweep]`` table::

    [sweep]
    title = "..."                 # what the experiment shows
    claim = "..."                 # the paper's claim it checks
    mode = "simulate"             # or "run" (real processes, shaped network)
    seeds = [0, 1, 2]             # the reported seeds
    tune_seeds = [100]            # the search's seeds (default [100]), never among the reported
    close_seeds = 5               # seeds for a group whose verdict is under two standard deviations
    tune_key = "algo.inner.lr"    # searched on the tune seeds for every arm, best kept for all
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

import json
import math
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gasloc_emu import config as C
from gasloc_emu.config import to_toml
from gasloc_emu.experiments import data, stats
from gasloc_emu.experiments.engines import Engine, LocalEngine, Point
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
    spec_dict,
    spec_from_dict,
)


def final_loss(row: dict) -> float:
    """A run's final eval loss; infinite for a run that failed or diverged (never the best)."""
    v = row.get("final_eval_loss")
    return math.inf if row.get("status", "ok") != "ok" or v is None else float(v)


def failed_runs(rows: list[dict]) -> int:
    """How many of these runs did not end with status ok (diverged, failed, stopped)."""
    return sum(r.get("status", "ok") != "ok" for r in rows)


class _Runner:
    """Runs of one sweep: each made (or reused) in its folder by the engine and read back as a
    data row. A phase's runs go to the engine together (``rows``): they do not depend on one
    another, so an engine may make them at once."""

    def __init__(self, preset: Path, spec: SweepSpec, out: Path, log,
                 kept: data.KeptRows | None = None, engine: Engine | None = None):
        self.preset, self.spec, self.out, self.log = preset, spec, out, log
        self.kept = kept if kept is not None else data.KeptRows(None)
        self.engine = engine if engine is not None else LocalEngine(C.EngineConfig(), out)

    def rows(self, requests: list[tuple[Arm, str, int, tuple]]) -> list[dict]:
        """The data row of each (arm, phase, seed, point), in order: kept from an earlier sweep
        (``data.KeptRows``), else made by the engine, with the runs not kept as one batch."""
        todo = []
        for arm, phase, seed, point in requests:
            tag = _run_tag(arm, seed, point)
            cfg = arm_config(self.preset, arm, seed, self.spec.settings(point, arm))
            sha = data.config_sha(to_toml(cfg), self.spec.mode, self.spec.predict)
            todo.append((tag, cfg, sha, self.kept.get(tag, phase, sha)))
        points = [p for (tag, cfg, _, kept), (_, phase, _, _) in zip(todo, requests, strict=True)
                  if kept is None for p in self._points(cfg, tag, phase)]
        made = self.engine.run(points, self.log)
        out = []
        for (tag, _, sha, kept), (arm, phase, seed, point) in zip(todo, requests, strict=True):
            if kept is not None:
                self.log(f"  {tag}: kept from an earlier sweep")
                out.append(kept)
                continue
            row = self._row(made, tag, arm, phase, seed, point)
            self.kept.add(tag, phase, sha, row)
            out.append(row)
        return out

    def _points(self, cfg: C.Config, tag: str, phase: str) -> list[Point]:
        """A run's point, and in a predicting sweep a reported run's simulation beside it."""
        points = [Point(cfg, self.out / tag, self.spec.mode)]
        if self.spec.predict and phase == data.REPORT:
            points.append(Point(cfg, self.out / f"{tag}-sim", "simulate"))
        return points

    def _row(self, made: Iterator[Path], tag: str, arm: Arm, phase: str, seed: int,
             point: tuple) -> dict:
        """The row of a run the engine made (the next folder of ``made``, and its
        simulation's where the sweep predicts)."""
        row = data.run_row(next(made), arm, phase, seed, point, self.spec.mode)
        if self.spec.predict and phase == data.REPORT:   # the simulator's word beside it
            sim = data.run_row(next(made), arm, phase, seed, point, "simulate")
            row["predicted_s"] = sim["clock_s"]
        loss = row["final_eval_loss"]
        self.log(f"  {tag}: final eval loss {'-' if loss is None else f'{loss:.4f}'}")
        return row

    def arms(self, arms: list[Arm]) -> list[ArmResult]:
        """Every arm's search on the tune seeds (one batch), then each arm's best point on the
        reported seeds (another)."""
        spec = self.spec
        results = [ArmResult(a) for a in arms]
        searched = [(a, data.TUNE, seed, point) for a in arms if spec.tune_of(a)
                    for point in spec.grid(a) for seed in spec.tune_seeds]
        if searched:
            self.log(f"search on tune seeds {list(spec.tune_seeds)}: {len(searched)} runs")
        tuning = self.rows(searched)
        for res in results:
            res.tuning = [r for r in tuning if r["arm"] == res.arm.name]
            res.tuned, res.best = search_result(res.tuning)
        self.log(f"reported seeds {list(spec.seeds)}: {len(arms) * len(spec.seeds)} runs")
        reported = self.rows([(res.arm, data.REPORT, seed, res.best) for res in results
                              for seed in spec.seeds])
        for res in results:
            res.runs = [r for r in reported if r["arm"] == res.arm.name]
        return results


def search_result(tuning: list[dict]) -> tuple[dict, tuple]:
    """({grid point: mean final eval loss over the tune seeds}, the best point); ({}, ())
    without a search. A point with a failed run is never the best."""
    by_point: dict[tuple, list[float]] = {}
    for r in tuning:
        by_point.setdefault(tuple(r["point"]), []).append(final_loss(r))
    tuned = {p: float(np.mean(v)) for p, v in by_point.items()}
    return tuned, (min(tuned, key=lambda p: tuned[p]) if tuned else ())


def _run_tag(arm: Arm, seed: int, point: tuple) -> str:
    """A run's folder name. An arm with its own grid names its keys: its grid can change (or
    differ from another arm's) and a folder holding another key's value must not be reused as
    this one's; arms on the sweep-wide grid keep the folder names finished sweeps have."""
    keys = tuple(k for k, _ in arm.tune) if arm.tune else ()
    return f"{arm.name}-s{seed}" + point_tag(point, keys)


def run_sweep(preset: str | Path, out: str | Path, log=print, arms: tuple[str, ...] = (),
              command: str = "", kept: Path | None = None, engine: Engine | None = None) -> dict:
    """Every chosen arm over the preset's seeds (and more where a verdict is close); writes
    the data file, results.json and the plots under ``out`` and returns the report.
    ``command``: the command line, kept in the data file for the section to show. ``kept``:
    where finished runs' rows are appended and reused from (``data.KeptRows``). ``engine``:
    where the runs are made (``engines``; default: one after another in this process)."""
    preset, out = Path(preset), Path(out)
    spec = load_spec(preset)
    chosen = [a for a in spec.arms if not arms or a.name in arms]
    for a in chosen:  # every arm's config, at every grid point, must resolve before anything runs
        for point in spec.grid(a):
            arm_config(preset, a, spec.seeds[0], spec.settings(point, a))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    runner = _Runner(preset, spec, out, log, data.KeptRows(kept), engine)
    results = runner.arms(chosen)
    _more_seeds_where_close(runner, results)
    rows = [r for res in results for r in res.tuning + res.runs]
    header = {"preset": str(preset), "spec": spec_dict(spec), "machine": machine(),
              "seconds": time.time() - t0, "command": command,
              "batched": C.resolve(preset).sim.batched, "engine": runner.engine.describe()}
    data.write(out / "data.jsonl", header, rows)
    return build_report(header, rows, out)


def _more_seeds_where_close(runner: _Runner, results: list[ArmResult]) -> None:
    """A group whose verdict rests on a paired difference under two standard deviations gets
    ``close_seeds`` seeds (the preset's, then the next ones), every arm of the group."""
    spec = runner.spec
    table = summarize(spec, results)
    close = {g for g, judged in verdict(spec, table).items()
             for j in judged for c in j.get("against", ()) if c.get("close")}
    more = [res for res in results if (res.arm.group or "all") in close]
    requests = [(res.arm, data.REPORT, seed, res.best) for res in more
                for seed in range(max(spec.seeds) + 1,
                                  max(spec.seeds) + 1 + spec.close_seeds - len(res.runs))]
    if requests:
        runner.log(f"close verdicts: {len(requests)} runs on more seeds")
    rows = runner.rows(requests)
    for res in more:
        res.runs += [r for r in rows if r["arm"] == res.arm.name]


def build_report(header: dict, rows: list[dict], out: Path | None) -> dict:
    """The report of a sweep from its data file's header and rows alone: results.json, the
    plot and the search's heat maps under ``out`` (None: the report only, nothing written);
    what the results page is written from."""
    spec = spec_from_dict(header["spec"])
    results = results_from_rows(spec, rows)
    table = summarize(spec, results)
    report = {"preset": header["preset"], "spec": header["spec"], "rows": table,
              "verdict": verdict(spec, table), "machine": header["machine"],
              "seconds": header["seconds"], "runs": len(rows), "command": header.get("command"),
              "batched": header.get("batched", False),
              "run_seconds": sum(r.get("run_wall_s") or 0.0 for r in rows)}
    if _wants_tuning_plot(spec, results):
        report["tuning_plot"] = str(Path(out or ".") / "tuning.png")
    if out is None:
        return report
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_sweep(spec, results, out / "plot.png")
    if "tuning_plot" in report:
        plot_tuning(spec, results, out / "tuning.png")
    return report


def results_from_rows(spec: SweepSpec, rows: list[dict]) -> list[ArmResult]:
    """Each arm's search and reported runs as the data rows hold them, in the spec's order."""
    out = []
    for arm in spec.arms:
        mine = [r for r in rows if r["arm"] == arm.name]
        if not mine:
            continue
        res = ArmResult(arm, tuning=[r for r in mine if r["phase"] == data.TUNE],
                        runs=sorted((r for r in mine if r["phase"] == data.REPORT),
                                    key=lambda r: r["seed"]))
        res.tuned, res.best = search_result(res.tuning)
        out.append(res)
    return out


def _wants_tuning_plot(spec: SweepSpec, results: list[ArmResult]) -> bool:
    """Heat maps show a grid's shape: worth drawing for a joint search or per-arm searches
    (their own one-row maps included), when some arm searched anything at all."""
    return (spec.per_arm or len(spec.tune) >= 2) and any(spec.tune_of(r.arm) for r in results)


def time_to_target(row: dict, target: float) -> float | None:
    """The run clock at the end of the first evaluated round whose eval loss is <= target."""
    for _, time_s, loss in row["curve"]:
        if loss is not None and loss <= target:
            return time_s
    return None


def summarize(spec: SweepSpec, results: list[ArmResult]) -> list[dict]:
    """One table row per arm: each measurement's sample statistics over the reported seeds
    ([mean, sample sd, half width of the 95 % interval, n]) and its value per seed."""
    rows = []
    for res in results:
        per_seed = {key: {r["seed"]: r.get(key) for r in res.runs}
                    for key in ("final_eval_loss", "consensus_distance", "clock_s",
                                "bytes_sent_total", "predicted_s")}
        per_seed["final_eval_loss"] = {r["seed"]: final_loss(r) for r in res.runs}
        if any("faults" in r for r in res.runs):   # a scenario with random faults
            per_seed |= {f"faults_{key}": {r["seed"]: (r.get("faults") or {}).get(key)
                                           for r in res.runs} for key in FAULT_COUNTS}
        per_seed["time_to_target_s"] = {r["seed"]: time_to_target(r, spec.target_loss)
                                        for r in res.runs} if spec.target_loss is not None else {}
        stat = {key: _stat(v.values()) for key, v in per_seed.items()}
        rows.append({
            "arm": res.arm.name, "group": res.arm.group, "role": res.arm.role,
            "tuned": {point_label(k): v for k, v in res.tuned.items()},
            "tune_keys": list(spec.arm_keys(res.arm)),  # what "tuned" and "best" are values of
            "best": point_value(res.best), "final_eval_loss": stat["final_eval_loss"],
            "consensus_distance": stat["consensus_distance"], "wall_s": stat["clock_s"],
            "predicted_s": stat["predicted_s"],
            "time_to_target_s": stat.get("time_to_target_s", _stat(())),
            "bytes_sent_total": stat["bytes_sent_total"], "per_seed": per_seed,
            "rounds": res.runs[0].get("rounds") if res.runs else None,
            "seeds": [r["seed"] for r in res.runs], "failed_runs": failed_runs(res.runs),
            **{k: stat[k] for k in stat if k.startswith("faults_")},
        })
    return rows


FAULT_COUNTS = ("due", "left", "joined", "drops")   # data.run_row's "faults", in the table


def _stat(values) -> list:
    s = stats.sample(values)
    return [s.mean, s.sd, s.half, s.n]


def verdict(spec: SweepSpec, rows: list[dict]) -> dict:
    """Per group: does the candidate (GASLoC) arm do what the claim says against each baseline?

    Each comparison is the paired difference over the seeds both ran (``stats.paired``), with
    its 95 % interval; the rule says what the intervals must show:

    beats:       candidate's final eval loss lower than every baseline's
    faster:      candidate reaches target_loss sooner than every baseline
    competitive: candidate's final eval loss above the best baseline's by less than
                 ``tolerance`` (relative)
    "yes" when every interval shows it, "no" when one shows the opposite, "tie" otherwise.
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
        return {"arm": cand["arm"], "holds": "not judged",
                "why": f"{cand['arm']} failed or diverged in {cand['failed_runs']} runs"}
    if cand[key][0] is None:
        return {"arm": cand["arm"], "holds": "not judged", "why": f"{cand['arm']} has no {key}"}
    mine = cand["per_seed"][key]
    if spec.verdict == "competitive":
        best = min(bases, key=lambda b: math.inf if b[key][0] is None else b[key][0])
        relative = stats.paired(mine, best["per_seed"][key], relative=True)
        against = [_compare(relative, best, key, spec.tolerance)]
    else:
        against = [_compare(stats.paired(mine, b["per_seed"][key]), b, key, 0.0)
                   if b[key][0] is not None else _never(b) for b in bases]
    missed = sum(v is None for v in mine.values()) if key == "time_to_target_s" else 0
    holds = "no" if missed or any(c["direction"] == "higher" for c in against) else \
        "yes" if all(c["direction"] == "lower" for c in against) else "tie"
    return {"arm": cand["arm"], "holds": holds, "key": key, "value": cand[key][0],
            "against": against, "missed": missed, "seeds": len(mine)}


def _compare(diff: stats.Sample, base: dict, key: str, margin: float) -> dict:
    """One comparison: the paired difference (less ``margin``) and where its interval lies;
    ``close``: under two standard deviations from zero on fewer seeds than the rule asks."""
    shifted = stats.Sample(None if diff.mean is None else diff.mean - margin, diff.sd,
                           diff.half, diff.n)
    close = diff.sd is not None and abs(shifted.mean) < 2 * diff.sd
    return {"arm": base["arm"], "value": base[key][0], "diff": [diff.mean, diff.sd, diff.half,
                                                                diff.n],
            "direction": stats.direction(shifted), "close": close}


def _never(base: dict) -> dict:
    """A baseline that never reached the target: any time the candidate has is sooner."""
    return {"arm": base["arm"], "value": None, "diff": [None, None, None, 0],
            "direction": "lower", "close": False}


def machine() -> dict:
    import torch  # only when a sweep has run, so it is loaded already
    return {"platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "cpus": os.cpu_count(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
