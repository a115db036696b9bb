"""Uneven workers end to end: the simulator's prediction and the emulator's processes agree on
steps, losses and wall-clock under a compute profile (the must-holds of the compute model)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

# 4 workers, 10 steps of 0.05 s, worker 3 at speed 0.25, 4 rounds, DiLoCo over 1 Gbit/s links
STRAGGLER = ["--workers", "4", "--model", "tiny", "--seed", "1", "--local-steps", "10",
             "--rounds", "4", "--algo", "diloco", "--compute-profile", "straggler",
             "--step-time-s", "0.05", "--bw-profile", "uniform", "--rate-mbit", "1000",
             "--no-dashboard", "--set", "data.max_corpus_mb=1", "--set", "net.probe=false"]


def cli(*args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gasloc_emu", *args], capture_output=True,
                          text=True, timeout=timeout)


def rows(run_dir: Path) -> dict[tuple[int, int], dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {(r["worker"], r["round"]): r for r in map(json.loads, lines)}


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def simulate_and_run(tmp_path: Path, *extra: str) -> tuple[Path, Path]:
    sim, run = tmp_path / "sim", tmp_path / "run"
    done = cli("simulate", *STRAGGLER, *extra, "--out", str(sim))
    assert done.returncode == 0, done.stderr
    done = cli("run", *STRAGGLER, *extra, "--out", str(run))
    assert done.returncode == 0, done.stderr
    return sim, run


def assert_same_steps_and_losses(sim: Path, run: Path) -> None:
    got, want = rows(run), rows(sim)
    assert sorted(got) == sorted(want)
    for key, row in want.items():
        assert got[key]["steps"] == row["steps"] and got[key]["speed"] == row["speed"], key
        assert got[key]["train_loss"] == pytest.approx(row["train_loss"], rel=1e-5), key
    assert summary(run)["final_eval_loss"] == pytest.approx(summary(sim)["final_eval_loss"],
                                                            rel=1e-5)


# the pace test's own size, for CI's budget: 3 rounds of 5 steps (the straggler's 1 s a round,
# 3 s in all), one evaluation batch: its run trains 3 s where 4 rounds of 10 steps took 8 s
PACE_ROUNDS, PACE_STEPS = 3, 5
PACE = ["--rounds", str(PACE_ROUNDS), "--local-steps", str(PACE_STEPS),
        "--set", "data.eval_batches=1"]


def test_diloco_with_a_straggler_takes_its_pace_as_predicted(tmp_path):
    sim, run = simulate_and_run(tmp_path, *PACE)
    predicted = summary(sim)["predicted_wall_s"]
    assert predicted == pytest.approx(PACE_ROUNDS * PACE_STEPS * 0.05 / 0.25, rel=0.10)
    assert summary(run)["wall_s"] == pytest.approx(predicted, rel=0.15)
    assert_same_steps_and_losses(sim, run)
    assert {r["steps"] for r in rows(run).values()} == {PACE_STEPS}
    # the fast workers spend most of every round waiting for worker 3, which hardly waits
    fast = [r["wait_s"] / (r["compute_s"] + r["comm_s"]) for (w, _), r in rows(run).items()
            if w < 3]
    assert min(fast) > 0.6
    assert summary(run)["compute"]["speeds"] == [1.0, 1.0, 1.0, 0.25]


def test_a_time_budget_gives_the_straggler_fewer_steps_in_both_modes(tmp_path):
    sim, run = simulate_and_run(tmp_path, "--inner-budget-s", "0.5")
    for r in (rows(sim), rows(run)):
        assert {w: {row["steps"] for (k, _), row in r.items() if k == w} for w in range(4)} \
            == {0: {10}, 1: {10}, 2: {10}, 3: {2}}
    assert_same_steps_and_losses(sim, run)
    assert summary(sim)["local_steps"] == [10, 10, 10, 2]
    predicted = summary(sim)["predicted_wall_s"]
    assert predicted == pytest.approx(4 * 0.5, rel=0.10)
    # the run's clock at its last round: over 2 s, wall_s's final evaluation (about 0.1 s, not
    # part of the prediction) would take most of the margin
    assert max(r["time_s"] for r in rows(run).values()) == pytest.approx(predicted, rel=0.15)


def test_unshaped_nominal_runs_are_predicted_and_weighting_changes_diloco(tmp_path):
    base = [a for a in STRAGGLER if a not in ("--bw-profile", "uniform", "--rate-mbit", "1000")]
    base += ["--inner-budget-s", "0.5", "--rounds", "2"]
    plain, steps = tmp_path / "plain", tmp_path / "steps"
    for out, mean in ((plain, "plain"), (steps, "steps")):
        done = cli("simulate", *base, "--set", f"algo.pseudo_grad_mean={mean}",
                   "--out", str(out))
        assert done.returncode == 0, done.stderr
    assert summary(plain)["predicted_wall_s"] == pytest.approx(2 * 0.5, rel=0.01)
    assert summary(plain)["final_eval_loss"] != summary(steps)["final_eval_loss"]


def test_compute_show_prints_each_worker(tmp_path):
    shown = cli("compute", "show", "--compute-profile", "straggler", "--workers", "4",
                "--step-time-s", "0.05", "--inner-budget-s", "0.5")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith("compute profile 'straggler', 4 workers")
    assert lines[4] == "worker   3: speed 0.250  step 0.2 s  2 steps per round"


@pytest.mark.parametrize("cmd", [["compute", "show"], ["simulate", "--rounds", "1", "--out"]],
                         ids=["show", "simulate"])
def test_a_bad_profile_file_is_bad_input(tmp_path, cmd):
    """Exit 2 and nothing recorded (``simulate`` needs preflight to call ``compute.check``)."""
    bad = tmp_path / "speeds.toml"
    bad.write_text("[[worker]]\nid = 9\nspeed = 0.5\n")
    out = [str(tmp_path / "x")] if cmd[-1] == "--out" else []
    done = cli(*cmd, *out, "--workers", "4", "--compute-profile", str(bad))
    assert done.returncode == 2, done.stderr
    assert "id = 9 is out of range; expected a worker in [0, 3]" in done.stderr
    assert not (tmp_path / "x" / "metrics.jsonl").exists()
