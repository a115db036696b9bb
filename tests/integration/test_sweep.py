"""Sweeps: every arm over seeds with a tuning search (shared or per arm), a table, a plot and a
results section."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np
import pytest

from gasloc_emu import config as C
from gasloc_emu.experiments import crossover, data, engines, page, plots, sweep
from gasloc_emu.experiments import spec as sweep_spec

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
MINI = """
seed = 0
workers = 4
[model]
preset = "tiny"
[algo]
local_steps = 2
[data]
max_corpus_mb = 1.0
[run]
rounds = 3
eval_every = 1
[sweep]
title = "mini"
claim = "gasloc beats local gossip"
seeds = [0, 1]
close_seeds = 2
tune_key = "algo.inner.lr"
tune_values = [0.001, 0.003]
target_loss = 4.6
x_axis = "both"
verdict = "beats"
[[sweep.arm]]
name = "g"
group = "x"
role = "candidate"
set = { "algo.name" = "gasloc", "topology.name" = "ring" }
[[sweep.arm]]
name = "lg"
group = "x"
role = "baseline"
set = { "algo.name" = "local-gossip", "topology.name" = "ring" }
"""


@pytest.mark.parametrize("preset", sorted((REPO / "runs").glob("*.toml")), ids=lambda p: p.stem)
def test_every_preset_and_arm_resolves(preset):
    if "[crossover]" in preset.read_text():  # the crossover map's preset: its own table
        spec = crossover.load_crossover(preset)
        for arm in spec.arms:
            sweep_spec.arm_config(preset, arm, spec.seed)
        return
    spec = sweep_spec.load_spec(preset)
    assert len(spec.seeds) == 3 and spec.arms
    C.resolve(preset)  # the base config runs with `gasloc-emu run --config`
    for arm in spec.arms:
        for seed in spec.seeds:
            for point in spec.grid(arm):
                cfg = sweep_spec.arm_config(preset, arm, seed, spec.settings(point, arm))
                assert cfg.seed == seed


def _final_loss(run) -> float:
    return json.loads((Path(run) / "summary.json").read_text())["final_eval_loss"]


def _section(report: dict) -> str:
    return page.markdown_section("mini", report, "cmd", "x.png")


def test_mini_sweep_writes_data_table_plot_and_section(tmp_path):
    preset = tmp_path / "mini.toml"
    preset.write_text(MINI)
    out = tmp_path / "out"
    report = sweep.run_sweep(preset, out, log=lambda *_: None)
    rows = {r["arm"]: r for r in report["rows"]}
    assert set(rows) == {"g", "lg"}
    for arm, r in rows.items():
        assert set(r["tuned"]) == {"0.001", "0.003"}
        assert r["best"] == min((0.001, 0.003), key=lambda v: r["tuned"][f"{v:g}"])
        # the search ran on tune seed 100 only; the reported seeds ran the best value alone
        for value, loss in r["tuned"].items():
            assert loss == _final_loss(out / f"{arm}-s100-{value}")
        assert r["seeds"] == [0, 1]
        losses = [_final_loss(out / f"{arm}-s{seed}-{r['best']:g}") for seed in (0, 1)]
        mean, sd, half, n = r["final_eval_loss"]
        assert (mean, sd, n) == pytest.approx((statistics.fmean(losses),
                                               statistics.stdev(losses), 2), rel=1e-12)
        assert half == pytest.approx(12.706 * sd / math.sqrt(2))
        assert sd > 0  # two seeds, two different runs
        # an untrained byte model scores ln 256 = 5.55; six steps at the best rate take every
        # run at least 1 nat below that (about 3.5 for g, 3.9 for lg), a tiny model no lower than 2
        assert all(2.0 < loss < math.log(256) - 1.0 for loss in losses), (arm, losses)
    assert report["runs"] == 2 * (2 + 2)  # per arm: two tuned values on seed 100, two seeds
    judged = report["verdict"]["x"][0]
    diffs = [rows["g"]["per_seed"]["final_eval_loss"][s] - rows["lg"]["per_seed"]
             ["final_eval_loss"][s] for s in (0, 1)]
    assert judged["against"][0]["diff"][0] == pytest.approx(statistics.fmean(diffs))
    png = out / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"][0]["final_eval_loss"] == list(rows[saved["rows"][0]["arm"]]
                                                       ["final_eval_loss"])

    # the data file alone gives the same section, without the run folders
    header, data_rows = data.read(out / "data.jsonl")
    assert len(data_rows) == report["runs"]
    assert {(r["arm"], r["phase"], r["seed"]) for r in data_rows} >= {("g", "tune", 100),
                                                                      ("lg", "report", 1)}
    rebuilt = sweep.build_report(header, data_rows, tmp_path / "rebuilt")
    assert _section(rebuilt) == _section(report)

    results = tmp_path / "RESULTS.md"
    results.write_text("# Results\n\nintro stays\n")
    for _ in range(2):  # writing twice replaces the section instead of appending it again
        page.update_results_page(results, "mini", _section(report))
    text = results.read_text()
    assert text.count("<!-- begin mini -->") == 1 and "intro stays" in text
    assert f"{rows['g']['final_eval_loss'][0]:.4f}" in text and "| g |" in text


def test_a_sweep_reuses_finished_runs_and_redoes_cut_short_ones(tmp_path):
    preset = tmp_path / "mini.toml"
    preset.write_text(MINI.replace("seeds = [0, 1]", "seeds = [0]").replace(
        "tune_values = [0.001, 0.003]", "tune_values = [0.001]"))
    out = tmp_path / "out"
    first = sweep.run_sweep(preset, out, log=lambda *_: None)
    cut = out / "lg-s0-0.001"
    (cut / "summary.json").unlink()  # as if that run had been killed
    stamp = (out / "g-s0-0.001" / "metrics.jsonl").stat().st_mtime_ns
    again = sweep.run_sweep(preset, out, log=lambda *_: None)
    assert (out / "g-s0-0.001" / "metrics.jsonl").stat().st_mtime_ns == stamp  # reused
    # redone from nothing, same seed: same losses
    for a, b in zip(again["rows"], first["rows"], strict=True):
        assert (a["tuned"], a["final_eval_loss"]) == (b["tuned"], b["final_eval_loss"])
    # a finished run made with other settings than the preset's now is made again
    preset.write_text(preset.read_text().replace("rounds = 3", "rounds = 2"))
    sweep.run_sweep(preset, out, log=lambda *_: None)
    assert (out / "g-s0-0.001" / "metrics.jsonl").stat().st_mtime_ns != stamp
    assert json.loads((out / "g-s0-0.001" / "summary.json").read_text())["rounds"] == 2


def test_a_sweep_resumes_from_kept_rows_without_its_run_folders(tmp_path):
    """Rows kept as runs finish carry a sweep to a fresh checkout (no run folders): the same
    runs are not run again, the report is the same; a changed preset setting runs anew."""
    preset = tmp_path / "mini.toml"
    preset.write_text(MINI.replace("seeds = [0, 1]", "seeds = [0]").replace(
        "tune_values = [0.001, 0.003]", "tune_values = [0.001]"))
    kept = tmp_path / "results" / "mini.partial.jsonl"
    first = sweep.run_sweep(preset, tmp_path / "a", log=lambda *_: None, kept=kept)
    assert len(kept.read_text().splitlines()) == first["runs"]
    with kept.open("a") as f:
        f.write('{"tag": "cut short')   # a line a kill cut off is skipped
    said = []
    again = sweep.run_sweep(preset, tmp_path / "b", log=said.append, kept=kept)
    assert not (tmp_path / "b" / "g-s0-0.001").exists()   # nothing ran
    assert sum("kept from an earlier sweep" in line for line in said) == first["runs"]
    assert _section(again) == _section(first)
    preset.write_text(preset.read_text().replace("local_steps = 2", "local_steps = 3"))
    sweep.run_sweep(preset, tmp_path / "c", log=lambda *_: None, kept=kept)
    assert (tmp_path / "c" / "g-s0-0.001" / "summary.json").exists()   # another config: run


def test_tune_seeds_that_are_also_reported_are_refused(tmp_path):
    preset = tmp_path / "reused.toml"
    preset.write_text(MINI.replace("seeds = [0, 1]", "seeds = [0, 1]\ntune_seeds = [1]"))
    with pytest.raises(C.ConfigError, match=r"tune_seeds \[1\] share \[1\]"):
        sweep_spec.load_spec(preset)


GRID = MINI.replace('tune_key = "algo.inner.lr"\ntune_values = [0.001, 0.003]\n',
                    'tune = { "algo.outer_lr" = [0.5, 1.0], "algo.momentum" = [0.0, "auto*0.5"], '
                    '"algo.inner.lr" = [0.003] }\n')
GRID = GRID.replace("seeds = [0, 1]", "seeds = [0]").replace("rounds = 3", "rounds = 2")


def test_a_joint_search_runs_every_combination_and_draws_the_grid(tmp_path):
    preset = tmp_path / "grid.toml"
    preset.write_text(GRID)
    spec = sweep_spec.load_spec(preset)
    assert spec.tune_keys == ("algo.outer_lr", "algo.momentum", "algo.inner.lr")
    assert len(spec.grid()) == 4
    report = sweep.run_sweep(preset, tmp_path / "out", log=lambda *_: None)
    assert report["runs"] == 2 * (4 + 1)   # per arm every combination on seed 100, then seed 0
    for row in report["rows"]:
        assert set(row["tuned"]) == {"0.5, 0, 0.003", "0.5, auto*0.5, 0.003",
                                     "1, 0, 0.003", "1, auto*0.5, 0.003"}
        best = min(row["tuned"], key=row["tuned"].get)
        assert ", ".join(sweep_spec.fmt_value(v) for v in row["best"]) == best
    run = tmp_path / "out" / "g-s100-1-auto*0.5-0.003"
    gamma = json.loads((run / "summary.json").read_text())["gamma"]
    from gasloc_emu.topology import Topology
    assert gamma == pytest.approx(0.5 * Topology("ring", 4).gamma_star)
    png = Path(report["tuning_plot"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.markdown_section("grid", report, "cmd", "results/grid.png")
    assert "the grid algo.outer_lr [0.5, 1.0] x algo.momentum [0.0, 'auto*0.5']" in text
    assert "![grid search](results/grid-tuning.png)" in text
    assert "| best algo.outer_lr, algo.momentum, algo.inner.lr |" in text


def test_a_grid_and_a_single_key_cannot_both_be_given(tmp_path):
    preset = tmp_path / "both.toml"
    preset.write_text(MINI + '[sweep.tune]\n"algo.outer_lr" = [0.5]\n')
    with pytest.raises(C.ConfigError, match="either"):
        sweep_spec.load_spec(preset)


# ------------------------------------------------------------------ per-arm searches

# g searches its own two keys, lg the sweep-wide learning rates, d its own three learning rates
PER_ARM = GRID.replace(
    'tune = { "algo.outer_lr" = [0.5, 1.0], "algo.momentum" = [0.0, "auto*0.5"], '
    '"algo.inner.lr" = [0.003] }\n',
    'tune_key = "algo.inner.lr"\ntune_values = [0.001, 0.003]\n').replace(
    'set = { "algo.name" = "gasloc", "topology.name" = "ring" }\n',
    'set = { "algo.name" = "gasloc", "topology.name" = "ring" }\n'
    'tune = { "algo.outer_lr" = [0.5, 1.0], "algo.inner.lr" = [0.003] }\n') + """
