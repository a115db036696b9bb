"""The crossover map from its runs: the ratio grid, where it crosses 1, which arm is first, an
arm without rounds timed at its target, the preset's checks, and the section rebuilt from a
data file alone."""
from __future__ import annotations

import math

import pytest

from gasloc_emu import config as C
from gasloc_emu.experiments import crossover as X

SPEC = {"title": "t", "rates_mbit": [1.0, 10.0, 100.0], "step_times_s": [0.01, 0.1],
        "target_loss": 3.0, "arms": [{"name": "g", "sets": {}}, {"name": "d", "sets": {}}],
        "checks": [[10.0, 0.1]], "seed": 0}


def grid_row(arm: str, rate: float, step: float, time_s: float | None) -> dict:
    return {"phase": "grid", "arm": arm, "rate_mbit": rate, "step_time_s": step,
            "time_s": time_s, "loss": 2.9, "rounds_to_target": 4 if arm == "g" else 3,
            "run_wall_s": 6.0}


def rows() -> list[dict]:
    """g pays 1 s of compute plus 8/rate a round, d pays 1 s plus 24/rate: g wins at low rates,
    and at 0.1 s steps d's fewer rounds (3 against 4) win at high rates."""
    out = []
    for step in SPEC["step_times_s"]:
        for rate in SPEC["rates_mbit"]:
            out.append(grid_row("g", rate, step, 4 * (10 * step + 8 / rate)))
            out.append(grid_row("d", rate, step, 3 * (10 * step + 24 / rate)))
    probe = {"phase": "probe", "curve": [[1, 0.0, 3.5], [4, 1.0, 2.9]]}
    return out + [probe | {"arm": "g"}, probe | {"arm": "d", "curve": [[3, 0.0, 2.9]]},
                  grid_row("g", 10.0, 0.1, 4.4) | {"phase": "check"}]


def test_the_ratio_grid_and_where_it_crosses_one():
    grid = X.ratio_grid(SPEC, rows())
    assert grid.shape == (2, 3)
    assert grid[0, 0] == pytest.approx(4 * (0.1 + 8) / (3 * (0.1 + 24)))
    assert grid[1, 2] > 1 > grid[1, 0]  # 0.1 s steps: g first on slow links, d on fast ones
    cross = X.crossover_rates(SPEC, grid)
    a, b = grid[1, 1] - 1, grid[1, 2] - 1
    assert cross[1] == pytest.approx(10 ** (1 + a / (a - b)))
    assert cross[0] is None or cross[0] > 10


def test_a_missing_time_is_left_out_of_the_map():
    grid = X.ratio_grid(SPEC, [r for r in rows() if (r.get("arm"), r.get("rate_mbit")) !=
                               ("d", 1.0)])
    assert math.isnan(grid[0, 0]) and not math.isnan(grid[0, 1])


def test_the_section_says_what_the_runs_say():
    header = {"spec": SPEC, "command": "gasloc-emu crossover x.toml", "preset": "runs/x.toml",
              "seconds": 60.0, "machine": {"platform": "p", "cpus": 2, "python": "3",
                                           "torch": "2", "gpu": None}}
    text = X.section(header, rows())
    assert "g 4 rounds (loss 2.9000); d 3 rounds (loss 2.9000)" in text
    assert "to the last bit" in text
    # predicted 4 (1 + 8 / 10) s, its 4 rounds, and both losses
    assert "| g | 10 | 0.1 | 4 | 7.20 | 4.40 | 0.611 | 2.9000 | 2.9000 |" in text
    assert "![crossover](results/x.png)" in text
    assert "its 15 runs took 1.3 min" in text  # 13 runs of 6 s, not the header's 60 s
    assert "has no rounds" not in text and "First to the target" not in text


A_SPEC = SPEC | {"arms": SPEC["arms"] + [{"name": "a", "sets": {}}]}


def a_rows() -> list[dict]:
    """A third arm without rounds: it paid 0.5 s a step plus 16/rate an exchange and reached the
    target after 5 to 7 steps, except at 1 Mbit/s with 0.01 s steps, where it never did."""
    out = []
    for step in SPEC["step_times_s"]:
        for j, rate in enumerate(SPEC["rates_mbit"]):
            n = 5 + j
            reached = (rate, step) != (1.0, 0.01)
            out.append(grid_row("a", rate, step, n * (5 * step + 16 / rate) if reached else None)
                       | {"timed": False, "rounds": 9, "rounds_to_target": n if reached else None,
                          "loss": 2.95 if reached else None})
    probe = {"phase": "probe", "arm": "a", "timed": False, "curve": [[5, 0.1, 2.95]]}
    return rows() + out + [probe]


def test_an_arm_without_rounds_gets_its_own_map_and_the_first_table():
    grid = X.ratio_grid(A_SPEC, a_rows(), "a")
    assert math.isnan(grid[0, 0])  # never reached: left out, not a ratio
    assert grid[1, 2] == pytest.approx(7 * (0.5 + 0.16) / (3 * (1 + 0.24)))
    first = X.first_grid(A_SPEC, a_rows())
    times = {(r["arm"], r["rate_mbit"], r["step_time_s"]): r["time_s"] for r in a_rows()
             if r.get("phase") == "grid" and r["time_s"] is not None}
    for i, step in enumerate(SPEC["step_times_s"]):
        for j, rate in enumerate(SPEC["rates_mbit"]):
            best = min((t, arm) for (arm, r, s), t in times.items() if (r, s) == (rate, step))
            assert first[i][j] == best[1]
    assert X.candidates(A_SPEC) == ["g", "a"] and X.baseline(A_SPEC) == "d"


def test_the_section_says_how_an_arm_without_rounds_was_timed():
    header = {"spec": A_SPEC, "command": "c", "preset": "runs/x.toml", "seconds": 60.0,
              "machine": {"platform": "p", "cpus": 2, "python": "3", "torch": "2", "gpu": None}}
    text = X.section(header, a_rows())
    assert "g 4 rounds (loss 2.9000); d 3 rounds (loss 2.9000); a 5 steps (loss 2.9500)" in text
    assert ("a has no rounds" in text and "runs it for 9 steps" in text
            and "reached the target at 5 of 6 points, after 5 to 7 steps" in text)
    assert "to the last bit" in text  # the timed arms' grid losses are still checked alone
    assert "Time to eval loss 3 of a over d's" in text and "First to the target:" in text
    assert X.section(header, a_rows()).count("The crossover line") == 2


def test_a_preset_is_checked_where_it_is_read(tmp_path):
    path = tmp_path / "x.toml"
    base = ('[crossover]\nrates_mbit = [1, 10]\nstep_times_s = [0.1]\ntarget_loss = 3.0\n'
            '[[crossover.arm]]\nname = "a"\n[[crossover.arm]]\nname = "b"\n')
    path.write_text(base)
    assert X.load_crossover(path).rates_mbit == (1.0, 10.0)
    C.resolve(path)  # a preset is also a config: its [crossover] table is not a setting
    path.write_text(base.replace("[crossover]\n", "[crossover]\ncheck = [[5, 0.1]]\n"))
    with pytest.raises(C.ConfigError, match=r"check points \[\(5.0, 0.1\)\] are not on the grid"):
        X.load_crossover(path)
    path.write_text(base.replace("[1, 10]", "[0, 10]"))
    with pytest.raises(C.ConfigError, match="rates_mbit"):
        X.load_crossover(path)
    path.write_text(base.replace('[[crossover.arm]]\nname = "b"\n', ""))
    with pytest.raises(C.ConfigError, match="2 or more"):
        X.load_crossover(path)
