"""Sweeps: every arm over seeds with the same tuning, a table, a plot and a results section."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gasloc_emu import config as C
from gasloc_emu import sweep

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
    spec = sweep.load_spec(preset)
    assert len(spec.seeds) == 3 and spec.arms
    C.resolve(preset)  # the base config runs with `gasloc-emu run --config`
    for arm in spec.arms:
        for seed in spec.seeds:
            for point in spec.grid():
                assert sweep.arm_config(preset, arm, seed, spec.settings(point)).seed == seed


def test_mini_sweep_writes_table_plot_and_section(tmp_path):
    preset = tmp_path / "mini.toml"
    preset.write_text(MINI)
    report = sweep.run_sweep(preset, tmp_path / "out", log=lambda *_: None)
    rows = {r["arm"]: r for r in report["rows"]}
    assert set(rows) == {"g", "lg"}
    for r in rows.values():
        assert set(r["tuned"]) == {"0.001", "0.003"}
        assert r["best"] == min((0.001, 0.003), key=lambda v: r["tuned"][f"{v:g}"])
        mean, std, n = r["final_eval_loss"]
        assert n == 2 and 2.0 < mean < 5.6 and std >= 0
    assert report["runs"] == 2 * (2 + 1)  # per arm: two tuned values on seed 0, plus seed 1
    g, lg = rows["g"]["final_eval_loss"][0], rows["lg"]["final_eval_loss"][0]
    assert report["verdict"]["x"][0]["holds"] == (g < lg)
    png = tmp_path / "out" / "plot.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    first_row = saved["rows"][0]
    assert first_row["final_eval_loss"] == list(rows[first_row["arm"]]["final_eval_loss"])

    page = tmp_path / "RESULTS.md"
    page.write_text("# Results\n\nintro stays\n")
    for _ in range(2):  # writing twice replaces the section instead of appending it again
        sweep.update_results_page(page, "mini",
                                  sweep.markdown_section("mini", report, "cmd", "x.png"))
    text = page.read_text()
    assert text.count("<!-- begin mini -->") == 1 and "intro stays" in text
    assert f"{g:.4f}" in text and "| g |" in text and "| lg |" in text


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


GRID = MINI.replace('tune_key = "algo.inner.lr"\ntune_values = [0.001, 0.003]\n',
                    'tune = { "algo.outer_lr" = [0.5, 1.0], "algo.momentum" = [0.0, "auto*0.5"], '
                    '"algo.inner.lr" = [0.003] }\n')
GRID = GRID.replace("seeds = [0, 1]", "seeds = [0]").replace("rounds = 3", "rounds = 2")


def test_a_joint_search_runs_every_combination_and_draws_the_grid(tmp_path):
    preset = tmp_path / "grid.toml"
    preset.write_text(GRID)
    spec = sweep.load_spec(preset)
    assert spec.tune_keys == ("algo.outer_lr", "algo.momentum", "algo.inner.lr")
    assert len(spec.grid()) == 4
    report = sweep.run_sweep(preset, tmp_path / "out", log=lambda *_: None)
    assert report["runs"] == 2 * 4   # per arm every combination on seed 0 (the best is reused)
    for row in report["rows"]:
        assert set(row["tuned"]) == {"0.5, 0, 0.003", "0.5, auto*0.5, 0.003",
                                     "1, 0, 0.003", "1, auto*0.5, 0.003"}
        best = min(row["tuned"], key=row["tuned"].get)
        assert ", ".join(sweep._fmt_val(v) for v in row["best"]) == best
    run = tmp_path / "out" / "g-s0-1-auto*0.5-0.003"
    gamma = json.loads((run / "summary.json").read_text())["gamma"]
    from gasloc_emu.topology import Topology
    assert gamma == pytest.approx(0.5 * Topology("ring", 4).gamma_star)
    png = Path(report["tuning_plot"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = sweep.markdown_section("grid", report, "cmd", "results/grid.png")
    assert "the grid algo.outer_lr [0.5, 1.0] x algo.momentum [0.0, 'auto*0.5']" in text
    assert "![grid search](results/grid-tuning.png)" in text
    assert "| best algo.outer_lr, algo.momentum, algo.inner.lr |" in text


def test_a_grid_and_a_single_key_cannot_both_be_given(tmp_path):
    preset = tmp_path / "both.toml"
    preset.write_text(MINI + '[sweep.tune]\n"algo.outer_lr" = [0.5]\n')
    with pytest.raises(C.ConfigError, match="either"):
        sweep.load_spec(preset)