[[sweep.arm]]
name = "d"
group = "x"
role = "baseline"
set = { "algo.name" = "dsgd", "topology.name" = "ring", "algo.local_steps" = 1 }
tune = { "algo.inner.lr" = [0.001, 0.003, 0.01] }
"""

EQUAL_BUDGET = PER_ARM.replace('verdict = "beats"', 'verdict = "beats"\nequal_budget = true')


def test_per_arm_searches_run_each_arms_own_grid_and_report_it(tmp_path):
    preset = tmp_path / "per-arm.toml"
    preset.write_text(PER_ARM)
    out = tmp_path / "out"
    report = sweep.run_sweep(preset, out, log=lambda *_: None)
    # every arm's points on seed 100, then its best on seed 0; own grids name their keys, the
    # sweep-wide grid keeps its value-only names
    searched = ["g-s100-outer_lr=0.5-lr=0.003", "g-s100-outer_lr=1-lr=0.003", "lg-s100-0.001",
                "lg-s100-0.003", "d-s100-lr=0.001", "d-s100-lr=0.003", "d-s100-lr=0.01"]
    dirs = sorted(d.name for d in out.iterdir() if d.is_dir())
    assert set(searched) <= set(dirs) and len(dirs) == 7 + 3
    assert report["runs"] == 7 + 3
    eta = json.loads((out / "g-s100-outer_lr=0.5-lr=0.003" / "summary.json").read_text())["eta"]
    assert eta == 0.5
    rows = {r["arm"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert {a: r["tune_keys"] for a, r in rows.items()} == {
        "g": ["algo.outer_lr", "algo.inner.lr"], "lg": ["algo.inner.lr"], "d": ["algo.inner.lr"]}
    assert set(rows["g"]["tuned"]) == {"0.5, 0.003", "1, 0.003"}
    assert set(rows["d"]["tuned"]) == {"0.001", "0.003", "0.01"}
    for r in rows.values():  # each arm's best is the best of its own search
        best = min(r["tuned"], key=r["tuned"].get)
        assert page._best_words(r["best"]) == best
    assert Path(report["tuning_plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    text = page.markdown_section("per-arm", report, "cmd", "results/per-arm.png")
    assert "seeds [0]; each arm's own search (below) on tune seed 100, from 2 to 3 points per " \
           "arm, best value kept for the reported seeds." in text
    assert "- g: the grid algo.outer_lr [0.5, 1.0] x algo.inner.lr [0.003] (every " \
           "combination), 2 runs\n- lg: algo.inner.lr [0.001, 0.003], 2 runs\n" in text
    assert "| arm | best | final eval loss |" in text  # the cells say which keys
    g_best, lg_best = rows["g"]["best"], rows["lg"]["best"]
    assert f"| g | outer_lr {sweep_spec.fmt_value(g_best[0])}, lr 0.003 | " in text
    assert f"| lg | lr {sweep_spec.fmt_value(lg_best)} | " in text
    assert "![per-arm search](results/per-arm-tuning.png)" in text


def test_a_heat_map_has_one_row_for_an_arm_that_searched_one_key():
    arm = sweep_spec.Arm("d", {}, tune=(("algo.inner.lr", (0.001, 0.003, 0.01)),))
    spec = sweep_spec.SweepSpec("t", "c", "simulate", (0,), (arm,))
    res = sweep_spec.ArmResult(arm, tuned={(0.001,): 3.0, (0.003,): 2.5, (0.01,): float("inf")})
    cells = plots.tuning_grid(spec, res)
    assert cells.shape == (1, 3) and list(cells[0, :2]) == [3.0, 2.5] and np.isnan(cells[0, 2])


def test_equal_budget_refuses_arms_whose_searches_differ_in_size(tmp_path):
    preset = tmp_path / "unequal.toml"
    preset.write_text(EQUAL_BUDGET)
    with pytest.raises(C.ConfigError, match=r"equal_budget.*g 2, lg 2, d 3"):
        sweep_spec.load_spec(preset)


def test_equal_budget_is_said_in_the_mode_sentence(tmp_path):
    preset = tmp_path / "equal.toml"
    preset.write_text(EQUAL_BUDGET.replace("[0.001, 0.003, 0.01]", "[0.001, 0.003]"))
    report = _fake_report(sweep_spec.load_spec(preset))
    text = page.markdown_section("equal", report, "cmd", "e.png")
    assert "each arm's own search (below) on tune seed 100; every arm had the same budget of 2 " \
           "points, best value kept for the reported seeds." in text


@pytest.mark.parametrize("arm_extra, match", [
    ('tunes = { "algo.inner.lr" = [0.001] }\n', "unknown keys"),  # a misspelt tune
    ('tune = { "topology.name" = ["ring", "torus"] }\n', "both sets and searches"),
])
def test_an_arms_search_is_checked(tmp_path, arm_extra, match):
    preset = tmp_path / "bad.toml"
    preset.write_text(MINI.replace('name = "lg"\n', 'name = "lg"\n' + arm_extra))
    with pytest.raises(C.ConfigError, match=match):
        sweep_spec.load_spec(preset)


def _fake_row(arm, phase: str, seed: int, point: tuple, loss: float) -> dict:
    """A data row with made-up numbers (the shape ``data.run_row`` writes)."""
    return {"kind": "run", "arm": arm.name, "phase": phase, "seed": seed, "point": list(point),
            "status": "ok", "final_eval_loss": loss, "consensus_distance": 0.25 + seed / 200,
            "bytes_sent_total": 1.5434e9, "clock_s": 30.0 + seed, "rounds": 3,
            "run_wall_s": 38.8, "curve": [[0, 5.0 + seed, 4.9], [2, 10.0 + 2 * seed, loss]]}


def _fake_report(spec: sweep_spec.SweepSpec) -> dict:
    """A report as build_report gives it, from made-up data rows: the markdown without runs.
    Arm i's loss on seed s is 2.5 - i/100 + s/1000 + i*s/3000 (each arm's first search point
    is its best), so the paired differences vary with the seed."""
    rows = []
    for i, arm in enumerate(spec.arms):
        grid = spec.grid(arm)
        for k, point in enumerate(grid if spec.tune_of(arm) else ()):
            rows += [_fake_row(arm, "tune", seed, point, 2.6 + k / 10)
                     for seed in spec.tune_seeds]
        best = grid[0] if spec.tune_of(arm) else ()
        rows += [_fake_row(arm, "report", seed, best, 2.5 - i / 100 + seed / 1000
                           + i * seed / 3000) for seed in spec.seeds]
    header = {"preset": "p.toml", "spec": sweep_spec.spec_dict(spec),
              "machine": {"platform": "Linux-x", "python": "3.11.7", "torch": "2.13.0+cpu",
                          "cpus": 2, "gpu": None}, "seconds": 100.0}
    results = sweep.results_from_rows(spec, rows)
    table = sweep.summarize(spec, results)
    return {"preset": "p.toml", "spec": header["spec"], "rows": table,
            "verdict": sweep.verdict(spec, table), "machine": header["machine"],
            "seconds": 100.0, "runs": len(rows),
            "run_seconds": sum(r["run_wall_s"] for r in rows),
            **({"tuning_plot": "x/tuning.png"} if len(spec.tune) >= 2 else {})}


# the section of a joint search on three seeds, pinned: a change of wording, statistics or
# layout shows here first (and then in every section of docs/RESULTS.md)
GRID_SECTION = """## mini

