"""The crossover map made end to end on the simulator: two round-based arms timed at their
probe's rounds, and an arm without rounds (A2CiD2) run to the target at every grid point.

Sized for CI: one evaluation batch, and probes a little longer than the target needs (GASLoC and
DiLoCo reach 3.6 at round 3 of 5, A2CiD2 at step 8 of 12), so the grid runs 3 rounds and 12
steps (1.5 x 8) a point: 11 s where 12 and 24 probe rounds of 8 batches took 25 s."""
from __future__ import annotations

import math

import numpy as np
import pytest

from gasloc_emu import config as C
from gasloc_emu.experiments import crossover as X
from gasloc_emu.experiments import data, engines

pytestmark = pytest.mark.integration

MINI = """
seed = 0
workers = 4
[model]
preset = "tiny"
[algo]
local_steps = 2
[algo.inner]
lr = 0.003
[topology]
name = "ring"
[data]
max_corpus_mb = 1.0
eval_batches = 1
[compute]
step_time_s = 0.05
[run]
rounds = 5
[crossover]
title = "mini"
rates_mbit = [10, 1000]
step_times_s = [0.05]
target_loss = 3.6
[[crossover.arm]]
name = "g"
set = { "algo.name" = "gasloc" }
[[crossover.arm]]
name = "d"
set = { "algo.name" = "diloco" }
[[crossover.arm]]
name = "a"
set = { "algo.name" = "a2cid2", "run.rounds" = 12 }
"""


class _Batches(engines.LocalEngine):
    """The local engine, noting the batches of runs it is handed."""

    def __init__(self, folder):
        super().__init__(C.EngineConfig(), folder)
        self.batches = []

    def run(self, points, log=print):
        self.batches.append([p.out.name for p in points])
        return super().run(points, log)


def test_an_arm_without_rounds_runs_to_the_target_at_every_point(tmp_path):
    preset = tmp_path / "mini.toml"
    preset.write_text(MINI)
    engine = _Batches(tmp_path / "out")
    header, rows = X.run_crossover(preset, tmp_path / "out", log=lambda *_: None, engine=engine)
    # every arm's probe, then every arm's grid, each one batch an engine may make at once
    grid = [f"{a}-{r}mbit-0.05s" for a in "gda" for r in (10, 1000)]
    assert engine.batches == [["g-probe", "d-probe", "a-probe"], grid, []]
    probe = {r["arm"]: r for r in rows if r["phase"] == "probe"}
    assert [probe[a]["timed"] for a in "gda"] == [True, True, False]
    steps, _ = X.rounds_to_target(probe["a"], 3.6)
    grid = {(r["arm"], r["rate_mbit"]): r for r in rows if r["phase"] == "grid"}
    for rate in (10.0, 1000.0):
        a = grid["a", rate]
        assert a["rounds"] == math.ceil(X.BUDGET * steps)  # evaluated every step up to there
        assert len(a["curve"]) == a["rounds"]
        n, t, loss = X.first_at_target(a, 3.6)
        assert (a["rounds_to_target"], a["time_s"], a["loss"]) == (n, t, loss)
        assert loss <= 3.6 < a["curve"][n - 2][2]
        g = grid["g", rate]  # a timed arm: exactly its probe's rounds, ending on its loss
        assert g["rounds"] == g["rounds_to_target"] == X.rounds_to_target(probe["g"], 3.6)[0]
    # the slow link's exchanges outlast the 0.05 s steps: the target comes later on the clock
    assert grid["a", 10.0]["time_s"] > 2 * grid["a", 1000.0]["time_s"]
    text = X.section(header, rows)
    assert "to the last bit" in text and "a has no rounds" in text
    assert not np.isnan(X.ratio_grid(header["spec"], rows, "a")).any()
    path = tmp_path / "mini.jsonl"
    data.write(path, header, rows, kind=X.KIND)
    assert X.section(*data.read(path, kind=X.KIND)) == text