Claim: gasloc beats local gossip.

Command: `cmd`

Mode: simulate (in-process simulator; its clock is the compute model's time (nominal step times \
where compute.step_time_s is set) plus modelled transfers); reported seeds [0, 1, 2]; the same \
search over the grid algo.outer_lr [0.5, 1.0] x algo.momentum [0.0, 'auto*0.5'] x algo.inner.lr \
[0.003] (every combination) on tune seed 100 for every arm, best value kept for the reported \
seeds. Mean ± sample standard deviation over the reported seeds. Final eval loss is that of the \
average of the workers' models; consensus distance is the RMS distance of the workers' \
parameters to that average.

| arm | best algo.outer_lr, algo.momentum, algo.inner.lr | final eval loss | consensus distance \
| time to eval loss 4.6 (s) | predicted s (simulator) | MB sent |
| --- | --- | --- | --- | --- | --- | --- |
| g | 0.5, 0, 0.003 | 2.5010 ± 0.0010 | 0.255 ± 0.005 | 12.0 ± 2.0 | 31.0 ± 1.0 | 1543.4 |
| lg | 0.5, 0, 0.003 | 2.4913 ± 0.0013 | 0.255 ± 0.005 | 12.0 ± 2.0 | 31.0 ± 1.0 | 1543.4 |

![grid](results/grid.png)

The whole search, tune seed 100, one heat map per arm:

![grid search](results/grid-tuning.png)

Verdict (rule: beats), from the difference of each pair of runs with the same seed (same \
initialisation and data order), mean [95 % interval]:

- x: g (2.5010) lower final eval loss than lg 2.4913, difference +0.0097 [+0.0088, +0.0105] over \
3 seeds: **no**

Machine: Linux-x, 2 CPUs, Python 3.11.7, torch 2.13.0+cpu, GPU none; its 14 runs (search \
included) took 9.1 min of wall-clock.
"""


def test_a_section_reads_as_pinned_and_the_same_from_json(tmp_path):
    preset = tmp_path / "grid.toml"
    preset.write_text(GRID.replace("seeds = [0]", "seeds = [0, 1, 2]"))
    report = _fake_report(sweep_spec.load_spec(preset))
    assert page.markdown_section("grid", report, "cmd", "results/grid.png") == GRID_SECTION
    # results.json's lists (not tuples) give the same section
    again = json.loads(json.dumps(report))
    assert page.markdown_section("grid", again, "cmd", "results/grid.png") == GRID_SECTION
    h1_spec = sweep_spec.load_spec(REPO / "runs" / "local-steps.toml")
    h1 = page.markdown_section("h1", _fake_report(h1_spec), "cmd", "h1.png")
    assert "reported seeds [0, 1, 2]; the same search over algo.inner.lr [0.001, 0.003] on " \
           "tune seed 100 for every arm, best value kept for the reported seeds." in h1
    assert "| arm | best algo.inner.lr | final eval loss |" in h1
    assert "| gasloc-ring-H1 | 0.001 |" in h1


def test_a_preset_without_any_search_says_so_and_has_no_best_column(tmp_path):
    preset = tmp_path / "fixed.toml"
    preset.write_text(MINI.replace('tune_key = "algo.inner.lr"\ntune_values = [0.001, 0.003]\n',
                                   ""))
    spec = sweep_spec.load_spec(preset)
    assert spec.grid(spec.arms[0]) == [()]
    text = page.markdown_section("fixed", _fake_report(spec), "cmd", "results/fixed.png")
    assert "no search: each arm runs the settings the preset gives it. Mean" in text
    assert "best value kept" not in text
    assert "| arm | final eval loss | consensus distance |" in text
    assert "| --- | --- | --- | --- |\n" in text


def test_a_run_mode_sweep_can_set_the_simulators_prediction_beside_each_run(tmp_path):
    preset = tmp_path / "grid.toml"
    preset.write_text(MINI.replace('seeds = [0, 1]', 'seeds = [0, 1]\nmode = "run"\n'
                                   'predict = true'))
    spec = sweep_spec.load_spec(preset)
    assert spec.predict and sweep_spec.spec_from_dict(sweep_spec.spec_dict(spec)).predict
    rows = []
    for i, arm in enumerate(spec.arms):
        rows += [_fake_row(arm, "tune", 100, (v,), 2.6) for v in (0.001, 0.003)]
        rows += [_fake_row(arm, "report", s, (0.001,), 2.5 - i / 100) | {"predicted_s": 28.0 + s}
                 for s in spec.seeds]
    table = sweep.summarize(spec, sweep.results_from_rows(spec, rows))
    report = {"spec": sweep_spec.spec_dict(spec), "rows": table, "runs": len(rows),
              "verdict": sweep.verdict(spec, table), "run_seconds": 60.0,
              "machine": {"platform": "L", "python": "3", "torch": "2", "cpus": 2, "gpu": None}}
    text = page.markdown_section("mini", report, "cmd", "mini.png")
    assert "| wall-clock s (emulator) | predicted s (simulator) | MB sent |" in text
    assert "| 30.5 ± 0.7 | 28.5 ± 0.7 | 1543.4 |" in text
    preset.write_text(MINI.replace('seeds = [0, 1]', 'seeds = [0, 1]\npredict = true'))
    with pytest.raises(C.ConfigError, match="sweep.predict = True; expected true .with mode"):
        sweep_spec.load_spec(preset)


def test_a_predicting_sweep_simulates_each_reported_run_beside_it(tmp_path, monkeypatch):
    """The wiring, with the emulator's runs stood in for by the simulator's (the same record)."""
    preset = tmp_path / "p.toml"
    preset.write_text(MINI.replace('seeds = [0, 1]', 'seeds = [0]\nmode = "run"\npredict = true')
                      .replace("[0.001, 0.003]", "[0.003]").replace("rounds = 3", "rounds = 1"))
    made, real = [], engines.run_one

    def run_one(cfg, out, mode):
        made.append((out.name, mode))
        return real(cfg, out, "simulate")
    monkeypatch.setattr(engines, "run_one", run_one)
    report = sweep.run_sweep(preset, tmp_path / "out", log=lambda *_: None)
    assert ("g-s0-0.003-sim", "simulate") in made and ("g-s0-0.003", "run") in made
    assert not any(name.startswith("g-s100") and name.endswith("-sim") for name, _ in made)
    row = next(r for r in report["rows"] if r["arm"] == "g")
    assert row["predicted_s"][3] == 1 and row["predicted_s"][0] > 0  # mean over one seed
